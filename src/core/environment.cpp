#include "core/environment.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "gpupool/options.hpp"

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

std::optional<std::vector<int>> devices_from_environment() {
  constexpr const char* name = "GPUPOOL_DEVICES";
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  // Each device needs a lane of its own.
  constexpr auto most_devices = static_cast<std::size_t>(limits::most_lanes_per_executor);
  const std::string text(value);  // held: the environment may change while it is read
  const auto refuse = [&] {
    constexpr std::size_t shown = 200;  // of a value that may be any length
    return std::invalid_argument(
        std::string(name) +
        " must be device ordinals separated by commas, such as 0,1 or 0,0 (digits only, at "
        "most " +
        std::to_string(most_devices) + " of them), not '" + text.substr(0, shown) +
        (text.size() > shown ? "...'" : "'"));
  };
  std::vector<int> ordinals;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string entry = text.substr(start, comma - start);
    if (entry.empty() || ordinals.size() == most_devices) throw refuse();
    try {
      ordinals.push_back(
          static_cast<int>(*parse_count({name, "an ordinal", 0, 65535}, entry.c_str())));
    } catch (const std::invalid_argument&) {
      throw refuse();
    }
    if (comma == text.size()) return ordinals;
    start = comma + 1;
  }
}

bool quiet_from_environment() {
  const char* v = std::getenv("GPUPOOL_QUIET");
  if (v == nullptr || *v == '\0' || std::string_view(v) == "0") return false;
  if (std::string_view(v) == "1") return true;
  throw std::invalid_argument(std::string("GPUPOOL_QUIET must be 0 or 1, not '") + v + "'");
}

}  // namespace gpupool::detail
