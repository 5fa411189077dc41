// The task queue: queueing work (push, push_all), waking lanes, and the lanes' taking and
// stealing it. Taking work out (close, retire, drain) is in task_queue_drain.cpp and the priority
// levels in task_queue_levels.cpp; the queue is described in task_queue.hpp.
#include "core/scheduling/task_queue.hpp"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace gpupool::detail {

task_queue::task_queue(int devices, std::chrono::microseconds spin, int usual_priority)
    : usual_level_(level_of(usual_priority)),
      count_(devices > 0 ? static_cast<std::size_t>(devices) : 0),
      spin_(std::max(spin, std::chrono::microseconds{0})),
      queues_(std::make_unique<device_queue[]>(count_)),
      live_(devices > 0 ? devices : 0) {
  if (devices < 1)
    throw std::invalid_argument("gpupool: a task queue needs at least one device, not " +
                                std::to_string(devices));
}

task_queue::~task_queue() = default;

task_queue::device_queue& task_queue::at(int device) const {
  if (device < 0 || static_cast<std::size_t>(device) >= count_)
    throw std::out_of_range("gpupool: the task queue has no device " + std::to_string(device));
  return queues_[static_cast<std::size_t>(device)];
}

bool task_queue::append_locked(std::deque<work_item_ptr>& deque, work_item_ptr& item,
                               bool may_absorb) {
  // An item that reports success but keeps `next` would be lost if trusted: what decides is
  // whether the item was taken over.
  if (may_absorb && !deque.empty()) static_cast<void>(deque.back()->absorb(item));
  if (!item) return false;
  deque.push_back(std::move(item));
  return true;
}

void task_queue::refresh_idle_locked(device_queue& q) {
  const int now = q.sleeping - q.signalled;
  const int before = q.idle.exchange(now);
  // Sequentially consistent: a lane that goes idle and then looks for shared items, and a
  // producer that queues one and then looks for idle lanes, cannot both miss the other.
  if (now != before) idle_total_.fetch_add(now - before);
}

std::size_t task_queue::spinning_claim_locked(const device_queue& q, std::size_t items) {
  return std::min(items, static_cast<std::size_t>(std::max(0, q.spinning.load())));
}

std::pair<int, bool> task_queue::signal_locked(device_queue& q, std::size_t items, wake_rule rule) {
  const int free = q.sleeping - q.signalled;
  int n = 0;
  if (rule == wake_rule::every_item) {
    const std::size_t unclaimed = items - spinning_claim_locked(q, items);
    n = static_cast<int>(std::min<std::size_t>(unclaimed, static_cast<std::size_t>(free)));
  } else if (items > 0 && free > 0 && q.signalled + q.dispatched + q.spinning.load() == 0) {
    n = 1;  // a lane woken earlier that has not yet looked (or one spinning) will take it and
            // pass the rest on
  }
  if (n == 0) return {0, false};
  q.signalled += n;
  refresh_idle_locked(q);
  return {n, q.signalled == q.sleeping};
}

void task_queue::notify(device_queue& q, std::pair<int, bool> woken) {
  if (woken.first == 0) return;
  if (woken.second) {
    q.wake.notify_all();  // every sleeping lane of q was signalled
    return;
  }
  for (int i = 0; i < woken.first; ++i) q.wake.notify_one();
}

void task_queue::wake_idle(std::size_t items, std::size_t first, wake_rule rule) {
  for (std::size_t i = 0; i < count_ && items > 0; ++i) {
    if (idle_total_.load() == 0) return;
    device_queue& q = queues_[(first + i) % count_];
    if (q.idle.load() == 0 || q.retired.load()) continue;
    std::pair<int, bool> woken;
    {
      std::lock_guard lock(q.mutex);
      if (q.retired.load()) continue;  // retired since the look above: its lanes are leaving
      woken = signal_locked(q, items, rule);
    }
    notify(q, woken);
    // One lane on its way is enough: it takes the item wherever it is and wakes the next.
    // (If that device had one on its way already, nobody was woken: look further.)
    if (rule == wake_rule::one_in_transit && woken.first > 0) return;
    items -= static_cast<std::size_t>(woken.first);
  }
}

