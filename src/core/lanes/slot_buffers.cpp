#include "core/lanes/slot_buffers.hpp"

#include "gpupool/pinned.hpp"

namespace gpupool::detail {
namespace {
void*& buffer_at(std::vector<void*>& buffers, int i) {
  if (buffers.size() <= static_cast<std::size_t>(i))
    buffers.resize(static_cast<std::size_t>(i) + 1);
  return buffers[static_cast<std::size_t>(i)];
}
}  // namespace

void slot_buffers::open(backend_stream& stream, int slots, bool device_buffers) {
  slots_.resize(static_cast<std::size_t>(slots));
  for (int k = 0; k < slots; ++k) {
    slots_[static_cast<std::size_t>(k)].done = stream.make_event();
    // The first buffer of every slot is needed by any elementwise work: take it now, off the hot
    // path. The second is only for two-input kernels and comes on first use.
    host(k, 0);
    if (device_buffers) device(k, 0);
  }
}

void slot_buffers::close() noexcept {
  for (auto& s : slots_) {
    for (void*& d : s.device) {
      if (d) owner_.deallocate_bytes(d, bytes_);
      d = nullptr;
    }
    for (void*& h : s.host) {
      if (h) deallocate_pinned(h, bytes_);
      h = nullptr;
    }
  }
  slots_.clear();
}

void* slot_buffers::host(int slot, int i) {
  void*& p = buffer_at(slots_.at(static_cast<std::size_t>(slot)).host, i);
  if (p == nullptr) p = allocate_pinned(bytes_);
  return p;
}

void* slot_buffers::device(int slot, int i) {
  void*& p = buffer_at(slots_.at(static_cast<std::size_t>(slot)).device, i);
  if (p == nullptr) p = owner_.allocate_bytes(bytes_);
  return p;
}

}  // namespace gpupool::detail
