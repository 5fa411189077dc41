#include "core/lanes/lane_worker.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <string>
#include <utility>

#include "core/kernels/user_call.hpp"
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

lane_worker::lane_worker(const lane_setup& setup) : setup_(setup) {}

lane_worker::~lane_worker() {
  join();
}

std::future<void> lane_worker::start() {
  std::promise<void> ready;
  auto started = ready.get_future();
  // Lanes never take the process's asynchronous signals (Ctrl-C, termination, timers): the
  // kernel then hands them to the application's own threads, where a Python main thread sees
  // them at once. A thread inherits its creator's mask, so it is set around the creation only.
  sigset_t asynchronous, previous;
  sigemptyset(&asynchronous);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2, SIGCHLD, SIGWINCH})
    sigaddset(&asynchronous, s);
  pthread_sigmask(SIG_BLOCK, &asynchronous, &previous);
  try {
    thread_ = std::thread([this, ready = std::move(ready)]() mutable { run(std::move(ready)); });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
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
  traces_.resize(slots_.size());
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    slots_[k].done = stream_->make_event();
    // The first buffer of every slot is needed by any elementwise work: take it now, off the hot
    // path. The second is only for two-input kernels and comes on first use.
    slot_host(static_cast<int>(k), 0);
    slot_device(static_cast<int>(k), 0);
  }
  // Faults are injected into the lane's work, not into its start.
  if (setup_.faults != nullptr && setup_.faults->any()) {
    faults_.emplace(*setup_.faults, static_cast<std::uint64_t>(setup_.index));
    stream_ = with_faults(std::move(stream_), *faults_);
  }
}

void lane_worker::close() noexcept {
  if (!stream_) return;
  recover();
  for (auto& s : slots_) {
    for (void*& d : s.device) {
      if (d) deallocate_bytes(d, setup_.chunk_bytes);
      d = nullptr;
    }
    for (void*& h : s.host) {
      if (h) deallocate_pinned(h, setup_.chunk_bytes);
      h = nullptr;
    }
  }
  recover();
  slots_.clear();
  staging_done_.reset();
  stream_.reset();
}

namespace {
void*& buffer_at(std::vector<void*>& buffers, int i) {
  if (buffers.size() <= static_cast<std::size_t>(i))
    buffers.resize(static_cast<std::size_t>(i) + 1);
  return buffers[static_cast<std::size_t>(i)];
}
}  // namespace

void* lane_worker::slot_host(int slot, int i) {
  void*& p = buffer_at(slots_.at(static_cast<std::size_t>(slot)).host, i);
  if (p == nullptr) p = allocate_pinned(setup_.chunk_bytes);
  return p;
}

void* lane_worker::slot_device(int slot, int i) {
  void*& p = buffer_at(slots_.at(static_cast<std::size_t>(slot)).device, i);
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
        begin_trace(next_slot, *item, /*lane_idle=*/window.empty());
        try {
          if (faults_) faults_->maybe_fail(fault_kind::call);
          item->start(*this, next_slot);
          slots_[static_cast<std::size_t>(next_slot)].done->record();
          window.push_back({std::move(item), next_slot});
          next_slot = (next_slot + 1) % static_cast<int>(slots_.size());
        } catch (...) {
          end_trace(next_slot, *item, /*failed=*/true);
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
      GPUPOOL_NVTX_RANGE("gpupool: wait for the device");
      done.wait();
    } else if (!done.ready()) {
      return false;
    }
    oldest.item->finish(*this, oldest.slot);
    // Recorded before the result is handed over, so a trace taken once a future is ready
    // includes that task.
    end_trace(oldest.slot, *oldest.item, /*failed=*/false);
    oldest.item->complete();
  } catch (...) {
    end_trace(oldest.slot, *oldest.item, /*failed=*/true);
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

void lane_worker::calibrate_clock() {
  // A mark recorded on an idle stream completes between the host readings taken around it; the
  // narrowest of a few windows places it best (to within half that window, a few microseconds).
  // Two marks, swapped whenever the probe's window is the narrowest yet (a mark keeps its time
  // once the stream has passed it), so recalibrating allocates nothing.
  if (!reference_) reference_ = stream_->make_timer();
  if (!probe_) probe_ = stream_->make_timer();
  stream_->synchronize();
  double best_window = 1e300;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const double before = now_us();
    probe_->record();
    stream_->synchronize();
    const double after = now_us();
    if (after - before < best_window) {
      best_window = after - before;
      std::swap(reference_, probe_);
      reference_us_ = 0.5 * (before + after);
    }
  }
  calibrated_at_us_ = reference_us_;
}

