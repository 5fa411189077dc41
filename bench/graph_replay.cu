// Would CUDA graphs make gpupool's small tasks cheaper? A lane runs each small task (or each
// coalesced batch) as three operations on its stream (upload from its pinned staging slot, the
// kernel, download into a pinned result) and an event record; a graph would make that one
// launch. This measures, for the same tasks from T threads (each with its own stream and two
// slots, as a lane has):
//
//   stream            cudaMemcpyAsync, kernel, cudaMemcpyAsync, cudaEventRecord per task
//   graph, fixed      one graph per slot, instantiated once and replayed (every pointer fixed:
//                     the best a graph can do)
//   graph, new out    the same, with the download's destination set before each launch (a new
//                     result block per task, as gpupool's results are) and the event recorded
//
// Each mode issues --tasks tasks per thread, then waits for all; it prints the time per task of
// issuing alone and of the whole run (tasks per second over all threads). Every slot's output is
// poisoned first and checked against the CPU after each mode, before its times are printed.
//
//   gpupool_bench_graphs [--sizes 1024,8192,131072] [--tasks 20000] [--threads 1,8]
//                        [--repeat 3]
// Sizes are float64 elements per task. Exits 1 on a wrong result, 2 on a bad argument. CUDA builds
// only; like the library it links the CUDA runtime statically and never libcuda.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

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

unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 65535));
}

enum class mode { stream, graph_fixed, graph_new_out };
const char* name_of(mode m) {
  switch (m) {
    case mode::stream:
      return "stream";
    case mode::graph_fixed:
      return "graph, fixed";
    case mode::graph_new_out:
      return "graph, new out";
  }
  return "?";
}

// What one thread owns: a stream, an event, two slots (pinned input, device in and out) and a
// ring of pinned result blocks (a task's result goes to the next block of the ring).
class lane_like {
 public:
  static constexpr int slots = 2;
  static constexpr int results = 8;

