#include "core/scheduling/task_queue.hpp"

#include <utility>

namespace gpupool::detail {

bool task_queue::push(work_item_ptr item, std::optional<int> device) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return false;
    auto& q = device ? per_device_.at(static_cast<std::size_t>(*device)) : shared_;
    // Coalescing: the last queued item may carry this one along; then nothing new is queued.
    if (!q.empty() && q.back()->absorb(item)) return true;
    q.push_back(std::move(item));
    ++size_;
  }
  // A device-pinned item must reach a lane of that device, so wake everyone in that case.
  if (device)
    available_.notify_all();
  else
    available_.notify_one();
  return true;
}

bool task_queue::push_all(std::vector<work_item_ptr>& items, std::optional<int> device) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return false;
    auto& q = device ? per_device_[static_cast<std::size_t>(*device)] : shared_;
    for (auto& item : items) {
      if (!q.empty() && q.back()->absorb(item)) continue;
      q.push_back(std::move(item));
      ++size_;
    }
  }
  items.clear();
  available_.notify_all();
  return true;
}

work_item_ptr task_queue::take_locked(int device) {
  auto& own = per_device_[static_cast<std::size_t>(device)];
  auto& q = !own.empty() ? own : shared_;
  if (q.empty()) return nullptr;
  work_item_ptr item = std::move(q.front());
  q.pop_front();
  --size_;
  return item;
}

work_item_ptr task_queue::pop(int device, bool block) {
  std::unique_lock lock(mutex_);
  if (!block) return take_locked(device);
  for (;;) {
    if (auto item = take_locked(device)) return item;
    if (closed_) return nullptr;
    available_.wait(lock);
  }
}

void task_queue::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  available_.notify_all();
}

std::vector<std::pair<work_item_ptr, std::optional<int>>> task_queue::drain() {
  std::lock_guard lock(mutex_);
  std::vector<std::pair<work_item_ptr, std::optional<int>>> items;
  items.reserve(size_);
  for (std::size_t d = 0; d < per_device_.size(); ++d)
    for (auto& item : per_device_[d]) items.emplace_back(std::move(item), static_cast<int>(d));
  for (auto& item : shared_) items.emplace_back(std::move(item), std::nullopt);
  for (auto& q : per_device_) q.clear();
  shared_.clear();
  size_ = 0;
  return items;
}

std::size_t task_queue::size() const {
  std::lock_guard lock(mutex_);
  return size_;
}

bool task_queue::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

}  // namespace gpupool::detail
