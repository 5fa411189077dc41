// Would CUDA graphs make gpupool's small tasks cheaper? A lane runs each small task (or each
// coalesced batch) as three operations on its stream (upload from its pinned staging slot, the
// kernel, download into a pinned result) and an event record; a graph would make the three one
// launch. This measures, for the same tasks from T threads (each with its own stream, slots and
// result blocks, as a lane has):
//
//   stream            cudaMemcpyAsync, kernel, cudaMemcpyAsync, then cudaEventRecord
//   graph, fixed      one graph per slot, instantiated once and replayed with every pointer
//                     fixed (the most a graph can save), then cudaEventRecord
//   graph, new out    the same, with the download's destination set before each launch (a new
//                     result block per task, as gpupool's results are)
//
// Per mode and per thread, two figures:
//   issue us/task     the host's time to issue one task, measured over bursts of --burst tasks
//                     with the stream waited for between bursts (so that issuing never waits
//                     for room in the stream's queue, which a long run fills)
//   wall us/task      a run of --tasks tasks issued back to back, then waited for: its wall time
//                     over the tasks of one thread (all threads run at once; tasks/s counts all)
//
// The check: thread t's slot s stages its own input, and task k uses slot k % 8 and writes result
// block k % 16 (block r holds slot r % 8's squares); every result block is set to NaN before each
// timed run and compared with the CPU's squares after it. A result that went to a block of
// another slot, or a block a run never wrote, fails; one sent to the block 8 away (the same
// slot's) cannot be told apart.
//
//   gpupool_bench_graphs [--sizes 1024,8192,65536] [--threads 1,8] [--tasks 20000]
//                        [--burst 128] [--repeat 3]
// Sizes are float64 elements per task; figures are the best of --repeat runs. Exit status: 0, 1
// on a wrong result, 2 on a bad argument, 3 on a CUDA error (no GPU included). CUDA builds only;
// like the library it links the CUDA runtime statically and never libcuda.
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

// A CUDA call that failed (exit status 3), and a result that differs from the CPU's (1).
struct cuda_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct wrong_result : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw cuda_failure(std::string(call) + ": " + cudaGetErrorString(status));
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

// What one thread owns: a stream, an event, slots (pinned input, device in and out, and a graph
// of the three operations) and a ring of pinned result blocks.
class lane_like {
 public:
  static constexpr int slots = 8;
  static constexpr int results = 16;  // a multiple of slots: block r always holds slot r % slots

