// The executor's queue: one small queue per device, each behind its own lock. Items for any
// device are spread over the devices' queues and stolen by lanes of a device that runs dry;
// items pinned to a device stay in that device's queue. A lane that finds nothing keeps looking
// for a short while (the spin) before it sleeps; sleeping lanes are woken per device, one per
// queued item, only where an item can run and no spinning lane will take it. A device taken out
// of service (retire) queues nothing more and its lanes leave.
//
// Priorities: each FIFO is one per priority level (work_item::priority). A lane takes the highest
// priority it can run first (stealing a higher-priority item from another device rather than
// taking a lower one of its own), first come first served within a priority (a device's pinned
// items before its shared ones, as without priorities). Aging bounds starvation: while a device
// holds items of more than one priority, every take by its lanes that is not of its oldest item
// counts, and after `aging_takes` such takes in a row its next take is its oldest item.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "core/scheduling/work_item.hpp"
#include "gpupool/options.hpp"

namespace gpupool::detail {

class task_queue {
 public:
  /// The priority levels: one FIFO each per device (pinned and shared).
  static constexpr std::size_t levels =
      static_cast<std::size_t>(limits::highest_priority - limits::lowest_priority + 1);
  /// Takes of a device's lanes in a row that may pass over its oldest item while it holds items
  /// of more than one priority; the next one takes the oldest. So low-priority work gets at
  /// least one take in aging_takes + 1 under a steady stream of higher-priority work, and a
  /// high-priority item waits behind at most one aged take per lane.
  static constexpr unsigned aging_takes = limits::priority_aging_takes;

  /// A queue for `devices` devices (at least 1). A lane that finds nothing to take keeps looking
  /// for `spin` before it sleeps (see lane_spin.hpp); zero: it sleeps at once. Items of
  /// `usual_priority` (the executor's default) are the common case that costs nothing extra.
  explicit task_queue(int devices, std::chrono::microseconds spin = std::chrono::microseconds{0},
                      int usual_priority = 0);
  task_queue(const task_queue&) = delete;
  task_queue& operator=(const task_queue&) = delete;
  ~task_queue();

  /// Queues `item` (at its `priority`'s level) for any device, or for `device` alone. False if the
  /// queue is closed, or if no device that may run it is in service (see `retire`). An item the
  /// last queued item of the same device queue absorbs (`work_item::absorb`) is not queued on its
  /// own and not counted by `size()`.
  /// @throw std::out_of_range for a device this queue does not have.
  bool push(work_item_ptr item, std::optional<int> device);
  /// Like `push`, but an item that is not queued stays with the caller (false), who must end it.
  bool offer(work_item_ptr& item, std::optional<int> device);
  /// Queues several items at once, for any device or for `device` alone, taking each device's
  /// lock once and waking at most one waiting lane per item (a single item is queued as `push`
  /// queues it). False (nothing queued, `items` left as they were) if closed or if no device
  /// that may run them is in service; otherwise `items` is left empty. If the queue cannot grow
  /// (std::bad_alloc), nothing is queued either and `items` is left as it was. Items of
  /// different priorities are queued one priority at a time, highest first; if one priority's
  /// items cannot be queued, `items` is left holding just the items not queued: that priority's
  /// first, then the lower priorities' items in the order they were given.
  /// @throw std::invalid_argument for a null item or a priority outside limits.
  bool push_all(std::vector<work_item_ptr>& items, std::optional<int> device = std::nullopt);

  /// Takes the next item for a lane of `device`: of the highest priority queued that it may run
  /// (aging aside, see aging_takes); within it, that device's pinned items first, then the
  /// items for any device queued at that device, then such items stolen from other devices
  /// (never their pinned items). With `block`, waits for one; returns null only once the queue
  /// is closed and holds nothing `device` may run. Without `block`, returns null at once when
  /// nothing is there.
  work_item_ptr pop(int device, bool block);
  /// Like `pop`, but takes up to `most` items (at least 1 when it returns any) in order, appended
  /// to `out`; returns how many. It leaves queued the items other lanes were woken for, so a
  /// batch never takes the work of a lane that is waking up for it.
  std::size_t pop_some(int device, std::size_t most, std::vector<work_item_ptr>& out, bool block);

