// W5: a compute-heavy elementwise kernel (2,048 dependent FMAs per element) over 2,000 chunks of
// 16,384 float32 already in device memory. Compares, in one run:
//   one launch   - the kernel once over all the data (the limit)
//   map          - executor::map_on_device over the 2,000 chunks (batched launches)
//   tasks        - one submitted task per chunk, each running the kernel with lane::run
// Every result is checked against a CPU reference before any time is reported.
//
//   gpupool_bench_w5 [--chunks N] [--size N] [--fmas N] [--repeat N] [--lanes N] [--backend B]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "compare_common.hpp"
#include "gpupool/gpupool.hpp"

namespace {

struct settings {
  std::size_t chunks = 2000;
  std::size_t size = 16384;
  int fmas = 2048;
  int repeat = 10;
  int lanes = 0;
  std::string backend;
};

constexpr char usage[] =
    "usage: gpupool_bench_w5 [--chunks N] [--size N] [--fmas N] [--repeat N] [--lanes N]\n"
    "                        [--backend cpu|cuda]\n"
    "\n"
    "W5 from C++: a kernel of --fmas dependent FMAs per element over --chunks chunks of --size\n"
    "float32 on the device, as one launch, through map_on_device and as one task per chunk;\n"
    "results checked against the CPU, then the median of --repeat runs of each.\n"
    "Defaults: 2000 chunks x 16384, 2048 FMAs, 10 runs, the executor's lanes and backend.\n";

// The options (compare::read_options says how -h, --help and mistakes are met).
settings parse(int argc, char** argv) {
  settings s;
  compare::read_options(
      argc, argv, usage,
      {{"--chunks", [&](const std::string& v) { s.chunks = compare::to_number<std::size_t>(v); }},
       {"--size", [&](const std::string& v) { s.size = compare::to_number<std::size_t>(v); }},
       {"--fmas", [&](const std::string& v) { s.fmas = compare::to_number<int>(v); }},
       {"--repeat", [&](const std::string& v) { s.repeat = compare::to_number<int>(v); }},
       {"--lanes", [&](const std::string& v) { s.lanes = compare::to_number<int>(v); }},
       {"--backend", [&](const std::string& v) { s.backend = v; }}});
  if (s.chunks == 0 || s.size == 0 || s.fmas < 1 || s.repeat < 1 || s.lanes < 0) {
    std::fprintf(stderr, "sizes, FMAs and repeats must be positive, lanes not negative\n");
    std::exit(2);
  }
  return s;
}

template <class F>
double median_ms(int repeat, F&& run) {
  run();  // warm-up: compiles or loads the kernel, fills the memory pool
  std::vector<double> ms;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const settings s = parse(argc, argv);
  gpupool::executor_options options;
  if (s.backend == "cpu") options.backend = gpupool::backend_kind::cpu;
  if (s.backend == "cuda") options.backend = gpupool::backend_kind::cuda;
  options.lanes_per_device = s.lanes;
  options.devices = {0};
  gpupool::executor ex(options);

  const gpupool::elementwise_kernel k("float32 x, float32 a, float32 b", "float32 y",
                                      "float v = x;\nfor (int i = 0; i < " +
                                          std::to_string(s.fmas) + "; ++i) v = v * a + b;\ny = v;",
                                      "w5_fma_chain");
  const float a = 0.999f, b = 0.001f;
  const std::size_t total = s.chunks * s.size;

  std::vector<float> host(total);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& v : host) v = dist(rng);

  // Inputs and outputs stay on the device for the whole run; chunks are views into them.
  gpupool::device_array<float> x, y;
  ex.submit([&](gpupool::lane& l) {
      x = l.upload(std::span<const float>(host));
      y = l.allocate<float>(total);
    }).get();
  std::vector<gpupool::device_call> calls;
  for (std::size_t c = 0; c < s.chunks; ++c)
    calls.push_back({{std::span<const float>(x.data() + c * s.size, s.size), a, b},
                     y.data() + c * s.size,
                     s.size});

  // Checks a sample of the results against the CPU (the GPU fuses each step into one FMA).
  auto check = [&](const char* what) {
    std::vector<float> got(total);
    ex.submit([&](gpupool::lane& l) {
        l.download(y, std::span<float>(got));
        l.run(gpupool::elementwise_kernel("float32 x", "float32 y", "y = -12345.0f;", "poison"),
              {x}, y);
      }).get();
    for (std::size_t i = 0; i < total; i += std::max<std::size_t>(1, total / 4093)) {
      float v = host[i];
      for (int r = 0; r < s.fmas; ++r) v = std::fma(v, a, b);
      if (std::abs(got[i] - v) > 1e-4f * (1.0f + std::abs(v))) {
        std::fprintf(stderr, "%s: element %zu is %g, the CPU says %g\n", what, i, got[i], v);
        std::exit(1);
      }
    }
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

  one_launch();
  check("one launch");
  mapped();
  check("map_on_device");
  tasks();
  check("one task per chunk");

  const double t_one = median_ms(s.repeat, one_launch);
  const double t_map = median_ms(s.repeat, mapped);
  const double t_tasks = median_ms(s.repeat, tasks);
  std::printf("W5 on %s (%s, %d lanes): %zu chunks x %zu float32, %d dependent FMAs each\n",
              ex.devices()[0].name.c_str(), gpupool::to_string(ex.backend()), ex.lanes_per_device(),
              s.chunks, s.size, s.fmas);
  std::printf("  one launch over all   %9.3f ms\n", t_one);
  std::printf("  map_on_device         %9.3f ms  (%.2fx one launch)\n", t_map, t_map / t_one);
  std::printf("  one task per chunk    %9.3f ms  (%.2fx one launch)\n", t_tasks, t_tasks / t_one);
  std::printf("results checked against the CPU; medians of %d runs after a warm-up\n", s.repeat);
  ex.submit([&](gpupool::lane&) {
      x = {};
      y = {};
    }).get();
  return 0;
}
