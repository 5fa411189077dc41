// A plain hand-written CUDA pipeline with no gpupool, for `gpupool compare`: what a careful
// programmer writes by hand. Each thread owns a non-blocking stream, pinned staging buffers and
// device buffers made once; per chunk it copies the pageable input into pinned memory, uploads,
// runs the kernel, downloads and copies the result out (W1, W2, W4, W6), or moves pinned inputs
// and outputs directly (W3), or launches on data already on the GPU (W5). It also measures the
// machine's limits (--workload limits): pinned copies each way and both at once per GPU and on
// every GPU together, and the launch latency. One JSON object per line (compare_common.hpp);
// results are checked against the CPU before any time is printed.
//
//   gpupool_baseline_pipeline --workload limits|W1|W2|W3|W4|W5|W6|W6c [--chunks N] [--size N]
//       [--fmas N] [--repeat N] [--min-repeat N] [--seconds S] [--threads-list 1,4,8,16]
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "compare_common.hpp"

namespace {

using compare::options;

void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(status));
}
#define CUDA(call) check_cuda((call), #call)

__global__ void square_kernel(const double* x, double* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    y[i] = x[i] * x[i];
}

// v = v * a + b (W5), or v = v * a + x (W6c, add_input: the result depends on the input however
// long the chain).
__global__ void fma_kernel(const float* x, float* y, std::size_t n, int fmas, float a, float b,
                           bool add_input) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    float v = x[i];
    const float addend = add_input ? v : b;
    for (int k = 0; k < fmas; ++k) v = v * a + addend;
    y[i] = v;
  }
}

__global__ void empty_kernel() {}

unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 65535));
}

template <class T>
void launch(cudaStream_t s, const T* x, T* y, std::size_t n, int fmas, bool add_input = false) {
  if constexpr (sizeof(T) == sizeof(double))
    square_kernel<<<blocks_for(n), 256, 0, s>>>(x, y, n);
  else
    fma_kernel<<<blocks_for(n), 256, 0, s>>>(x, y, n, fmas, 0.999f, 0.001f, add_input);
  CUDA(cudaGetLastError());
}

int device_count() {
  int n = 0;
  CUDA(cudaGetDeviceCount(&n));
  if (n < 1) throw std::runtime_error("no CUDA device");
  return n;
}

