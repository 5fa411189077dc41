// What a trace says: stats, the Chrome trace format, the records as JSON, a text table.
// (Pictures are drawn from the records JSON by the Python package, with matplotlib.)
#include "gpupool/trace.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>
#include <string>
#include <utility>

namespace gpupool {
namespace {

// Engine tracks sit after the lanes' tracks in each device's process.
constexpr int engine_track_base = 100000;
constexpr const char* engine_names[] = {"copies in (H2D)", "kernels", "copies out (D2H)"};

using json = nlohmann::json;

// Times to the nanosecond: finer digits are noise and only make the files longer.
double microseconds(double v) {
  return std::round(v * 1e3) / 1e3;
}

// Length of the union of [begin, end) intervals.
double covered(std::vector<std::pair<double, double>> spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0.0, begin = 0.0, end = -1.0;
  for (const auto& [b, e] : spans) {
    if (b > end) {
      if (end > begin) total += end - begin;
      begin = b;
      end = e;
    } else {
      end = std::max(end, e);
    }
  }
  if (end > begin) total += end - begin;
  return total;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const auto hi = static_cast<std::size_t>(std::ceil(rank));
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

lane_stats summarise(int device, int lane, const std::vector<const task_record*>& records) {
  lane_stats s;
  s.device = device;
  s.lane = lane;
  std::vector<std::pair<double, double>> busy;
  std::vector<double> waits;
  double first = 0.0, last = 0.0;
  for (const task_record* r : records) {
    if (s.tasks == 0 || r->started < first) first = r->started;
    last = std::max(last, r->done);
    ++s.tasks;
    s.bytes_in += r->bytes_in;
    s.bytes_out += r->bytes_out;
    busy.emplace_back(r->started, r->done);
    waits.push_back(r->started - r->submitted);
  }
  s.busy_us = covered(std::move(busy));
  s.wall_us = s.tasks ? last - first : 0.0;
  s.queue_wait_p50_us = percentile(waits, 0.50);
  s.queue_wait_p99_us = percentile(std::move(waits), 0.99);
  return s;
}

}  // namespace

trace::trace(backend_kind backend, std::vector<std::string> device_names, int lanes_per_device,
             std::vector<task_record> records)
    : backend_(backend),
      device_names_(std::move(device_names)),
      lanes_per_device_(lanes_per_device),
      records_(std::move(records)) {}

std::vector<lane_stats> trace::stats() const {
  std::map<std::pair<int, int>, std::vector<const task_record*>> by_lane;
  std::map<int, std::vector<const task_record*>> by_device;
  for (const auto& r : records_) {
    by_lane[{r.device, r.lane}].push_back(&r);
    by_device[r.device].push_back(&r);
  }
  std::vector<lane_stats> out;
  for (const auto& [key, records] : by_lane)
    out.push_back(summarise(key.first, key.second, records));
  for (const auto& [device, records] : by_device) out.push_back(summarise(device, -1, records));
  return out;
}

void trace::write_chrome_json(std::ostream& out) const {
  json events = json::array();
  auto name_track = [&](int pid, int tid, const std::string& name, int order) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", tid},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", pid},
                      {"tid", tid},
                      {"args", {{"sort_index", order}}}});
  };
  for (std::size_t d = 0; d < device_names_.size(); ++d) {
    const int pid = static_cast<int>(d);
    events.push_back(
        {{"ph", "M"},
         {"name", "process_name"},
         {"pid", pid},
         {"args", {{"name", "device " + std::to_string(d) + ": " + device_names_[d]}}}});
    for (int e = 0; e < 3; ++e) name_track(pid, engine_track_base + e, engine_names[e], 1000 + e);
  }
  std::map<int, bool> named_lanes;
  auto span_event = [&](const task_record& r, int tid, const char* stage, const span_us& s,
                        const char* cat) {
    if (!s.present()) return;
    events.push_back({{"ph", "X"},
                      {"name", stage},
                      {"cat", cat},
                      {"pid", r.device},
                      {"tid", tid},
                      {"ts", microseconds(s.begin)},
                      {"dur", microseconds(s.end - s.begin)},
                      {"args", {{"task", r.id}, {"kernel", r.name}}}});
  };
  for (const auto& r : records_) {
    const int host_tid = 2 * r.lane, stream_tid = 2 * r.lane + 1;
    if (!named_lanes[r.lane]) {
      named_lanes[r.lane] = true;
      name_track(r.device, host_tid, "lane " + std::to_string(r.lane) + " host", 2 * r.lane);
      name_track(r.device, stream_tid, "lane " + std::to_string(r.lane) + " stream",
                 2 * r.lane + 1);
    }
    // The whole journey, from the lane taking it to its result handed back.
    events.push_back({{"ph", "X"},
                      {"name", r.name + " #" + std::to_string(r.id)},
                      {"cat", "task"},
                      {"pid", r.device},
                      {"tid", host_tid},
                      {"ts", microseconds(r.started)},
                      {"dur", microseconds(r.done - r.started)},
                      {"args",
                       {{"task", r.id},
                        {"queued_us", microseconds(r.started - r.submitted)},
                        {"bytes_in", r.bytes_in},
                        {"bytes_out", r.bytes_out},
                        {"failed", r.failed}}}});
    span_event(r, host_tid, "stage in", r.stage_in, "host");
    span_event(r, host_tid, "stage out", r.stage_out, "host");
    const bool has_stream_stages = r.upload.present();
    if (has_stream_stages) {
      span_event(r, stream_tid, "upload", r.upload, "stream");
      span_event(r, stream_tid, "kernel", r.kernel, "stream");
      span_event(r, stream_tid, "download", r.download, "stream");
    }
    // The device's engines: several lanes overlap there, so these are async events.
    const span_us* engines[] = {&r.upload, has_stream_stages ? &r.kernel : nullptr, &r.download};
    for (int e = 0; e < 3; ++e) {
      if (engines[e] == nullptr || !engines[e]->present()) continue;
      for (const auto& [phase, at] : {std::pair{"b", engines[e]->begin}, {"e", engines[e]->end}})
        events.push_back({{"ph", phase},
                          {"name", r.name},
                          {"cat", engine_names[e]},
                          {"id", r.id},
                          {"pid", r.device},
                          {"tid", engine_track_base + e},
                          {"ts", microseconds(at)}});
    }
  }
  const json document = {{"displayTimeUnit", "ms"},
                         {"otherData", {{"backend", to_string(backend_)}}},
                         {"traceEvents", std::move(events)}};
  // Replacement characters for invalid UTF-8 in user-given names, rather than an exception.
  out << document.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
}

