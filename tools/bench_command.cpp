#include "bench_command.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "gpupool/gpupool.hpp"
#include "outputs.hpp"
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

// A whole number, so that kernels with alpha run on integer arrays too.
constexpr double bench_alpha = 3.0;

gpupool::builtin_kernel kernel_named(const std::string& name) {
  for (const gpupool::builtin_kernel_info& k : gpupool::builtin_kernels())
    if (name == k.name) return gpupool::builtin_kernel::of(k.operation, bench_alpha);
  throw std::invalid_argument("bench: no built-in kernel is named '" + name + "'");
}

// What every point must produce: the kernel run once on the CPU backend (the arithmetic the
// built-ins share), so the check needs no formula of its own.
template <class T>
std::vector<T> reference(const gpupool::builtin_kernel& k, std::span<const T> x,
                         std::span<const T> y) {
  gpupool::executor_options o;
  o.backend = gpupool::backend_kind::cpu;
  o.quiet = true;
  gpupool::executor cpu(o);
  std::vector<T> want(x.size());
  if (k.arity() == 2)
    cpu.transform<T>(k, x, y, std::span<T>(want)).get();
  else
    cpu.transform<T>(k, x, std::span<T>(want)).get();
  return want;
}

// Whether a device's result equals the CPU's: exactly for integers; for floating point within a
// few rounding steps of the operands' size, since a GPU may fuse a multiply and an add.
template <class T>
bool agrees(T got, T want, T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    return got == want;
  } else {
    const double size = std::fabs(double{x}) * (std::fabs(double{x}) + bench_alpha) +
                        std::fabs(double{y}) + std::fabs(double{want});
    return std::fabs(double{got} - double{want}) <= 8 * std::numeric_limits<T>::epsilon() * size;
  }
}

// One sweep point: `x` (and for two-input kernels `y`; pageable) streamed through the devices in
// chunks of `chunk_bytes`, each chunk a transform into pinned memory. Checked in full against
// `want` before any time is taken.
template <class T>
point run_point(gpupool::executor_options o, int lanes, std::size_t chunk_bytes,
                const gpupool::builtin_kernel& k, std::span<const T> x, std::span<const T> y,
                std::span<const T> want, std::span<T> output, int repeat) {
  o.lanes_per_device = lanes;
  o.chunk_bytes = std::max<std::size_t>(chunk_bytes, 4096);
  gpupool::executor ex(o);
  const std::size_t per_chunk = std::max<std::size_t>(1, chunk_bytes / sizeof(T));
  auto run = [&] {
    gpupool::multi_future<void> all;
    for (std::size_t at = 0; at < x.size(); at += per_chunk) {
      const std::size_t n = std::min(per_chunk, x.size() - at);
      if (k.arity() == 2)
        all.push_back(
            ex.transform<T>(k, x.subspan(at, n), y.subspan(at, n), output.subspan(at, n)));
      else
        all.push_back(ex.transform<T>(k, x.subspan(at, n), output.subspan(at, n)));
    }
    all.get();
  };
  std::fill(output.begin(), output.end(), T{-1});
  run();
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!agrees(output[i], want[i], x[i], y.empty() ? T{} : y[i]))
      throw std::runtime_error("bench: wrong result at element " + std::to_string(i) + " (" +
                               std::to_string(output[i]) + " instead of " +
                               std::to_string(want[i]) + ")");
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
  const std::size_t input_bytes = x.size_bytes() * static_cast<std::size_t>(k.arity());
  p.gb_per_s = static_cast<double>(input_bytes) / p.seconds / 1e9;
  return p;
}

template <class T>
int sweep(const gpupool::executor_options& base, const bench_flags& flags) {
  const gpupool::builtin_kernel k = kernel_named(flags.kernel);
  const std::vector<std::size_t>& sizes = flags.sizes;
  const std::size_t total = flags.total;
  if (total < sizeof(T) * static_cast<std::size_t>(k.arity()))
    throw std::invalid_argument("bench: --total is too small");
  check_writable(flags.csv_path);
  check_writable(flags.json_path);

  std::printf("measuring copy limits...\n");
  std::fflush(stdout);
  const copy_limits limits =
      measure_copy_limits(base, std::min<std::size_t>(total, std::size_t{256} << 20));
  std::printf(
      "copy limits: host->device %.2f GB/s, device->host %.2f GB/s, both at once %.2f "
      "GB/s each way\n",
      limits.h2d, limits.d2h, limits.both);

  // --total bytes of input, over the kernel's one or two arrays.
  const std::size_t count = total / sizeof(T) / static_cast<std::size_t>(k.arity());
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> dist(-100.0, 100.0);
  std::vector<T> x(count), y(k.arity() == 2 ? count : 0);
  for (auto& v : x) v = static_cast<T>(dist(rng));
  for (auto& v : y) v = static_cast<T>(dist(rng));
  const std::vector<T> want = reference<T>(k, x, y);
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
        const point p =
            run_point<T>(base, lanes, size, k, std::span<const T>(x), std::span<const T>(y),
                         std::span<const T>(want), std::span<T>(output, count), flags.repeat);
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
    write_file(flags.csv_path, [&](std::ostream& csv) {
      csv << "lanes,chunk_bytes,dtype,kernel,total_bytes,seconds,input_gb_per_s,"
             "fraction_of_limit\n";
      for (const auto& p : points)
        csv << p.lanes << ',' << p.chunk_bytes << ',' << flags.dtype << ',' << flags.kernel << ','
            << total << ',' << p.seconds << ',' << p.gb_per_s << ',' << p.gb_per_s / limits.both
            << '\n';
    });
  }
  if (!flags.json_path.empty()) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& p : points)
      rows.push_back({{"lanes", p.lanes},
                      {"chunk_bytes", p.chunk_bytes},
                      {"seconds", p.seconds},
                      {"input_gb_per_s", p.gb_per_s},
                      {"fraction_of_limit", p.gb_per_s / limits.both}});
    const nlohmann::json results = {
        {"backend", backend},
        {"dtype", flags.dtype},
        {"kernel", flags.kernel},
        {"total_bytes", total},
        {"limits_gb_per_s", {{"h2d", limits.h2d}, {"d2h", limits.d2h}, {"both", limits.both}}},
        {"points", std::move(rows)}};
    write_file(flags.json_path, [&](std::ostream& out) {
      out << results.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    });
  }
  return 0;
}

}  // namespace

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int run_bench(const gpupool::executor_options& base, const bench_flags& flags) {
  for (const gpupool::dtype_info& t : gpupool::dtypes)
    if (flags.dtype == t.name)
      return gpupool::visit_dtype(t.type, [&]<class T>() { return sweep<T>(base, flags); });
  throw std::invalid_argument("bench: no dtype is named '" + flags.dtype + "'");
}

}  // namespace gpupool_cli