std::size_t task_queue::shared_target() {
  if (count_ == 1) return queues_[0].retired.load() ? count_ : 0;
  // Each producing thread deals its items out in turn, from a start of its own, so that
  // producers do not all begin at device 0 (and share no counter).
  thread_local std::size_t turn = std::hash<std::thread::id>{}(std::this_thread::get_id());
  if (idle_total_.load() > 0) {
    for (std::size_t i = 0; i < count_; ++i) {
      const std::size_t d = (turn + i) % count_;
      if (queues_[d].idle.load() > 0 && !queues_[d].retired.load()) {
        turn = d + 1;
        return d;
      }
    }
  }
  for (std::size_t i = 0; i < count_; ++i) {
    const std::size_t d = turn++ % count_;
    if (!queues_[d].retired.load()) return d;
  }
  return count_;
}

bool task_queue::push(work_item_ptr item, std::optional<int> device) {
  if (!item) throw std::invalid_argument("gpupool: a null work item cannot be queued");
  return push_one(item, device);
}

bool task_queue::offer(work_item_ptr& item, std::optional<int> device) {
  if (!item) throw std::invalid_argument("gpupool: a null work item cannot be queued");
  return push_one(item, device);
}

bool task_queue::push_one(work_item_ptr& item, std::optional<int> device) {
  const bool pinned = device.has_value();
  if (pinned) (void)at(*device);  // throws for an unknown device
  const std::size_t level = level_of(item->priority);
  std::size_t target = 0;
  std::pair<int, bool> woken;
  bool every_lane_busy = false;
  for (bool queued = false; !queued;) {
    target = pinned ? static_cast<std::size_t>(*device) : shared_target();
    if (target >= count_) return false;  // no device in service
    device_queue& q = queues_[target];
    std::lock_guard lock(q.mutex);
    if (closed_.load()) return false;
    if (q.retired.load()) {
      if (pinned) return false;
      continue;  // taken out of service since it was chosen: choose again
    }
    // Coalescing only while every lane of the device is busy: an idle one takes the item now.
    const bool may_absorb = q.sleeping - q.signalled == 0 && q.spinning.load() == 0;
    if (!append_locked(pinned ? q.pinned[level] : q.shared[level], item, may_absorb))
      return true;  // absorbed
    note_queued_locked(q, pinned, level, 1);
    (pinned ? q.pinned_count : q.shared_count).fetch_add(1);
    woken = signal_locked(q, 1, wake_rule::one_in_transit);
    every_lane_busy = q.sleeping == 0 && q.spinning.load() == 0;
    queued = true;
  }
  notify(queues_[target], woken);
  // No lane of that device waits: a waiting lane of another device may steal an unpinned item.
  if (!pinned && every_lane_busy) wake_idle(1, target + 1, wake_rule::one_in_transit);
  return true;
}

