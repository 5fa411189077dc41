#include "core/tracing/lane_tracer.hpp"

#include <algorithm>
#include <utility>

namespace gpupool::detail {

void lane_tracer::attach(backend_stream& stream, std::size_t slots) {
  stream_ = &stream;
  slots_.resize(slots);
}

void lane_tracer::detach() noexcept {
  slots_.clear();
  reference_.reset();
  probe_.reset();
  stream_ = nullptr;
}

void lane_tracer::calibrate_clock() {
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

void lane_tracer::begin(int slot, const work_item& item, bool lane_idle) noexcept {
  slot_trace& t = slots_[static_cast<std::size_t>(slot)];
  t.on = where_.tracing != nullptr && where_.tracing->load(std::memory_order_relaxed);
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
    t.record.device = where_.device;
    t.record.lane = where_.lane;
    t.record.priority = item.priority;
    t.record.express = where_.express;
    t.record.submitted = item.submitted_us;
    t.record.started = now_us();
    for (bool& m : t.marked) m = false;
  } catch (...) {
    t.on = false;  // a trace that cannot be taken must not cost the task
  }
}

bool lane_tracer::traced(int slot) const noexcept {
  return slots_[static_cast<std::size_t>(slot)].on;
}

backend_timer& lane_tracer::timer(int slot, mark m) {
  slot_trace& t = slots_[static_cast<std::size_t>(slot)];
  const auto i = static_cast<std::size_t>(m);
  if (!t.marks[i]) t.marks[i] = stream_->make_timer();
  t.marked[i] = true;
  return *t.marks[i];
}

void lane_tracer::stamp(int slot, mark m) {
  if (traced(slot)) timer(slot, m).record();
}

void lane_tracer::stage_in(int slot, double begin_us) noexcept {
  slot_trace& t = slots_[static_cast<std::size_t>(slot)];
  if (t.on) t.record.stage_in = {begin_us, now_us()};
}

void lane_tracer::stage_out(int slot, double begin_us) noexcept {
  slot_trace& t = slots_[static_cast<std::size_t>(slot)];
  if (t.on) t.record.stage_out = {begin_us, now_us()};
}

void lane_tracer::end(int slot, const work_item& item, bool failed) noexcept {
  slot_trace& t = slots_[static_cast<std::size_t>(slot)];
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
  if (where_.recorder == nullptr) return;
  const std::size_t tasks = item.carried_count();
  if (tasks == 1) {
    where_.recorder->add(std::move(r));
    return;
  }
  // A coalesced batch: every task that ran in it gets the batch's stage times under its own id,
  // submission time and bytes.
  for (std::size_t i = 0; i < tasks; ++i) {
    try {
      task_record one = r;
      if (item.carried(i, one.id, one.submitted, one.bytes_in, one.bytes_out))
        where_.recorder->add(std::move(one));
    } catch (...) {
      // Out of memory for a copy of the record: that task goes untraced, the rest do not.
    }
  }
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
