// The unit a lane takes from the queue. Internal: users see futures, not work items (what
// `executor::submit` queues is a user_task, wrapped in an item by src/core/executor/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "gpupool/future.hpp"
#include "gpupool/lane.hpp"

namespace gpupool::detail {

/// The handle a lane gives the item it runs in one of its slots: that slot's staging buffers, the
/// lane's stream and its tracer (src/core/lanes/slot_context.hpp). Items reach the lane only
/// through it, never through the lane's own internals.
class slot_context;

/// The lane behind a slot, for work that only needs the public lane interface (user callables).
[[nodiscard]] lane& lane_of(slot_context& slot) noexcept;

/// One queued piece of work. A lane calls, in order: `claim()` (false: drop it, it was cancelled),
/// `start()` (enqueue work on the lane's stream), then, once the stream has passed that point,
/// `finish()` (host work after the device's, e.g. copying results out) and `complete()` (hand the
/// result over). If `start` or `finish` throws, the lane calls `fail()` instead. `cancel()` is
/// called for items still queued at `shutdown(cancel_pending=true)`: it cancels the item's task
/// if that has not started and returns true (the item is done with), or returns false when the
/// item is a piece of a task that already started elsewhere, which must then run to its end.
class work_item {
 public:
  virtual ~work_item() = default;
  virtual bool claim() = 0;
  virtual void start(slot_context& slot) = 0;
  virtual void finish(slot_context& slot) = 0;
  virtual void complete() noexcept = 0;
  virtual void fail(std::exception_ptr e) noexcept = 0;
  [[nodiscard]] virtual bool cancel() noexcept = 0;

  /// Coalescing: `next` was queued right behind this item, for the same device, while this one
  /// still waits in the queue (no lane has taken it). An item that can carry `next`'s work along
  /// with its own (the same built-in kernel and type, within its size bound) takes it over and
  /// returns true, leaving `next` empty; then `next` is never queued on its own. Called with the
  /// queue's lock held: cheap, never blocks. The default takes nothing.
  [[nodiscard]] virtual bool absorb(std::unique_ptr<work_item>& next) noexcept {
    (void)next;
    return false;
  }

  /// For the trace: what to call this item, and the bytes it moves each way.
  [[nodiscard]] virtual const char* trace_name() const noexcept { return "task"; }
  [[nodiscard]] virtual std::size_t bytes_in() const noexcept { return 0; }
  [[nodiscard]] virtual std::size_t bytes_out() const noexcept { return 0; }

  /// The most bytes any one operand (each input and the output) of its call holds, for an item
  /// that runs through the staged pipeline alone (start_staged: a kernel of gpupool's making
  /// touches only its operands, in the slot's buffers): of the whole call where it is one piece
  /// of several, of its batch where calls were coalesced. 0 for an item that does anything else
  /// (a user's callable, a raw kernel). An urgent item of few bytes runs in the lane's express
  /// slot (see core/lanes/express_slot.hpp).
  [[nodiscard]] virtual std::size_t staged_operand_bytes() const noexcept { return 0; }

  /// Tasks this item carries: more than one once it absorbed others. The trace keeps one record
  /// per task that ran; `carried(i, ...)` names task `i` (false: it did not run, e.g. cancelled).
  [[nodiscard]] virtual std::size_t carried_count() const noexcept { return 1; }
  [[nodiscard]] virtual bool carried(std::size_t i, std::uint64_t& id, double& submitted,
                                     std::size_t& in, std::size_t& out) const noexcept {
    if (i != 0) return false;
    id = trace_id;
    submitted = submitted_us;
    in = bytes_in();
    out = bytes_out();
    return true;
  }

  std::uint64_t trace_id = 0;  ///< Submission order, set when queued.
  double submitted_us = 0.0;   ///< When queued, on the executor's clock.
  /// Which of the queue's priority levels it joins (limits::lowest_priority..highest_priority;
  /// higher is taken first), set when queued. Items of different priorities never absorb each
  /// other (they wait in different FIFOs).
  int priority = 0;
};

using work_item_ptr = std::unique_ptr<work_item>;

}  // namespace gpupool::detail
