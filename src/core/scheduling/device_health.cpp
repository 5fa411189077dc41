#include "core/scheduling/device_health.hpp"

#include <cstdio>
#include <utility>

namespace gpupool::detail {
namespace {

// Ends `item` with `error` unless it was cancelled (then it is done with already).
void fail_queued(work_item& item, const std::exception_ptr& error) noexcept {
  try {
    if (item.claim()) item.fail(error);
  } catch (...) {
    item.fail(error);
  }
}

}  // namespace

device_health::device_health(const backend& owner, task_queue& queue,
                             std::vector<std::string> names, bool quiet)
    : owner_(owner),
      queue_(queue),
      names_(std::move(names)),
      quiet_(quiet),
      faults_(names_.size()) {}

void device_health::report(int device, const std::exception_ptr& failure) noexcept {
  if (!failure || device < 0 || static_cast<std::size_t>(device) >= names_.size()) return;
  fault_scope scope = fault_scope::none;
  std::string message;
  std::exception_ptr error;
  try {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      scope = owner_.classify_fault(e);
      if (scope == fault_scope::none) return;
      message = "gpupool: device " + std::to_string(device) + " (" +
                names_[static_cast<std::size_t>(device)] + ") " +
                (scope == fault_scope::device
                     ? "is out of service after a fault: "
                     : "hit a fault that ends this process's use of every device (restart the "
                       "process to use them again): ") +
                e.what();
    } catch (...) {
      return;
    }
    error = std::make_exception_ptr(device_fault(message));
  } catch (...) {
    // No memory for the message: the devices stay in service (their tasks keep failing with
    // their own errors, as they would without this).
    return;
  }
  // From here nothing is allowed to leave an item unended: whatever is taken out of the queue
  // is queued again or failed.
  std::vector<std::unique_ptr<task_queue::retired_items>> taken;
  try {
    taken.reserve(names_.size());
    if (scope == fault_scope::device) {
      if (auto items = queue_.retire(device)) taken.push_back(std::move(items));
    } else {
      for (int d = 0; d < static_cast<int>(names_.size()); ++d)
        if (auto items = queue_.retire(d)) taken.push_back(std::move(items));
    }
  } catch (...) {
    // retire throws before it takes anything: what it took is in `taken`, handled below.
  }
  if (taken.empty()) return;  // out of service already: said once
  {
    std::lock_guard lock(mutex_);
    for (std::size_t d = 0; d < faults_.size(); ++d)
      if (faults_[d].empty() && queue_.retired(static_cast<int>(d))) {
        try {
          faults_[d] = message;
        } catch (...) {
          // refusal() then names the device without the fault.
        }
      }
  }
  const bool others = queue_.live_devices() > 0;
  if (!quiet_)
    std::fprintf(stderr, "%s; %s\n", message.c_str(),
                 others ? "the other devices take its queued work"
                        : "no device is left, so everything queued fails");
  for (auto& items : taken) {
    for (auto& item : items->pinned) fail_queued(*item, error);
    // Work for any device goes to the devices left. It fails with the fault where none is left,
    // or where the queue is closed (a shutdown under way: the lanes may be leaving, and work
    // queued now could be left behind).
    bool moved = false;
    try {
      moved = !items->shared.empty() && queue_.push_all(items->shared);
    } catch (...) {
      // push_all leaves the items with us when it fails
    }
    if (!moved)
      for (auto& item : items->shared)
        if (item) fail_queued(*item, error);
  }
}

std::optional<std::string> device_health::fault(int device) const {
  std::lock_guard lock(mutex_);
  if (device < 0 || static_cast<std::size_t>(device) >= faults_.size() ||
      faults_[static_cast<std::size_t>(device)].empty())
    return std::nullopt;
  return faults_[static_cast<std::size_t>(device)];
}

device_fault device_health::refusal(std::optional<int> device) const {
  if (device) {
    if (auto why = fault(*device)) return device_fault(*why);
    return device_fault("gpupool: device " + std::to_string(*device) + " is out of service");
  }
  std::lock_guard lock(mutex_);
  for (const auto& why : faults_)
    if (!why.empty()) return device_fault("gpupool: every device is out of service; " + why);
  return device_fault("gpupool: every device is out of service");
}

}  // namespace gpupool::detail