  lane_like(std::size_t n, int seed) : n_(n) {
    const std::size_t bytes = n * sizeof(double);
    CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    for (int s = 0; s < slots; ++s) {
      CUDA(cudaHostAlloc(reinterpret_cast<void**>(&staging_[s]), bytes, cudaHostAllocDefault));
      CUDA(cudaMalloc(reinterpret_cast<void**>(&in_[s]), bytes));
      CUDA(cudaMalloc(reinterpret_cast<void**>(&out_[s]), bytes));
      for (std::size_t i = 0; i < n; ++i)
        staging_[s][i] = static_cast<double>(seed * slots + s) + 1e-3 * static_cast<double>(i);
    }
    for (int r = 0; r < results; ++r)
      CUDA(cudaHostAlloc(reinterpret_cast<void**>(&result_[r]), bytes, cudaHostAllocDefault));
    for (int s = 0; s < slots; ++s) build_graph(s);
  }
  lane_like(const lane_like&) = delete;
  lane_like& operator=(const lane_like&) = delete;
  ~lane_like() {
    for (int s = 0; s < slots; ++s) {
      cudaGraphExecDestroy(exec_[s]);
      cudaGraphDestroy(graph_[s]);
      cudaFreeHost(staging_[s]);
      cudaFree(in_[s]);
      cudaFree(out_[s]);
    }
    for (int r = 0; r < results; ++r) cudaFreeHost(result_[r]);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  void poison() {
    for (int r = 0; r < results; ++r) std::fill(result_[r], result_[r] + n_, std::nan(""));
  }

  // Task k: slot k % 2 into result block k % 8 (both rings line up: 8 is a multiple of 2).
  void issue(mode m, int k) {
    const int s = k % slots;
    const int r = k % results;
    const std::size_t bytes = n_ * sizeof(double);
    switch (m) {
      case mode::stream:
        CUDA(cudaMemcpyAsync(in_[s], staging_[s], bytes, cudaMemcpyHostToDevice, stream_));
        square_kernel<<<blocks_for(n_), 256, 0, stream_>>>(in_[s], out_[s], n_);
        CUDA(cudaGetLastError());
        CUDA(cudaMemcpyAsync(result_[r], out_[s], bytes, cudaMemcpyDeviceToHost, stream_));
        CUDA(cudaEventRecord(done_, stream_));
        break;
      case mode::graph_fixed:
        CUDA(cudaGraphLaunch(exec_[s], stream_));
        break;
      case mode::graph_new_out:
        CUDA(cudaGraphExecMemcpyNodeSetParams1D(exec_[s], download_[s], result_[r], out_[s], bytes,
                                                cudaMemcpyDeviceToHost));
        CUDA(cudaGraphLaunch(exec_[s], stream_));
        CUDA(cudaEventRecord(done_, stream_));
        break;
    }
  }

  void wait() { CUDA(cudaStreamSynchronize(stream_)); }

  // The squares of the slot inputs, in every result block a task of the run wrote (a fixed graph
  // writes the slot's first block only: the one it was built with).
  std::string check(mode m, int tasks) const {
    for (int r = 0; r < results; ++r) {
      if (r >= tasks || (m == mode::graph_fixed && r >= slots)) continue;
      const int s = r % slots;
      for (std::size_t i = 0; i < n_; ++i)
        if (result_[r][i] != staging_[s][i] * staging_[s][i])
          return "result block " + std::to_string(r) + " element " + std::to_string(i) + " is " +
                 std::to_string(result_[r][i]);
    }
    return "";
  }

 private:
  void build_graph(int s) {
    const std::size_t bytes = n_ * sizeof(double);
    CUDA(cudaGraphCreate(&graph_[s], 0));
    cudaGraphNode_t upload = nullptr;
    cudaGraphNode_t kernel = nullptr;
    CUDA(cudaGraphAddMemcpyNode1D(&upload, graph_[s], nullptr, 0, in_[s], staging_[s], bytes,
                                  cudaMemcpyHostToDevice));
    cudaKernelNodeParams params{};
    const double* x = in_[s];
    double* y = out_[s];
    std::size_t n = n_;
    void* args[] = {&x, &y, &n};
    params.func = reinterpret_cast<void*>(square_kernel);
    params.gridDim = dim3(blocks_for(n_));
    params.blockDim = dim3(256);
    params.kernelParams = args;
    CUDA(cudaGraphAddKernelNode(&kernel, graph_[s], &upload, 1, &params));
    CUDA(cudaGraphAddMemcpyNode1D(&download_[s], graph_[s], &kernel, 1, result_[s], out_[s], bytes,
                                  cudaMemcpyDeviceToHost));
    CUDA(cudaGraphInstantiate(&exec_[s], graph_[s], 0));
  }

  std::size_t n_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  double* staging_[slots] = {};
  double* in_[slots] = {};
  double* out_[slots] = {};
  double* result_[results] = {};
  cudaGraph_t graph_[slots] = {};
  cudaGraphExec_t exec_[slots] = {};
  cudaGraphNode_t download_[slots] = {};
};

struct timing {
  double issue_s = 0;  // the slowest thread's issuing
  double whole_s = 0;  // issuing and waiting, all threads
};

timing run(const std::vector<std::unique_ptr<lane_like>>& lanes, mode m, int tasks) {
  std::vector<double> issue(lanes.size());
  std::vector<std::exception_ptr> failed(lanes.size());
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < lanes.size(); ++t)
    threads.emplace_back([&, t] {
      try {
        const auto begun = std::chrono::steady_clock::now();
        for (int k = 0; k < tasks; ++k) lanes[t]->issue(m, k);
        issue[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();
        lanes[t]->wait();
      } catch (...) {
        failed[t] = std::current_exception();
      }
    });
  for (auto& th : threads) th.join();
  for (auto& f : failed)
    if (f) std::rethrow_exception(f);
  timing out;
  out.whole_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.issue_s = *std::max_element(issue.begin(), issue.end());
  return out;
}

std::vector<long> numbers(const char* text, const char* option) {
  std::vector<long> out;
  std::string s(text);
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = std::min(s.find(',', at), s.size());
    const std::string part = s.substr(at, comma - at);
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 1 || v > 100'000'000)
      throw std::invalid_argument(std::string(option) + ": '" + part +
                                  "' is not a whole number from 1 to 100000000");
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<long> sizes{1024, 8192, 131072};
  std::vector<long> thread_counts{1, 8};
  long tasks = 20000;
  long repeat = 3;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      const char* v = argv[++i];
      if (a == "--sizes")
        sizes = numbers(v, "--sizes");
      else if (a == "--threads")
        thread_counts = numbers(v, "--threads");
      else if (a == "--tasks")
        tasks = numbers(v, "--tasks").at(0);
      else if (a == "--repeat")
        repeat = numbers(v, "--repeat").at(0);
      else
        throw std::invalid_argument("unknown option " + a);
    }
    if (tasks > 10'000'000 || repeat > 1000 ||
        *std::max_element(thread_counts.begin(), thread_counts.end()) > 256)
      throw std::invalid_argument("at most 10000000 tasks, 1000 repeats and 256 threads");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpupool_bench_graphs: %s\n", e.what());
    return 2;
  }
  try {
    int devices = 0;
    CUDA(cudaGetDeviceCount(&devices));
    if (devices < 1) throw std::runtime_error("no CUDA device");
    cudaDeviceProp prop{};
    CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("CUDA graphs against stream operations, %s: %ld tasks per thread, best of %ld\n",
                prop.name, tasks, repeat);
    std::printf("%9s %7s  %-15s %12s %12s %14s\n", "elements", "threads", "mode", "issue us/task",
                "whole us/task", "tasks/s (all)");
    for (const long n : sizes)
      for (const long threads : thread_counts) {
        std::vector<std::unique_ptr<lane_like>> lanes;
        for (long t = 0; t < threads; ++t)
          lanes.push_back(
              std::make_unique<lane_like>(static_cast<std::size_t>(n), static_cast<int>(t)));
        for (const mode m : {mode::stream, mode::graph_fixed, mode::graph_new_out}) {
          run(lanes, m, 64);  // warm-up
          for (auto& l : lanes) l->poison();
          timing best{1e30, 1e30};
          for (long r = 0; r < repeat; ++r) {
            const timing t = run(lanes, m, static_cast<int>(tasks));
            best.issue_s = std::min(best.issue_s, t.issue_s);
            best.whole_s = std::min(best.whole_s, t.whole_s);
          }
          for (auto& l : lanes) {
            const std::string wrong = l->check(m, static_cast<int>(tasks));
            if (!wrong.empty()) {
              std::fprintf(stderr, "FAIL: %s, %ld elements: %s\n", name_of(m), n, wrong.c_str());
              return 1;
            }
          }
          std::printf("%9ld %7ld  %-15s %12.2f %12.2f %14.0f\n", n, threads, name_of(m),
                      1e6 * best.issue_s / static_cast<double>(tasks),
                      1e6 * best.whole_s / static_cast<double>(tasks),
                      static_cast<double>(tasks * threads) / best.whole_s);
        }
      }
    std::puts("results checked against the CPU in every result block each mode wrote");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpupool_bench_graphs: %s\n", e.what());
    return 1;
  }
  return 0;
}
