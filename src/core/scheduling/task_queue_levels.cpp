// The task queue's priority levels: which level an item goes to, what a lane of a device takes
// first when several levels are queued (aging included), and whether a higher level waits on
// another device. The rest of the queue is in task_queue.cpp (pushing, waking, stealing) and
// task_queue_drain.cpp (closing, retiring, draining); the levels are described in task_queue.hpp.
#include <algorithm>
#include <bit>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/scheduling/task_queue.hpp"

namespace gpupool::detail {
namespace {

// The highest level set in `mask` (not 0).
std::size_t top_level(unsigned mask) noexcept {
  return static_cast<std::size_t>(std::bit_width(mask)) - 1;
}

}  // namespace

std::size_t task_queue::level_of(int priority) {
  check_priority(priority, "a work item's priority");
  return static_cast<std::size_t>(priority - limits::lowest_priority);
}

void task_queue::note_queued_locked(device_queue& q, bool pinned, std::size_t level,
                                    std::size_t n) {
  if (n == 0) return;
  const unsigned bit = 1U << level;
  if (pinned) {
    q.pinned_mask |= bit;
  } else if ((q.shared_mask & bit) == 0) {
    q.shared_mask |= bit;
    q.shared_levels.store(q.shared_mask, std::memory_order_release);
  }
  if (level != usual_level_ && count_ > 1) off_default_.fetch_add(n);
}

work_item_ptr task_queue::take_front_locked(device_queue& q, bool pinned, std::size_t level) {
  std::deque<work_item_ptr>& fifo = pinned ? q.pinned[level] : q.shared[level];
  work_item_ptr item = std::move(fifo.front());
  fifo.pop_front();
  const unsigned bit = 1U << level;
  if (pinned) {
    q.pinned_count.fetch_sub(1);
    if (fifo.empty()) q.pinned_mask &= ~bit;
  } else {
    q.shared_count.fetch_sub(1);
    if (fifo.empty()) {
      q.shared_mask &= ~bit;
      q.shared_levels.store(q.shared_mask, std::memory_order_release);
    }
  }
  if (level != usual_level_ && count_ > 1) off_default_.fetch_sub(1);
  return item;
}

work_item_ptr task_queue::take_own_locked(device_queue& q) {
  const unsigned mask = q.pinned_mask | q.shared_mask;
  if (mask == 0) return nullptr;
  const std::size_t top = top_level(mask);
  const bool top_pinned = (q.pinned_mask >> top & 1U) != 0;
  if (mask == 1U << top) {  // one priority only: its pinned items first, then its shared ones
    q.passed = 0;
    return take_front_locked(q, top_pinned, top);
  }
  // Several priorities: the highest, unless aging says that the oldest item is due.
  bool oldest_pinned = top_pinned;
  std::size_t oldest_level = top;
  std::uint64_t oldest = (top_pinned ? q.pinned[top] : q.shared[top]).front()->trace_id;
  for (std::size_t level = 0; level < levels; ++level)
    for (const bool pinned : {true, false}) {
      const std::deque<work_item_ptr>& fifo = pinned ? q.pinned[level] : q.shared[level];
      if (!fifo.empty() && fifo.front()->trace_id < oldest) {
        oldest = fifo.front()->trace_id;
        oldest_pinned = pinned;
        oldest_level = level;
      }
    }
  if (oldest_is_due(oldest_level == top && oldest_pinned == top_pinned, q.passed))
    return take_front_locked(q, oldest_pinned, oldest_level);
  return take_front_locked(q, top_pinned, top);
}

bool task_queue::higher_elsewhere_locked(device_queue& q, int device) {
  if (count_ == 1 || off_default_.load() == 0) return false;
  const unsigned mask = q.pinned_mask | q.shared_mask;
  const int own = mask == 0 ? -1 : static_cast<int>(top_level(mask));
  // This device's oldest item is due (aging): it is taken rather than work stolen past it.
  if (own >= 0 && q.passed >= aging_takes) return false;
  if (best_elsewhere(device) <= own) return false;
  if (own >= 0) ++q.passed;  // passing over this device's own items
  return true;
}

bool task_queue::waits_above(int device, int priority) const {
  device_queue& q = at(device);
  const auto level = static_cast<int>(level_of(priority));
  if (q.pinned_count.load() + q.shared_count.load() != 0) {
    unsigned own = 0;
    {
      std::lock_guard lock(q.mutex);
      own = q.pinned_mask | q.shared_mask;
    }
    if ((own >> static_cast<unsigned>(level + 1)) != 0) return true;
  }
  return count_ > 1 && best_elsewhere(device) > level;
}

work_item_ptr task_queue::take_shared_locked(device_queue& q) {
  if (q.shared_mask == 0) return nullptr;
  return take_front_locked(q, /*pinned=*/false, top_level(q.shared_mask));
}

int task_queue::best_elsewhere(int device) const {
  int best = -1;
  for (std::size_t i = 1; i < count_; ++i) {
    const device_queue& q = queues_[(static_cast<std::size_t>(device) + i) % count_];
    const unsigned mask = q.shared_levels.load(std::memory_order_acquire);
    if (mask != 0 && !q.retired.load()) best = std::max(best, static_cast<int>(top_level(mask)));
  }
  return best;
}

bool task_queue::push_all(std::vector<work_item_ptr>& items, std::optional<int> device) {
  bool one_priority = true;
  for (const auto& item : items) {
    if (!item) throw std::invalid_argument("gpupool: a null work item cannot be queued");
    (void)level_of(item->priority);
    one_priority = one_priority && item->priority == items.front()->priority;
  }
  if (one_priority) return push_all_one_level(items, device);
  // Several priorities (work a retired device held): each priority's items in one push,
  // highest first, in their order.
  std::vector<work_item_ptr> group;
  group.reserve(items.size());  // may throw: nothing queued yet
  for (int p = limits::highest_priority; p >= limits::lowest_priority; --p) {
    group.clear();
    for (auto& item : items)
      if (item && item->priority == p) group.push_back(std::move(item));
    if (group.empty()) continue;
    // Not queued (false or a throw): this priority's items and the lower ones are left in
    // `items`, in order, what was queued taken out (within its capacity: no allocation).
    const auto leave_the_rest = [&] {
      std::erase_if(items, [](const work_item_ptr& i) { return !i; });
      items.insert(items.begin(), std::make_move_iterator(group.begin()),
                   std::make_move_iterator(group.end()));
    };
    bool queued = false;
    try {
      queued = push_all_one_level(group, device);
    } catch (...) {
      leave_the_rest();
      throw;
    }
    if (!queued) {
      leave_the_rest();
      return false;
    }
  }
  items.clear();
  return true;
}

}  // namespace gpupool::detail
