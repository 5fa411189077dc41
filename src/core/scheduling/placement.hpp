// Placement: which small calls of built-in kernels run on the host lanes and which on the
// devices (executor_options::host_lanes). Like a performance-model scheduler (StarPU's dmda), it
// learns each side's rate from the calls it ran; unlike one, it needs no model per kernel: calls
// placed together form a group, and when a side's last call of a group ends, the bytes it carried
// over the time since they were queued is that side's rate (its latency for a lone call, its
// throughput for many). The next calls are shared in proportion to the two rates, so that both
// sides finish a group's calls at about the same time. Neither side's share falls below
// least_share: a side that got slower (a device freed by other work, a host loaded by the
// application) is seen again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "gpupool/executor.hpp"

namespace gpupool::detail {

class host_placement;

/// Calls placed in one push: each side's calls of it, and when they were queued.
class placement_group {
 public:
  placement_group(host_placement& owner, std::size_t host_bytes, std::size_t host_calls,
                  std::size_t device_bytes, std::size_t device_calls) noexcept;
  placement_group(const placement_group&) = delete;
  placement_group& operator=(const placement_group&) = delete;

  /// One of the group's calls ended successfully on the host lanes (`on_host`) or a device; the
  /// side's last one measures its rate. Calls that fail or are cancelled never report, and their
  /// side of the group then teaches nothing.
  void finished(bool on_host) noexcept;

 private:
  struct side {
    std::size_t bytes;
    std::atomic<std::size_t> pending;
  };
  host_placement& owner_;
  const std::chrono::steady_clock::time_point queued_;
  side host_, device_;
};

/// The executor's placement of small calls: the shares, the rates behind them and the counts.
/// Thread-safe.
class host_placement {
 public:
  /// The least share of candidate calls either side gets while both exist.
  static constexpr double least_share = 1.0 / 64;
  /// How much one measurement moves a side's rate (an exponentially weighted mean).
  static constexpr double learning_weight = 0.25;

  /// `host_lanes` beside `device_lanes`: before anything is measured, each lane's share is equal.
  host_placement(int host_lanes, int device_lanes) noexcept;

  [[nodiscard]] bool enabled() const noexcept { return host_lanes_ > 0; }

  /// Whether a call of `bytes` (in and out together) may run on the host lanes at all.
  [[nodiscard]] static bool candidate(std::size_t bytes) noexcept {
    return bytes <= limits::most_host_task_bytes;
  }

  /// Where each of `n` candidate calls goes, in order: calls `choose(i)` once per call with
  /// whether it goes to the host. Spreads the host's share evenly over the calls, and over
  /// pushes of a call each (a credit carried from one push to the next).
  template <class Choose>
  void place(std::size_t n, Choose choose) {
    double share, credit;
    {
      std::lock_guard lock(mutex_);
      share = share_;
      credit = credit_;
      const double advanced = credit_ + share * static_cast<double>(n);
      credit_ = advanced - static_cast<double>(static_cast<std::uint64_t>(advanced));
    }
    for (std::size_t i = 0; i < n; ++i) {
      credit += share;
      const bool host = credit >= 1.0;
      if (host) credit -= 1.0;
      choose(i, host);
    }
  }

  /// Counts calls placed on each side (for placement()).
  void count(std::size_t host_calls, std::size_t device_calls) noexcept {
    host_calls_.fetch_add(host_calls, std::memory_order_relaxed);
    device_calls_.fetch_add(device_calls, std::memory_order_relaxed);
  }

  /// A measurement: a side's calls of one group carried `bytes_per_second`.
  void learn(bool on_host, double bytes_per_second) noexcept;

  [[nodiscard]] placement_stats stats() const;

 private:
  const int host_lanes_;
  mutable std::mutex mutex_;
  double share_;          // of candidate calls, to the host lanes
  double credit_ = 0;     // carried between pushes: see place()
  double host_rate_ = 0;  // bytes per second, 0 until measured
  double device_rate_ = 0;
  std::atomic<std::uint64_t> host_calls_{0};
  std::atomic<std::uint64_t> device_calls_{0};
};

}  // namespace gpupool::detail