void lane_worker::begin_trace(int slot, const work_item& item, bool lane_idle) noexcept {
  slot_trace& t = traces_[static_cast<std::size_t>(slot)];
  t.on = setup_.tracing != nullptr && setup_.tracing->load(std::memory_order_relaxed);
  if (!t.on) return;
  try {
    // GPU and host clocks drift apart slowly: line them up again now and then, when nothing is
    // in flight (so the synchronisation costs no overlap).
    constexpr double recalibrate_after_us = 1e6;
    if (!reference_ || (lane_idle && now_us() - calibrated_at_us_ > recalibrate_after_us))
      calibrate_clock();
    t.record = task_record{};
    t.record.id = item.trace_id;
    t.record.name = item.trace_name();
    t.record.device = setup_.device;
    t.record.lane = setup_.index;
    t.record.submitted = item.submitted_us;
    t.record.started = now_us();
    for (bool& m : t.marked) m = false;
  } catch (...) {
    t.on = false;  // a trace that cannot be taken must not cost the task
  }
}

bool lane_worker::traced(int slot) const noexcept {
  return traces_[static_cast<std::size_t>(slot)].on;
}

backend_timer& lane_worker::mark_timer(int slot, mark m) {
  slot_trace& t = traces_[static_cast<std::size_t>(slot)];
  const auto i = static_cast<std::size_t>(m);
  if (!t.marks[i]) t.marks[i] = stream_->make_timer();
  t.marked[i] = true;
  return *t.marks[i];
}

void lane_worker::trace_mark(int slot, mark m) {
  if (traced(slot)) mark_timer(slot, m).record();
}

void lane_worker::launch(int slot, const kernel& k, dtype t, const void* x, const void* y,
                         void* out, std::size_t count) {
  if (!traced(slot)) {
    stream_->launch(k, t, x, y, out, count);
    return;
  }
  stream_->launch_marked(k, t, x, y, out, count, mark_timer(slot, mark::kernel_begin),
                         mark_timer(slot, mark::kernel_end));
}

void lane_worker::trace_stage_in(int slot, double begin_us) {
  slot_trace& t = traces_[static_cast<std::size_t>(slot)];
  if (t.on) t.record.stage_in = {begin_us, now_us()};
}

void lane_worker::trace_stage_out(int slot, double begin_us) {
  slot_trace& t = traces_[static_cast<std::size_t>(slot)];
  if (t.on) t.record.stage_out = {begin_us, now_us()};
}

void lane_worker::end_trace(int slot, const work_item& item, bool failed) noexcept {
  slot_trace& t = traces_[static_cast<std::size_t>(slot)];
  if (!t.on) return;
  t.on = false;
  task_record& r = t.record;
  r.done = now_us();
  r.failed = failed;
  r.bytes_in = item.bytes_in();
  r.bytes_out = item.bytes_out();
  const bool all_marked = t.marked[0] && t.marked[1] && t.marked[2] && t.marked[3];
  if (all_marked && !failed) {
    try {
      double at[mark_count];
      for (std::size_t i = 0; i < mark_count; ++i)
        at[i] = reference_us_ + t.marks[i]->microseconds_since(*reference_);
      r.upload = {at[0], at[1]};
      r.kernel = {at[1], at[2]};
      r.download = {at[2], at[3]};
    } catch (...) {
      // A mark the device could not time: the record keeps its host-side times only.
    }
  } else if (!all_marked) {
    // Work with no stages of its own (submit): its whole run on the lane.
    r.kernel = {r.started, r.done};
  }
  if (setup_.recorder != nullptr) setup_.recorder->add(std::move(r));
}

void trace_recorder::add(task_record&& r) noexcept {
  std::lock_guard lock(mutex_);
  try {
    ring_.push_back(std::move(r));
  } catch (...) {
    ++dropped_;  // out of memory for the trace: drop the record rather than the task
    return;
  }
  trim_locked();
}

void trace_recorder::trim_locked() noexcept {
  while (ring_.size() > capacity_) {
    ring_.pop_front();
    ++dropped_;
  }
}

std::vector<task_record> trace_recorder::since(std::uint64_t first_id) const {
  std::vector<task_record> records;
  {
    std::lock_guard lock(mutex_);
    for (const auto& r : ring_)
      if (r.id >= first_id) records.push_back(r);
  }
  // Lanes finish in any order; the trace is in submission order.
  std::sort(records.begin(), records.end(),
            [](const task_record& a, const task_record& b) { return a.id < b.id; });
  return records;
}

std::size_t trace_recorder::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

std::size_t trace_recorder::capacity() const {
  std::lock_guard lock(mutex_);
  return capacity_;
}

void trace_recorder::set_capacity(std::size_t records) {
  std::lock_guard lock(mutex_);
  capacity_ = std::max<std::size_t>(records, 1);
  trim_locked();
  ring_.shrink_to_fit();
}

void trace_recorder::clear() {
  std::deque<task_record> gone;
  std::lock_guard lock(mutex_);
  gone.swap(ring_);  // a cleared deque may keep its blocks; a fresh one holds none
  dropped_ = 0;
}

}  // namespace gpupool::detail
