// Placement: which small calls of built-in kernels run on the host lanes and which on the
// devices (executor_options::host_lanes). Like a performance-model scheduler (StarPU's dmda), it
// learns each side's rate from the calls it ran; unlike one, it needs no model per kernel: calls
// placed together form a group, and when a side's last call of a group ends, the bytes its calls
// carried over the time since they were queued is that side's rate (its latency for a lone call,
// its throughput for many). The next calls are shared in proportion to the two rates, so that
// both sides finish a group's calls at about the same time. Neither side's share falls below
// least_share: a side that got faster (a device freed by other work, a host no longer loaded by
// the application) is seen again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "gpupool/executor.hpp"

namespace gpupool::detail {

class host_placement;

/// Calls placed in one push: how many each side got, and when they were queued.
class placement_group {
 public:
  placement_group(host_placement& owner, std::size_t host_calls, std::size_t device_calls) noexcept;
  placement_group(const placement_group&) = delete;
  placement_group& operator=(const placement_group&) = delete;

  /// One of the group's calls ended on the host lanes (`on_host`) or a device, carrying `bytes`
  /// (in and out; 0 for a call that failed or was cancelled). The side's last call measures its
  /// rate from the bytes its calls carried, if any.
  void finished(bool on_host, std::size_t bytes) noexcept;

 private:
  struct side {
    const std::size_t calls;
    std::atomic<std::size_t> pending;
    std::atomic<std::size_t> bytes{0};
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
  /// How much a full measurement counts: each side's rate is a mean of its measurements, each
  /// older one counting this much less than the next (an exponentially weighted mean).
  static constexpr double forgetting = 0.25;
  /// A measurement of this many calls or more is a full one; one of fewer counts in proportion
  /// (a lone call's time is its latency, which says less of a side's pace than many calls').
  static constexpr double calls_per_full_measurement = 8;
  /// How far one full measurement moves the share towards what the rates say: the share follows
  /// the rates without jumping at the first one.
  static constexpr double share_step = 0.5;

  /// `host_lanes` beside `device_lanes`: before anything is measured, each lane's share is equal.
  host_placement(int host_lanes, int device_lanes) noexcept;

  [[nodiscard]] bool enabled() const noexcept { return host_lanes_ > 0; }

  /// Whether a call of `bytes` in and out together may run on the host lanes at all.
  [[nodiscard]] static bool candidate(std::size_t bytes) noexcept {
    return bytes <= limits::most_host_task_bytes;
  }

  /// Where each of `n` candidate calls goes, in order: calls `choose(i, on_host)` once per call.
  /// Spreads the host's share evenly over the calls, and over pushes of a call each (a credit
  /// carried from one push to the next).
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

  /// Counts calls queued on each side (for placement()).
  void count(std::size_t host_calls, std::size_t device_calls) noexcept {
    host_calls_.fetch_add(host_calls, std::memory_order_relaxed);
    device_calls_.fetch_add(device_calls, std::memory_order_relaxed);
  }

  /// A measurement: `calls` of a side's calls of one group carried `bytes_per_second`.
  void learn(bool on_host, double bytes_per_second, std::size_t calls) noexcept;

  [[nodiscard]] placement_stats stats() const;

 private:
  struct rate {
    double mean = 0;    // bytes per second, 0 until measured
    double weight = 0;  // of the measurements behind it, older ones forgotten in part
    void add(double sample, double w) noexcept {
      weight = (1 - forgetting) * weight + w;
      mean += w / weight * (sample - mean);
    }
  };

  const int host_lanes_;
  mutable std::mutex mutex_;
  double share_;       // of candidate calls, to the host lanes
  double credit_ = 0;  // carried between pushes: see place()
  rate host_rate_, device_rate_;
  std::atomic<std::uint64_t> host_calls_{0};
  std::atomic<std::uint64_t> device_calls_{0};
};

}  // namespace gpupool::detail
