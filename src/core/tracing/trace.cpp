// What a trace says: stats, the Chrome trace format, the records as JSON, a text table; each
// iterates `trace_stages` for the stages. (Pictures are drawn from the records by the Python
// package, with matplotlib, from the same table.)
#include "gpupool/trace.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
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

// The device engines the stages name, in the order of their first stage.
std::vector<std::string> engine_names() {
  std::vector<std::string> names;
  for (const trace_stage& stage : trace_stages)
    if (stage.engine != nullptr &&
        std::find(names.begin(), names.end(), stage.engine) == names.end())
      names.emplace_back(stage.engine);
  return names;
}

int engine_index(const std::vector<std::string>& engines, const char* engine) {
  return static_cast<int>(std::find(engines.begin(), engines.end(), engine) - engines.begin());
}

const char* track_name(stage_track t) {
  return t == stage_track::host ? "host" : "stream";
}

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
    for (std::size_t i = 0; i < trace_stage_count; ++i)
      s.stage_us[i] += (r->*trace_stages[i].span).length();
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
  // Host lanes (host_device) after the devices, as their lane numbers are.
  const auto host_last = [](int a, int b) {
    return (a == host_device ? INT_MAX : a) < (b == host_device ? INT_MAX : b);
  };
  const auto by_device_then_lane = [&](const std::pair<int, int>& a, const std::pair<int, int>& b) {
    return a.first != b.first ? host_last(a.first, b.first) : a.second < b.second;
  };
  std::map<std::pair<int, int>, std::vector<const task_record*>, decltype(by_device_then_lane)>
      by_lane(by_device_then_lane);
  std::map<int, std::vector<const task_record*>, decltype(host_last)> by_device(host_last);
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
  const std::vector<std::string> engines = engine_names();
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
    for (std::size_t e = 0; e < engines.size(); ++e)
      name_track(pid, engine_track_base + static_cast<int>(e), engines[e],
                 1000 + static_cast<int>(e));
  }
  // Host lanes' tasks (host_device) are a process of their own, after the devices.
  const int host_pid = static_cast<int>(device_names_.size());
  const auto pid_of = [&](const task_record& r) {
    return r.device == host_device ? host_pid : r.device;
  };
  if (std::any_of(records_.begin(), records_.end(),
                  [](const task_record& r) { return r.device == host_device; }))
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", host_pid},
                      {"args", {{"name", "host lanes"}}}});
  std::map<int, bool> named_lanes;
  auto span_event = [&](const task_record& r, int tid, const char* stage, const span_us& s,
                        const char* cat) {
    if (!s.present()) return;
    events.push_back({{"ph", "X"},
                      {"name", stage},
                      {"cat", cat},
                      {"pid", pid_of(r)},
                      {"tid", tid},
                      {"ts", microseconds(s.begin)},
                      {"dur", microseconds(s.end - s.begin)},
                      {"args", {{"task", r.id}, {"kernel", r.name}}}});
  };
  for (const auto& r : records_) {
    const int host_tid = 2 * r.lane, stream_tid = 2 * r.lane + 1;
    if (!named_lanes[r.lane]) {
      named_lanes[r.lane] = true;
      name_track(pid_of(r), host_tid, "lane " + std::to_string(r.lane) + " host", 2 * r.lane);
      // A host lane has no stream.
      if (r.device != host_device)
        name_track(pid_of(r), stream_tid, "lane " + std::to_string(r.lane) + " stream",
                   2 * r.lane + 1);
    }
    // The whole journey, from the lane taking it to its result handed back.
    events.push_back({{"ph", "X"},
                      {"name", r.name + " #" + std::to_string(r.id)},
                      {"cat", "task"},
                      {"pid", pid_of(r)},
                      {"tid", host_tid},
                      {"ts", microseconds(r.started)},
                      {"dur", microseconds(r.done - r.started)},
                      {"args",
                       {{"task", r.id},
                        {"priority", r.priority},
                        {"queued_us", microseconds(r.started - r.submitted)},
                        {"bytes_in", r.bytes_in},
                        {"bytes_out", r.bytes_out},
                        {"failed", r.failed},
                        {"express", r.express}}}});
    // A submit() task's run is the task event itself: its `kernel` span is not stream work.
    const bool on_stream = went_through_stream(r);
    for (const trace_stage& stage : trace_stages) {
      const span_us& s = r.*stage.span;
      if (stage.track == stage_track::stream && !on_stream) continue;
      span_event(r, stage.track == stage_track::host ? host_tid : stream_tid, stage.label, s,
                 track_name(stage.track));
      // The device's engines: several lanes overlap there, so these are async events.
      if (stage.engine == nullptr || !s.present() || !on_stream) continue;
      const int e = engine_index(engines, stage.engine);
      for (const auto& [phase, at] : {std::pair{"b", s.begin}, {"e", s.end}})
        events.push_back({{"ph", phase},
                          {"name", r.name},
                          {"cat", stage.engine},
                          {"id", r.id},
                          {"pid", pid_of(r)},
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
  for (const task_record& r : records_) {
    json record = {{"id", r.id},
                   {"name", r.name},
                   {"device", r.device},
                   {"lane", r.lane},
                   {"priority", r.priority},
                   {"submitted", microseconds(r.submitted)},
                   {"started", microseconds(r.started)},
                   {"done", microseconds(r.done)},
                   {"bytes_in", r.bytes_in},
                   {"bytes_out", r.bytes_out},
                   {"failed", r.failed},
                   {"express", r.express},
                   {"on_stream", went_through_stream(r)}};
    for (const trace_stage& stage : trace_stages) record[stage.key] = span(r.*stage.span);
    records.push_back(std::move(record));
  }
  json stages = json::array();
  for (const trace_stage& stage : trace_stages)
    stages.push_back({{"key", stage.key},
                      {"label", stage.label},
                      {"track", track_name(stage.track)},
                      {"engine", stage.engine != nullptr ? json(stage.engine) : json(nullptr)},
                      {"colour", stage.colour}});
  const json document = {{"backend", to_string(backend_)},
                         {"stages", std::move(stages)},
                         {"records", std::move(records)}};
  out << document.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
}

void trace::write_stats_table(std::ostream& out) const {
  char line[256];
  std::snprintf(line, sizeof line, "%-8s %-6s %7s %12s %12s %10s %10s %10s %10s %8s", "device",
                "lane", "tasks", "MB in", "MB out", "busy ms", "wall ms", "wait p50", "wait p99",
                "GB/s in");
  out << line;
  for (const trace_stage& stage : trace_stages) {
    std::snprintf(line, sizeof line, " %12s", (std::string(stage.label) + " ms").c_str());
    out << line;
  }
  out << '\n';
  for (const auto& s : stats()) {
    std::snprintf(line, sizeof line,
                  "%-8s %-6s %7zu %12.2f %12.2f %10.3f %10.3f %8.1fus %8.1fus %8.2f",
                  s.device == host_device ? "host" : std::to_string(s.device).c_str(),
                  s.lane < 0 ? "all" : std::to_string(s.lane).c_str(), s.tasks,
                  static_cast<double>(s.bytes_in) / 1e6, static_cast<double>(s.bytes_out) / 1e6,
                  s.busy_us / 1e3, s.wall_us / 1e3, s.queue_wait_p50_us, s.queue_wait_p99_us,
                  s.input_gb_per_s());
    out << line;
    for (const double us : s.stage_us) {
      std::snprintf(line, sizeof line, " %12.3f", us / 1e3);
      out << line;
    }
    out << '\n';
  }
}

}  // namespace gpupool
