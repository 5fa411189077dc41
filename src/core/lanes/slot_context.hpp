// The handle a lane gives the item running in one of its slots: what the item may touch (the
// slot's buffers, the lane's stream, the tracer's record for this slot) and nothing of the lane's
// loop. Items are written against this, not against the lane worker.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/backend.hpp"
#include "core/lanes/slot_buffers.hpp"
#include "core/scheduling/work_item.hpp"
#include "core/tracing/lane_tracer.hpp"
#include "gpupool/lane.hpp"

namespace gpupool::detail {

/// Counts of coalesced work, shared by an executor's lanes.
struct coalescing_counters {
  std::atomic<std::uint64_t> batches{0};  ///< Items that ran two or more tasks at once.
  std::atomic<std::uint64_t> tasks{0};    ///< Tasks that ran inside such an item.
};

class slot_context {
 public:
  using mark = lane_tracer::mark;

  /// `express`: the lane's express slot (express_slot.hpp), whose kernels work on its pinned
  /// host buffers in place.
  slot_context(lane& owner, backend_stream& stream, slot_buffers& buffers, lane_tracer& tracer,
               coalescing_counters* coalescing, int slot, bool express = false) noexcept
      : owner_(owner),
        stream_(stream),
        buffers_(buffers),
        tracer_(tracer),
        coalescing_(coalescing),
        slot_(slot),
        express_(express) {}

  [[nodiscard]] lane& owner() const noexcept { return owner_; }
  /// The executor's index of the lane's device.
  [[nodiscard]] int device() const noexcept { return owner_.device(); }
  [[nodiscard]] backend_stream& stream() const noexcept { return stream_; }

  /// True in the lane's express slot: the staged pipeline copies nothing to or from the device,
  /// and the kernel reads and writes the slot's pinned host buffers in place.
  [[nodiscard]] bool express() const noexcept { return express_; }

  /// Bytes each of the slot's buffers holds (the executor's chunk_bytes).
  [[nodiscard]] std::size_t buffer_bytes() const noexcept { return buffers_.buffer_bytes(); }
  /// The slot's pinned host buffer `i` and device buffer `i`, made on first use.
  [[nodiscard]] void* host_buffer(int i) const { return buffers_.host(slot_, i); }
  [[nodiscard]] void* device_buffer(int i) const { return buffers_.device(slot_, i); }

  // Tracing: each does nothing unless this slot's item is traced.
  [[nodiscard]] bool traced() const noexcept { return tracer_.traced(slot_); }
  [[nodiscard]] double now_us() const noexcept { return tracer_.now_us(); }
  /// `now_us()` when traced, else 0 (no clock read on the untraced path).
  [[nodiscard]] double trace_clock() const noexcept { return traced() ? now_us() : 0.0; }
  void stamp(mark m) const { tracer_.stamp(slot_, m); }
  void stage_in(double begin_us) const noexcept { tracer_.stage_in(slot_, begin_us); }
  void stage_out(double begin_us) const noexcept { tracer_.stage_out(slot_, begin_us); }

  /// Enqueues a built-in kernel; when traced the launch also stamps `kernel_begin` and
  /// `kernel_end` (on CUDA the kernel stamps them itself).
  void launch(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
              std::size_t count) const {
    if (!traced()) {
      stream_.launch(k, t, x, y, out, count);
      return;
    }
    stream_.launch_marked(k, t, x, y, out, count, tracer_.timer(slot_, mark::kernel_begin),
                          tracer_.timer(slot_, mark::kernel_end));
  }

  /// Counts an item that ran `tasks` (two or more) coalesced tasks.
  void count_batch(std::size_t tasks) const noexcept {
    if (coalescing_ == nullptr) return;
    coalescing_->batches.fetch_add(1, std::memory_order_relaxed);
    coalescing_->tasks.fetch_add(tasks, std::memory_order_relaxed);
  }

 private:
  lane& owner_;
  backend_stream& stream_;
  slot_buffers& buffers_;
  lane_tracer& tracer_;
  coalescing_counters* coalescing_;
  int slot_;
  bool express_;
};

}  // namespace gpupool::detail
