// Trace: a snapshot of an executor's per-task trace, as Python records, stats and text.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <string>

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {
namespace {

nb::object span_value(const gpupool::span_us& s) {
  if (!s.present()) return nb::none();
  return nb::make_tuple(s.begin, s.end);
}

// Every stage of gpupool::trace_stages, under its key: a record's span, a stat's time.
nb::dict record_dict(const gpupool::task_record& r) {
  nb::dict d;
  d["id"] = r.id;
  d["name"] = r.name;
  d["device"] = r.device;
  d["lane"] = r.lane;
  d["priority"] = r.priority;
  d["submitted"] = r.submitted;
  d["started"] = r.started;
  for (const gpupool::trace_stage& stage : gpupool::trace_stages)
    d[stage.key] = span_value(r.*stage.span);
  d["done"] = r.done;
  d["bytes_in"] = r.bytes_in;
  d["bytes_out"] = r.bytes_out;
  d["failed"] = r.failed;
  d["express"] = r.express;
  d["on_stream"] = gpupool::went_through_stream(r);
  return d;
}

nb::dict stats_dict(const gpupool::lane_stats& s) {
  nb::dict d;
  d["device"] = s.device;
  d["lane"] = s.lane < 0 ? nb::none() : nb::cast(s.lane);
  d["tasks"] = s.tasks;
  d["bytes_in"] = s.bytes_in;
  d["bytes_out"] = s.bytes_out;
  d["busy_us"] = s.busy_us;
  d["wall_us"] = s.wall_us;
  d["queue_wait_p50_us"] = s.queue_wait_p50_us;
  d["queue_wait_p99_us"] = s.queue_wait_p99_us;
  d["input_gb_per_s"] = s.input_gb_per_s();
  nb::dict stage_us;
  for (std::size_t i = 0; i < gpupool::trace_stage_count; ++i)
    stage_us[gpupool::trace_stages[i].key] = s.stage_us[i];
  d["stage_us"] = stage_us;
  return d;
}

// The stage table, for the Python renderer: one dict per stage, in the journey's order.
nb::list stage_table() {
  nb::list out;
  for (const gpupool::trace_stage& stage : gpupool::trace_stages) {
    nb::dict d;
    d["key"] = stage.key;
    d["label"] = stage.label;
    d["track"] = stage.track == gpupool::stage_track::host ? "host" : "stream";
    d["engine"] = stage.engine != nullptr ? nb::cast(stage.engine) : nb::none();
    d["colour"] = stage.colour;
    out.append(d);
  }
  return out;
}

// A NumPy array of `shape` over `values`, which it owns from now on.
template <class T>
nb::object numpy_array(std::unique_ptr<T[]> values, std::size_t rows, std::size_t columns = 0) {
  T* owned = values.release();
  nb::capsule owner(owned, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  const std::size_t shape[2] = {rows, columns};
  return nb::cast(nb::ndarray<nb::numpy, T>(owned, columns == 0 ? 1 : 2, shape, owner));
}

// The records' fields a picture needs, one NumPy array each, made without a Python object per
// record (a dict per record is what makes a big trace slow to turn into a picture).
nb::dict record_columns(const gpupool::trace& t) {
  const auto& records = t.records();
  const std::size_t n = records.size();
  auto device = std::make_unique<std::int64_t[]>(n);
  auto lane = std::make_unique<std::int64_t[]>(n);
  auto started = std::make_unique<double[]>(n);
  auto done = std::make_unique<double[]>(n);
  auto on_stream = std::make_unique<bool[]>(n);
  auto express = std::make_unique<bool[]>(n);
  std::uint64_t bytes_in = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const gpupool::task_record& r = records[i];
    device[i] = r.device;
    lane[i] = r.lane;
    started[i] = r.started;
    done[i] = r.done;
    on_stream[i] = gpupool::went_through_stream(r);
    express[i] = r.express;
    bytes_in += r.bytes_in;
  }
  nb::dict spans;
  constexpr double absent = std::numeric_limits<double>::quiet_NaN();
  for (const gpupool::trace_stage& stage : gpupool::trace_stages) {
    auto span = std::make_unique<double[]>(2 * n);
    for (std::size_t i = 0; i < n; ++i) {
      const gpupool::span_us& s = records[i].*stage.span;
      span[2 * i] = s.present() ? s.begin : absent;
      span[2 * i + 1] = s.present() ? s.end : absent;
    }
    spans[stage.key] = numpy_array(std::move(span), n, 2);
  }
  nb::dict d;
  d["device"] = numpy_array(std::move(device), n);
  d["lane"] = numpy_array(std::move(lane), n);
  d["started"] = numpy_array(std::move(started), n);
  d["done"] = numpy_array(std::move(done), n);
  d["on_stream"] = numpy_array(std::move(on_stream), n);
  d["express"] = numpy_array(std::move(express), n);
  d["bytes_in"] = bytes_in;
  d["spans"] = spans;
  return d;
}

template <class Write>
std::string to_text(Write write) {
  std::ostringstream out;
  write(out);
  return out.str();
}

}  // namespace

void bind_trace(nb::module_& m) {
  m.def("trace_stages", &stage_table,
        "The stages of a task's journey, as the C++ library declares them: key (the records'\n"
        "field), label, track ('host' or 'stream'), engine (a device engine's row, or None),\n"
        "colour.");
  nb::class_<gpupool::trace>(m, "Trace", "A snapshot of an executor's per-task trace.")
      .def_prop_ro(
          "backend",
          [](const gpupool::trace& t) { return std::string(gpupool::to_string(t.backend())); })
      .def(
          "records",
          [](const gpupool::trace& t) {
            nb::list out;
            for (const auto& r : t.records()) out.append(record_dict(r));
            return out;
          },
          "One dict per task (per piece for map/transform), in submission order; times in\n"
          "microseconds since the executor started, stages as (begin, end) or None.")
      .def("columns", &record_columns,
           "The records' fields as NumPy arrays, one per field: device, lane (int64), started,\n"
           "done (float64), on_stream, express (bool); bytes_in, the total; spans: per stage\n"
           "key, an (n, 2) float64 array of (begin, end), NaN where a record lacks the stage.")
      .def(
          "stats",
          [](const gpupool::trace& t) {
            nb::list out;
            for (const auto& s : t.stats()) out.append(stats_dict(s));
            return out;
          },
          "Per lane, then per device (lane None): tasks, bytes, busy time, queue wait, GB/s,\n"
          "and stage_us: the time in each stage (by key).")
      .def(
          "chrome_json",
          [](const gpupool::trace& t) {
            return to_text([&](std::ostream& o) { t.write_chrome_json(o); });
          },
          "The trace in Chrome trace format (Perfetto, chrome://tracing).")
      .def(
          "stats_table",
          [](const gpupool::trace& t) {
            return to_text([&](std::ostream& o) { t.write_stats_table(o); });
          },
          "The stats as an aligned text table.")
      .def("__len__", [](const gpupool::trace& t) { return t.records().size(); });
}

}  // namespace gpupool_python
