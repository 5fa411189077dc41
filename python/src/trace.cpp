// Trace: a snapshot of an executor's per-task trace, as Python records, stats and text.

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

nb::dict record_dict(const gpupool::task_record& r) {
  nb::dict d;
  d["id"] = r.id;
  d["name"] = r.name;
  d["device"] = r.device;
  d["lane"] = r.lane;
  d["submitted"] = r.submitted;
  d["started"] = r.started;
  d["stage_in"] = span_value(r.stage_in);
  d["upload"] = span_value(r.upload);
  d["kernel"] = span_value(r.kernel);
  d["download"] = span_value(r.download);
  d["stage_out"] = span_value(r.stage_out);
  d["done"] = r.done;
  d["bytes_in"] = r.bytes_in;
  d["bytes_out"] = r.bytes_out;
  d["failed"] = r.failed;
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
      .def(
          "stats",
          [](const gpupool::trace& t) {
            nb::list out;
            for (const auto& s : t.stats()) out.append(stats_dict(s));
            return out;
          },
          "Per lane, then per device (lane None): tasks, bytes, busy time, queue wait, GB/s.")
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
