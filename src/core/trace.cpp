// What a trace says: stats, the Chrome trace format, an SVG picture, a text table.
#include "gpupool/trace.hpp"

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

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
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
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"backend\":"
      << json_string(to_string(backend_)) << "},\"traceEvents\":[\n";
  bool first = true;
  auto event = [&](const std::string& body) {
    out << (first ? "" : ",\n") << '{' << body << '}';
    first = false;
  };
  auto name_track = [&](int pid, int tid, const std::string& name, int order) {
    event("\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(pid) +
          ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"name\":" + json_string(name) + "}");
    event("\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" + std::to_string(pid) +
          ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"sort_index\":" + std::to_string(order) +
          "}");
  };
  for (std::size_t d = 0; d < device_names_.size(); ++d) {
    const int pid = static_cast<int>(d);
    event("\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(pid) +
          ",\"args\":{\"name\":" +
          json_string("device " + std::to_string(d) + ": " + device_names_[d]) + "}");
    for (int e = 0; e < 3; ++e) name_track(pid, engine_track_base + e, engine_names[e], 1000 + e);
  }
  std::map<int, bool> named_lanes;
  auto span_event = [&](const task_record& r, int tid, const char* stage, const span_us& s,
                        const std::string& cat) {
    if (!s.present()) return;
    event("\"ph\":\"X\",\"name\":" + json_string(std::string(stage)) +
          ",\"cat\":" + json_string(cat) + ",\"pid\":" + std::to_string(r.device) +
          ",\"tid\":" + std::to_string(tid) + ",\"ts\":" + number(s.begin) +
          ",\"dur\":" + number(s.end - s.begin) + ",\"args\":{\"task\":" + std::to_string(r.id) +
          ",\"kernel\":" + json_string(r.name) + "}");
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
    event("\"ph\":\"X\",\"name\":" + json_string(r.name + " #" + std::to_string(r.id)) +
          ",\"cat\":\"task\",\"pid\":" + std::to_string(r.device) +
          ",\"tid\":" + std::to_string(host_tid) + ",\"ts\":" + number(r.started) +
          ",\"dur\":" + number(r.done - r.started) + ",\"args\":{\"task\":" + std::to_string(r.id) +
          ",\"queued_us\":" + number(r.started - r.submitted) + ",\"bytes_in\":" +
          std::to_string(r.bytes_in) + ",\"bytes_out\":" + std::to_string(r.bytes_out) +
          ",\"failed\":" + (r.failed ? "true" : "false") + "}");
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
      const std::string common =
          "\"name\":" + json_string(r.name) + ",\"cat\":" + json_string(engine_names[e]) +
          ",\"id\":" + std::to_string(r.id) + ",\"pid\":" + std::to_string(r.device) +
          ",\"tid\":" + std::to_string(engine_track_base + e);
      event("\"ph\":\"b\"," + common + ",\"ts\":" + number(engines[e]->begin));
      event("\"ph\":\"e\"," + common + ",\"ts\":" + number(engines[e]->end));
    }
  }
  out << "\n]}\n";
}

