// Tiny tasks per second as devices and lanes grow: the per-task cost of the scheduling path.
// For each device count and lanes-per-device count it measures, in one run:
//   submit - a loop of executor::submit of a no-op returning its index, then every get()
//   map    - executor::map(builtin_kernel::square, many small float64 arrays) (W4's shape),
//            then get()
//   one    - one task in flight: submit a no-op returning its index, get() it, and again (the
//            latency of a hand-off to a lane and back, which a caller waiting on each result pays)
// Every result is checked before any rate is reported. Reported: the best round's tasks per
// second (on a shared machine the best round is the one least disturbed), the median round's (how
// far the rounds spread), the process's CPU time (user + system, every thread) per task over all
// rounds, and for map the time `map` itself took per input (queueing, on the submitting thread) in
// the best round. Devices are CPU stand-ins on the CPU backend (executor_options::cpu_devices) and
// the first N GPUs on CUDA; with --shared-gpu yes, N devices of the first GPU (or stand-in) alone
// (executor_options::devices naming it N times), which tells what more devices cost in scheduling
// from what more GPUs bring.
//
//   gpupool_bench_small_tasks [--backend cpu|cuda] [--devices 1,2] [--lanes 4,8,16]
//                             [--tasks N] [--size N] [--repeat N]
//                             [--modes submit,one,map]
//                             [--budget default|none] [--shared-gpu no|yes]
//                             [--keep-results no|yes]
//                             [--host-lanes N] [--cpu-copy-rate BYTES_PER_SECOND]
//                             [--profile-signal N]
// --keep-results yes: each map round's results are kept until the next round, whose time then
// includes freeing them first (as `gpupool compare`'s W4 from C++ does), instead of being freed
// after the round's clock stops.
// --budget none: no in-flight budget (executor_options::in_flight_budget = SIZE_MAX), so map
// tasks count no bytes; beside the default it shows what the counting costs per task.
// --host-lanes N: that many host lanes (executor_options::host_lanes) beside the devices' lanes;
// map rows then say what share of the calls ran on them. --cpu-copy-rate: the CPU stand-ins'
// copy rate (executor_options::cpu_copy_rate), to model a device slower than the host.
// --profile-signal N: raises signal N before each row's timed rounds and after them, so that a
// profiler that signal switches on and off (gperftools' CPUPROFILESIGNAL=N) samples those alone.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/resource.h>

#include "gpupool/gpupool.hpp"

namespace {

struct settings {
  std::string backend = "cpu";
  std::vector<int> devices{1, 2};
  std::vector<int> lanes{4, 8, 16};
  std::vector<std::string> modes{"submit", "map"};
  std::size_t tasks = 20000;
  std::size_t size = 1024;
  int repeat = 3;
  bool budget = true;         // false: --budget none
  bool shared_gpu = false;    // --shared-gpu yes: every device is the first GPU
  bool keep_results = false;  // --keep-results yes: a round frees the last round's results
  int host_lanes = 0;
  double cpu_copy_rate = 0;
  int profile_signal = 0;  // 0: none
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    if (end > begin) parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

std::vector<int> split_ints(const std::string& text) {
  std::vector<int> values;
  for (const auto& part : split(text)) {
    const int v = std::stoi(part);
    if (v < 1) throw std::invalid_argument("counts must be positive: " + part);
    values.push_back(v);
  }
  return values;
}

constexpr const char* usage_text =
    "usage: gpupool_bench_small_tasks [--backend cpu|cuda] [--devices 1,2] [--lanes 4,8,16]\n"
    "                                 [--tasks N] [--size N] [--repeat N]\n"
    "                                 [--modes submit,one,map]\n"
    "                                 [--budget default|none] [--shared-gpu no|yes]\n"
    "                                 [--keep-results no|yes]\n"
    "                                 [--host-lanes N] [--cpu-copy-rate BYTES_PER_SECOND]\n"
    "                                 [--profile-signal N]\n"
    "Tiny tasks per second as devices and lanes grow (W4's shape from C++); the comment at the\n"
    "top of bench/small_tasks.cpp says what each mode and option measures.\n";

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--backend")
      s.backend = value;
    else if (flag == "--devices")
      s.devices = split_ints(value);
    else if (flag == "--lanes")
      s.lanes = split_ints(value);
    else if (flag == "--modes")
      s.modes = split(value);
    else if (flag == "--tasks")
      s.tasks = std::stoul(value);
    else if (flag == "--size")
      s.size = std::stoul(value);
    else if (flag == "--repeat")
      s.repeat = std::stoi(value);
    else if (flag == "--budget" && (value == "default" || value == "none"))
      s.budget = value == "default";
    else if (flag == "--host-lanes")
      s.host_lanes = std::stoi(value);
    else if (flag == "--cpu-copy-rate")
      s.cpu_copy_rate = std::stod(value);
    else if (flag == "--profile-signal")
      s.profile_signal = std::stoi(value);
    else if (flag == "--keep-results" && (value == "no" || value == "yes"))
      s.keep_results = value == "yes";
    else if (flag == "--shared-gpu" && (value == "no" || value == "yes"))
      s.shared_gpu = value == "yes";
    else
      throw std::invalid_argument("unknown option " + flag);
  }
  if (s.backend != "cpu" && s.backend != "cuda")
    throw std::invalid_argument("--backend must be cpu or cuda");
  if (s.tasks == 0 || s.size == 0 || s.repeat < 1)
    throw std::invalid_argument("--tasks, --size and --repeat must be positive");
  if (s.profile_signal < 0 || s.profile_signal >= NSIG)
    throw std::invalid_argument("--profile-signal must be a signal number");
  if (s.profile_signal != 0) {
    // Unhandled, the signal would end the process at the first timed round.
    struct sigaction now {};
    if (sigaction(s.profile_signal, nullptr, &now) != 0 || now.sa_handler == SIG_DFL ||
        now.sa_handler == SIG_IGN)
      throw std::invalid_argument("--profile-signal " + std::to_string(s.profile_signal) +
                                  ": nothing handles it here (run under a profiler it switches, "
                                  "such as gperftools with CPUPROFILESIGNAL=" +
                                  std::to_string(s.profile_signal) + ")");
  }
  for (const auto& m : s.modes)
    if (m != "submit" && m != "one" && m != "map") throw std::invalid_argument("unknown mode " + m);
  return s;
}

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

