#include "core/lanes/lane_worker.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "core/kernels/user_call.hpp"
#include "core/lanes/lane_thread.hpp"
#include "core/tracing/nvtx.hpp"
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

lane_worker::lane_worker(const lane_setup& setup)
    : setup_(setup),
      buffers_(*this, setup.chunk_bytes),
      tracer_({setup.recorder, setup.tracing, setup.epoch, setup.device, setup.index}),
      express_(*this, setup.chunk_bytes,
               {setup.recorder, setup.tracing, setup.epoch, setup.device, setup.index}) {}

lane& lane_of(slot_context& slot) noexcept {
  return slot.owner();
}

lane_worker::~lane_worker() {
  join();
}

std::future<void> lane_worker::start() {
  std::promise<void> ready;
  auto started = ready.get_future();
  thread_ = start_lane_thread(
      "gpupool d" + std::to_string(setup_.device) + "." + std::to_string(setup_.index_on_device),
      [this, ready = std::move(ready)]() mutable { run(std::move(ready)); });
  return started;
}

void lane_worker::join() {
  if (thread_.joinable()) thread_.join();
}

void lane_worker::open() {
  setup_.owner->bind_thread(setup_.ordinal);
  reaches_pinned_ = kernels_reach_pinned_blocks(setup_.owner->kind());
  stream_ = setup_.owner->open_stream(setup_.ordinal, setup_.priority);
  for (auto& done : staging_done_) done = stream_->make_event();
  buffers_.open(*stream_, setup_.slots);
  // Faults are injected into the lane's work, not into its start.
  if (setup_.faults != nullptr && setup_.faults->any()) {
    faults_.emplace(*setup_.faults, static_cast<std::uint64_t>(setup_.index));
    stream_ = with_faults(std::move(stream_), *faults_);
  }
  tracer_.attach(*stream_, static_cast<std::size_t>(setup_.slots));
  contexts_.reserve(static_cast<std::size_t>(setup_.slots));
  for (int k = 0; k < setup_.slots; ++k)
    contexts_.emplace_back(*this, *stream_, buffers_, tracer_, setup_.coalescing, k);
}

void lane_worker::close() noexcept {
  express_.close();
  if (!stream_) return;
  recover();
  contexts_.clear();
  tracer_.detach();
  buffers_.close();
  recover();
  for (auto& done : staging_done_) done.reset();
  stream_.reset();
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
  // Each completion pass runs inside a completion_batch, so that work futures' callbacks defer
  // (taking Python's lock, say) is done once per pass rather than once per task.
  const auto complete_ready = [&] {
    completion_batch pass(setup_.budget);
    while (!window.empty() && complete_oldest(window, /*block=*/false)) {
    }
  };
  for (;;) {
    complete_ready();
    if (window.size() < static_cast<std::size_t>(buffers_.count())) {
      work_item_ptr item = setup_.queue->pop(setup_.device, /*block=*/window.empty());
      if (item) {
        if (!item->claim()) continue;
        if (express_slot::takes(*item, setup_.priority, reaches_pinned_)) {
          run_express(std::move(item));
          continue;
        }
        current_slot_ = next_slot;
        tracer_.begin(next_slot, *item, /*lane_idle=*/window.empty());
        try {
          if (faults_) faults_->maybe_fail(fault_kind::call);
          item->start(contexts_[static_cast<std::size_t>(next_slot)]);
          buffers_.done(next_slot).record();
          window.push_back({std::move(item), next_slot});
          next_slot = (next_slot + 1) % buffers_.count();
        } catch (...) {
          const std::exception_ptr failure = std::current_exception();
          tracer_.end(next_slot, *item, /*failed=*/true);
          // A device fault retires the device before the task's future ends, so that whoever
          // reacts to that future finds the device out of service. The stream is waited out
          // before the task ends too: what its start enqueued (a copy into its output, say)
          // must not run after its memory went back (a failed map input gives its output
          // block back as it ends).
          report_failure(failure);
          recover();
          item->fail(failure);
        }
        continue;
      }
      if (window.empty()) break;  // the queue is closed and holds nothing for this device
    }
    {
      completion_batch pass(setup_.budget);
      complete_oldest(window, /*block=*/true);
      while (!window.empty() && complete_oldest(window, /*block=*/false)) {
      }
    }
  }
  close();
}

bool lane_worker::complete_oldest(std::deque<in_flight>& window, bool block) {
  in_flight& oldest = window.front();
  backend_event& done = buffers_.done(oldest.slot);
  try {
    if (block) {
      GPUPOOL_NVTX_RANGE("gpupool: wait for the device");
      done.wait();
    } else if (!done.ready()) {
      return false;
    }
    oldest.item->finish(contexts_[static_cast<std::size_t>(oldest.slot)]);
    // Recorded before the result is handed over, so a trace taken once a future is ready
    // includes that task.
    tracer_.end(oldest.slot, *oldest.item, /*failed=*/false);
    oldest.item->complete();
  } catch (...) {
    const std::exception_ptr failure = std::current_exception();
    tracer_.end(oldest.slot, *oldest.item, /*failed=*/true);
    report_failure(failure);  // before the future ends, and the stream waited out, as in run()
    recover();
    oldest.item->fail(failure);
  }
  window.pop_front();
  return true;
}