bool task_queue::push_all_one_level(std::vector<work_item_ptr>& items, std::optional<int> device) {
  const std::size_t level = items.empty() ? usual_level_ : level_of(items.front()->priority);
  // One item (map queues each input's pieces on their own) is queued as push does, waking a
  // lane only if none is on its way.
  if (items.size() == 1) {
    if (!push_one(items.front(), device)) return false;
    items.clear();
    return true;
  }
  if (device) {
    device_queue& q = at(*device);
    std::pair<int, bool> woken;
    {
      std::lock_guard lock(q.mutex);
      if (closed_.load() || q.retired.load()) return false;
      make_room_locked(q.pinned[level], items.size());  // may throw: nothing queued yet
      const std::size_t queued = append_run_locked(q, q.pinned[level], items, 0, items.size());
      note_queued_locked(q, /*pinned=*/true, level, queued);
      q.pinned_count.fetch_add(queued);
      woken = signal_locked(q, queued, wake_rule::every_item);
    }
    items.clear();
    notify(q, woken);
    return true;
  }

  // Items for any device: cut into consecutive runs, one per device in service (fewer if there
  // are fewer items), so each device works through its run in order and runs stay coalescible.
  // Every target's lock is held at once so that the batch is queued whole or not at all.
  const std::size_t n = items.size();
  if (n == 0) return !closed_.load();
  for (;;) {
    const std::size_t first = shared_target();
    if (first >= count_) return false;  // no device in service
    std::vector<std::size_t> targets;   // in service, from `first` on
    std::vector<char> is_target(count_, 0);
    targets.reserve(count_);
    for (std::size_t i = 0; i < count_ && targets.size() < n; ++i) {
      const std::size_t d = (first + i) % count_;
      if (queues_[d].retired.load()) continue;
      targets.push_back(d);
      is_target[d] = 1;
    }
    const std::size_t runs = targets.size();
    std::vector<std::pair<int, bool>> woken(runs);
    std::size_t unserved = 0;  // items queued for which the target device had no idle lane
    {
      ordered_locks locks(runs);
      for (std::size_t d = 0; d < count_; ++d)
        if (is_target[d] != 0) locks.lock(queues_[d]);
      if (closed_.load()) return false;
      if (std::any_of(targets.begin(), targets.end(),
                      [&](std::size_t d) { return queues_[d].retired.load(); }))
        continue;  // one was taken out of service meanwhile: choose again
      // Room in every target first (may throw: then none of the batch is queued, the room made
      // in earlier targets taken off again), then the runs, which cannot fail.
      for (std::size_t r = 0; r < runs; ++r) {
        try {
          make_room_locked(queues_[targets[r]].shared[level], n * (r + 1) / runs - n * r / runs);
        } catch (...) {
          for (std::size_t earlier = 0; earlier < r; ++earlier) {
            std::deque<work_item_ptr>& shared = queues_[targets[earlier]].shared[level];
            for (std::size_t e = n * earlier / runs; e < n * (earlier + 1) / runs; ++e)
              shared.pop_back();
          }
          throw;
        }
      }
      for (std::size_t r = 0; r < runs; ++r) {
        device_queue& q = queues_[targets[r]];
        const std::size_t queued =
            append_run_locked(q, q.shared[level], items, n * r / runs, n * (r + 1) / runs);
        note_queued_locked(q, /*pinned=*/false, level, queued);
        q.shared_count.fetch_add(queued);
        woken[r] = signal_locked(q, queued, wake_rule::every_item);
        // Served: those a woken lane takes, and those the device's spinning lanes take.
        unserved +=
            queued - static_cast<std::size_t>(woken[r].first) - spinning_claim_locked(q, queued);
      }
    }
    items.clear();
    for (std::size_t r = 0; r < runs; ++r) notify(queues_[targets[r]], woken[r]);
    if (unserved > 0) wake_idle(unserved, first, wake_rule::every_item);
    return true;
  }
}

void task_queue::make_room_locked(std::deque<work_item_ptr>& deque, std::size_t n) {
  const std::size_t before = deque.size();
  try {
    for (std::size_t i = 0; i < n; ++i) deque.emplace_back();
  } catch (...) {
    while (deque.size() > before) deque.pop_back();
    throw;
  }
}

std::size_t task_queue::append_run_locked(device_queue& q, std::deque<work_item_ptr>& deque,
                                          std::vector<work_item_ptr>& items, std::size_t begin,
                                          std::size_t end) noexcept {
  // While lanes of the device wait, the run is cut into about one entry per waiting lane, so
  // that they all start at once (each entry may still coalesce the items it carries); with
  // every lane busy, items coalesce as far as the items themselves allow.
  const auto idle =
      static_cast<std::size_t>(std::max(0, q.sleeping - q.signalled + q.spinning.load()));
  const std::size_t per_entry = idle == 0 ? end - begin : (end - begin + idle - 1) / idle;
  std::size_t in_back = per_entry;  // items the last entry carries: the run opens a new entry
  std::size_t filled = deque.size() - (end - begin);  // the first empty entry (make_room_locked)
  std::size_t queued = 0;
  for (std::size_t i = begin; i < end; ++i) {
    work_item_ptr& item = items[i];
    // As append_locked does, with the last filled entry as the back: an item that reports
    // success but keeps `next` would be lost if trusted.
    if ((idle == 0 || in_back < per_entry) && filled > 0)
      static_cast<void>(deque[filled - 1]->absorb(item));
    if (item) {
      deque[filled++] = std::move(item);
      ++queued;
      in_back = 1;
    } else {
      ++in_back;
    }
  }
  while (deque.size() > filled) deque.pop_back();  // the entries coalescing left empty
  return queued;
}

std::pair<int, bool> task_queue::pass_on_locked(device_queue& q) {
  return signal_locked(q, q.pinned_count.load() + q.shared_count.load(), wake_rule::one_in_transit);
}

bool task_queue::any_shared() const {
  for (std::size_t d = 0; d < count_; ++d)
    if (queues_[d].shared_count.load() != 0) return true;
  return false;
}

