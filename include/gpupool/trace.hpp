// The journey of every task, recorded when tracing is on: queued, started on a lane, staged into
// pinned memory, uploaded, computed, downloaded, handed back. Times from the GPU's own clock,
// stamped in stream order (host clocks on the CPU backend), all on one clock: microseconds since
// the executor started.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <iterator>
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

/// The `device` of a task that ran on a host lane (executor_options::host_lanes).
inline constexpr int host_device = -1;

/// One task's journey. Pipelined work (map, transform) records one entry per piece.
struct task_record {
  std::uint64_t id = 0;    ///< Submission order within the executor.
  std::string name;        ///< "task" for submit(), else the kernel's name.
  int device = 0;          ///< Executor device index; host_device for a host lane.
  int lane = 0;            ///< Global lane index (host lanes follow the devices' lanes).
  int priority = 0;        ///< Its priority (task_options::priority, or the executor's).
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
  /// Ran in its lane's express slot (an urgent call of few bytes): its kernel read and wrote
  /// pinned host memory in place, and its `upload` and `download` copied nothing.
  bool express = false;
};

/// Where a stage runs: on the lane's thread (host copies) or in the lane's stream, in stream order.
enum class stage_track { host, stream };

/// A stage of a task's journey, declared once. Every writer iterates `trace_stages`: the Chrome
/// trace (an event per stage, named `label`), the records (JSON and Python: a field per stage,
/// named `key`), the stats (time per stage) and the pictures (Python draws with `colour`, on
/// `track`, and on `engine`'s row). Adding a stage: a span_us member of task_record, its row
/// here, and the lane code that stamps it.
struct trace_stage {
  const char* key;             ///< "stage_in": the record's field
  const char* label;           ///< "stage in": the event's name, the picture's legend
  stage_track track;           ///< which row of its lane it is drawn on
  const char* engine;          ///< the device engine it occupies ("kernels"), or nullptr
  const char* colour;          ///< "#9e9e9e": its colour in pictures
  span_us task_record::*span;  ///< where a record keeps it
};

/// The stages, in the order of a task's journey.
inline constexpr trace_stage trace_stages[] = {
    {"stage_in", "stage in", stage_track::host, nullptr, "#9e9e9e", &task_record::stage_in},
    {"upload", "upload", stage_track::stream, "copies in (H2D)", "#1f77b4", &task_record::upload},
    {"kernel", "kernel", stage_track::stream, "kernels", "#2ca02c", &task_record::kernel},
    {"download", "download", stage_track::stream, "copies out (D2H)", "#ff7f0e",
     &task_record::download},
    {"stage_out", "stage out", stage_track::host, nullptr, "#9467bd", &task_record::stage_out},
};
inline constexpr std::size_t trace_stage_count = std::size(trace_stages);

/// Whether `r`'s work went through its lane's stream (a piece of map or transform). A submit()
/// task has no copies: its `kernel` span is its whole run on the lane, not stream work.
[[nodiscard]] inline bool went_through_stream(const task_record& r) noexcept {
  return r.upload.present();
}

/// Per-lane (or, summed, per-device) figures derived from a trace.
struct lane_stats {
  int device = 0;  ///< As task_record::device (host_device: the host lanes).
  int lane = -1;   ///< -1 for a device total.
  std::size_t tasks = 0;
  std::size_t bytes_in = 0;
  std::size_t bytes_out = 0;
  double busy_us = 0.0;  ///< Time with at least one task in flight.
  double wall_us = 0.0;  ///< First start to last completion.
  double queue_wait_p50_us = 0.0;
  double queue_wait_p99_us = 0.0;
  /// Time spent in each stage, summed over the tasks, in the order of `trace_stages`.
  std::array<double, trace_stage_count> stage_us{};
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

  /// Chrome trace format (Perfetto, chrome://tracing): two tracks per lane (host, stream), and
  /// one per device engine named in `trace_stages`.
  void write_chrome_json(std::ostream& out) const;
  /// The stats as an aligned text table.
  void write_stats_table(std::ostream& out) const;
  /// The records as a JSON list of objects (the fields of task_record; stages as [begin, end]
  /// or null; `on_stream`: went_through_stream), with the backend and `trace_stages`: what `python
  /// -m gpupool.plot timeline` (matplotlib) draws.
  void write_records_json(std::ostream& out) const;

 private:
  backend_kind backend_ = backend_kind::cpu;
  std::vector<std::string> device_names_;
  int lanes_per_device_ = 0;
  std::vector<task_record> records_;
};

}  // namespace gpupool