  /// Stops accepting work and wakes every waiting lane.
  void close();
  /// What a device held when it was taken out of service.
  struct retired_items {
    std::vector<work_item_ptr> pinned;  // only that device could run these
    std::vector<work_item_ptr> shared;  // for any device: queue them again elsewhere
  };
  /// Takes `device` out of service: nothing is queued for it from now on, its lanes' pops return
  /// nothing (so they leave once their work in flight ends), and what it held is returned, in
  /// order. Null if it was out of service already.
  std::unique_ptr<retired_items> retire(int device);
  /// Whether `device` was taken out of service.
  [[nodiscard]] bool retired(int device) const;
  /// Devices still in service.
  [[nodiscard]] int live_devices() const noexcept { return live_.load(); }
  /// Removes and returns everything still queued, each with the device it was queued for
  /// (nullopt: any device). Pinned items come first, by device; the others in submission order
  /// (`work_item::trace_id`).
  /// With `spare_woken`, each device keeps the items that lanes already woken for them will take
  /// (its first ones, as many as lanes are on their way): those count as taken, so that work a
  /// lane was dispatched to is not cancelled in the moment before the lane reaches it.
  std::vector<std::pair<work_item_ptr, std::optional<int>>> drain(bool spare_woken = false);
  /// Whether an item of a higher priority than `priority` is queued that a lane of `device` may
  /// take (its own items, or shared items of another device in service).
  [[nodiscard]] bool waits_above(int device, int priority) const;
  /// Items queued and not taken. Exact when no push or pop runs at the same time.
  [[nodiscard]] std::size_t size() const;
  [[nodiscard]] bool closed() const;
  [[nodiscard]] int devices() const noexcept { return static_cast<int>(count_); }
  /// Lanes of `device` blocked in `pop` now with no item on its way to them (for tests).
  [[nodiscard]] int idle_lanes(int device) const;
  /// Lanes of `device` in `pop` looking for work before they sleep (for tests).
  [[nodiscard]] int spinning_lanes(int device) const;
  /// How many times a lane blocked in `pop` was woken so far (for tests and diagnostics).
  [[nodiscard]] std::size_t wakeups() const noexcept {
    return wakeups_.load(std::memory_order_relaxed);
  }

 private:
  // One per device, on its own cache lines so that devices never share one.
  struct alignas(64) device_queue {
    std::mutex mutex;
    std::condition_variable wake;
    // One FIFO per priority level (index: priority - limits::lowest_priority).
    std::array<std::deque<work_item_ptr>, levels> pinned;  // only this device's lanes take these
    std::array<std::deque<work_item_ptr>, levels> shared;  // any lane; this device's first
    // Bit L set when pinned[L] (shared[L]) holds an item (under `mutex`); `shared_mask` is also
    // published in `shared_levels` for thieves choosing where to steal without the lock.
    unsigned pinned_mask = 0;
    unsigned shared_mask = 0;
    std::atomic<unsigned> shared_levels{0};
    // Takes by this device's lanes in a row that were not of its oldest item while it held items
    // of more than one priority (under `mutex`; see aging_takes).
    unsigned passed = 0;
    // The deques' sizes, readable without the lock: by thieves looking for work, by size(), and
    // by a lane checking for work before it sleeps.
    std::atomic<std::size_t> pinned_count{0};
    std::atomic<std::size_t> shared_count{0};
    int sleeping = 0;  // lanes blocked on `wake` (under `mutex`)
    // Lanes that found nothing and look again before they sleep (changed under `mutex`; read
    // without it by spinning_lanes): each takes the next item it sees, so an item pushed while
    // one spins wakes nobody.
    std::atomic<int> spinning{0};
    int signalled = 0;  // of those, lanes an item woke that have not yet run (under `mutex`)
    // Lanes an item woke that are up and have not yet looked for it under the lock, and lanes
    // that saw an item as their spin ended (under `mutex`): with `signalled` and `spinning`, the
    // work a cancelling shutdown leaves to them.
    int dispatched = 0;
    std::atomic<int> idle{0};  // sleeping - signalled, readable without the lock
    // Out of service (set under `mutex`, never cleared): nothing is queued here any more, and
    // this device's lanes take nothing.
    std::atomic<bool> retired{false};
  };

