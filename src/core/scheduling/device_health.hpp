// Devices taken out of service after a fault that ends what they can run. After a sticky CUDA
// error (an illegal address) every later CUDA call of the process fails the same way, on every
// device; without this, every queued task would be started only to fail, one by one.
#pragma once

#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/scheduling/task_queue.hpp"

namespace gpupool::detail {

/// What the executor knows of its devices' faults. Lanes report every task failure here; the
/// first one the backend classifies as ending a device (backend::classify_fault) takes that
/// device, or every device for a fault of the whole process, out of service: the queue stops
/// giving them work (their lanes leave once their work in flight has ended), the work only they
/// could run fails with a device_fault naming the fault, other queued work moves to the devices
/// left, and one line on stderr says so (unless quiet). With no device left, everything still
/// queued fails. Thread-safe.
class device_health {
 public:
  /// `names[d]` describes executor device d in messages.
  device_health(const backend& owner, task_queue& queue, std::vector<std::string> names,
                bool quiet);

  /// A task on executor device `device` failed with `failure`.
  void report(int device, const std::exception_ptr& failure) noexcept;

  /// Why `device` is out of service; nullopt while it is in service.
  [[nodiscard]] std::optional<std::string> fault(int device) const;

  /// The error for work that could not be queued because `device` (nullopt: every device) is out
  /// of service.
  [[nodiscard]] device_fault refusal(std::optional<int> device) const;

 private:
  const backend& owner_;
  task_queue& queue_;
  std::vector<std::string> names_;
  bool quiet_;
  mutable std::mutex mutex_;
  std::vector<std::string> faults_;  // "" while in service (under mutex_)
};

}  // namespace gpupool::detail
