// Tracing on a lane: the executor's ring of task records, and each lane's tracer, which times the
// stages of the items in its slots (host clock for host work, GPU marks for stream work) and
// turns them into one record per task.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "core/backend.hpp"
#include "core/scheduling/work_item.hpp"
#include "gpupool/trace.hpp"

namespace gpupool::detail {

/// Microseconds since `epoch`.
inline double clock_us(std::chrono::steady_clock::time_point epoch) noexcept {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch)
      .count();
}

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

/// One lane's tracer: a record in the making per slot. Every call does nothing for a slot whose
/// item is not traced (tracing was off when the lane took it). Used by the lane's thread only.
class lane_tracer {
 public:
  enum class mark { upload_begin, kernel_begin, kernel_end, download_end };

  struct where {
    trace_recorder* recorder = nullptr;          // null: nothing is kept
    const std::atomic<bool>* tracing = nullptr;  // the executor's switch
    std::chrono::steady_clock::time_point epoch{};
    int device = 0;
    int lane = 0;
    bool express = false;  // the lane's express slot's tracer: its records say so
  };

  explicit lane_tracer(const where& w) : where_(w) {}

  /// Times marks on `stream` from now on; `slots` records in the making at most.
  void attach(backend_stream& stream, std::size_t slots);
  /// Drops the stream's timers (before the stream goes).
  void detach() noexcept;

  [[nodiscard]] double now_us() const noexcept { return clock_us(where_.epoch); }

  /// Starts the slot's record if tracing is on; `lane_idle`: nothing else in flight (a good
  /// moment to line the GPU clock up with the host's).
  void begin(int slot, const work_item& item, bool lane_idle) noexcept;
  /// Completes the slot's record (GPU marks converted to the executor's clock) and keeps one
  /// record per task the item carried.
  void end(int slot, const work_item& item, bool failed) noexcept;

  [[nodiscard]] bool traced(int slot) const noexcept;
  /// Timestamps this point of the stream's work (a GPU clock stamp on CUDA).
  void stamp(int slot, mark m);
  /// The slot's timer for `m` (made on first use), counted as marked; for launches that stamp
  /// their own kernel marks.
  backend_timer& timer(int slot, mark m);
  /// Records a host-side stage (staging copies) that ran from `begin_us` to now.
  void stage_in(int slot, double begin_us) noexcept;
  void stage_out(int slot, double begin_us) noexcept;

 private:
  static constexpr std::size_t mark_count = 4;
  struct slot_trace {
    bool on = false;
    task_record record;
    std::unique_ptr<backend_timer> marks[mark_count];
    bool marked[mark_count] = {};
  };

  /// Lines the lane's GPU timestamps up with the host clock (synchronises the stream).
  void calibrate_clock();

  where where_;
  backend_stream* stream_ = nullptr;
  std::vector<slot_trace> slots_;
  std::unique_ptr<backend_timer> reference_;  // a mark taken at `reference_us_`
  std::unique_ptr<backend_timer> probe_;      // calibration's spare mark (made once, reused)
  double reference_us_ = 0.0;
  double calibrated_at_us_ = 0.0;
};

}  // namespace gpupool::detail
