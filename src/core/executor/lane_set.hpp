// The lane set: an executor's lane threads, started together (each holding its stream and slots
// before the executor is handed out, or none left running) and joined at shutdown.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/lanes/lane_worker.hpp"

namespace gpupool::detail {

class lane_set {
 public:
  lane_set() = default;
  lane_set(const lane_set&) = delete;
  lane_set& operator=(const lane_set&) = delete;

  // Starts `lanes_per_device` lanes on each of `ordinals` (device d's lanes account their memory
  // in `memory[d]`), each set up as `shared` says for what all lanes share, and waits until each
  // holds its stream and slots. If any cannot start (no thread left, no memory), `queue` is
  // closed and the lanes already running are joined before the error leaves: nothing is left
  // behind, and nothing waits on a lane.
  void start(const lane_setup& shared, const std::vector<int>& ordinals, int lanes_per_device,
             const std::vector<std::unique_ptr<device_memory>>& memory, task_queue& queue);

  // Waits for every lane to end (their queue closed: each ends once it is empty).
  void join();

  [[nodiscard]] std::size_t size() const noexcept { return lanes_.size(); }

 private:
  std::vector<std::unique_ptr<lane_worker>> lanes_;
};

}  // namespace gpupool::detail
