#include "core/lanes/event_wait.hpp"

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gpupool::detail {

event_wait parse_event_wait(const char* value) {
  if (value == nullptr || *value == '\0') return event_wait::spin;
  const std::string_view s(value);
  if (s == "spin") return event_wait::spin;
  if (s == "block") return event_wait::block;
  throw std::invalid_argument("GPUPOOL_EVENT_WAIT must be 'spin' or 'block', not '" +
                              std::string(s) + "'");
}

event_wait event_wait_from_environment() {
  return parse_event_wait(std::getenv("GPUPOOL_EVENT_WAIT"));
}

}  // namespace gpupool::detail
