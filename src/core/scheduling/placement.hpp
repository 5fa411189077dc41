// Placement: which small calls of built-in kernels run on the host lanes and which on the
// devices (executor_options::host_lanes). Like a performance-model scheduler (StarPU's dmda), it
// predicts when each side would finish a push's calls and shares them so that both finish
// together; unlike one, it needs no model per kernel, only one per side, learnt from the calls it
// ran:
//
//   time from queueing to a side's last call of a push = latency + bytes / throughput,
//
// where bytes counts the side's calls of that push and those still pending on that side when it
// was placed (a side works through what it was given in order). Fitted over the pushes seen, the
// two terms tell a side that is slow to start (a device: staging, launch, copies back) from one
// that is slow per byte (a few host threads), so that a device that keeps up with the calls it
// gets keeps them, and the host lanes take a share once the devices' backlog would make them
// finish later. A time that does not grow with the bytes is latency alone (the pace then as fast
// as any side may be). Where the loads measured are all alike, the fit cannot tell the terms
// apart: the pace last fitted stays and the latency is what the mean time leaves; before any
// fit, the whole time counts per byte.
//
// Neither side's share falls below least_share, so that a side that got faster (a device freed by
// other work, a host no longer loaded by the application) is seen again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>

#include "gpupool/executor.hpp"

namespace gpupool::detail {

/// The executor's placement of small calls: each side's model, what each side has pending, and
/// the counts. Thread-safe.
class host_placement {
 public:
  /// The least share of a push's candidate calls either side gets while both exist.
  static constexpr double least_share = 1.0 / 64;
  /// How much less each older measurement counts than the next one (an exponentially weighted
  /// fit): a side's pace follows what it does now.
  static constexpr double forgetting = 1.0 / 32;
  /// The fit splits latency from pace only where the loads measured spread this much (the
  /// variance of their bytes over their mean squared); on one load alone it cannot.
  static constexpr double least_spread = 0.01;
  /// Bytes per second no side is taken to exceed (well above what host memory carries): the pace
  /// of a side whose time does not grow with the bytes.
  static constexpr double fastest_pace = 1e12;

  /// `host_lanes` beside `device_lanes`: before anything is measured, each lane is assumed as
  /// fast as any other, with no latency.
  host_placement(int host_lanes, int device_lanes) noexcept;

  [[nodiscard]] bool enabled() const noexcept { return host_lanes_ > 0; }

  /// Whether a call of `bytes` in and out together may run on the host lanes at all.
  [[nodiscard]] static bool candidate(std::size_t bytes) noexcept {
    return bytes <= limits::most_host_task_bytes;
  }

  /// What one push was given: each side's bytes (in and out), and what was pending ahead of
  /// them when they were placed. Those bytes count as pending from then on: a call placed gives
  /// its bytes back as it ends (ended()), and a push that is never queued gives all of them back
  /// (withdraw()).
  struct reservation {
    std::size_t host_bytes = 0, device_bytes = 0;
    std::size_t host_ahead = 0, device_ahead = 0;
  };

  /// Places the candidate calls of one push, in order: `bytes(i)` is call i's bytes in and out,
  /// and `choose(i, on_host)` is called once per call. The host's share of the push's bytes is
  /// the one with which both sides would finish together, given what each has pending, within
  /// [least_share, 1 - least_share]; the host's calls are spread evenly over the push, and over
  /// pushes of a call each (a credit of bytes carried from one push to the next).
  template <class Bytes, class Choose>
  reservation place(std::size_t n, Bytes bytes, Choose choose) {
    std::size_t total = 0;
    for (std::size_t i = 0; i < n; ++i) total += bytes(i);
    reservation r;
    std::lock_guard lock(mutex_);
    r.host_ahead = host_pending_.load(std::memory_order_relaxed);
    r.device_ahead = device_pending_.load(std::memory_order_relaxed);
    const double share = host_share_locked(total, r.host_ahead, r.device_ahead);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t b = bytes(i);
      // A call goes to the host once the credit reaches half of it: rounding, not truncating,
      // so that a lone call at a share near 1 goes to the host.
      credit_ += share * static_cast<double>(b);
      const bool host = credit_ >= 0.5 * static_cast<double>(b);
      if (host) {
        credit_ -= static_cast<double>(b);
        r.host_bytes += b;
      }
      choose(i, host);
    }
    r.device_bytes = total - r.host_bytes;
    host_pending_.fetch_add(r.host_bytes, std::memory_order_relaxed);
    device_pending_.fetch_add(r.device_bytes, std::memory_order_relaxed);
    return r;
  }