// Runs `body(thread index)` on `threads` threads; rethrows the first exception.
template <class F>
void on_threads(int threads, F&& body) {
  std::mutex lock;
  std::exception_ptr first;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        body(t);
      } catch (...) {
        std::lock_guard<std::mutex> hold(lock);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

// One worker's resources, made once and reused by every run.
template <class T>
struct worker {
  int device = 0;
  cudaStream_t stream = nullptr;
  T* pinned_in = nullptr;
  T* pinned_out = nullptr;
  T* device_in = nullptr;
  T* device_out = nullptr;

  worker(int dev, std::size_t largest, bool staging) : device(dev) {
    CUDA(cudaSetDevice(device));
    CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (staging) {
      CUDA(cudaMallocHost(&pinned_in, largest * sizeof(T)));
      CUDA(cudaMallocHost(&pinned_out, largest * sizeof(T)));
    }
    CUDA(cudaMalloc(&device_in, largest * sizeof(T)));
    CUDA(cudaMalloc(&device_out, largest * sizeof(T)));
  }
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
  ~worker() {
    cudaSetDevice(device);
    cudaFreeHost(pinned_in);
    cudaFreeHost(pinned_out);
    cudaFree(device_in);
    cudaFree(device_out);
    cudaStreamDestroy(stream);
  }
};

// The pipeline over host chunks: `threads` workers spread over `devices`; each takes the next
// chunk, stages it (unless the host memory is pinned already), uploads, runs the kernel,
// downloads and waits. Outputs are written in place (made once, warm, like pinned slots).
template <class T>
struct pipeline {
  std::vector<std::unique_ptr<worker<T>>> workers;
  bool staging;
  int fmas;
  bool add_input = false;

  pipeline(int threads, int devices, std::size_t largest, bool stage, int fma_count,
           bool chain_adds_input)
      : staging(stage), fmas(fma_count), add_input(chain_adds_input) {
    for (int t = 0; t < threads; ++t)
      workers.push_back(std::make_unique<worker<T>>(t % devices, largest, stage));
  }

  void run(const std::vector<T*>& in, const std::vector<T*>& out, std::size_t size) {
    std::atomic<std::size_t> next{0};
    on_threads(static_cast<int>(workers.size()), [&](int t) {
      worker<T>& w = *workers[t];
      CUDA(cudaSetDevice(w.device));
      const std::size_t bytes = size * sizeof(T);
      for (std::size_t c = next++; c < in.size(); c = next++) {
        const T* source = in[c];
        T* target = out[c];
        if (staging) {
          std::memcpy(w.pinned_in, in[c], bytes);
          source = w.pinned_in;
          target = w.pinned_out;
        }
        CUDA(cudaMemcpyAsync(w.device_in, source, bytes, cudaMemcpyHostToDevice, w.stream));
        launch<T>(w.stream, w.device_in, w.device_out, size, fmas, add_input);
        CUDA(cudaMemcpyAsync(target, w.device_out, bytes, cudaMemcpyDeviceToHost, w.stream));
        CUDA(cudaStreamSynchronize(w.stream));
        if (staging) std::memcpy(out[c], w.pinned_out, bytes);
      }
    });
  }
};

// Inputs and outputs of W1-W4 and W6 (float64 squared) or W6c (float32 FMA chain). `pinned`
// puts both in pinned memory (W3).
template <class T>
struct host_data {
  std::vector<T*> in, out;
  std::size_t size;
  bool pinned;
  std::vector<std::vector<T>> in_store, out_store;

  host_data(std::size_t chunks, std::size_t n, bool pin) : size(n), pinned(pin) {
    for (std::size_t c = 0; c < chunks; ++c) {
      T* i = nullptr;
      T* o = nullptr;
      if (pinned) {
        CUDA(cudaMallocHost(&i, n * sizeof(T)));
        CUDA(cudaMallocHost(&o, n * sizeof(T)));
      } else {
        in_store.emplace_back(n);
        out_store.emplace_back(n);
        i = in_store.back().data();
        o = out_store.back().data();
      }
      std::vector<T> values(n);
      compare::fill(values, c);
      if constexpr (sizeof(T) == sizeof(float))
        for (auto& v : values) v *= 0.1f;  // FMA inputs in [-1, 1)
      std::memcpy(i, values.data(), n * sizeof(T));
      std::fill(o, o + n, std::numeric_limits<T>::quiet_NaN());
      in.push_back(i);
      out.push_back(o);
    }
  }
  host_data(const host_data&) = delete;
  host_data& operator=(const host_data&) = delete;
  ~host_data() {
    if (pinned)
      for (std::size_t c = 0; c < in.size(); ++c) {
        cudaFreeHost(in[c]);
        cudaFreeHost(out[c]);
      }
  }

  // Checks every result (squares) or a sample (FMA chains), then poisons what it read so that
  // the next run must write it again.
  std::string check(int fmas, bool add_input) {
    for (std::size_t c = 0; c < in.size(); ++c) {
      const std::size_t step =
          sizeof(T) == sizeof(double) ? 1 : std::max<std::size_t>(1, size / 16);
      for (std::size_t i = 0; i < size; i += step) {
        const bool ok =
            sizeof(T) == sizeof(double)
                ? out[c][i] == in[c][i] * in[c][i]
                : compare::fma_close(out[c][i], compare::fma_chain(in[c][i], fmas, add_input));
        if (!ok)
          return "chunk " + std::to_string(c) + " element " + std::to_string(i) + " is wrong";
        out[c][i] = std::numeric_limits<T>::quiet_NaN();
      }
    }
    return {};
  }
};

std::vector<int> threads_or(const options& o, std::vector<int> fallback) {
  return o.threads_list.empty() ? fallback : o.threads_list;
}

std::string threads_json(int threads, int devices) {
  return "{\"threads\": " + std::to_string(threads) + ", \"devices\": " + std::to_string(devices) +
         "}";
}

void host_workload(const options& o, bool pinned, const std::string& unit, double amount,
                   std::vector<int> fallback) {
  host_data<double> data(o.chunks, o.size, pinned);
  for (int threads : threads_or(o, fallback)) {
    pipeline<double> p(threads, 1, o.size, !pinned, 0, false);
    std::string why;
    const auto t = compare::timed(
        o, [&] { p.run(data.in, data.out, o.size); }, [&] { return data.check(0, false); }, why);
    compare::emit(
        o.workload,
        "hand-written C++ pipeline, " + std::to_string(threads) +
            (pinned ? " threads (pinned in and out)" : " threads (staged through pinned)"),
        "alternative", unit, amount, t, why, threads_json(threads, 1));
  }
}

// W5: chunks already on the GPU; each thread launches its share on its own stream.
void on_device(const options& o) {
  const std::size_t total = o.chunks * o.size;
  std::vector<float> host(total);
  compare::fill(host, 0);
  for (auto& v : host) v *= 0.1f;
  CUDA(cudaSetDevice(0));
  float *x = nullptr, *y = nullptr;
  CUDA(cudaMalloc(&x, total * sizeof(float)));
  CUDA(cudaMalloc(&y, total * sizeof(float)));
  CUDA(cudaMemcpy(x, host.data(), total * sizeof(float), cudaMemcpyHostToDevice));
  auto check = [&]() -> std::string {
    std::vector<float> got(total);
    CUDA(cudaDeviceSynchronize());
    CUDA(cudaMemcpy(got.data(), y, total * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA(cudaMemset(y, 0xff, total * sizeof(float)));  // NaNs: the next run must write again
    for (std::size_t i = 0; i < total; i += std::max<std::size_t>(1, total / 4093))
      if (!compare::fma_close(got[i], compare::fma_chain(host[i], o.fmas)))
        return "element " + std::to_string(i) + " differs from the CPU's";
    return {};
  };
  const double n = static_cast<double>(o.chunks);
  std::string why;
  auto t = compare::timed(
      o,
      [&] {
        launch<float>(nullptr, x, y, total, o.fmas);
        CUDA(cudaDeviceSynchronize());
      },
      check, why);
  compare::emit("W5", "CUDA one launch over all the data (limit)", "limit", "ms", n, t, why);
  for (int threads : threads_or(o, {1, 4, 16})) {
    std::vector<cudaStream_t> streams(threads);
    for (auto& s : streams) CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto run = [&] {
      std::atomic<std::size_t> next{0};
      on_threads(threads, [&](int th) {
        CUDA(cudaSetDevice(0));
        for (std::size_t c = next++; c < o.chunks; c = next++)
          launch<float>(streams[th], x + c * o.size, y + c * o.size, o.size, o.fmas);
        CUDA(cudaStreamSynchronize(streams[th]));
      });
    };
    t = compare::timed(o, run, check, why);
    compare::emit("W5",
                  "hand-written C++, one launch per chunk, " + std::to_string(threads) +
                      " threads (a stream each)",
                  "alternative", "ms", n, t, why, threads_json(threads, 1));
    for (auto& s : streams) cudaStreamDestroy(s);
  }
  cudaFree(x);
  cudaFree(y);
}

// W6 and W6c: 8 threads per GPU on every GPU, then on the first; one speed-up line.
template <class T>
void every_device_vs_one(const options& o) {
  const int devices = device_count();
  const int per_device = o.threads_list.empty() ? 8 : o.threads_list.front();
  host_data<T> data(o.chunks, o.size, false);
  const int fmas = sizeof(T) == sizeof(double) ? 0 : o.fmas;
  const double gigabytes = static_cast<double>(o.chunks * o.size * sizeof(T)) / 1e9;
  std::vector<double> medians;
  std::string why;
  for (int used : {devices, 1}) {
    pipeline<T> p(per_device * used, used, o.size, true, fmas, fmas > 0);
    const auto t = compare::timed(
        o, [&] { p.run(data.in, data.out, o.size); }, [&] { return data.check(fmas, fmas > 0); },
        why);
    if (!why.empty()) break;
    medians.push_back(compare::median(t));
  }
  const std::string variant =
      "hand-written C++ pipeline, " + std::to_string(per_device) + " threads per GPU";
  if (!why.empty()) {
    compare::emit(o.workload, variant, "alternative", "x", gigabytes, {}, why);
    return;
  }
  std::printf(
      "{\"workload\": \"%s\", \"variant\": \"%s\", \"kind\": \"alternative\", \"unit\": \"x\", "
      "\"value\": %.6g, \"status\": \"ok\", \"repeats_s\": [%.9f], \"per_device\": "
      "{\"gb_per_s_every_gpu\": %.6g, \"gb_per_s_one_gpu\": %.6g, \"devices\": %d}}\n",
      o.workload.c_str(), variant.c_str(), medians[1] / medians[0], medians[0],
      gigabytes / medians[0], gigabytes / medians[1], devices);
}

// Pinned copies each way and both at once, per GPU and on every GPU together; launch latency.
void limits(const options& o) {
  const int devices = device_count();
  const std::size_t bytes = o.size;
  constexpr int rounds = 5;
  struct buffers {
    void *host_in = nullptr, *host_out = nullptr, *dev_in = nullptr, *dev_out = nullptr;
    cudaStream_t up = nullptr, down = nullptr;
  };
  std::vector<buffers> b(devices);
  for (int d = 0; d < devices; ++d) {
    CUDA(cudaSetDevice(d));
    CUDA(cudaMallocHost(&b[d].host_in, bytes));
    CUDA(cudaMallocHost(&b[d].host_out, bytes));
    std::memset(b[d].host_in, 7, bytes);
    CUDA(cudaMalloc(&b[d].dev_in, bytes));
    CUDA(cudaMalloc(&b[d].dev_out, bytes));
    CUDA(cudaStreamCreateWithFlags(&b[d].up, cudaStreamNonBlocking));
    CUDA(cudaStreamCreateWithFlags(&b[d].down, cudaStreamNonBlocking));
  }
  // Seconds for `rounds` copies in the chosen directions on the chosen devices at once.
  auto copies = [&](const std::vector<int>& on, bool up, bool down) {
    std::barrier<> start(static_cast<std::ptrdiff_t>(on.size()));
    std::vector<double> seconds(on.size());
    on_threads(static_cast<int>(on.size()), [&](int t) {
      const buffers& x = b[on[t]];
      CUDA(cudaSetDevice(on[t]));
      auto issue = [&] {
        if (up) CUDA(cudaMemcpyAsync(x.dev_in, x.host_in, bytes, cudaMemcpyHostToDevice, x.up));
        if (down)
          CUDA(cudaMemcpyAsync(x.host_out, x.dev_out, bytes, cudaMemcpyDeviceToHost, x.down));
      };
      issue();
      CUDA(cudaDeviceSynchronize());
      start.arrive_and_wait();
      const auto t0 = compare::clock_type::now();
      for (int r = 0; r < rounds; ++r) issue();
      CUDA(cudaStreamSynchronize(x.up));
      CUDA(cudaStreamSynchronize(x.down));
      seconds[t] = std::chrono::duration<double>(compare::clock_type::now() - t0).count();
    });
    return *std::max_element(seconds.begin(), seconds.end());
  };
  const double gb = static_cast<double>(bytes) * rounds / 1e9;
  auto best_of = [&](const std::vector<int>& on, bool up, bool down) {
    double fastest = 1e300;
    for (int r = 0; r < std::max(1, o.min_repeat); ++r)
      fastest = std::min(fastest, copies(on, up, down));
    return gb * static_cast<double>(on.size()) / fastest;
  };
  for (int d = 0; d < devices; ++d) {
    const std::string gpu = "GPU " + std::to_string(d);
    const std::string suffix = d == 0 ? "" : "_gpu" + std::to_string(d);
    compare::emit_value("pinned copies host to device, " + gpu, "GB/s", best_of({d}, true, false),
                        "h2d_gb_s" + suffix);
    compare::emit_value("pinned copies device to host, " + gpu, "GB/s", best_of({d}, false, true),
                        "d2h_gb_s" + suffix);
    compare::emit_value("pinned copies each way at once, " + gpu + " (GB/s each way)", "GB/s",
                        best_of({d}, true, true), "both_gb_s" + suffix);
  }
  std::vector<int> all;
  for (int d = 0; d < devices; ++d) all.push_back(d);
  compare::emit_value("pinned copies host to device, every GPU at once", "GB/s",
                      best_of(all, true, false), "all_h2d_gb_s");
  compare::emit_value("pinned copies device to host, every GPU at once", "GB/s",
                      best_of(all, false, true), "all_d2h_gb_s");
  compare::emit_value("pinned copies each way at once, every GPU at once (GB/s each way)", "GB/s",
                      best_of(all, true, true), "all_both_gb_s");

  // Launch latency: many empty kernels queued on one stream (the issue cost per launch), and a
  // launch followed by a wait (the round trip a task that waits for its result pays).
  CUDA(cudaSetDevice(0));
  constexpr int launches = 2000;
  empty_kernel<<<1, 1, 0, b[0].up>>>();
  CUDA(cudaStreamSynchronize(b[0].up));
  auto t0 = compare::clock_type::now();
  for (int i = 0; i < launches; ++i) empty_kernel<<<1, 1, 0, b[0].up>>>();
  CUDA(cudaStreamSynchronize(b[0].up));
  const double queued =
      std::chrono::duration<double, std::micro>(compare::clock_type::now() - t0).count() / launches;
  t0 = compare::clock_type::now();
  for (int i = 0; i < launches / 4; ++i) {
    empty_kernel<<<1, 1, 0, b[0].up>>>();
    CUDA(cudaStreamSynchronize(b[0].up));
  }
  const double round_trip =
      std::chrono::duration<double, std::micro>(compare::clock_type::now() - t0).count() /
      (launches / 4);
  CUDA(cudaGetLastError());
  compare::emit_value("kernel launch, queued back to back, GPU 0 (us each)", "us", queued,
                      "launch_us");
  compare::emit_value("kernel launch and wait, GPU 0 (us each)", "us", round_trip,
                      "launch_wait_us");
  for (auto& x : b) {
    cudaFreeHost(x.host_in);
    cudaFreeHost(x.host_out);
    cudaFree(x.dev_in);
    cudaFree(x.dev_out);
    cudaStreamDestroy(x.up);
    cudaStreamDestroy(x.down);
  }
}

constexpr char usage[] =
    "usage: gpupool_baseline_pipeline --workload limits|W1|W2|W3|W4|W5|W6|W6c [--chunks N]\n"
    "           [--size N] [--fmas N] [--repeat N] [--min-repeat N] [--seconds S]\n"
    "           [--threads-list 1,4,8,16]\n"
    "\n"
    "A hand-written CUDA pipeline (threads, streams, pinned staging; no gpupool) on one\n"
    "workload of `gpupool compare`, or the machine's copy limits and launch latency\n"
    "(limits); one JSON object per line, each run's results checked first.\n"
    "  --chunks, --size   inputs and elements per input (default 5 x 1000000)\n"
    "  --fmas             dependent FMAs per element, W5 and W6c (default 2048)\n"
    "  --repeat, --min-repeat, --seconds\n"
    "                     timed runs after one warm-up: at most --repeat, stopping past\n"
    "                     --seconds once --min-repeat ran (default 7, 3, 1.5)\n"
    "  --threads-list     host threads, each with its own stream (default: per workload)\n"
    "The other options of gpupool_bench_compare are taken and have no effect here.\n";

}  // namespace

int main(int argc, char** argv) {
  const options o = compare::parse(argc, argv, usage);
  try {
    device_count();
    const double gigabytes = static_cast<double>(o.chunks * o.size * sizeof(double)) / 1e9;
    if (o.workload == "limits")
      limits(o);
    else if (o.workload == "W1")
      host_workload(o, false, "ms", static_cast<double>(o.chunks), {1, 5});
    else if (o.workload == "W2")
      host_workload(o, false, "GB/s", gigabytes, {4, 8, 16});
    else if (o.workload == "W3")
      host_workload(o, true, "GB/s", gigabytes, {1, 2, 4});
    else if (o.workload == "W4")
      host_workload(o, false, "tasks/s", static_cast<double>(o.chunks), {1, 8});
    else if (o.workload == "W5")
      on_device(o);
    else if (o.workload == "W6")
      every_device_vs_one<double>(o);
    else if (o.workload == "W6c")
      every_device_vs_one<float>(o);
    else {
      std::fprintf(stderr, "unknown workload %s\n", o.workload.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpupool_baseline_pipeline: %s\n", e.what());
    return 1;
  }
  return 0;
}
