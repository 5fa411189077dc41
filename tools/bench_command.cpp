#include "bench_command.hpp"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpupool/gpupool.hpp"
#include "progress.hpp"

namespace gpupool_cli {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::string human_bytes(std::size_t bytes) {
  char buf[32];
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0)
    std::snprintf(buf, sizeof buf, "%zu MiB", bytes >> 20);
  else if (bytes >= 1024 && bytes % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%zu KiB", bytes >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

// The copy engines' limits, in GB/s: pinned host -> device, device -> host, and each direction
// while both run at once (what a map that sends and returns equal amounts can reach).
struct copy_limits {
  double h2d = 0.0;
  double d2h = 0.0;
  double both = 0.0;
};

copy_limits measure_copy_limits(gpupool::executor_options o, std::size_t bytes) {
  o.lanes_per_device = 2;
  gpupool::executor ex(o);
  constexpr int rounds = 5;
  void* host_in = gpupool::allocate_pinned(bytes);
  void* host_out = gpupool::allocate_pinned(bytes);
  std::fill_n(static_cast<unsigned char*>(host_in), bytes, static_cast<unsigned char>(7));

  // Runs `copy(lane, device_buffer)` `rounds` times after a warm-up, returns seconds taken.
  auto timed = [&](gpupool::lane& l, auto copy, std::barrier<>* together) {
    auto device = l.allocate<unsigned char>(bytes);
    copy(l, device.data());
    l.synchronize();
    if (together) together->arrive_and_wait();
    const auto t0 = clock_type::now();
    for (int i = 0; i < rounds; ++i) copy(l, device.data());
    l.synchronize();
    return seconds_since(t0);
  };
  auto upload = [&](gpupool::lane& l, void* device) { l.upload_bytes(device, host_in, bytes); };
  auto download = [&](gpupool::lane& l, void* device) {
    l.download_bytes(host_out, device, bytes);
  };
  const double moved = static_cast<double>(bytes) * rounds / 1e9;
  copy_limits limits;
  limits.h2d =
      moved / ex.submit_to(0, [&](gpupool::lane& l) { return timed(l, upload, nullptr); }).get();
  limits.d2h =
      moved / ex.submit_to(0, [&](gpupool::lane& l) { return timed(l, download, nullptr); }).get();
  std::barrier<> together(2);
  auto in = ex.submit_to(0, [&](gpupool::lane& l) { return timed(l, upload, &together); });
  auto out = ex.submit_to(0, [&](gpupool::lane& l) { return timed(l, download, &together); });
  const double t_in = in.get(), t_out = out.get();
  limits.both = moved / std::max(t_in, t_out);
  gpupool::deallocate_pinned(host_in, bytes);
  gpupool::deallocate_pinned(host_out, bytes);
  return limits;
}

struct point {
  int lanes = 0;
  std::size_t chunk_bytes = 0;
  double seconds = 0.0;
  double gb_per_s = 0.0;
};

gpupool::kernel kernel_named(const std::string& name) {
  if (name == "square") return gpupool::kernel::square();
  if (name == "scale") return gpupool::kernel::scale(2.5);
  throw std::invalid_argument("bench: --kernel must be square or scale, not '" + name + "'");
}

template <class T>
T reference(const gpupool::kernel& k, T x) {
  return k.operation() == gpupool::op::square ? x * x : static_cast<T>(k.alpha()) * x;
}

// One sweep point: `input` (pageable) streamed through the devices in chunks of `chunk_bytes`,
// each chunk a transform into pinned memory. Checked in full before any time is taken.
template <class T>
point run_point(gpupool::executor_options o, int lanes, std::size_t chunk_bytes,
                const gpupool::kernel& k, std::span<const T> input, std::span<T> output,
                int repeat) {
  o.lanes_per_device = lanes;
  o.chunk_bytes = std::max<std::size_t>(chunk_bytes, 4096);
  gpupool::executor ex(o);
  const std::size_t per_chunk = std::max<std::size_t>(1, chunk_bytes / sizeof(T));
  auto run = [&] {
    gpupool::multi_future<void> all;
    for (std::size_t at = 0; at < input.size(); at += per_chunk) {
      const std::size_t n = std::min(per_chunk, input.size() - at);
      all.push_back(ex.transform<T>(k, input.subspan(at, n), output.subspan(at, n)));
    }
    all.get();
  };
  std::fill(output.begin(), output.end(), T{-1});
  run();
  for (std::size_t i = 0; i < input.size(); ++i) {
    const T want = reference(k, input[i]);
    if (output[i] != want)
      throw std::runtime_error("bench: wrong result at element " + std::to_string(i) + " (" +
                               std::to_string(output[i]) + " instead of " + std::to_string(want) +
                               ")");
  }
  std::vector<double> times;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = clock_type::now();
    run();
    times.push_back(seconds_since(t0));
  }
  point p;
  p.lanes = lanes;
  p.chunk_bytes = chunk_bytes;
  p.seconds = median(times);
  p.gb_per_s = static_cast<double>(input.size_bytes()) / p.seconds / 1e9;
  return p;
}

void write_svg_plot(const std::string& path, const std::vector<point>& points,
                    const copy_limits& limits, const std::string& title) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  const double w = 900, h = 520, left = 70, right = 160, top = 50, bottom = 60;
  double x_min = 1e300, x_max = 0, y_max = limits.both * 1.1;
  for (const auto& p : points) {
    x_min = std::min(x_min, std::log2(static_cast<double>(p.chunk_bytes)));
    x_max = std::max(x_max, std::log2(static_cast<double>(p.chunk_bytes)));
    y_max = std::max(y_max, p.gb_per_s * 1.1);
  }
  if (x_max <= x_min) x_max = x_min + 1;
  if (y_max <= 0) y_max = 1;
  auto X = [&](double log2_bytes) {
    return left + (log2_bytes - x_min) / (x_max - x_min) * (w - left - right);
  };
  auto Y = [&](double gbps) { return top + (1 - gbps / y_max) * (h - top - bottom); };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"12\"><rect width=\"100%%\" "
                "height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"25\" "
                "font-size=\"15\">%s</text>\n",
                w, h, left, title.c_str());
  out << buf;
  for (int i = 0; i <= 5; ++i) {
    const double v = y_max * i / 5;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text "
                  "x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.1f</text>\n",
                  left, w - right, Y(v), Y(v), left - 6, Y(v) + 4, v);
    out << buf;
  }
  for (double e = x_min; e <= x_max + 1e-9; e += 1) {
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n",
                  X(e), h - bottom + 18,
                  human_bytes(static_cast<std::size_t>(std::exp2(e))).c_str());
    out << buf;
  }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">chunk size</text><text "
                "x=\"18\" y=\"%.0f\" transform=\"rotate(-90 18 %.0f)\" "
                "text-anchor=\"middle\">GB/s of input</text>\n",
                (left + w - right) / 2, h - 15, (top + h - bottom) / 2, (top + h - bottom) / 2);
  out << buf;
  std::snprintf(buf, sizeof buf,
                "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"black\" "
                "stroke-dasharray=\"6 4\"/><text x=\"%.0f\" y=\"%.1f\">copy limit, both "
                "ways</text>\n",
                left, w - right, Y(limits.both), Y(limits.both), w - right + 6, Y(limits.both) + 4);
  out << buf;
  const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};
  std::vector<int> lanes;
  for (const auto& p : points)
    if (std::find(lanes.begin(), lanes.end(), p.lanes) == lanes.end()) lanes.push_back(p.lanes);
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    const char* color = colors[i % 6];
    out << "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" << color << "\" points=\"";
    for (const auto& p : points)
      if (p.lanes == lanes[i])
        out << X(std::log2(static_cast<double>(p.chunk_bytes))) << ',' << Y(p.gb_per_s) << ' ';
    out << "\"/>\n";
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">%d lane%s per device</text>\n",
                  w - right + 6, top + 20.0 * static_cast<double>(i), color, lanes[i],
                  lanes[i] == 1 ? "" : "s");
    out << buf;
  }
  out << "</svg>\n";
}