gpupool::executor_options options_for(const settings& s, int devices, int lanes) {
  gpupool::executor_options o;
  o.lanes_per_device = lanes;
  o.quiet = true;
  o.tuning = gpupool::tuning::fixed;  // tiny arrays: the chunk size does not matter here
  if (!s.budget) o.in_flight_budget = std::numeric_limits<std::size_t>::max();
  o.host_lanes = s.host_lanes;
  o.cpu_copy_rate = s.cpu_copy_rate;
  o.backend = s.backend == "cpu" ? gpupool::backend_kind::cpu : gpupool::backend_kind::cuda;
  if (s.backend == "cpu") o.cpu_devices = s.shared_gpu ? 1 : devices;
  for (int d = 0; d < devices; ++d) o.devices.push_back(s.shared_gpu ? 0 : d);
  return o;
}

// Seconds for one round of `tasks` submitted no-ops, results checked.
double submit_round(gpupool::executor& ex, std::size_t tasks) {
  const auto t0 = clock_type::now();
  std::vector<gpupool::future<std::size_t>> futures;
  futures.reserve(tasks);
  for (std::size_t i = 0; i < tasks; ++i)
    futures.push_back(ex.submit([i](gpupool::lane&) { return i; }));
  for (std::size_t i = 0; i < tasks; ++i)
    if (futures[i].get() != i) throw std::runtime_error("submit: a task returned the wrong value");
  return seconds_since(t0);
}

// Seconds for `tasks` no-ops run one at a time (each submitted once the one before has ended),
// results checked.
double one_round(gpupool::executor& ex, std::size_t tasks) {
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < tasks; ++i)
    if (ex.submit([i](gpupool::lane&) { return i; }).get() != i)
      throw std::runtime_error("one: a task returned the wrong value");
  return seconds_since(t0);
}

using map_results = std::vector<gpupool::host_vector<double>>;

// Seconds for one map of square over `inputs`, results checked; `queued` gets the seconds
// `map` itself took (the submitting thread's share: queueing every input). With `kept`, the
// round first frees what it holds (on the clock) and leaves this round's results in it.
double map_round(gpupool::executor& ex, const std::vector<std::vector<double>>& inputs,
                 double& queued, map_results* kept = nullptr) {
  const auto t0 = clock_type::now();
  if (kept != nullptr) kept->clear();
  const auto queueing_from = clock_type::now();
  auto futures = ex.map(gpupool::builtin_kernel::square(), inputs);
  queued = seconds_since(queueing_from);
  auto results = futures.get();
  const double took = seconds_since(t0);
  for (std::size_t i = 0; i < inputs.size(); ++i)
    for (std::size_t j = 0; j < inputs[i].size(); ++j)
      if (results[i][j] != inputs[i][j] * inputs[i][j])
        throw std::runtime_error("map: a result differs from the CPU's");
  if (kept != nullptr) *kept = std::move(results);
  return took;
}

