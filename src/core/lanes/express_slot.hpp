// A lane's express slot: where it runs an urgent item of few bytes at once, beside the items in
// its ordinary slots, and without the copy engines.
//
// Copies are not preempted: a GPU's copy engine serves the uploads queued on it in turn, so an
// urgent task's upload queued behind a bulk map's waits for every byte of the map queued ahead
// of it, whatever its stream's priority. And a lane's stream runs its slots' items in order. So
// an item more urgent than its executor's default, whose operands are small, runs here instead:
// its inputs are gathered into the slot's pinned host buffers, its kernel reads them and writes
// its output there in place (pinned memory the backend allocated is in every device's address
// space), on a stream of the slot's own at the most urgent of gpupool's levels that the device
// gives, and the lane waits for it before it takes anything else. The kernel's reads and writes
// cross the bus beside the copy engines' transfers rather than behind them.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "core/backend.hpp"
#include "core/lanes/slot_buffers.hpp"
#include "core/lanes/slot_context.hpp"
#include "core/scheduling/work_item.hpp"
#include "core/tracing/lane_tracer.hpp"
#include "gpupool/lane.hpp"

namespace gpupool::detail {

class fault_injector;

class express_slot {
 public:
  /// The most bytes an operand of an express item may hold: the kernel reads and writes them
  /// across the bus, which pays for small operands only.
  static constexpr std::size_t most_operand_bytes = std::size_t{256} << 10;

  /// Whether `item` runs express on a lane whose kernels reach gpupool's pinned blocks or not
  /// (`reaches_pinned`: kernels_reach_pinned_blocks), in an executor whose default priority is
  /// `default_priority`: it is more urgent than that, runs through the staged pipeline alone,
  /// and no operand of its call (of its batch, for coalesced calls) holds more than
  /// most_operand_bytes.
  [[nodiscard]] static bool takes(const work_item& item, int default_priority,
                                  bool reaches_pinned) noexcept {
    if (!reaches_pinned || item.priority <= default_priority) return false;
    const std::size_t bytes = item.staged_operand_bytes();
    return bytes > 0 && bytes <= most_operand_bytes;
  }

  /// Buffers of `buffer_bytes` (at most most_operand_bytes are used); `where` as the lane's own
  /// tracer's.
  express_slot(lane& owner, std::size_t buffer_bytes, const lane_tracer::where& where);
  express_slot(const express_slot&) = delete;
  express_slot& operator=(const express_slot&) = delete;
  ~express_slot() { close(); }

  [[nodiscard]] bool is_open() const noexcept { return stream_ != nullptr; }
  /// Opens the stream (on `ordinal`, bound to the calling thread) at the most urgent gpupool
  /// priority the device gives, the buffer and the tracer; `faults`, if set, fail its work as
  /// they fail the lane's.
  void open(backend& owner, int ordinal, fault_injector* faults, coalescing_counters* coalescing);
  /// Waits out the stream and frees everything; open() may be called again.
  void close() noexcept;

  /// What the item gets, the event recorded after it, and its tracer (slot 0). Only while open.
  [[nodiscard]] slot_context& context() noexcept { return *context_; }
  [[nodiscard]] backend_event& done() noexcept { return buffers_.done(0); }
  [[nodiscard]] lane_tracer& tracer() noexcept { return tracer_; }
  /// Waits out what the stream holds, failures included (after an item failed).
  void recover() noexcept;

 private:
  lane& owner_;
  slot_buffers buffers_;
  lane_tracer tracer_;
  std::unique_ptr<backend_stream> stream_;
  std::optional<slot_context> context_;
};

}  // namespace gpupool::detail