void trace::write_records_json(std::ostream& out) const {
  auto span = [](const span_us& s) {
    if (!s.present()) return std::string("null");
    char buf[80];
    std::snprintf(buf, sizeof buf, "[%.3f, %.3f]", s.begin, s.end);
    return std::string(buf);
  };
  out << "{\"backend\": " << json_string(to_string(backend_)) << ", \"records\": [";
  for (std::size_t i = 0; i < records_.size(); ++i) {
    const task_record& r = records_[i];
    out << (i ? ",\n" : "\n") << "{\"id\": " << r.id << ", \"name\": " << json_string(r.name)
        << ", \"device\": " << r.device << ", \"lane\": " << r.lane
        << ", \"submitted\": " << number(r.submitted) << ", \"started\": " << number(r.started)
        << ", \"stage_in\": " << span(r.stage_in) << ", \"upload\": " << span(r.upload)
        << ", \"kernel\": " << span(r.kernel) << ", \"download\": " << span(r.download)
        << ", \"stage_out\": " << span(r.stage_out) << ", \"done\": " << number(r.done)
        << ", \"bytes_in\": " << r.bytes_in << ", \"bytes_out\": " << r.bytes_out
        << ", \"failed\": " << (r.failed ? "true" : "false") << "}";
  }
  out << "\n]}\n";
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

void trace::write_svg(std::ostream& out) const {
  // Rows: per device, one per lane (host activity above, stream activity below), then one per
  // engine.
  double t0 = 0.0, t1 = 1.0;
  bool any = false;
  std::map<int, std::map<int, int>> lane_rows;  // device -> lane -> row within device
  for (const auto& r : records_) {
    t0 = any ? std::min(t0, r.started) : r.started;
    t1 = any ? std::max(t1, r.done) : r.done;
    any = true;
    lane_rows[r.device].emplace(r.lane, 0);
  }
  if (t1 <= t0) t1 = t0 + 1.0;
  const double left = 150, right = 30, top = 50, row_h = 26, width = 1400;
  const double plot_w = width - left - right;
  std::map<int, double> device_top;
  double y = top;
  for (auto& [device, lanes] : lane_rows) {
    device_top[device] = y;
    int i = 0;
    for (auto& [lane, row] : lanes) row = i++;
    y += (static_cast<double>(lanes.size()) + 3.0) * row_h + 20;
  }
  const double height = y + 60;
  auto x_of = [&](double t) { return left + (t - t0) / (t1 - t0) * plot_w; };
  char buf[512];
  auto rect = [&](double b, double e, double row_y, double h, const char* color, const char* tip) {
    const double x = x_of(b), w = std::max(0.5, x_of(e) - x);
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" "
                  "fill-opacity=\"0.8\"><title>%s</title></rect>\n",
                  x, row_y, w, h, color, tip);
    out << buf;
  };
  const char* colors[] = {"#9e9e9e", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"};
  const char* labels[] = {"stage in (host copy)", "upload", "kernel / task", "download",
                          "stage out (host copy)"};

  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" "
                "height=\"100%%\" fill=\"white\"/>\n",
                width, height);
  out << buf;
  std::size_t bytes = 0;
  for (const auto& r : records_) bytes += r.bytes_in;
  std::snprintf(buf, sizeof buf,
                "<text x=\"%.0f\" y=\"22\" font-size=\"15\">gpupool timeline: %zu tasks on the %s "
                "backend, %.3f ms, %.2f GB/s of input</text>\n",
                left, records_.size(), to_string(backend_), (t1 - t0) / 1e3,
                static_cast<double>(bytes) / ((t1 - t0) * 1e3));
  out << buf;
  for (int i = 0; i < 5; ++i) {  // legend
    const double lx = left + 180.0 * i;
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.0f\" y=\"30\" width=\"12\" height=\"10\" fill=\"%s\"/><text "
                  "x=\"%.0f\" y=\"40\">%s</text>\n",
                  lx, colors[i], lx + 16, labels[i]);
    out << buf;
  }
  for (const auto& [device, lanes] : lane_rows) {
    const double dy = device_top[device];
    for (const auto& [lane, row] : lanes) {
      std::snprintf(buf, sizeof buf, "<text x=\"8\" y=\"%.1f\">device %d, lane %d</text>\n",
                    dy + row * row_h + 16, device, lane);
      out << buf;
    }
    for (int e = 0; e < 3; ++e) {
      std::snprintf(buf, sizeof buf, "<text x=\"8\" y=\"%.1f\">%s</text>\n",
                    dy + (static_cast<double>(lanes.size()) + e) * row_h + 16, engine_names[e]);
      out << buf;
    }
  }
  for (const auto& r : records_) {
    const double dy = device_top[r.device];
    const double lane_y = dy + lane_rows[r.device][r.lane] * row_h;
    const double lanes = static_cast<double>(lane_rows[r.device].size());
    std::snprintf(buf, sizeof buf, "%s #%llu", r.name.c_str(),
                  static_cast<unsigned long long>(r.id));
    const std::string tip = buf;
    if (r.stage_in.present())
      rect(r.stage_in.begin, r.stage_in.end, lane_y + 2, 10, colors[0], tip.c_str());
    if (r.stage_out.present())
      rect(r.stage_out.begin, r.stage_out.end, lane_y + 2, 10, colors[4], tip.c_str());
    const span_us* stages[] = {&r.upload, &r.kernel, &r.download};
    for (int s = 0; s < 3; ++s) {
      if (!stages[s]->present()) continue;
      rect(stages[s]->begin, stages[s]->end, lane_y + 13, 10, colors[s + 1], tip.c_str());
      if (r.upload.present())  // engine rows: only work that went through the device's engines
        rect(stages[s]->begin, stages[s]->end, dy + (lanes + s) * row_h + 2, 20, colors[s + 1],
             tip.c_str());
    }
  }
  // Time axis.
  const double axis_y = height - 40;
  std::snprintf(buf, sizeof buf,
                "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", left,
                axis_y, left + plot_w, axis_y);
  out << buf;
  for (int i = 0; i <= 10; ++i) {
    const double t = t0 + (t1 - t0) * i / 10.0;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#ccc\"/>"
                  "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.2f ms</text>\n",
                  x_of(t), top, x_of(t), axis_y, x_of(t), axis_y + 16, (t - t0) / 1e3);
    out << buf;
  }
  out << "</svg>\n";
}

}  // namespace gpupool
