#include "core/scheduling/lane_spin.hpp"

#include <cstdlib>

#include "core/environment.hpp"

namespace gpupool::detail {

std::chrono::microseconds parse_lane_spin(const char* value) {
  const auto us = parse_count({"GPUPOOL_LANE_SPIN_US", "microseconds", 0,
                               static_cast<unsigned long long>(longest_lane_spin.count())},
                              value);
  return us ? std::chrono::microseconds{static_cast<long long>(*us)} : default_lane_spin;
}

std::chrono::microseconds lane_spin_from_environment() {
  return parse_lane_spin(std::getenv("GPUPOOL_LANE_SPIN_US"));
}

}  // namespace gpupool::detail
