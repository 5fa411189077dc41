#include "core/scheduling/placement.hpp"

#include <algorithm>

namespace gpupool::detail {

void host_placement::model::add(double x, double t) noexcept {
  const double keep = 1 - forgetting;
  weight = keep * weight + 1;
  bytes = keep * bytes + x;
  seconds = keep * seconds + t;
  bytes_squared = keep * bytes_squared + x * x;
  bytes_seconds = keep * bytes_seconds + x * t;
  const double mean_x = bytes / weight;
  const double mean_t = seconds / weight;
  const double spread = bytes_squared / weight - mean_x * mean_x;
  if (spread > least_spread * mean_x * mean_x) {
    // A time that does not grow with the bytes (a slope at or below zero, within the noise) is
    // latency; the pace is then as fast as any side may be.
    const double slope = (bytes_seconds / weight - mean_x * mean_t) / spread;
    seconds_per_byte = std::max(slope, 1.0 / fastest_pace);
    latency = std::max(0.0, mean_t - seconds_per_byte * mean_x);
    return;
  }
  // Loads all alike tell latency from pace not: the pace last fitted stays, and the latency is
  // what the mean time leaves; with none yet, the whole time counts per byte.
  if (!measured()) seconds_per_byte = bytes_seconds / bytes_squared;
  latency = std::max(0.0, mean_t - seconds_per_byte * mean_x);
}

host_placement::host_placement(int host_lanes, int device_lanes) noexcept
    : host_lanes_(host_lanes), device_lanes_(std::max(device_lanes, 1)) {}

double host_placement::seconds_per_byte(const model& m, bool on_host) const noexcept {
  if (m.measured()) return m.seconds_per_byte;
  // The prior: every lane as fast as any other, here a byte a second, or, where the other side
  // is measured, as fast as one of its lanes.
  const model& other = on_host ? device_ : host_;
  const double other_lanes = on_host ? device_lanes_ : host_lanes_;
  const double lanes = on_host ? host_lanes_ : device_lanes_;
  const double per_lane = other.measured() ? other.seconds_per_byte * other_lanes : 1.0;
  return per_lane / std::max(lanes, 1.0);
}

double host_placement::host_share_locked(std::size_t bytes, std::size_t host_ahead,
                                         std::size_t device_ahead) const noexcept {
  const double b = static_cast<double>(bytes);
  const double h = seconds_per_byte(host_, true);
  const double d = seconds_per_byte(device_, false);
  // Both finish together: host latency + (host_ahead + x) h = device latency + (device_ahead +
  // b - x) d.
  const double x = (device_.latency - host_.latency + (static_cast<double>(device_ahead) + b) * d -
                    static_cast<double>(host_ahead) * h) /
                   (h + d);
  const double share = b > 0 ? x / b : d / (h + d);
  return std::clamp(share, least_share, 1.0 - least_share);
}

double host_placement::host_share_of(std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  return host_share_locked(bytes, host_pending_.load(std::memory_order_relaxed),
                           device_pending_.load(std::memory_order_relaxed));
}

void host_placement::learn(bool on_host, double bytes, double seconds) noexcept {
  std::lock_guard lock(mutex_);
  (on_host ? host_ : device_).add(bytes, seconds);
}

placement_stats host_placement::stats() const {
  placement_stats s;
  s.host_tasks = host_calls_.load(std::memory_order_relaxed);
  s.device_tasks = device_calls_.load(std::memory_order_relaxed);
  if (!enabled()) return s;
  std::lock_guard lock(mutex_);
  const double h = seconds_per_byte(host_, true);
  const double d = seconds_per_byte(device_, false);
  s.host_share = std::clamp(d / (h + d), least_share, 1.0 - least_share);
  if (host_.measured()) s.host_bytes_per_second = 1.0 / host_.seconds_per_byte;
  if (device_.measured()) s.device_bytes_per_second = 1.0 / device_.seconds_per_byte;
  s.host_latency_seconds = host_.latency;
  s.device_latency_seconds = device_.latency;
  return s;
}

placement_group::placement_group(host_placement& owner, std::size_t host_calls,
                                 std::size_t device_calls,
                                 const host_placement::reservation& placed,
                                 bool device_learns) noexcept
    : owner_(owner),
      queued_(std::chrono::steady_clock::now()),
      host_{placed.host_bytes, placed.host_ahead, host_calls, false},
      device_{placed.device_bytes, placed.device_ahead, device_calls, !device_learns} {}

void placement_group::finished(bool on_host, std::size_t bytes, bool succeeded) noexcept {
  owner_.ended(on_host, bytes);
  side& s = on_host ? host_ : device_;
  if (!succeeded) s.failed.store(true, std::memory_order_relaxed);
  // acq_rel: the last call sees whether any other failed.
  if (s.pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (s.failed.load(std::memory_order_relaxed)) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - queued_).count();
  // A clock that did not move says nothing about the pace.
  if (seconds > 0 && s.bytes > 0)
    owner_.learn(on_host, static_cast<double>(s.ahead) + static_cast<double>(s.bytes), seconds);
}

}  // namespace gpupool::detail