void lane_worker::run_express(work_item_ptr item) {
  completion_batch pass(setup_.budget);
  bool traced = false;
  try {
    if (!express_.is_open())
      express_.open(*setup_.owner, setup_.ordinal, faults_ ? &*faults_ : nullptr,
                    setup_.coalescing);
    // The express stream is idle whenever an item starts: a good moment for the clock.
    express_.tracer().begin(0, *item, /*lane_idle=*/true);
    traced = true;
    if (faults_) faults_->maybe_fail(fault_kind::call);
    item->start(express_.context());
    express_.done().record();
    {
      GPUPOOL_NVTX_RANGE("gpupool: wait for an express item");
      express_.done().wait();
    }
    item->finish(express_.context());
    express_.tracer().end(0, *item, /*failed=*/false);
    item->complete();
  } catch (...) {
    const std::exception_ptr failure = std::current_exception();
    if (traced) express_.tracer().end(0, *item, /*failed=*/true);
    // As in run(): the device's health learns of it, and the stream is waited out, before the
    // item's futures end.
    report_failure(failure);
    express_.recover();
    item->fail(failure);
  }
}

void lane_worker::report_failure(const std::exception_ptr& failure) noexcept {
  // A fault that ends the device takes it out of service: this lane then takes nothing more.
  if (setup_.health != nullptr) setup_.health->report(setup_.device, failure);
}

void lane_worker::recover() noexcept {
  try {
    stream_->synchronize();
  } catch (...) {
    // The failure was already reported to the task that caused it; what matters here is only
    // that the stream holds no more work touching the slots.
  }
  staging_busy_ = {};
}

void* lane_worker::native_stream() const noexcept {
  return stream_ ? stream_->native_handle() : nullptr;
}

void lane_worker::synchronize() {
  stream_->synchronize();
  staging_busy_ = {};
}

bool lane_worker::stream_idle() noexcept {
  return stream_->idle();
}

void lane_worker::make_device_current() {
  setup_.owner->bind_thread(setup_.ordinal);
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

std::pair<void*, std::size_t> lane_worker::acquire_staging() {
  const std::size_t i = next_staging_;
  next_staging_ = 1 - i;
  if (staging_busy_[i]) {
    staging_done_[i]->wait();
    staging_busy_[i] = false;
  }
  return {buffers_.host(current_slot_, static_cast<int>(i)), i};
}

void lane_worker::upload_bytes(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  if (is_pinned(host_src)) {
    stream_->copy_to_device(device_dst, host_src, bytes);
    return;
  }
  const auto* src = static_cast<const char*>(host_src);
  auto* dst = static_cast<char*>(device_dst);
  // Each copy starts with the slot's first staging buffer (made with the slot), so only a copy
  // of several pieces ever takes the second.
  next_staging_ = 0;
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t n = std::min(setup_.chunk_bytes, bytes - done);
    const auto [staging, i] = acquire_staging();
    std::memcpy(staging, src + done, n);
    stream_->copy_to_device(dst + done, staging, n);
    staging_done_[i]->record();
    staging_busy_[i] = true;
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
  // Two pieces at a time: the device copies the next piece into one staging buffer while the
  // piece before is copied out of the other (the first piece into the first buffer, as above).
  next_staging_ = 0;
  struct piece {
    std::size_t at, n, i;
    void* staging;
  };
  std::optional<piece> before;
  for (std::size_t done = 0;;) {
    std::optional<piece> now;
    if (done < bytes) {
      const std::size_t n = std::min(setup_.chunk_bytes, bytes - done);
      const auto [staging, i] = acquire_staging();
      stream_->copy_to_host(staging, src + done, n);
      staging_done_[i]->record();
      staging_busy_[i] = true;
      now = piece{done, n, i, staging};
      done += n;
    }
    if (before) {
      staging_done_[before->i]->wait();
      staging_busy_[before->i] = false;
      std::memcpy(dst + before->at, before->staging, before->n);
    }
    if (!now) break;
    before = now;
  }
}

void lane_worker::apply_bytes(const builtin_kernel& k, dtype t, const void* x, const void* y,
                              void* out, std::size_t count) {
  if (count == 0) return;
  if (k.arity() == 2 && y == nullptr)
    throw std::invalid_argument(std::string("gpupool: kernel '") + k.name() +
                                "' needs a second input");
  stream_->launch(k, t, x, y, out, count);
}

namespace {

template <class K>
void run_user_kernel(backend& owner, int ordinal, backend_stream& stream, const K& k,
                     const std::vector<kernel_argument>& inputs, dtype out_type, void* out,
                     std::size_t count) {
  const prepared_call call = prepare_call(k, inputs, out_type, count);
  auto compiled = compile_for(owner, k, call, ordinal);
  if (count == 0) return;
  const std::vector<void*> args = call.launch_args(out);
  stream.launch_compiled(*compiled, args.data(), count);
}

}  // namespace

void lane_worker::run_bytes(const elementwise_kernel& k, const std::vector<kernel_argument>& inputs,
                            dtype out_type, void* out, std::size_t count) {
  run_user_kernel(*setup_.owner, setup_.ordinal, *stream_, k, inputs, out_type, out, count);
}

void lane_worker::run_bytes(const raw_kernel& k, const std::vector<kernel_argument>& inputs,
                            dtype out_type, void* out, std::size_t count) {
  run_user_kernel(*setup_.owner, setup_.ordinal, *stream_, k, inputs, out_type, out, count);
}

}  // namespace gpupool::detail