void trace::write_records_json(std::ostream& out) const {
  auto span = [](const span_us& s) {
    return s.present() ? json::array({microseconds(s.begin), microseconds(s.end)}) : json(nullptr);
  };
  json records = json::array();
  for (const task_record& r : records_)
    records.push_back({{"id", r.id},
                       {"name", r.name},
                       {"device", r.device},
                       {"lane", r.lane},
                       {"submitted", microseconds(r.submitted)},
                       {"started", microseconds(r.started)},
                       {"stage_in", span(r.stage_in)},
                       {"upload", span(r.upload)},
                       {"kernel", span(r.kernel)},
                       {"download", span(r.download)},
                       {"stage_out", span(r.stage_out)},
                       {"done", microseconds(r.done)},
                       {"bytes_in", r.bytes_in},
                       {"bytes_out", r.bytes_out},
                       {"failed", r.failed}});
  const json document = {{"backend", to_string(backend_)}, {"records", std::move(records)}};
  out << document.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
}

void trace::write_stats_table(std::ostream& out) const {
  char line[256];
  std::snprintf(line, sizeof line, "%-8s %-6s %7s %12s %12s %10s %10s %10s %10s %8s\n", "device",
                "lane", "tasks", "MB in", "MB out", "busy ms", "wall ms", "wait p50", "wait p99",
                "GB/s in");
  out << line;
  for (const auto& s : stats()) {
    std::snprintf(line, sizeof line,
                  "%-8d %-6s %7zu %12.2f %12.2f %10.3f %10.3f %8.1fus %8.1fus %8.2f\n", s.device,
                  s.lane < 0 ? "all" : std::to_string(s.lane).c_str(), s.tasks,
                  static_cast<double>(s.bytes_in) / 1e6, static_cast<double>(s.bytes_out) / 1e6,
                  s.busy_us / 1e3, s.wall_us / 1e3, s.queue_wait_p50_us, s.queue_wait_p99_us,
                  s.input_gb_per_s());
    out << line;
  }
}

}  // namespace gpupool
