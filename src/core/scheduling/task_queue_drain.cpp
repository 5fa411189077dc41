// Taking work out of the task queue: closing it, taking a device out of service (`retire`,
// which hands back what that device held), and `drain`, which empties it for a cancelling
// shutdown. Queueing and taking work is in task_queue.cpp, the priority levels in
// task_queue_levels.cpp; the queue is described in task_queue.hpp.
#include <algorithm>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/scheduling/task_queue.hpp"

namespace gpupool::detail {

std::unique_ptr<task_queue::retired_items> task_queue::retire(int device) {
  device_queue& q = at(device);
  auto taken = std::make_unique<retired_items>();
  {
    std::lock_guard lock(q.mutex);
    if (q.retired.load()) return nullptr;
    // Room first, so that nothing below throws once items leave their deques.
    taken->pinned.reserve(q.pinned_count.load());
    taken->shared.reserve(q.shared_count.load());
    q.retired.store(true);
    // Highest priority first, each in its order.
    std::size_t off_default = 0;
    for (std::size_t level = levels; level-- > 0;) {
      if (level != usual_level_ && count_ > 1)
        off_default += q.pinned[level].size() + q.shared[level].size();
      for (auto& item : q.pinned[level]) taken->pinned.push_back(std::move(item));
      for (auto& item : q.shared[level]) taken->shared.push_back(std::move(item));
      q.pinned[level].clear();
      q.shared[level].clear();
    }
    off_default_.fetch_sub(off_default);
    q.pinned_mask = 0;
    q.shared_mask = 0;
    q.shared_levels.store(0, std::memory_order_release);
    q.pinned_count.store(0);
    q.shared_count.store(0);
    live_.fetch_sub(1);
  }
  q.wake.notify_all();  // its waiting lanes find it out of service and leave
  return taken;
}

bool task_queue::retired(int device) const {
  return at(device).retired.load();
}

void task_queue::close() {
  closed_.store(true);
  for (std::size_t d = 0; d < count_; ++d) {
    // Taking the lock orders this after any lane's check of `closed_` under it: a lane either
    // saw the queue closed or is already waiting and gets this wake-up.
    { std::lock_guard lock(queues_[d].mutex); }
    queues_[d].wake.notify_all();
  }
}

std::vector<std::pair<work_item_ptr, std::optional<int>>> task_queue::drain(bool spare_woken) {
  std::vector<std::pair<work_item_ptr, std::optional<int>>> items;
  std::vector<std::pair<work_item_ptr, std::optional<int>>> unpinned;
  ordered_locks locks(count_);
  for (std::size_t d = 0; d < count_; ++d) locks.lock(queues_[d]);
  std::size_t pinned = 0, shared = 0;
  for (std::size_t d = 0; d < count_; ++d) {
    pinned += queues_[d].pinned_count.load();
    shared += queues_[d].shared_count.load();
  }
  // Room first, so that nothing below throws once items leave their deques.
  items.reserve(pinned + shared);
  unpinned.reserve(shared);
  for (std::size_t d = 0; d < count_; ++d) {
    device_queue& q = queues_[d];
    // A woken lane takes its device's highest priority first, of it the pinned items first,
    // then the shared ones (take_own_locked): those are the items spared.
    std::size_t spared =
        spare_woken
            ? static_cast<std::size_t>(std::max(0, q.signalled + q.dispatched + q.spinning.load()))
            : 0;
    std::size_t kept_pinned = 0, kept_shared = 0, off_default = 0;
    q.pinned_mask = 0;
    q.shared_mask = 0;
    for (std::size_t level = levels; level-- > 0;) {
      for (const bool is_pinned : {true, false}) {
        std::deque<work_item_ptr>& fifo = is_pinned ? q.pinned[level] : q.shared[level];
        const std::size_t keep = std::min(spared, fifo.size());
        spared -= keep;
        for (std::size_t i = keep; i < fifo.size(); ++i) {
          if (is_pinned)
            items.emplace_back(std::move(fifo[i]), static_cast<int>(d));
          else
            unpinned.emplace_back(std::move(fifo[i]), std::nullopt);
        }
        if (level != usual_level_ && count_ > 1) off_default += fifo.size() - keep;
        fifo.resize(keep);
        if (keep > 0) (is_pinned ? q.pinned_mask : q.shared_mask) |= 1U << level;
        (is_pinned ? kept_pinned : kept_shared) += keep;
      }
    }
    q.shared_levels.store(q.shared_mask, std::memory_order_release);
    off_default_.fetch_sub(off_default);
    q.pinned_count.store(kept_pinned);
    q.shared_count.store(kept_shared);
  }
  // Items for any device were dealt out over the devices: put them back in submission order.
  std::stable_sort(unpinned.begin(), unpinned.end(), [](const auto& a, const auto& b) {
    return a.first->trace_id < b.first->trace_id;
  });
  std::move(unpinned.begin(), unpinned.end(), std::back_inserter(items));
  return items;
}

}  // namespace gpupool::detail
