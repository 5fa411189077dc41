// Host lanes (executor_options::host_lanes): threads beside the devices' lanes that run small
// calls of built-in kernels on the host. Placement (core/scheduling/placement.hpp) queues calls
// here; a host lane takes them, coalesced as the devices' lanes take them, computes each straight
// from its host arrays into its output (no slots, no streams, no copies) and ends its future.
// They run nothing else: no user task, no compiled kernel, nothing pinned to a device.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/scheduling/task_queue.hpp"
#include "core/scheduling/work_item.hpp"
#include "core/tracing/lane_tracer.hpp"
#include "gpupool/future.hpp"

namespace gpupool::detail {

class host_lanes {
 public:
  /// What the host lanes share with the executor.
  struct setup {
    trace_recorder* recorder = nullptr;
    const std::atomic<bool>* tracing = nullptr;  // the executor's switch
    std::chrono::steady_clock::time_point epoch{};
    int first_index = 0;  // the first host lane's global lane index (after the devices' lanes)
    budget_account* budget = nullptr;   // where completed tasks give their bytes back
    int priority = 0;                   // the executor's default priority
    std::chrono::microseconds spin{0};  // as the devices' lanes look before they sleep
  };

  /// Starts `count` lanes (none for 0). If one cannot start, those started are stopped and the
  /// error thrown.
  host_lanes(int count, const setup& s);
  host_lanes(const host_lanes&) = delete;
  host_lanes& operator=(const host_lanes&) = delete;
  /// Closes the queue and waits for the lanes (each ends once the queue is empty).
  ~host_lanes();

  [[nodiscard]] int count() const noexcept { return static_cast<int>(threads_.size()); }
  /// Queues pieces of built-in kernels (elementwise_piece) for the host lanes, as
  /// task_queue::push_all. False if closed (or there are no host lanes), `items` left as given.
  bool push_all(std::vector<work_item_ptr>& items);
  /// Cancels everything queued and not yet taken (shutdown(cancel_pending)); what cannot be
  /// cancelled (a piece of a call already running) stays queued and runs.
  void cancel_queued() noexcept;
  /// Stops taking work, lets the lanes finish what is queued and waits for them.
  void close_and_join();
  /// Calls queued and not taken (a coalesced batch counts once).
  [[nodiscard]] std::size_t queued() const { return queue_.size(); }
  /// True on one of these lanes' threads (where a future's callbacks may run).
  [[nodiscard]] bool is_own_thread() const noexcept;

 private:
  void run(int index) noexcept;
  // Runs one item taken from the queue, start to end: it never throws.
  void run_item(work_item_ptr item, int index) noexcept;
  void record(const work_item& item, int index, double started, double ended, bool failed);

  setup setup_;
  task_queue queue_;
  std::vector<std::thread> threads_;
};

}  // namespace gpupool::detail