  // Locks device queues' mutexes in index order (every path that holds more than one lock takes
  // them so, and no other holds two at once) and unlocks them on scope exit.
  class ordered_locks {
   public:
    explicit ordered_locks(std::size_t most) { held_.reserve(most); }  // may throw: before locking
    ordered_locks(const ordered_locks&) = delete;
    ordered_locks& operator=(const ordered_locks&) = delete;
    ~ordered_locks() {
      for (auto it = held_.rbegin(); it != held_.rend(); ++it) (*it)->mutex.unlock();
    }
    void lock(device_queue& q) {
      q.mutex.lock();
      held_.push_back(&q);  // within the reserved capacity: cannot throw
    }

   private:
    std::vector<device_queue*> held_;
  };

  device_queue& at(int device) const;
  // push, leaving `item` with the caller if the queue is closed.
  bool push_one(work_item_ptr& item, std::optional<int> device);
  // Under q's lock: the next item for one of q's lanes (highest priority, pinned before shared,
  // aging applied), null if q holds none.
  work_item_ptr take_own_locked(device_queue& q);
  // Under q's lock: the first item of q's highest shared level, for a thief; null if none.
  work_item_ptr take_shared_locked(device_queue& q);
  // Under q's lock: takes the front of q's pinned or shared FIFO of `level`, keeping the counts
  // and level masks.
  work_item_ptr take_front_locked(device_queue& q, bool pinned, std::size_t level);
  // Under q's lock, after items were queued in q's pinned or shared FIFO of `level`.
  void note_queued_locked(device_queue& q, bool pinned, std::size_t level, std::size_t n);
  // The level of priority `priority` (checked: std::invalid_argument outside limits).
  static std::size_t level_of(int priority);
  // Under q's lock: appends `item` to `deque`, or lets its last item absorb it. True if queued.
  // `may_absorb` false: queued as an entry of its own.
  static bool append_locked(std::deque<work_item_ptr>& deque, work_item_ptr& item,
                            bool may_absorb = true);
  // push_all for items of one priority.
  bool push_all_one_level(std::vector<work_item_ptr>& items, std::optional<int> device);
  // Under q's lock (q: `device`'s queue): whether a lane of `device` should steal a higher
  // priority from another device before taking from q (counting that as passing over q's
  // items for aging).
  bool higher_elsewhere_locked(device_queue& q, int device);
  // The highest level of shared items another device than `device` holds (by the lock-free
  // masks), or -1.
  [[nodiscard]] int best_elsewhere(int device) const;
  // Under the deque's lock: adds `n` empty entries at its back, or throws (the deque could not
  // grow) having added none. The one step of queueing a run that can fail, taken before any of
  // the run is queued.
  static void make_room_locked(std::deque<work_item_ptr>& deque, std::size_t n);
  // Under q's lock, after make_room_locked(deque, end - begin): moves items[begin, end) into the
  // empty entries at the back of `deque` (coalescing them into about one entry per idle lane of
  // q, or freely when none is idle) and takes the entries left empty off again. Returns the
  // entries queued.
  static std::size_t append_run_locked(device_queue& q, std::deque<work_item_ptr>& deque,
                                       std::vector<work_item_ptr>& items, std::size_t begin,
                                       std::size_t end) noexcept;
  // Takes a shared item from another device than `device`, of the highest priority there is;
  // null if none.
  work_item_ptr steal(int device);
  // After a lane woken for an item took one of its own device: if other devices hold shared
  // items, an idle lane is woken to steal them (see the definition).
  void hand_on_steal(int device);
  // A lane dispatched to `device`'s items that stole a higher priority elsewhere instead: the
  // items it was woken for would wait for a busy lane. Wake an idle lane for them.
  void hand_on_own(int device);
  // True if any device holds a shared item.
  [[nodiscard]] bool any_shared() const;
  // Under q's lock: how many of `items` new items q's spinning lanes take (each takes one without
  // being woken).
  static std::size_t spinning_claim_locked(const device_queue& q, std::size_t items);
  // How many waiting lanes a wake-up pass wakes for `items` new items.
  enum class wake_rule {
    // One, and only if no lane of that device is already on its way (signalled, or up and not yet
    // looked under the lock): that lane, once it takes an item and sees more, wakes the next
    // (pass_on_locked). Single pushes use it, so that a producer pays for at most one wake-up while
    // lanes are waking, and lanes that would find
    // nothing are not woken.
    one_in_transit,
    // One per item, as many as wait: a batch known at once (push_all).
    every_item,
  };
  // Under q's lock: marks idle lanes of q as woken for `items` items by `rule`; returns how
  // many, and whether they are all of q's sleeping lanes (then one notify_all wakes them).
  std::pair<int, bool> signal_locked(device_queue& q, std::size_t items, wake_rule rule);
  // Under q's lock, after a lane took from q: items are left, so wake the next lane if none is
  // on its way.
  std::pair<int, bool> pass_on_locked(device_queue& q);
  static void notify(device_queue& q, std::pair<int, bool> woken);
  // Wakes idle lanes of any device (they steal) for `items` items by `rule`, starting at device
  // `first`.
  void wake_idle(std::size_t items, std::size_t first, wake_rule rule);
  // Under q's lock, after `sleeping` or `signalled` changed: q's idle count and the total.
  void refresh_idle_locked(device_queue& q);
  // Where the next items for any device go: a device in service with idle (sleeping) lanes if
  // there is one, else the next in service in turn (count_ if none is in service). Spinning lanes
  // do not draw items to their device: a device whose lanes keep finishing work always has one
  // spinning, and would draw every item while other devices' lanes slept.
  std::size_t shared_target();
  // Whether a lane of `q`'s device has something to look at: an item of its own, a shared item
  // elsewhere to steal, or the queue closed or its device retired. Lock-free.
  [[nodiscard]] bool worth_a_look(const device_queue& q) const;
  // The blocking part of pop/pop_some: waits until something may be there. False once closed
  // and nothing is left that `device` may run. Spins first (see `spin_`), then sleeps.
  // `woken_for_item` is set when an item's signal woke the lane (it then counts as dispatched
  // until its next look under the lock: see device_queue::dispatched).
  bool wait_for_work(int device, bool& woken_for_item);
  // A lane of the out-of-service `device` leaves: if an item's signal woke it, it no longer
  // counts as on its way, and the wake-up goes to a lane of another device.
  void leave_retired(int device, bool& woken_for_item);

  std::size_t usual_level_;  // the level of the executor's default priority
  std::size_t count_;
  std::chrono::microseconds spin_;
  std::unique_ptr<device_queue[]> queues_;
  alignas(64) std::atomic<int> idle_total_{0};  // the sum of every device's `idle`
  std::atomic<bool> closed_{false};
  std::atomic<int> live_;  // devices in service
  std::atomic<std::size_t> wakeups_{0};
  // Items queued at a level other than the usual priority's, on every device (counted only with
  // more than one device, the only case that reads it): while none is, lanes take and steal as
  // without priorities, without looking at the levels of other devices.
  alignas(64) std::atomic<std::size_t> off_default_{0};
};

}  // namespace gpupool::detail
