#include "core/scheduling/placement.hpp"

#include <algorithm>

namespace gpupool::detail {

placement_group::placement_group(host_placement& owner, std::size_t host_calls,
                                 std::size_t device_calls) noexcept
    : owner_(owner),
      queued_(std::chrono::steady_clock::now()),
      host_{host_calls, host_calls},
      device_{device_calls, device_calls} {}

void placement_group::finished(bool on_host, std::size_t bytes) noexcept {
  side& s = on_host ? host_ : device_;
  if (bytes != 0) s.bytes.fetch_add(bytes, std::memory_order_relaxed);
  // acq_rel: the last call sees every other call's bytes.
  if (s.pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - queued_).count();
  const std::size_t carried = s.bytes.load(std::memory_order_relaxed);
  // A clock that did not move, or calls that all failed, say nothing about the rate.
  if (seconds > 0 && carried > 0)
    owner_.learn(on_host, static_cast<double>(carried) / seconds, s.calls);
}

host_placement::host_placement(int host_lanes, int device_lanes) noexcept
    : host_lanes_(host_lanes),
      share_(host_lanes > 0 ? std::clamp(static_cast<double>(host_lanes) /
                                             static_cast<double>(host_lanes + device_lanes),
                                         least_share, 1.0 - least_share)
                            : 0.0) {}

void host_placement::learn(bool on_host, double bytes_per_second, std::size_t calls) noexcept {
  const double w = std::min(1.0, static_cast<double>(calls) / calls_per_full_measurement);
  std::lock_guard lock(mutex_);
  (on_host ? host_rate_ : device_rate_).add(bytes_per_second, w);
  if (host_rate_.mean <= 0 || device_rate_.mean <= 0) return;
  const double target = std::clamp(host_rate_.mean / (host_rate_.mean + device_rate_.mean),
                                   least_share, 1.0 - least_share);
  share_ += w * share_step * (target - share_);
}

placement_stats host_placement::stats() const {
  placement_stats s;
  s.host_tasks = host_calls_.load(std::memory_order_relaxed);
  s.device_tasks = device_calls_.load(std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  s.host_share = share_;
  s.host_bytes_per_second = host_rate_.mean;
  s.device_bytes_per_second = device_rate_.mean;
  return s;
}

}  // namespace gpupool::detail