template <class T>
int sweep(const gpupool::executor_options& base, const bench_flags& flags) {
  const gpupool::kernel k = kernel_named(flags.kernel);
  std::vector<std::size_t> sizes;
  for (const auto& s : flags.sizes) sizes.push_back(parse_bytes(s));
  const std::size_t total = parse_bytes(flags.total);
  if (total < sizeof(T)) throw std::invalid_argument("bench: --total is too small");

  std::printf("measuring copy limits...\n");
  std::fflush(stdout);
  const copy_limits limits =
      measure_copy_limits(base, std::min<std::size_t>(total, std::size_t{256} << 20));
  std::printf(
      "copy limits: host->device %.2f GB/s, device->host %.2f GB/s, both at once %.2f "
      "GB/s each way\n",
      limits.h2d, limits.d2h, limits.both);

  const std::size_t count = total / sizeof(T);
  std::vector<T> input(count);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> dist(-100.0, 100.0);
  for (auto& x : input) x = static_cast<T>(dist(rng));
  T* output = static_cast<T*>(gpupool::allocate_pinned(count * sizeof(T)));
  std::vector<point> points;
  std::string backend;
  {
    gpupool::executor probe(base);
    backend = std::string(gpupool::to_string(probe.backend())) + ", " + probe.devices()[0].name;
  }
  std::printf("\n%-6s %-10s %12s %10s %9s\n", "lanes", "chunk", "ms", "GB/s", "of limit");
  try {
    progress_line progress("bench", flags.lanes.size() * sizes.size());
    for (int lanes : flags.lanes) {
      for (std::size_t size : sizes) {
        const point p = run_point<T>(base, lanes, size, k, std::span<const T>(input),
                                     std::span<T>(output, count), flags.repeat);
        points.push_back(p);
        progress.clear();
        std::printf("%-6d %-10s %12.3f %10.2f %8.0f%%\n", lanes, human_bytes(size).c_str(),
                    p.seconds * 1e3, p.gb_per_s, 100.0 * p.gb_per_s / limits.both);
        std::fflush(stdout);
        progress.step();
      }
    }
  } catch (...) {
    gpupool::deallocate_pinned(output, count * sizeof(T));
    throw;
  }
  gpupool::deallocate_pinned(output, count * sizeof(T));

  if (!flags.csv_path.empty()) {
    std::ofstream csv(flags.csv_path);
    csv << "lanes,chunk_bytes,dtype,kernel,total_bytes,seconds,input_gb_per_s,fraction_of_limit\n";
    for (const auto& p : points)
      csv << p.lanes << ',' << p.chunk_bytes << ',' << flags.dtype << ',' << flags.kernel << ','
          << total << ',' << p.seconds << ',' << p.gb_per_s << ',' << p.gb_per_s / limits.both
          << '\n';
  }
  std::string json_path = flags.json_path;
  const bool png = flags.plot_path.size() > 4 &&
                   flags.plot_path.compare(flags.plot_path.size() - 4, 4, ".png") == 0;
  if (json_path.empty() && png) json_path = flags.plot_path + ".json";
  if (!json_path.empty()) {
    std::ofstream json(json_path);
    json << "{\"backend\": \"" << backend << "\", \"dtype\": \"" << flags.dtype
         << "\", \"kernel\": \"" << flags.kernel << "\", \"total_bytes\": " << total
         << ", \"limits_gb_per_s\": {\"h2d\": " << limits.h2d << ", \"d2h\": " << limits.d2h
         << ", \"both\": " << limits.both << "}, \"points\": [";
    for (std::size_t i = 0; i < points.size(); ++i)
      json << (i ? ", " : "") << "{\"lanes\": " << points[i].lanes
           << ", \"chunk_bytes\": " << points[i].chunk_bytes
           << ", \"seconds\": " << points[i].seconds
           << ", \"input_gb_per_s\": " << points[i].gb_per_s
           << ", \"fraction_of_limit\": " << points[i].gb_per_s / limits.both << "}";
    json << "]}\n";
  }
  if (!flags.plot_path.empty()) {
    const std::string title = "gpupool bench: " + flags.kernel + " on " + flags.dtype + ", " +
                              backend + " (pageable in, pinned out)";
    if (png) {
      const std::string command =
          "python3 -m gpupool.plot \"" + json_path + "\" \"" + flags.plot_path + "\"";
      if (std::system(command.c_str()) != 0)
        throw std::runtime_error(
            "bench: drawing the PNG needs the gpupool Python package with "
            "matplotlib (" +
            command + " failed); ask for an .svg instead");
    } else {
      write_svg_plot(flags.plot_path, points, limits, title);
    }
    std::printf("plot: %s\n", flags.plot_path.c_str());
  }
  return 0;
}

}  // namespace

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::size_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("not a size: '" + text + "' (e.g. 4096, 64K, 8M, 1G)");
  }
  const std::string suffix = text.substr(used);
  if (suffix.empty() || suffix == "B") return n;
  if (suffix == "K" || suffix == "KiB") return n << 10;
  if (suffix == "M" || suffix == "MiB") return n << 20;
  if (suffix == "G" || suffix == "GiB") return n << 30;
  throw std::invalid_argument("not a size: '" + text + "' (e.g. 4096, 64K, 8M, 1G)");
}

int run_bench(const gpupool::executor_options& base, const bench_flags& flags) {
  if (flags.dtype == "float32") return sweep<float>(base, flags);
  if (flags.dtype == "float64") return sweep<double>(base, flags);
  if (flags.dtype == "int32") return sweep<std::int32_t>(base, flags);
  if (flags.dtype == "int64") return sweep<std::int64_t>(base, flags);
  throw std::invalid_argument("bench: --dtype must be float32, float64, int32 or int64");
}

}  // namespace gpupool_cli