void task_queue::hand_on_steal(int device) {
  // A lane woken to steal may find an item of its own device queued meanwhile and take that
  // instead (a single push saw it on its way and woke nobody): the items it was woken for would
  // wait for a busy device. Wake another idle lane for them, this device's first.
  if (count_ == 1) return;
  for (std::size_t i = 1; i < count_; ++i)
    if (queues_[(static_cast<std::size_t>(device) + i) % count_].shared_count.load() != 0) {
      wake_idle(1, static_cast<std::size_t>(device), wake_rule::one_in_transit);
      return;
    }
}

void task_queue::hand_on_own(int device) {
  if (queues_[static_cast<std::size_t>(device)].shared_count.load() != 0)
    wake_idle(1, static_cast<std::size_t>(device), wake_rule::one_in_transit);
}

work_item_ptr task_queue::steal(int device) {
  const auto own = static_cast<std::size_t>(device);
  if (queues_[own].retired.load()) return nullptr;  // a lane of a faulted device runs nothing
  // With work of several priorities queued, a device holding the highest goes first; if that
  // was taken meanwhile, any device's (a second pass, so that a steal never misses work there).
  int best = off_default_.load() != 0 ? best_elsewhere(device) : -1;
  for (bool filtered = best >= 0;; filtered = false, best = -1) {
    for (std::size_t i = 1; i < count_; ++i) {
      device_queue& q = queues_[(own + i) % count_];
      if (q.shared_count.load() == 0 || q.retired.load()) continue;
      if (best >= 0 &&
          (q.shared_levels.load(std::memory_order_acquire) >> static_cast<unsigned>(best)) == 0)
        continue;
      work_item_ptr item;
      bool more = false;
      {
        std::lock_guard lock(q.mutex);
        item = take_shared_locked(q);
        if (!item) continue;
        more = q.shared_count.load() > 0;
      }
      // More left where this one came from: pass the wake-up on to an idle lane, this device's
      // first.
      if (more) wake_idle(1, own, wake_rule::one_in_transit);
      return item;
    }
    if (!filtered) return nullptr;
  }
}

bool task_queue::worth_a_look(const device_queue& q) const {
  return q.pinned_count.load() + q.shared_count.load() != 0 || q.retired.load() || closed_.load() ||
         (count_ > 1 && any_shared());
}

