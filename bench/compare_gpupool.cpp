// gpupool from C++, for `gpupool compare`: one workload per run, with the executor's defaults and
// then over a sweep of lanes x chunk_bytes, one JSON object per line (see compare_common.hpp).
// Every run's results are checked against the CPU before its times are printed.
//
//   gpupool_bench_compare --workload W1|W2|W3|W4|W5|W6|W6c [--chunks N] [--size N] [--fmas N]
//       [--repeat N] [--min-repeat N] [--seconds S] [--backend cpu|cuda]
//       [--lanes-list 4,8,16] [--chunk-list 1048576,8388608] [--host-lanes-list 2,8]
//
// --host-lanes-list adds, for W1, W2 and W4, runs with the defaults and that many host lanes
// (executor_options::host_lanes), each reporting where its calls ran.
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "compare_common.hpp"
#include "gpupool/gpupool.hpp"

namespace {

using compare::options;

struct setting {
  int lanes = 0;             // 0: the executor's default
  std::size_t chunk = 0;     // 0: the executor's default
  std::vector<int> devices;  // empty: every device
  bool sweep = false;
  int host_lanes = 0;
};

gpupool::executor_options executor_options_for(const options& o, const setting& s) {
  gpupool::executor_options eo;
  if (o.backend == "cpu") eo.backend = gpupool::backend_kind::cpu;
  if (o.backend == "cuda") eo.backend = gpupool::backend_kind::cuda;
  eo.lanes_per_device = s.lanes;
  if (s.chunk) eo.chunk_bytes = s.chunk;
  eo.devices = s.devices;
  eo.host_lanes = s.host_lanes;
  eo.quiet = true;
  return eo;
}

std::string describe(const gpupool::executor& ex, const setting& s) {
  std::string text = s.lanes == 0 && s.chunk == 0 ? "defaults (" : "";
  text += std::to_string(ex.lanes_per_device()) + " lanes x " +
          std::to_string(ex.chunk_bytes() >> 10) + " KiB";
  if (s.lanes == 0 && s.chunk == 0) text += ")";
  if (ex.host_lanes() > 0) text += " + " + std::to_string(ex.host_lanes()) + " host lanes";
  return text;
}

std::string settings_json(const gpupool::executor& ex) {
  return "{\"lanes\": " + std::to_string(ex.lanes_per_device()) +
         ", \"chunk_bytes\": " + std::to_string(ex.chunk_bytes()) +
         ", \"devices\": " + std::to_string(ex.devices().size()) + "}";
}

// Where an executor with host lanes ran its small calls, for a variant's name.
std::string placement_note(const gpupool::executor& ex) {
  if (ex.host_lanes() == 0) return {};
  const gpupool::placement_stats p = ex.placement();
  const double all = static_cast<double>(p.host_tasks + p.device_tasks);
  char text[96];
  std::snprintf(text, sizeof text, ", %.0f%% of calls on the host",
                all > 0 ? 100.0 * static_cast<double>(p.host_tasks) / all : 0.0);
  return text;
}

// The settings a workload runs with: the defaults, the defaults with host lanes, then the sweep
// (lanes only where pieces never split a task).
std::vector<setting> settings_for(const options& o, bool chunks_matter) {
  std::vector<setting> out{setting{}};
  for (int host : o.host_lanes_list) out.push_back({0, 0, {}, false, host});
  for (int lanes : o.lanes_list) {
    if (!chunks_matter || o.chunk_list.empty()) {
      out.push_back({lanes, 0, {}, true});
      continue;
    }
    for (std::size_t chunk : o.chunk_list) out.push_back({lanes, chunk, {}, true});
  }
  return out;
}

template <class Out>
std::string check_squares(const std::vector<std::vector<double>>& in, const Out& out) {
  if (out.size() != in.size()) return "wrong number of results";
  for (std::size_t c = 0; c < in.size(); ++c) {
    if (out[c].size() != in[c].size()) return "result " + std::to_string(c) + " has a wrong size";
    for (std::size_t i = 0; i < in[c].size(); ++i)
      if (out[c][i] != in[c][i] * in[c][i])
        return "result " + std::to_string(c) + " element " + std::to_string(i) + " is wrong";
  }
  return {};
}

std::vector<std::vector<double>> float64_chunks(const options& o) {
  std::vector<std::vector<double>> in(o.chunks, std::vector<double>(o.size));
  for (std::size_t c = 0; c < in.size(); ++c) compare::fill(in[c], c);
  return in;
}

// W1, W2 (NumPy-like: pageable in, new vectors out), W4 (many tiny tasks).
void map_squares(const options& o, const std::string& unit, double amount, bool chunks_matter) {
  const auto in = float64_chunks(o);
  for (const setting& s : settings_for(o, chunks_matter)) {
    gpupool::executor ex(executor_options_for(o, s));
    std::vector<gpupool::host_vector<double>> out;
    // The last run's results go first: kept while the next map runs, they would make it take a
    // second set of pinned blocks (a one-time cost that would land in a timed run).
    auto run = [&] {
      out.clear();
      out = ex.map(gpupool::builtin_kernel::square(), in).get();
    };
    std::string why;
    const auto seconds = compare::timed(
        o, run, [&] { return check_squares(in, out); }, why);
    compare::emit(o.workload, "map, " + describe(ex, s) + placement_note(ex), "gpupool", unit,
                  amount, seconds, why, settings_json(ex), s.sweep);
  }
}

// W3: inputs and outputs in pinned memory, each chunk streamed by transform.
void pinned_squares(const options& o) {
  const auto pageable = float64_chunks(o);
  std::vector<gpupool::pinned_vector<double>> in, out;
  for (const auto& p : pageable) {
    in.emplace_back(p.begin(), p.end());
    out.emplace_back(p.size(), std::numeric_limits<double>::quiet_NaN());
  }
  const double gigabytes = static_cast<double>(o.chunks * o.size * sizeof(double)) / 1e9;
  for (const setting& s : settings_for(o, true)) {
    if (s.host_lanes > 0) continue;  // its chunks are too large for host lanes
    gpupool::executor ex(executor_options_for(o, s));
    for (auto& v : out) std::fill(v.begin(), v.end(), std::numeric_limits<double>::quiet_NaN());
    auto run = [&] {
      gpupool::multi_future<void> done;
      for (std::size_t c = 0; c < in.size(); ++c)
        done.push_back(ex.transform(gpupool::builtin_kernel::square(),
                                    std::span<const double>(in[c]), std::span<double>(out[c])));
      done.get();
    };
    std::string why;
    const auto seconds = compare::timed(
        o, run, [&] { return check_squares(pageable, out); }, why);
    compare::emit(o.workload, "transform, pinned in and out, " + describe(ex, s), "gpupool", "GB/s",
                  gigabytes, seconds, why, settings_json(ex), s.sweep);
  }
}

// W5: a compiled FMA chain over chunks already on the device.
void on_device(const options& o) {
  const std::string body = "float v = x;\nfor (int i = 0; i < " + std::to_string(o.fmas) +
                           "; ++i) v = v * a + b;\ny = v;";
  const gpupool::elementwise_kernel k("float32 x, float32 a, float32 b", "float32 y", body,
                                      "compare_w5_" + std::to_string(o.fmas));
  const float a = 0.999f, b = 0.001f;
  const std::size_t total = o.chunks * o.size;
  std::vector<float> host(total);
  for (std::size_t i = 0; i < total; ++i)
    host[i] = static_cast<float>(static_cast<double>((i * 2654435761u) % 2000u) * 0.001 - 1.0);

  for (const setting& base : settings_for(o, false)) {
    if (base.host_lanes > 0) continue;  // host lanes take no compiled kernel
    setting s = base;
    s.devices = {0};
    gpupool::executor ex(executor_options_for(o, s));
    gpupool::device_array<float> x, y;
    ex.submit([&](gpupool::lane& l) {
        x = l.upload(std::span<const float>(host));
        y = l.allocate<float>(total);
      }).get();
    std::vector<gpupool::device_call> calls;
    for (std::size_t c = 0; c < o.chunks; ++c)
      calls.push_back({{std::span<const float>(x.data() + c * o.size, o.size), a, b},
                       y.data() + c * o.size,
                       o.size});
    // Reads a sample back and poisons the outputs, so that the next run must write them again.
    auto check = [&]() -> std::string {
      std::vector<float> got(total);
      ex.submit([&](gpupool::lane& l) {
          l.download(y, std::span<float>(got));
          l.run(gpupool::elementwise_kernel("float32 x", "float32 y", "y = -12345.0f;", "poison"),
                {x}, y);
        }).get();
      for (std::size_t i = 0; i < total; i += std::max<std::size_t>(1, total / 4093))
        if (!compare::fma_close(got[i], compare::fma_chain(host[i], o.fmas)))
          return "element " + std::to_string(i) + " differs from the CPU's";
      return {};
    };
    auto one_launch = [&] { ex.submit([&](gpupool::lane& l) { l.run(k, {x, a, b}, y); }).get(); };
    auto mapped = [&] { ex.map_on_device(0, k, calls).get(); };
    auto tasks = [&] {
      gpupool::multi_future<void> fs;
      for (const auto& call : calls)
        fs.push_back(ex.submit([&k, &call](gpupool::lane& l) {
          l.run_bytes(k, call.inputs, gpupool::dtype::float32, call.out, call.count);
        }));
      fs.get();
    };
    std::string why;
    const double n = static_cast<double>(o.chunks);
    if (!s.sweep) {
      auto t = compare::timed(o, one_launch, check, why);
      compare::emit(o.workload, "one launch over all the data (limit)", "limit", "ms", n, t, why,
                    settings_json(ex));
      t = compare::timed(o, tasks, check, why);
      compare::emit(o.workload, "one submitted task per chunk, " + describe(ex, s), "gpupool", "ms",
                    n, t, why, settings_json(ex));
    }
    const auto t = compare::timed(o, mapped, check, why);
    compare::emit(o.workload, "map_on_device, " + describe(ex, s), "gpupool", "ms", n, t, why,
                  settings_json(ex), s.sweep);
    ex.submit([&](gpupool::lane&) {
        x = {};
        y = {};
      }).get();
  }
}

// W6 and W6c: the same work on every device, then on the first; one speed-up line.
void every_device_vs_one(const options& o, bool compute) {
  std::vector<std::vector<double>> in64;
  std::vector<std::vector<float>> in32;
  std::vector<gpupool::host_vector<double>> out64;
  std::vector<std::vector<float>> out32;
  const std::string body = "float v = x;\nfor (int i = 0; i < " + std::to_string(o.fmas) +
                           "; ++i) v = v * a + x;\ny = v;";
  const gpupool::elementwise_kernel k("float32 x, float32 a", "float32 y", body,
                                      "compare_w6c_" + std::to_string(o.fmas));
  if (compute) {
    in32.assign(o.chunks, std::vector<float>(o.size));
    out32.assign(o.chunks, std::vector<float>(o.size));
    for (std::size_t c = 0; c < o.chunks; ++c)
      for (std::size_t i = 0; i < o.size; ++i)
        in32[c][i] = static_cast<float>(
            static_cast<double>((i * 2654435761u + c * 977u) % 2000u) * 0.001 - 1.0);
  } else {
    in64 = float64_chunks(o);
  }
  const double gigabytes =
      static_cast<double>(o.chunks * o.size) * (compute ? sizeof(float) : sizeof(double)) / 1e9;
  auto check = [&]() -> std::string {
    if (!compute) return check_squares(in64, out64);
    for (std::size_t c = 0; c < o.chunks; ++c)
      for (std::size_t i = 0; i < o.size; i += std::max<std::size_t>(1, o.size / 16)) {
        if (!compare::fma_close(out32[c][i], compare::fma_chain(in32[c][i], o.fmas, true)))
          return "chunk " + std::to_string(c) + " element " + std::to_string(i) + " is wrong";
        out32[c][i] = -12345.0f;  // the next run must write it again
      }
    return {};
  };
  std::vector<std::vector<double>> times(2);
  std::string why, label;
  for (int pass = 0; pass < 2 && why.empty(); ++pass) {
    setting s;
    if (pass == 1) s.devices = {0};
    gpupool::executor ex(executor_options_for(o, s));
    if (pass == 0) label = describe(ex, s);
    auto run = [&] {
      if (!compute) {
        out64 = ex.map(gpupool::builtin_kernel::square(), in64).get();
        return;
      }
      gpupool::multi_future<void> done;
      for (std::size_t c = 0; c < o.chunks; ++c)
        done.push_back(ex.transform<float>(k, {std::span<const float>(in32[c]), 0.999f},
                                           std::span<float>(out32[c])));
      done.get();
    };
    times[pass] = compare::timed(o, run, check, why);
  }
  const std::string variant = (compute ? "compiled kernel, " : "map, ") + label;
  if (!why.empty()) {
    compare::emit(o.workload, variant, "gpupool", "x", gigabytes, {}, why);
    return;
  }
  const double every = gigabytes / compare::median(times[0]);
  const double one = gigabytes / compare::median(times[1]);
  std::printf(
      "{\"workload\": \"%s\", \"variant\": \"%s\", \"kind\": \"gpupool\", \"unit\": \"x\", "
      "\"value\": %.6g, \"status\": \"ok\", \"repeats_s\": [%.9f], \"per_device\": "
      "{\"gb_per_s_every_gpu\": %.6g, \"gb_per_s_one_gpu\": %.6g}}\n",
      o.workload.c_str(), compare::escape(variant).c_str(), every / one, compare::median(times[0]),
      every, one);
}

constexpr char usage[] =
    "usage: gpupool_bench_compare --workload W1|W2|W3|W4|W5|W6|W6c [--chunks N] [--size N]\n"
    "           [--fmas N] [--repeat N] [--min-repeat N] [--seconds S] [--backend cpu|cuda]\n"
    "           [--lanes-list 4,8,16] [--chunk-list 1048576,8388608] [--host-lanes-list 2,8]\n"
    "\n"
    "gpupool from C++ on one workload of `gpupool compare`: the executor's defaults, then a\n"
    "sweep of lanes x chunk bytes; one JSON object per line, each run's results checked first.\n"
    "  --chunks, --size   inputs, and float64 per input (float32 for W5, W6c)\n"
    "                     (default 5 x 1000000)\n"
    "  --fmas             dependent FMAs per element, W5 and W6c (default 2048)\n"
    "  --repeat, --min-repeat, --seconds\n"
    "                     timed runs after one warm-up: at most --repeat, stopping past\n"
    "                     --seconds once --min-repeat ran (default 7, 3, 1.5)\n"
    "  --backend          the executor's backend (default: the executor's choice)\n"
    "  --lanes-list, --chunk-list\n"
    "                     the sweep's lanes per device and chunk bytes (default: none)\n"
    "  --host-lanes-list  W1, W2 and W4 also with the defaults and that many host lanes\n";

}  // namespace

int main(int argc, char** argv) {
  const options o = compare::parse(argc, argv, usage);
  try {
    const double gigabytes = static_cast<double>(o.chunks * o.size * sizeof(double)) / 1e9;
    if (o.workload == "W1")
      map_squares(o, "ms", static_cast<double>(o.chunks), true);
    else if (o.workload == "W2")
      map_squares(o, "GB/s", gigabytes, true);
    else if (o.workload == "W3")
      pinned_squares(o);
    else if (o.workload == "W4")
      map_squares(o, "tasks/s", static_cast<double>(o.chunks), false);
    else if (o.workload == "W5")
      on_device(o);
    else if (o.workload == "W6" || o.workload == "W6c")
      every_device_vs_one(o, o.workload == "W6c");
    else {
      std::fprintf(stderr, "unknown workload %s (W1, W2, W3, W4, W5, W6, W6c)\n",
                   o.workload.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpupool_bench_compare: %s\n", e.what());
    return 1;
  }
  return 0;
}
