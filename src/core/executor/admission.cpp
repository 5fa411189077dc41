#include "core/executor/admission.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/backend.hpp"
#include "gpupool/error.hpp"

namespace gpupool::detail {

std::size_t choose_in_flight_budget(const executor_options& options,
                                    const std::vector<device_info>& devices) {
  if (options.when_full != when_full::block && options.when_full != when_full::raise)
    throw std::invalid_argument("gpupool: when_full must be block or raise");
  std::size_t total = 0;
  for (const auto& d : devices) {
    std::size_t per_device = options.in_flight_budget;
    if (per_device == 0)
      per_device = traits_of(d.backend).default_in_flight_budget(d);  // the backend's rule
    if (per_device == no_in_flight_limit || total > no_in_flight_limit - per_device)
      return no_in_flight_limit;
    total += per_device;
  }
  return total;
}

std::size_t in_flight_gate::cost(std::size_t bytes, bool piecewise) const {
  if (budget_ == no_in_flight_limit) return 0;  // nothing to wait for: no accounting
  if (bytes <= budget_) return bytes;
  // Its pieces stream through the staging slots, so it never holds more than they do at once:
  // it counts as the whole budget and runs once everything before it has made room.
  if (piecewise) return budget_;
  throw out_of_memory("gpupool: a task of " + std::to_string(bytes) +
                      " bytes cannot run in pieces and is larger than the in-flight budget of " +
                      std::to_string(budget_) + " bytes (" + std::to_string(budget_ / devices_) +
                      " per device x " + std::to_string(devices_) +
                      " devices); raise in_flight_budget or split the task");
}

void in_flight_gate::take(std::size_t bytes, bool on_lane) {
  if (try_take(bytes)) return;
  if (on_lane) {
    note_peak(in_flight_.fetch_add(bytes) + bytes);
    return;
  }
  if (mode_ == when_full::raise)
    throw out_of_memory("gpupool: submitting " + std::to_string(bytes) +
                        " bytes would pass the in-flight budget of " + std::to_string(budget_) +
                        " bytes (" + std::to_string(in_flight_.load()) +
                        " in flight; when_full is raise)");
  std::unique_lock lock(mutex_);
  // Counted before the check under the lock: a release that does not see the count has already
  // given its bytes back, so the check sees them (both are sequentially consistent).
  waiting_.fetch_add(1);
  waits_.fetch_add(1, std::memory_order_relaxed);
  bool taken = false;
  cv_.wait(lock, [&] { return closed_.load() || (taken = try_take(bytes)); });
  waiting_.fetch_sub(1);
  if (!taken) throw std::runtime_error(shut_down_message);
}

void in_flight_gate::wake_waiters() noexcept {
  std::lock_guard lock(mutex_);
  cv_.notify_all();
}

void in_flight_gate::close() noexcept {
  std::lock_guard lock(mutex_);
  closed_.store(true);
  cv_.notify_all();
}

}  // namespace gpupool::detail