bool task_queue::wait_for_work(int device, bool& woken_for_item) {
  device_queue& q = queues_[static_cast<std::size_t>(device)];
  std::unique_lock lock(q.mutex);
  if (q.retired.load()) return false;  // out of service: its lanes take nothing more
  if (q.pinned_count.load() + q.shared_count.load() != 0) return true;
  // Closed: a lane leaves once nothing it may run is left (other devices' shared items it helps
  // with; their pinned ones are theirs).
  if (closed_.load()) return any_shared();
  if (spin_.count() > 0) {
    // A caller that waits for each result before it submits the next finds this lane still
    // looking, not asleep: waking a sleeping thread costs tens of microseconds on an idle
    // machine, more than the task. Counted under the lock, so that a push either sees this lane
    // spinning (and wakes nobody: the lane sees the item) or comes after it went to sleep.
    q.spinning.fetch_add(1);
    lock.unlock();
    const auto deadline = std::chrono::steady_clock::now() + spin_;
    while (!worth_a_look(q) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();  // a machine with more lanes than cores runs the others
    lock.lock();
    q.spinning.fetch_sub(1);
    if (q.retired.load()) return false;
    if (q.pinned_count.load() + q.shared_count.load() != 0) {
      // Still on its way to an item a push saw it spinning for (and so woke nobody): counted as
      // a woken lane until pop looks under the lock, so that a cancelling drain spares that item
      // and the lane, once it takes an item of its own, hands a wake-up on to the shared items
      // another device holds (which a push may have left to it, too).
      ++q.dispatched;
      woken_for_item = true;
      return true;
    }
    if (closed_.load()) return any_shared();
  }
  ++q.sleeping;
  refresh_idle_locked(q);
  // Items for any device queued elsewhere before this lane counted as idle: their producers may
  // not have seen it, so look again before sleeping.
  if (any_shared()) {
    --q.sleeping;
    refresh_idle_locked(q);
    return true;
  }
  q.wake.wait(lock);
  wakeups_.fetch_add(1, std::memory_order_relaxed);
  --q.sleeping;
  if (q.signalled > 0) {  // woken for an item (or by close; then it is moot)
    --q.signalled;
    ++q.dispatched;
    woken_for_item = true;
  }
  refresh_idle_locked(q);
  return true;
}

work_item_ptr task_queue::pop(int device, bool block) {
  device_queue& q = at(device);
  bool woken_for_item = false;
  for (;;) {
    if (q.retired.load()) {
      leave_retired(device, woken_for_item);
      return nullptr;
    }
    // Empty by the lock-free counts: skip the lock (a blocking pop looks again under it), unless
    // this lane was dispatched to an item and must say that it has looked.
    if (woken_for_item || q.pinned_count.load() + q.shared_count.load() != 0) {
      work_item_ptr item;
      std::pair<int, bool> woken;
      const bool was_dispatched = std::exchange(woken_for_item, false);
      bool steal_first = false;
      {
        std::lock_guard lock(q.mutex);
        steal_first = higher_elsewhere_locked(q, device);
        if (!steal_first) item = take_own_locked(q);
        if (was_dispatched) --q.dispatched;
        woken = pass_on_locked(q);
      }
      notify(q, woken);
      if (item) {
        if (was_dispatched) hand_on_steal(device);
        return item;
      }
      if (steal_first) {
        if (auto stolen = steal(device)) {
          if (was_dispatched) hand_on_own(device);
          return stolen;
        }
        continue;  // taken meanwhile: look again (this device's own items are still there)
      }
    }
    if (auto item = steal(device)) return item;
    if (!block || !wait_for_work(device, woken_for_item)) return nullptr;
  }
}

std::size_t task_queue::pop_some(int device, std::size_t most, std::vector<work_item_ptr>& out,
                                 bool block) {
  if (most == 0) return 0;
  device_queue& q = at(device);
  bool woken_for_item = false;
  for (;;) {
    if (q.retired.load()) {
      leave_retired(device, woken_for_item);
      return 0;
    }
    if (woken_for_item || q.pinned_count.load() + q.shared_count.load() != 0) {
      std::size_t take = 0;
      bool steal_first = false;
      std::pair<int, bool> woken;
      const bool was_dispatched = std::exchange(woken_for_item, false);
      {
        std::lock_guard lock(q.mutex);
        const std::size_t queued = q.pinned_count.load() + q.shared_count.load();
        // Left for the lanes on their way here (signalled, or up and not yet looked), this one
        // excepted.
        const auto reserved =
            static_cast<std::size_t>(q.signalled + q.dispatched - (was_dispatched ? 1 : 0));
        // This lane has looked, whatever follows (reserve may throw).
        if (was_dispatched) --q.dispatched;
        take = std::min(most,
                        queued > reserved ? queued - reserved : std::min<std::size_t>(queued, 1));
        steal_first = higher_elsewhere_locked(q, device);
        if (steal_first) take = 0;       // a higher priority elsewhere: steal that first (below)
        out.reserve(out.size() + take);  // may throw: before anything is taken
        for (std::size_t i = 0; i < take; ++i) out.push_back(take_own_locked(q));
        woken = pass_on_locked(q);
      }
      notify(q, woken);
      if (take > 0) {
        if (was_dispatched) hand_on_steal(device);
        return take;
      }
      if (steal_first) {
        if (auto item = steal(device)) {
          out.push_back(std::move(item));
          if (was_dispatched) hand_on_own(device);
          return 1;
        }
        continue;  // taken meanwhile: look again (this device's own items are still there)
      }
    }
    if (auto item = steal(device)) {
      out.push_back(std::move(item));  // cannot throw: steal leaves out as it is on failure
      return 1;
    }
    if (!block || !wait_for_work(device, woken_for_item)) return 0;
  }
}

void task_queue::leave_retired(int device, bool& woken_for_item) {
  if (!std::exchange(woken_for_item, false)) return;
  device_queue& q = queues_[static_cast<std::size_t>(device)];
  {
    std::lock_guard lock(q.mutex);
    --q.dispatched;  // it looked: nothing is there for it any more
  }
  // It may have been woken to steal another device's item: pass that on to a lane that can.
  if (any_shared()) wake_idle(1, static_cast<std::size_t>(device) + 1, wake_rule::one_in_transit);
}

std::size_t task_queue::size() const {
  std::size_t n = 0;
  for (std::size_t d = 0; d < count_; ++d)
    n += queues_[d].pinned_count.load() + queues_[d].shared_count.load();
  return n;
}

bool task_queue::closed() const {
  return closed_.load();
}

int task_queue::idle_lanes(int device) const {
  return at(device).idle.load();
}

int task_queue::spinning_lanes(int device) const {
  return at(device).spinning.load();
}

}  // namespace gpupool::detail