  /// The host's share of a push of `bytes` now (see place()).
  [[nodiscard]] double host_share_of(std::size_t bytes) const;

  /// A push placed and then not queued (an error on the way): its bytes are pending no more.
  void withdraw(const reservation& r) noexcept {
    ended(true, r.host_bytes);
    ended(false, r.device_bytes);
  }
  /// Bytes placed on each side and not yet ended (host, devices).
  [[nodiscard]] std::pair<std::size_t, std::size_t> pending() const noexcept {
    return {host_pending_.load(std::memory_order_relaxed),
            device_pending_.load(std::memory_order_relaxed)};
  }
  /// A call of `bytes` placed on a side ended, however.
  void ended(bool on_host, std::size_t bytes) noexcept {
    (on_host ? host_pending_ : device_pending_).fetch_sub(bytes, std::memory_order_relaxed);
  }

  /// Counts calls queued on each side (for placement()).
  void count(std::size_t host_calls, std::size_t device_calls) noexcept {
    host_calls_.fetch_add(host_calls, std::memory_order_relaxed);
    device_calls_.fetch_add(device_calls, std::memory_order_relaxed);
  }

  /// A measurement: a side's calls, queued behind others, took `seconds` from queueing to the
  /// last one's end, for `bytes` in and out (theirs and those ahead of them).
  void learn(bool on_host, double bytes, double seconds) noexcept;

  [[nodiscard]] placement_stats stats() const;

 private:
  // One side's time = latency + bytes * seconds_per_byte, fitted by weighted least squares over
  // its measurements, older ones forgotten in part.
  struct model {
    double weight = 0, bytes = 0, seconds = 0, bytes_squared = 0, bytes_seconds = 0;
    double latency = 0;           // seconds
    double seconds_per_byte = 0;  // 0 until measured
    void add(double x, double t) noexcept;
    [[nodiscard]] bool measured() const noexcept { return seconds_per_byte > 0; }
  };
  // Under mutex_: the model's per-byte time, or before any measurement, the prior.
  [[nodiscard]] double seconds_per_byte(const model& m, bool on_host) const noexcept;
  // Under mutex_: the host's share of a push of `bytes` queued behind what is pending.
  [[nodiscard]] double host_share_locked(std::size_t bytes, std::size_t host_ahead,
                                         std::size_t device_ahead) const noexcept;

  const int host_lanes_;
  const int device_lanes_;
  mutable std::mutex mutex_;
  double credit_ = 0;  // bytes, carried between pushes: see place()
  model host_, device_;
  std::atomic<std::size_t> host_pending_{0};  // bytes placed on each side and not yet ended
  std::atomic<std::size_t> device_pending_{0};
  std::atomic<std::uint64_t> host_calls_{0};
  std::atomic<std::uint64_t> device_calls_{0};
};

/// Calls placed in one push: per side, how many, their bytes, what was pending ahead of them, and
/// when they were queued.
class placement_group {
 public:
  /// `host_calls` and `device_calls` placed as `placed` says. With `device_learns` false (the
  /// push also queued work placement did not count, which the devices' time would include),
  /// only the host side measures.
  placement_group(host_placement& owner, std::size_t host_calls, std::size_t device_calls,
                  const host_placement::reservation& placed, bool device_learns) noexcept;
  placement_group(const placement_group&) = delete;
  placement_group& operator=(const placement_group&) = delete;

  /// One of the group's calls, of `bytes` in and out, ended on the host lanes (`on_host`) or a
  /// device, having `succeeded` or not; its bytes are pending no more. The side's last call
  /// measures the side's time, unless one of the side's calls failed or was cancelled (a time
  /// that says nothing of its pace).
  void finished(bool on_host, std::size_t bytes, bool succeeded) noexcept;

 private:
  struct side {
    const std::size_t bytes;
    const std::size_t ahead;
    std::atomic<std::size_t> pending;  // calls not yet ended
    std::atomic<bool> failed;  // set by a call that failed or was cancelled, or: must not teach
  };
  host_placement& owner_;
  const std::chrono::steady_clock::time_point queued_;
  side host_, device_;
};

}  // namespace gpupool::detail