  lane_like(std::size_t n, int thread) : n_(n) {
    const std::size_t bytes = n * sizeof(double);
    CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    for (int s = 0; s < slots; ++s) {
      CUDA(cudaHostAlloc(reinterpret_cast<void**>(&staging_[s]), bytes, cudaHostAllocDefault));
      CUDA(cudaMalloc(reinterpret_cast<void**>(&in_[s]), bytes));
      CUDA(cudaMalloc(reinterpret_cast<void**>(&out_[s]), bytes));
      for (std::size_t i = 0; i < n; ++i)  // distinct per thread, slot and element
        staging_[s][i] =
            static_cast<double>(thread * slots + s + 1) + 1e-3 * static_cast<double>(i);
    }
    for (int r = 0; r < results; ++r)
      CUDA(cudaHostAlloc(reinterpret_cast<void**>(&result_[r]), bytes, cudaHostAllocDefault));
    for (int s = 0; s < slots; ++s) build_graph(s);
  }
  lane_like(const lane_like&) = delete;
  lane_like& operator=(const lane_like&) = delete;
  ~lane_like() {
    for (int s = 0; s < slots; ++s) {
      if (exec_[s] != nullptr) cudaGraphExecDestroy(exec_[s]);
      if (graph_[s] != nullptr) cudaGraphDestroy(graph_[s]);
      cudaFreeHost(staging_[s]);
      cudaFree(in_[s]);
      cudaFree(out_[s]);
    }
    for (int r = 0; r < results; ++r) cudaFreeHost(result_[r]);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  // Before each run of a mode: results poisoned, and each slot's graph downloading to the slot's
  // own first block again (a run of "graph, new out" leaves it at the last block it used).
  void prepare(mode m) {
    for (int r = 0; r < results; ++r) std::fill(result_[r], result_[r] + n_, std::nan(""));
    if (m == mode::graph_fixed)
      for (int s = 0; s < slots; ++s) set_download(s, s);
  }

  // Task k: slot k % slots; its result goes to block k % results (a fixed graph: block k % slots,
  // the one it was built with).
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
        break;
      case mode::graph_fixed:
        CUDA(cudaGraphLaunch(exec_[s], stream_));
        break;
      case mode::graph_new_out:
        set_download(s, r);
        CUDA(cudaGraphLaunch(exec_[s], stream_));
        break;
    }
    CUDA(cudaEventRecord(done_, stream_));  // gpupool records one per task, whatever the mode
  }

  void wait() { CUDA(cudaStreamSynchronize(stream_)); }

  // Empty when every block a run of `tasks` tasks in mode `m` wrote holds its slot's squares.
  std::string check(mode m, int tasks) const {
    const int written = m == mode::graph_fixed ? slots : results;
    for (int r = 0; r < std::min(written, tasks); ++r) {
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
    void* args[] = {&x, &y, &n};  // copied into the node when it is added
    params.func = reinterpret_cast<void*>(square_kernel);
    params.gridDim = dim3(blocks_for(n_));
    params.blockDim = dim3(256);
    params.kernelParams = args;
    CUDA(cudaGraphAddKernelNode(&kernel, graph_[s], &upload, 1, &params));
    CUDA(cudaGraphAddMemcpyNode1D(&download_[s], graph_[s], &kernel, 1, result_[s], out_[s], bytes,
                                  cudaMemcpyDeviceToHost));
    CUDA(cudaGraphInstantiate(&exec_[s], graph_[s], 0));
  }

  // Later launches of slot s's graph download into result block r (launches already queued keep
  // the destination they were launched with).
  void set_download(int s, int r) {
    CUDA(cudaGraphExecMemcpyNodeSetParams1D(exec_[s], download_[s], result_[r], out_[s],
                                            n_ * sizeof(double), cudaMemcpyDeviceToHost));
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

// Runs `body(t)` on one thread per lane at once and returns the wall time of them all.
template <class Body>
double on_every_lane(std::size_t lanes, Body body) {
  std::vector<std::exception_ptr> failed(lanes);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < lanes; ++t)
    threads.emplace_back([&, t] {
      try {
        body(t);
      } catch (...) {
        failed[t] = std::current_exception();
      }
    });
  for (auto& th : threads) th.join();
  for (auto& f : failed)
    if (f) std::rethrow_exception(f);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Seconds to issue `tasks` tasks in bursts of `burst` (waiting for the stream between bursts,
// outside the time), the slowest thread's.
double issue_seconds(const std::vector<std::unique_ptr<lane_like>>& lanes, mode m, int tasks,
                     int burst) {
  std::vector<double> issuing(lanes.size());
  on_every_lane(lanes.size(), [&](std::size_t t) {
    for (int k = 0; k < tasks;) {
      const int end = std::min(tasks, k + burst);
      const auto begun = std::chrono::steady_clock::now();
      for (; k < end; ++k) lanes[t]->issue(m, k);
      issuing[t] += std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();
      lanes[t]->wait();
    }
  });
  return *std::max_element(issuing.begin(), issuing.end());
}

// Wall seconds of `tasks` tasks per thread issued back to back and waited for.
double wall_seconds(const std::vector<std::unique_ptr<lane_like>>& lanes, mode m, int tasks) {
  return on_every_lane(lanes.size(), [&](std::size_t t) {
    for (int k = 0; k < tasks; ++k) lanes[t]->issue(m, k);
    lanes[t]->wait();
  });
}

// A whole number from 1 to `most`, digits only.
long whole_number(const std::string& text, const char* option, long most) {
  const bool digits =
      !text.empty() && text.size() <= 9 &&
      std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
  const long v = digits ? std::strtol(text.c_str(), nullptr, 10) : 0;
  if (v < 1 || v > most)
    throw std::invalid_argument(std::string(option) + ": '" + text +
                                "' is not a whole number from 1 to " + std::to_string(most));
  return v;
}

std::vector<long> whole_numbers(const std::string& text, const char* option, long most) {
  std::vector<long> out;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    out.push_back(whole_number(text.substr(at, comma - at), option, most));
    at = comma + 1;
  }
  return out;
}

const char* const usage =
    "usage: gpupool_bench_graphs [--sizes 1024,8192,65536] [--threads 1,8] [--tasks 20000]\n"
    "                            [--burst 128] [--repeat 3]\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<long> sizes{1024, 8192, 65536};
  std::vector<long> thread_counts{1, 8};
  long tasks = 20000;
  long burst = 128;
  long repeat = 3;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(usage, stdout);
        return 0;
      }
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      const std::string v = argv[++i];
      if (a == "--sizes")
        sizes = whole_numbers(v, "--sizes", 100'000'000);
      else if (a == "--threads")
        thread_counts = whole_numbers(v, "--threads", 256);
      else if (a == "--tasks")
        tasks = whole_number(v, "--tasks", 10'000'000);
      else if (a == "--burst")
        burst = whole_number(v, "--burst", 1'000'000);
      else if (a == "--repeat")
        repeat = whole_number(v, "--repeat", 1000);
      else
        throw std::invalid_argument("unknown option " + a);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpupool_bench_graphs: %s\n%s", e.what(), usage);
    return 2;
  }
  try {
    int devices = 0;
    CUDA(cudaGetDeviceCount(&devices));
    if (devices < 1) throw cuda_failure("no CUDA device");
    cudaDeviceProp prop{};
    CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf(
        "CUDA graphs against stream operations, %s: %ld tasks per thread (issue: bursts of %ld), "
        "best of %ld\n",
        prop.name, tasks, burst, repeat);
    std::printf("%9s %7s  %-15s %14s %14s %14s\n", "elements", "threads", "mode", "issue us/task",
                "wall us/task", "tasks/s (all)");
    for (const long n : sizes)
      for (const long threads : thread_counts) {
        std::vector<std::unique_ptr<lane_like>> lanes;
        for (long t = 0; t < threads; ++t)
          lanes.push_back(
              std::make_unique<lane_like>(static_cast<std::size_t>(n), static_cast<int>(t)));
        const auto checked = [&](mode m, int count) {
          for (auto& l : lanes) {
            const std::string wrong = l->check(m, count);
            if (!wrong.empty())
              throw wrong_result(std::string(name_of(m)) + ", " + std::to_string(n) +
                                 " elements: " + wrong);
          }
        };
        const auto prepared = [&](mode m) {
          for (auto& l : lanes) l->prepare(m);
        };
        for (const mode m : {mode::stream, mode::graph_fixed, mode::graph_new_out}) {
          prepared(m);
          wall_seconds(lanes, m, 64);  // warm-up
          checked(m, 64);
          double issue = 1e30;
          double wall = 1e30;
          for (long r = 0; r < repeat; ++r) {
            prepared(m);
            issue = std::min(
                issue, issue_seconds(lanes, m, static_cast<int>(tasks), static_cast<int>(burst)));
            checked(m, static_cast<int>(tasks));
            prepared(m);
            wall = std::min(wall, wall_seconds(lanes, m, static_cast<int>(tasks)));
            checked(m, static_cast<int>(tasks));
          }
          std::printf("%9ld %7ld  %-15s %14.2f %14.2f %14.0f\n", n, threads, name_of(m),
                      1e6 * issue / static_cast<double>(tasks),
                      1e6 * wall / static_cast<double>(tasks),
                      static_cast<double>(tasks * threads) / wall);
          std::fflush(stdout);  // each row as it is measured, through a pipe too (a run is long)
        }
      }
    std::puts("results checked against the CPU after every run");
  } catch (const wrong_result& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpupool_bench_graphs: %s\n", e.what());
    return 3;
  }
  return 0;
}
