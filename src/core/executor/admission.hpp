// Admission: the in-flight budget of an executor's devices together, and what a task counts
// against it. Submitters take bytes before queueing a task; its future's state gives them back
// as it ends (state_base::hold), or a lane's completion pass gives back every task's at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "gpupool/executor.hpp"
#include "gpupool/future.hpp"
#include "gpupool/options.hpp"
#include "gpupool/types.hpp"

namespace gpupool::detail {

// Why work is refused once the executor is shut down (a waiting submitter learns it here).
inline constexpr const char* shut_down_message =
    "gpupool: the executor is shut down and takes no more work";

inline constexpr std::size_t no_in_flight_limit = std::numeric_limits<std::size_t>::max();

// The in-flight budget of all `devices` together: executor_options::in_flight_budget per
// device, or its default. @throw std::invalid_argument for a when_full that is neither.
[[nodiscard]] std::size_t choose_in_flight_budget(const executor_options& options,
                                                  const std::vector<device_info>& devices);

// Bytes of work admitted and not yet done, against a budget for all devices together. Taking and
// giving back are lock-free; only a submitter that must wait takes the mutex.
class in_flight_gate final : public budget_account {
 public:
  in_flight_gate(std::size_t budget, when_full mode, std::size_t devices)
      : budget_(budget), mode_(mode), devices_(devices) {}

  [[nodiscard]] std::size_t budget() const noexcept { return budget_; }

  // What a task of `bytes` counts: 0 without a budget (no accounting on the submit path); a
  // piecewise task at most the whole budget; a task that cannot be split and passes the budget
  // is refused. @throw out_of_memory naming the sizes.
  [[nodiscard]] std::size_t cost(std::size_t bytes, bool piecewise) const;

  // Takes `bytes` if they fit now.
  bool try_take(std::size_t bytes) noexcept {
    if (bytes == 0) return true;
    std::size_t now = in_flight_.load();
    do {
      if (now > budget_ || bytes > budget_ - now) return false;
    } while (!in_flight_.compare_exchange_weak(now, now + bytes));
    note_peak(now + bytes);
    return true;
  }

  // Takes `bytes`, waiting for room (or throwing out_of_memory, in raise mode; a runtime_error
  // once closed). A lane thread is admitted over the budget: it may be the very lane whose
  // completions would make room.
  void take(std::size_t bytes, bool on_lane);

  void give_back(std::size_t bytes) noexcept override { release(bytes); }

  void release(std::size_t bytes) noexcept {
    if (bytes == 0) return;
    in_flight_.fetch_sub(bytes);
    if (waiting_.load() > 0) wake_waiters();
  }

  // Wakes every waiting submitter to find the executor shut down.
  void close() noexcept;

  [[nodiscard]] in_flight_stats stats() const noexcept {
    return {in_flight_.load(), peak_.load(std::memory_order_relaxed), budget_, waiting_.load(),
            waits_.load(std::memory_order_relaxed)};
  }

 private:
  void note_peak(std::size_t now) noexcept {
    std::size_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  void wake_waiters() noexcept;

  const std::size_t budget_;
  const when_full mode_;
  const std::size_t devices_;  // for the message of a task too large
  std::atomic<std::size_t> in_flight_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<std::size_t> waiting_{0};
  std::atomic<std::uint64_t> waits_{0};
  std::atomic<bool> closed_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace gpupool::detail
