// How a lane waits for its stream's work (GPUPOOL_EVENT_WAIT), read by the CUDA backend's events
// and checked, on every backend, when an executor is made.
#pragma once

namespace gpupool::detail {

enum class event_wait {
  // The driver polls until the work is done (the default): the lowest latency, and faster on
  // large copies too (docs/performance.md); a core per waiting lane.
  spin,
  // Sleep in the driver until the GPU signals: no core used while waiting, but each wake-up
  // comes late.
  block,
};

/// Parses a GPUPOOL_EVENT_WAIT value: "spin" or "block"; unset or empty is `spin`. Throws
/// std::invalid_argument naming the variable and the value otherwise.
event_wait parse_event_wait(const char* value);

/// GPUPOOL_EVENT_WAIT as read now.
event_wait event_wait_from_environment();

}  // namespace gpupool::detail
