#include "core/scheduling/placement.hpp"

#include <algorithm>

namespace gpupool::detail {

placement_group::placement_group(host_placement& owner, std::size_t host_bytes,
                                 std::size_t host_calls, std::size_t device_bytes,
                                 std::size_t device_calls) noexcept
    : owner_(owner),
      queued_(std::chrono::steady_clock::now()),
      host_{host_bytes, host_calls},
      device_{device_bytes, device_calls} {}

void placement_group::finished(bool on_host) noexcept {
  side& s = on_host ? host_ : device_;
  if (s.pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - queued_).count();
  // A clock that did not move says nothing about the rate.
  if (seconds > 0) owner_.learn(on_host, static_cast<double>(s.bytes) / seconds);
}

host_placement::host_placement(int host_lanes, int device_lanes) noexcept
    : host_lanes_(host_lanes),
      share_(host_lanes > 0 ? std::clamp(static_cast<double>(host_lanes) /
                                             static_cast<double>(host_lanes + device_lanes),
                                         least_share, 1.0 - least_share)
                            : 0.0) {}

void host_placement::learn(bool on_host, double bytes_per_second) noexcept {
  std::lock_guard lock(mutex_);
  double& rate = on_host ? host_rate_ : device_rate_;
  rate = rate == 0 ? bytes_per_second
                   : (1 - learning_weight) * rate + learning_weight * bytes_per_second;
  if (host_rate_ > 0 && device_rate_ > 0)
    share_ = std::clamp(host_rate_ / (host_rate_ + device_rate_), least_share, 1.0 - least_share);
}

placement_stats host_placement::stats() const {
  placement_stats s;
  s.host_tasks = host_calls_.load(std::memory_order_relaxed);
  s.device_tasks = device_calls_.load(std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  s.host_share = share_;
  s.host_bytes_per_second = host_rate_;
  s.device_bytes_per_second = device_rate_;
  return s;
}

}  // namespace gpupool::detail
