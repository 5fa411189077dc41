// A lane's slots: per slot, pinned host buffers and device buffers of one size (one pair per
// array operand, made on first use), and the event that marks the slot's item done on the stream.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/backend.hpp"
#include "gpupool/lane.hpp"

namespace gpupool::detail {

class slot_buffers {
 public:
  /// Buffers of `buffer_bytes` each; device memory comes from `owner` (its stream-ordered pool,
  /// counted against the device's budget).
  slot_buffers(lane& owner, std::size_t buffer_bytes) : owner_(owner), bytes_(buffer_bytes) {}
  slot_buffers(const slot_buffers&) = delete;
  slot_buffers& operator=(const slot_buffers&) = delete;
  ~slot_buffers() { close(); }

  /// Makes `slots` slots with their events on `stream`, and the first buffer pair of each (the
  /// host buffer alone without `device_buffers`: for slots whose kernels work on host buffers).
  void open(backend_stream& stream, int slots, bool device_buffers = true);
  /// Frees every buffer (stream-ordered on the device side) and the events.
  void close() noexcept;

  [[nodiscard]] int count() const noexcept { return static_cast<int>(slots_.size()); }
  [[nodiscard]] std::size_t buffer_bytes() const noexcept { return bytes_; }
  /// Slot `slot`'s pinned host buffer `i`, made on first use.
  void* host(int slot, int i);
  /// Slot `slot`'s device buffer `i`, made on first use.
  void* device(int slot, int i);
  /// The event recorded after the slot's item was enqueued.
  [[nodiscard]] backend_event& done(int slot) noexcept {
    return *slots_[static_cast<std::size_t>(slot)].done;
  }

 private:
  struct one_slot {
    std::vector<void*> host;    // one pinned buffer per array operand, made on first use
    std::vector<void*> device;  // likewise on the device
    std::unique_ptr<backend_event> done;
  };

  lane& owner_;
  std::size_t bytes_;
  std::vector<one_slot> slots_;
};

}  // namespace gpupool::detail
