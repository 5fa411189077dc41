#include "core/executor/lane_set.hpp"

#include <exception>
#include <future>
#include <stdexcept>
#include <string>
#include <system_error>

#include "core/environment.hpp"
#include "gpupool/options.hpp"

namespace gpupool::detail {
namespace {

// Test hook: GPUPOOL_TEST_FAIL_LANE_START=<n> makes starting the lane thread numbered n fail as
// thread creation does when the process has no threads left (EAGAIN). -1: no fault.
int lane_start_fault() {
  const auto n =
      count_from_environment({"GPUPOOL_TEST_FAIL_LANE_START", "a lane number", 0,
                              static_cast<unsigned long long>(limits::most_lanes_per_executor)});
  return n ? static_cast<int>(*n) : -1;
}

}  // namespace

void lane_set::start(const lane_setup& shared, const std::vector<int>& ordinals,
                     int lanes_per_device,
                     const std::vector<std::unique_ptr<device_memory>>& memory, task_queue& queue) {
  const int fault_at = lane_start_fault();
  const int total = static_cast<int>(ordinals.size()) * lanes_per_device;
  std::vector<std::future<void>> ready;
  std::exception_ptr first_failure;
  try {
    for (std::size_t d = 0; d < ordinals.size(); ++d) {
      for (int i = 0; i < lanes_per_device; ++i) {
        lane_setup setup = shared;
        setup.memory = memory[d].get();
        setup.device = static_cast<int>(d);
        setup.ordinal = ordinals[d];
        setup.index = static_cast<int>(lanes_.size());
        setup.index_on_device = i;
        lanes_.push_back(std::make_unique<lane_worker>(setup));
        try {
          if (setup.index == fault_at)
            throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                                    "injected by GPUPOOL_TEST_FAIL_LANE_START");
          ready.push_back(lanes_.back()->start());
        } catch (const std::system_error& e) {
          throw std::runtime_error("gpupool: could not start lane " + std::to_string(setup.index) +
                                   " of " + std::to_string(total) + " (no thread: " + e.what() +
                                   "); the lanes already started were stopped");
        }
      }
    }
  } catch (...) {
    first_failure = std::current_exception();
  }
  for (auto& r : ready) {
    try {
      r.get();
    } catch (...) {
      if (!first_failure) first_failure = std::current_exception();
    }
  }
  if (first_failure) {
    queue.close();
    join();
    lanes_.clear();
    std::rethrow_exception(first_failure);
  }
}

void lane_set::join() {
  for (auto& l : lanes_) l->join();
}

}  // namespace gpupool::detail