// Raises the signal at its making and at its end (none for 0): around the timed rounds.
class profiled_rounds {
 public:
  explicit profiled_rounds(int signal) : signal_(signal) { toggle(); }
  profiled_rounds(const profiled_rounds&) = delete;
  profiled_rounds& operator=(const profiled_rounds&) = delete;
  ~profiled_rounds() { toggle(); }

 private:
  void toggle() const {
    if (signal_ != 0) (void)std::raise(signal_);
  }
  int signal_;
};

// CPU seconds this process spent so far, every thread, user and system.
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const settings s = parse(argc, argv);
    std::vector<std::vector<double>> inputs(s.tasks, std::vector<double>(s.size));
    for (std::size_t i = 0; i < inputs.size(); ++i)
      for (std::size_t j = 0; j < s.size; ++j) inputs[i][j] = static_cast<double>((i + j) % 97);

    std::printf("backend %s, %u host cores, %zu tasks of %zu float64, best of %d%s%s\n",
                s.backend.c_str(), std::thread::hardware_concurrency(), s.tasks, s.size, s.repeat,
                s.shared_gpu ? "; every device on the first GPU" : "",
                s.keep_results ? "; map rounds free the last round's results on the clock" : "");
    std::printf("%-7s %8s %6s %14s %14s %14s %16s %9s\n", "mode", "devices", "lanes", "tasks/s",
                "median", "cpu us/task", "queueing us/task", "on host");
    for (const auto& mode : s.modes) {
      for (int devices : s.devices) {
        for (int lanes : s.lanes) {
          std::vector<double> times, queueing;
          double cpu_before = 0.0;
          std::string on_host = "-";
          {
            gpupool::executor ex(options_for(s, devices, lanes));
            const std::vector<std::vector<double>> warm(
                inputs.begin(), inputs.begin() + static_cast<std::ptrdiff_t>(s.tasks / 10 + 1));
            if (mode == "submit" || mode == "one") {
              const auto round = mode == "submit" ? submit_round : one_round;
              round(ex, s.tasks / 10 + 1);
              cpu_before = cpu_seconds();
              const profiled_rounds profiled(s.profile_signal);
              for (int r = 0; r < s.repeat; ++r) times.push_back(round(ex, s.tasks));
            } else {
              double queued = 0.0;
              map_results kept;
              map_results* keep = s.keep_results ? &kept : nullptr;
              // Kept results: a whole warm-up round, so that the first timed round frees as
              // many as every other one.
              map_round(ex, s.keep_results ? inputs : warm, queued, keep);
              cpu_before = cpu_seconds();
              const profiled_rounds profiled(s.profile_signal);
              for (int r = 0; r < s.repeat; ++r) {
                times.push_back(map_round(ex, inputs, queued, keep));
                queueing.push_back(queued);
              }
              if (ex.host_lanes() > 0) {
                const gpupool::placement_stats p = ex.placement();
                on_host =
                    std::to_string(static_cast<int>(100.0 * static_cast<double>(p.host_tasks) /
                                                    static_cast<double>(std::max<std::uint64_t>(
                                                        p.host_tasks + p.device_tasks, 1)))) +
                    "%";
              }
            }
          }
          const double cpu_per_task =
              (cpu_seconds() - cpu_before) /
              static_cast<double>(s.tasks * static_cast<std::size_t>(s.repeat));
          const auto fastest = static_cast<std::size_t>(
              std::min_element(times.begin(), times.end()) - times.begin());
          std::vector<double> sorted = times;
          std::sort(sorted.begin(), sorted.end());
          const double median =
              sorted.size() % 2 == 1
                  ? sorted[sorted.size() / 2]
                  : (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]) / 2;
          std::printf("%-7s %8d %6d %14.0f %14.0f %14.2f", mode.c_str(), devices, lanes,
                      static_cast<double>(s.tasks) / times[fastest],
                      static_cast<double>(s.tasks) / median, 1e6 * cpu_per_task);
          // The map's own time per input in its fastest round ("-" where nothing is queued
          // separately from waiting).
          if (queueing.empty())
            std::printf(" %16s", "-");
          else
            std::printf(" %16.3f", 1e6 * queueing[fastest] / static_cast<double>(s.tasks));
          std::printf(" %9s\n", on_host.c_str());
          std::fflush(stdout);
        }
      }
    }
    std::printf("results checked\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpupool_bench_small_tasks: %s (--help lists the options)\n", e.what());
    return 1;
  }
}
