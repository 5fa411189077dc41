// A lane's thread: takes work items from the queue, keeps up to `slots` of them in flight on its
// stream, and completes them in order as the stream passes each one. The slots' buffers
// (slot_buffers), the tracing (lane_tracer) and what an item sees of all this (slot_context)
// live apart; this is the loop and the public lane interface.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/backend.hpp"
#include "core/fault_injection.hpp"
#include "core/lanes/express_slot.hpp"
#include "core/lanes/slot_buffers.hpp"
#include "core/lanes/slot_context.hpp"
#include "core/scheduling/device_health.hpp"
#include "core/scheduling/task_queue.hpp"
#include "core/tracing/lane_tracer.hpp"
#include "gpupool/lane.hpp"
#include "gpupool/trace.hpp"

namespace gpupool::detail {

/// Device memory accounting for one device: what gpupool holds now, its peak, and the budget.
class device_memory {
 public:
  explicit device_memory(std::size_t budget) : budget_(budget) {}
  /// Counts `bytes` as held. @throw out_of_memory if that would pass the budget.
  void reserve(std::size_t bytes);
  void release(std::size_t bytes) noexcept { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t in_use() const noexcept { return in_use_.load(); }
  [[nodiscard]] std::size_t peak() const noexcept { return peak_.load(); }
  [[nodiscard]] std::size_t budget() const noexcept { return budget_; }

 private:
  std::size_t budget_;
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> peak_{0};
};

struct lane_setup {
  backend* owner = nullptr;
  task_queue* queue = nullptr;
  device_memory* memory = nullptr;
  trace_recorder* recorder = nullptr;
  const fault_plan* faults = nullptr;  // injected faults (GPUPOOL_FAULTS); null or empty: none
  int device = 0;                      // executor device index
  int ordinal = 0;                     // backend ordinal
  int index = 0;
  int index_on_device = 0;
  int slots = 2;
  int priority = 0;  // the executor's default priority, which its streams take where they can
  std::size_t chunk_bytes = 0;
  const std::atomic<bool>* tracing = nullptr;     // the executor's switch
  std::chrono::steady_clock::time_point epoch{};  // zero of the executor's clock
  coalescing_counters* coalescing = nullptr;      // the executor's counts of batches run
  device_health* health = nullptr;  // told of every failure (a device fault retires the device)
  // The executor's in-flight budget: the bytes of the tasks a completion pass ends go back to it
  // once, as the pass ends (completion_batch).
  budget_account* budget = nullptr;
};

/// True if the calling thread is a lane taking work from `queue`.
bool is_lane_thread_of(const task_queue& queue) noexcept;

class lane_worker final : public lane {
 public:
  explicit lane_worker(const lane_setup& setup);
  lane_worker(const lane_worker&) = delete;
  lane_worker& operator=(const lane_worker&) = delete;
  ~lane_worker();

  /// Starts the thread; the returned future is ready once the lane holds its stream and slots
  /// (or carries the reason it could not get them).
  std::future<void> start();
  void join();

  // gpupool::lane
  int device() const noexcept override { return setup_.device; }
  int index() const noexcept override { return setup_.index; }
  int index_on_device() const noexcept override { return setup_.index_on_device; }
  backend_kind backend() const noexcept override { return setup_.owner->kind(); }
  void* native_stream() const noexcept override;
  void synchronize() override;
  bool stream_idle() noexcept override;
  void make_device_current() override;
  std::size_t staging_bytes() const noexcept override { return setup_.chunk_bytes; }
  void* allocate_bytes(std::size_t bytes) override;
  void deallocate_bytes(void* p, std::size_t bytes) noexcept override;
  void upload_bytes(void* device_dst, const void* host_src, std::size_t bytes) override;
  void download_bytes(void* host_dst, const void* device_src, std::size_t bytes) override;
  void apply_bytes(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
                   std::size_t count) override;
  void run_bytes(const elementwise_kernel& k, const std::vector<kernel_argument>& inputs,
                 dtype out_type, void* out, std::size_t count) override;
  void run_bytes(const raw_kernel& k, const std::vector<kernel_argument>& inputs, dtype out_type,
                 void* out, std::size_t count) override;

 private:
  struct in_flight {
    work_item_ptr item;
    int slot;
  };

  void run(std::promise<void> ready);
  void open();
  void close() noexcept;
  /// Completes the oldest in-flight item if its work is done (or, with `block`, once it is).
  bool complete_oldest(std::deque<in_flight>& window, bool block);
  /// Runs claimed `item` in the express slot to its end (express_slot::takes said it may).
  void run_express(work_item_ptr item);
  /// After a failure: wait out whatever the stream still holds so slots can be reused.
  void recover() noexcept;
  /// Tells the executor's device_health of a task's failure on this lane.
  void report_failure(const std::exception_ptr& failure) noexcept;
  /// A staging buffer of the current slot for upload/download inside a user task, waiting out
  /// its last use: the slot's two buffers are taken in turn, from the first at each copy, so
  /// that filling one overlaps the copy out of the other. Returns the buffer and the index of
  /// its event in staging_done_.
  std::pair<void*, std::size_t> acquire_staging();

  lane_setup setup_;
  std::thread thread_;
  std::optional<fault_injector> faults_;
  std::unique_ptr<backend_stream> stream_;
  slot_buffers buffers_;
  lane_tracer tracer_;
  std::vector<slot_context> contexts_;  // the handle each slot's item gets
  express_slot express_;                // opened at the first urgent item of few bytes
  bool reaches_pinned_ = false;         // kernels_reach_pinned_blocks: whether express may run
  // Per staging buffer: the event recorded after its last copy, and whether that copy may still
  // run; next_staging_ is the buffer taken next.
  std::array<std::unique_ptr<backend_event>, 2> staging_done_;
  std::array<bool, 2> staging_busy_{};
  std::size_t next_staging_ = 0;
  int current_slot_ = 0;
};

}  // namespace gpupool::detail
