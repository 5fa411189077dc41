#include "core/environment.hpp"

#include <charconv>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <system_error>

namespace gpupool::detail {

std::optional<unsigned long long> parse_count(const count_variable& v, const char* value) {
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string_view s(value);
  const auto refuse = [&] {
    return std::invalid_argument(std::string(v.name) + " must be " + v.what + " from " +
                                 std::to_string(v.lowest) + " to " + std::to_string(v.highest) +
                                 " (digits only), not '" + std::string(s) + "'");
  };
  if (s.find_first_not_of("0123456789") != std::string_view::npos) throw refuse();
  unsigned long long n = 0;
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), n);
  // Too many digits for the type is out of range like any other large number.
  if (error != std::errc{} || end != s.data() + s.size() || n < v.lowest || n > v.highest)
    throw refuse();
  return n;
}

std::optional<unsigned long long> count_from_environment(const count_variable& v) {
  return parse_count(v, std::getenv(v.name));
}

}  // namespace gpupool::detail
