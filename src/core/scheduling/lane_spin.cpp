#include "core/scheduling/lane_spin.hpp"

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gpupool::detail {

std::chrono::microseconds parse_lane_spin(const char* value) {
  if (value == nullptr || *value == '\0') return default_lane_spin;
  const std::string_view s(value);
  const auto refuse = [&] {
    return std::invalid_argument("GPUPOOL_LANE_SPIN_US must be microseconds from 0 to " +
                                 std::to_string(longest_lane_spin.count()) +
                                 " (digits only), not '" + std::string(s) + "'");
  };
  // Digits only (no sign, no spaces), and few enough that the number cannot overflow.
  if (s.size() > 9 || s.find_first_not_of("0123456789") != std::string_view::npos) throw refuse();
  const long long us = std::stoll(std::string(s));
  if (us > longest_lane_spin.count()) throw refuse();
  return std::chrono::microseconds{us};
}

std::chrono::microseconds lane_spin_from_environment() {
  return parse_lane_spin(std::getenv("GPUPOOL_LANE_SPIN_US"));
}

}  // namespace gpupool::detail
