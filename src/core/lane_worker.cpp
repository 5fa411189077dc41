#include "core/lane_worker.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "gpupool/error.hpp"
#include "gpupool/pinned.hpp"

namespace gpupool::detail {
namespace {
// The queue the calling thread's lane takes work from (null off lane threads).
thread_local const task_queue* lane_queue = nullptr;
}  // namespace

bool is_lane_thread_of(const task_queue& queue) noexcept {
  return lane_queue == &queue;
}

void device_memory::reserve(std::size_t bytes) {
  std::size_t now = in_use_.load(std::memory_order_relaxed);
  do {
    if (budget_ != 0 && now + bytes > budget_)
      throw out_of_memory("gpupool: allocating " + std::to_string(bytes) +
                          " bytes would pass the device memory budget of " +
                          std::to_string(budget_) + " bytes (" + std::to_string(now) + " in use)");
  } while (!in_use_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (now + bytes > peak &&
         !peak_.compare_exchange_weak(peak, now + bytes, std::memory_order_relaxed)) {
  }
}

lane_worker::lane_worker(const lane_setup& setup) : setup_(setup) {}

lane_worker::~lane_worker() {
  join();
}

std::future<void> lane_worker::start() {
  std::promise<void> ready;
  auto started = ready.get_future();
  thread_ = std::thread([this, ready = std::move(ready)]() mutable { run(std::move(ready)); });
  return started;
}

void lane_worker::join() {
  if (thread_.joinable()) thread_.join();
}

void lane_worker::open() {
  setup_.owner->bind_thread(setup_.ordinal);
  stream_ = setup_.owner->open_stream(setup_.ordinal);
  staging_done_ = stream_->make_event();
  slots_.resize(static_cast<std::size_t>(setup_.slots));
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    slots_[k].done = stream_->make_event();
    // The first buffer of every slot is needed by any elementwise work: take it now, off the hot
    // path. The second is only for two-input kernels and comes on first use.
    slot_host(static_cast<int>(k), 0);
    slot_device(static_cast<int>(k), 0);
  }
}

void lane_worker::close() noexcept {
  if (!stream_) return;
  recover();
  for (auto& s : slots_) {
    for (int i = 0; i < 2; ++i) {
      if (s.device[i]) deallocate_bytes(s.device[i], setup_.chunk_bytes);
      if (s.host[i]) deallocate_pinned(s.host[i], setup_.chunk_bytes);
      s.device[i] = s.host[i] = nullptr;
    }
  }
  recover();
  slots_.clear();
  staging_done_.reset();
  stream_.reset();
}

void* lane_worker::slot_host(int slot, int i) {
  void*& p = slots_.at(static_cast<std::size_t>(slot)).host[i];
  if (p == nullptr) p = allocate_pinned(setup_.chunk_bytes);
  return p;
}

void* lane_worker::slot_device(int slot, int i) {
  void*& p = slots_.at(static_cast<std::size_t>(slot)).device[i];
  if (p == nullptr) p = allocate_bytes(setup_.chunk_bytes);
  return p;
}

void lane_worker::run(std::promise<void> ready) {
  try {
    open();
  } catch (...) {
    close();
    ready.set_exception(std::current_exception());
    return;
  }
  ready.set_value();
  lane_queue = setup_.queue;

  // Items in flight, oldest first. Their slots are consecutive in ring order, ending just before
  // `next_slot`, so `next_slot` is free whenever fewer than `slots` items are in flight.
  std::deque<in_flight> window;
  int next_slot = 0;
  for (;;) {
    while (!window.empty() && complete_oldest(window, /*block=*/false)) {
    }
    if (window.size() < slots_.size()) {
      work_item_ptr item = setup_.queue->pop(setup_.device, /*block=*/window.empty());
      if (item) {
        if (!item->claim()) continue;
        current_slot_ = next_slot;
        try {
          item->start(*this, next_slot);
          slots_[static_cast<std::size_t>(next_slot)].done->record();
          window.push_back({std::move(item), next_slot});
          next_slot = (next_slot + 1) % static_cast<int>(slots_.size());
        } catch (...) {
          item->fail(std::current_exception());
          recover();
        }
        continue;
      }
      if (window.empty()) break;  // the queue is closed and holds nothing for this device
    }
    complete_oldest(window, /*block=*/true);
  }
  close();
}

bool lane_worker::complete_oldest(std::deque<in_flight>& window, bool block) {
  in_flight& oldest = window.front();
  backend_event& done = *slots_[static_cast<std::size_t>(oldest.slot)].done;
  try {
    if (block) {
      done.wait();
    } else if (!done.ready()) {
      return false;
    }
    oldest.item->finish(*this, oldest.slot);
  } catch (...) {
    oldest.item->fail(std::current_exception());
    recover();
  }
  window.pop_front();
  return true;
}

void lane_worker::recover() noexcept {
  try {
    stream_->synchronize();
  } catch (...) {
    // The failure was already reported to the task that caused it; what matters here is only
    // that the stream holds no more work touching the slots.
  }
  staging_busy_ = false;
}

void* lane_worker::native_stream() const noexcept {
  return stream_ ? stream_->native_handle() : nullptr;
}

void lane_worker::synchronize() {
  stream_->synchronize();
  staging_busy_ = false;
}

void* lane_worker::allocate_bytes(std::size_t bytes) {
  setup_.memory->reserve(bytes);
  try {
    return stream_->allocate(bytes);
  } catch (...) {
    setup_.memory->release(bytes);
    throw;
  }
}

void lane_worker::deallocate_bytes(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  stream_->deallocate(p);
  setup_.memory->release(bytes);
}

void* lane_worker::acquire_staging() {
  if (staging_busy_) {
    staging_done_->wait();
    staging_busy_ = false;
  }
  return slot_host(current_slot_, 0);
}

void lane_worker::upload_bytes(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  if (is_pinned(host_src)) {
    stream_->copy_to_device(device_dst, host_src, bytes);
    return;
  }
  const auto* src = static_cast<const char*>(host_src);
  auto* dst = static_cast<char*>(device_dst);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t n = std::min(setup_.chunk_bytes, bytes - done);
    void* staging = acquire_staging();
    std::memcpy(staging, src + done, n);
    stream_->copy_to_device(dst + done, staging, n);
    staging_done_->record();
    staging_busy_ = true;
    done += n;
  }
}

void lane_worker::download_bytes(void* host_dst, const void* device_src, std::size_t bytes) {
  if (bytes == 0) return;
  if (is_pinned(host_dst)) {
    stream_->copy_to_host(host_dst, device_src, bytes);
    return;
  }
  const auto* src = static_cast<const char*>(device_src);
  auto* dst = static_cast<char*>(host_dst);
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t n = std::min(setup_.chunk_bytes, bytes - done);
    void* staging = acquire_staging();
    stream_->copy_to_host(staging, src + done, n);
    staging_done_->record();
    staging_done_->wait();
    std::memcpy(dst + done, staging, n);
    done += n;
  }
}

void lane_worker::apply_bytes(const kernel& k, dtype t, const void* x, const void* y, void* out,
                              std::size_t count) {
  if (count == 0) return;
  if (k.arity() == 2 && y == nullptr)
    throw std::invalid_argument(std::string("gpupool: kernel '") + k.name() +
                                "' needs a second input");
  stream_->launch(k, t, x, y, out, count);
}

}  // namespace gpupool::detail
