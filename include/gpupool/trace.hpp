// The journey of every task, recorded when tracing is on: queued, started on a lane, staged into
// pinned memory, uploaded, computed, downloaded, handed back. Times from the GPU's own clock,
// stamped in stream order (host clocks on the CPU backend), all on one clock: microseconds since
// the executor started.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "gpupool/types.hpp"

namespace gpupool {

/// A stretch of time, in microseconds on the executor's clock; `end < begin` means "none".
struct span_us {
  double begin = 0.0;
  double end = -1.0;
  [[nodiscard]] bool present() const noexcept { return end >= begin; }
  [[nodiscard]] double length() const noexcept { return present() ? end - begin : 0.0; }
};

/// One task's journey. Pipelined work (map, transform) records one entry per piece.
struct task_record {
  std::uint64_t id = 0;    ///< Submission order within the executor.
  std::string name;        ///< "task" for submit(), else the kernel's name.
  int device = 0;          ///< Executor device index.
  int lane = 0;            ///< Global lane index.
  double submitted = 0.0;  ///< When it was queued.
  double started = 0.0;    ///< When a lane took it.
  span_us stage_in;        ///< Host copy into the pinned slot ("data preparation").
  span_us upload;          ///< Host-to-device copy.
  span_us kernel;          ///< The kernel (or, for submit(), the task's own function).
  span_us download;        ///< Device-to-host copy.
  span_us stage_out;       ///< Host copy out of the pinned slot.
  double done = 0.0;       ///< When its result was handed back.
  std::size_t bytes_in = 0;
  std::size_t bytes_out = 0;
  bool failed = false;
};

/// Per-lane (or, summed, per-device) figures derived from a trace.
struct lane_stats {
  int device = 0;
  int lane = -1;  ///< -1 for a device total.
  std::size_t tasks = 0;
  std::size_t bytes_in = 0;
  std::size_t bytes_out = 0;
  double busy_us = 0.0;  ///< Time with at least one task in flight.
  double wall_us = 0.0;  ///< First start to last completion.
  double queue_wait_p50_us = 0.0;
  double queue_wait_p99_us = 0.0;
  /// Bytes in over the span from first start to last completion, in GB/s.
  [[nodiscard]] double input_gb_per_s() const noexcept {
    return wall_us > 0 ? static_cast<double>(bytes_in) / (wall_us * 1e3) : 0.0;
  }
};

/// A snapshot of an executor's trace.
class trace {
 public:
  trace() = default;
  trace(backend_kind backend, std::vector<std::string> device_names, int lanes_per_device,
        std::vector<task_record> records);

  [[nodiscard]] backend_kind backend() const noexcept { return backend_; }
  [[nodiscard]] const std::vector<task_record>& records() const noexcept { return records_; }
  [[nodiscard]] const std::vector<std::string>& device_names() const noexcept {
    return device_names_;
  }
  [[nodiscard]] int lanes_per_device() const noexcept { return lanes_per_device_; }

  /// Stats per lane, then one total per device (lane == -1).
  [[nodiscard]] std::vector<lane_stats> stats() const;

  /// Chrome trace format (Perfetto, chrome://tracing): one track per lane, and one per device
  /// engine (copies in, kernels, copies out).
  void write_chrome_json(std::ostream& out) const;
  /// The stats as an aligned text table.
  void write_stats_table(std::ostream& out) const;
  /// The records as a JSON list of objects (the fields of task_record; stages as [begin, end]
  /// or null), with the backend: what `python -m gpupool.plot timeline` (matplotlib) draws.
  void write_records_json(std::ostream& out) const;

 private:
  backend_kind backend_ = backend_kind::cpu;
  std::vector<std::string> device_names_;
  int lanes_per_device_ = 0;
  std::vector<task_record> records_;
};

}  // namespace gpupool
