// A lane's thread: takes work items from the queue, keeps up to `slots` of them in flight on its
// stream, and completes them in order as the stream passes each one.
#pragma once

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
#include <vector>

#include "core/backend.hpp"
#include "core/fault_injection.hpp"
#include "core/scheduling/task_queue.hpp"
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

/// The executor's trace records, shared by its lanes: a ring of at most `capacity()` records
/// (the oldest are dropped, and counted, once it is full). Thread-safe.
class trace_recorder {
 public:
  /// About 200-300 bytes a record: the default holds about 60 MB at most.
  static constexpr std::size_t default_capacity = std::size_t{1} << 18;

  void add(task_record&& r) noexcept;
  /// Records of tasks numbered `first_id` or later, in submission order.
  [[nodiscard]] std::vector<task_record> since(std::uint64_t first_id) const;
  /// Records dropped to stay within the capacity since the last clear().
  [[nodiscard]] std::size_t dropped() const;
  [[nodiscard]] std::size_t capacity() const;
  /// Sets the most records kept (at least 1); drops the oldest beyond it now.
  void set_capacity(std::size_t records);
  /// Forgets every record and the dropped count, and gives their memory back.
  void clear();

 private:
  void trim_locked() noexcept;

  mutable std::mutex mutex_;
  std::deque<task_record> ring_;
  std::size_t capacity_ = default_capacity;
  std::size_t dropped_ = 0;
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
  std::size_t chunk_bytes = 0;
  const std::atomic<bool>* tracing = nullptr;     // the executor's switch
  std::chrono::steady_clock::time_point epoch{};  // zero of the executor's clock
};

/// Microseconds since `epoch`.
inline double clock_us(std::chrono::steady_clock::time_point epoch) noexcept {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch)
      .count();
}

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
  void* allocate_bytes(std::size_t bytes) override;
  void deallocate_bytes(void* p, std::size_t bytes) noexcept override;
  void upload_bytes(void* device_dst, const void* host_src, std::size_t bytes) override;
  void download_bytes(void* host_dst, const void* device_src, std::size_t bytes) override;
  void apply_bytes(const kernel& k, dtype t, const void* x, const void* y, void* out,
                   std::size_t count) override;
  void run_bytes(const elementwise_kernel& k, const std::vector<kernel_argument>& inputs,
                 dtype out_type, void* out, std::size_t count) override;
  void run_bytes(const raw_kernel& k, const std::vector<kernel_argument>& inputs, dtype out_type,
                 void* out, std::size_t count) override;

  // For the built-in pipelined kernels (elementwise pieces).
  [[nodiscard]] backend_stream& stream() noexcept { return *stream_; }
  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return setup_.chunk_bytes; }
  /// Slot `slot`'s pinned host buffer `i` of `chunk_bytes()`, made on first use.
  void* slot_host(int slot, int i);
  /// Slot `slot`'s device buffer `i` of `chunk_bytes()`, made on first use.
  void* slot_device(int slot, int i);

  // Tracing, for the items that know their stages. Each does nothing unless the slot's item is
  // being traced.
  enum class mark { upload_begin, kernel_begin, kernel_end, download_end };
  /// Timestamps this point of the stream's work (a GPU clock stamp on CUDA).
  void trace_mark(int slot, mark m);
  /// Enqueues a built-in kernel; for a traced slot the launch also marks `kernel_begin` and
  /// `kernel_end` (on CUDA the kernel stamps them itself).
  void launch(int slot, const kernel& k, dtype t, const void* x, const void* y, void* out,
              std::size_t count);
  /// Records a host-side stage (staging copies) that ran from `begin_us` to now.
  void trace_stage_in(int slot, double begin_us);
  void trace_stage_out(int slot, double begin_us);
  [[nodiscard]] bool traced(int slot) const noexcept;
  [[nodiscard]] double now_us() const noexcept { return clock_us(setup_.epoch); }

 private:
  struct slot_buffers {
    std::vector<void*> host;    // one pinned buffer per array operand, made on first use
    std::vector<void*> device;  // likewise on the device
    std::unique_ptr<backend_event> done;
  };
  struct in_flight {
    work_item_ptr item;
    int slot;
  };
  static constexpr std::size_t mark_count = 4;
  struct slot_trace {
    bool on = false;
    task_record record;
    std::unique_ptr<backend_timer> marks[mark_count];
    bool marked[mark_count] = {};
  };

  void begin_trace(int slot, const work_item& item, bool lane_idle) noexcept;
  /// The traced slot's timer for `m` (made on first use), counted as marked.
  backend_timer& mark_timer(int slot, mark m);
  /// Lines this lane's GPU timestamps up with the host clock (synchronises the stream).
  void calibrate_clock();
  /// Completes the slot's record (converting GPU marks to the executor's clock) and keeps it.
  void end_trace(int slot, const work_item& item, bool failed) noexcept;

  void run(std::promise<void> ready);
  void open();
  void close() noexcept;
  /// Completes the oldest in-flight item if its work is done (or, with `block`, once it is).
  bool complete_oldest(std::deque<in_flight>& window, bool block);
  /// After a failure: wait out whatever the stream still holds so slots can be reused.
  void recover() noexcept;
  /// The staging buffer used by upload/download inside a user task; waits out its last use.
  void* acquire_staging();

  lane_setup setup_;
  std::thread thread_;
  std::optional<fault_injector> faults_;
  std::unique_ptr<backend_stream> stream_;
  std::vector<slot_buffers> slots_;
  std::unique_ptr<backend_event> staging_done_;
  bool staging_busy_ = false;
  int current_slot_ = 0;

  std::vector<slot_trace> traces_;
  std::unique_ptr<backend_timer> reference_;  // a mark taken at `reference_us_`
  std::unique_ptr<backend_timer> probe_;      // calibration's spare mark (made once, reused)
  double reference_us_ = 0.0;
  double calibrated_at_us_ = 0.0;
};

}  // namespace gpupool::detail
