// The executor's queue: one FIFO any lane may take from, and one per device for pinned tasks.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "gpupool/detail/work_item.hpp"

namespace gpupool::detail {

class task_queue {
 public:
  explicit task_queue(int devices) : per_device_(static_cast<std::size_t>(devices)) {}

  /// Queues `item` for any device, or for `device` alone. False if the queue is closed.
  bool push(work_item_ptr item, std::optional<int> device);
  /// Queues several items at once, for any device or for `device` alone. False (nothing queued)
  /// if closed.
  bool push_all(std::vector<work_item_ptr>& items, std::optional<int> device = std::nullopt);

  /// Takes the next item for a lane of `device`: that device's own items first. With `block`,
  /// waits for one; returns null only once the queue is closed and holds nothing for `device`.
  /// Without `block`, returns null at once when nothing is there.
  work_item_ptr pop(int device, bool block);

  /// Stops accepting work and wakes every waiting lane.
  void close();
  /// Removes and returns everything still queued, each with the device it was queued for.
  std::vector<std::pair<work_item_ptr, std::optional<int>>> drain();
  [[nodiscard]] std::size_t size() const;
  [[nodiscard]] bool closed() const;

 private:
  work_item_ptr take_locked(int device);

  mutable std::mutex mutex_;
  std::condition_variable available_;
  std::deque<work_item_ptr> shared_;
  std::vector<std::deque<work_item_ptr>> per_device_;
  std::size_t size_ = 0;
  bool closed_ = false;
};

}  // namespace gpupool::detail
