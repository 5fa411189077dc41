// The gpupool command-line tool: `gpupool info`, `gpupool demo` and `gpupool bench`. It writes
// text, CSV and JSON; pictures of what it writes are drawn by the Python package's `gpupool`
// command (the same options, over this program), with matplotlib.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_command.hpp"
#include "gpupool/gpupool.hpp"
#include "outputs.hpp"
#include "progress.hpp"
#include "run_times.hpp"

namespace {

// Options every command shares: which backend, devices and lanes.
struct pool_flags {
  std::string backend;
  std::vector<int> devices;
  int lanes = 0;
  int slots = 2;
  int cpu_devices = 0;
  int host_lanes = 0;
  std::size_t chunk_bytes = 0;
  std::string tuning;

  void add_to(CLI::App& cmd) {
    std::vector<std::string> names;
    for (const auto& b : gpupool::backend_names) names.emplace_back(b.name);
    cmd.add_option("--backend", backend,
                   gpupool::backend_name_list() + " (default: GPUPOOL_BACKEND, else auto)")
        ->check(CLI::IsMember(names));
    cmd.add_option("--devices", devices,
                   "device ordinals to use, such as 0,1; one named twice (0,0) is two devices of "
                   "that GPU (default: GPUPOOL_DEVICES, else every visible device)")
        ->delimiter(',');
    cmd.add_option("--lanes", lanes, "lanes (threads) per device (default 0: as --tuning says)")
        ->check(CLI::Range(0, gpupool::limits::most_lanes_per_device));
    cmd.add_option("--slots", slots, "tasks in flight per lane")
        ->check(CLI::Range(1, gpupool::limits::most_slots_per_lane));
    cmd.add_option("--cpu-devices", cpu_devices, "devices the CPU backend stands in for")
        ->check(CLI::Range(0, gpupool::limits::most_cpu_devices));
    cmd.add_option("--host-lanes", host_lanes,
                   "threads beside the devices' lanes that run small calls of built-in kernels "
                   "on the host (default 0: none)")
        ->check(CLI::Range(0, gpupool::limits::most_host_lanes));
    cmd.add_option("--chunk-bytes", chunk_bytes,
                   "largest piece moved through a staging slot (e.g. 65536, 64K, 8M; default 0: "
                   "as --tuning says)")
        ->transform(CLI::AsSizeValue(false));
    cmd.add_option("--tuning", tuning,
                   "how lanes and chunk size left at 0 are chosen: auto (measured on CUDA, "
                   "fixed on the CPU backend), measured, remeasure or fixed (default: "
                   "GPUPOOL_TUNING, else auto)")
        ->check(CLI::IsMember({gpupool::to_string(gpupool::tuning::automatic),
                               gpupool::to_string(gpupool::tuning::measured),
                               gpupool::to_string(gpupool::tuning::remeasure),
                               gpupool::to_string(gpupool::tuning::fixed)}));
  }

  gpupool::executor_options options() const {
    gpupool::executor_options o;
    if (!backend.empty()) o.backend = gpupool::backend_from_name(backend);
    o.devices = devices;
    o.lanes_per_device = lanes;
    o.slots_per_lane = slots;
    o.cpu_devices = cpu_devices;
    o.host_lanes = host_lanes;
    o.chunk_bytes = chunk_bytes;
    if (auto t = gpupool::tuning_from_name(tuning)) o.tuning = *t;
    return o;
  }
};

/// A CLI11 check: the file's extension is `wanted`; otherwise `refusal` (if given) explains.
CLI::Validator file_type(const std::string& wanted, const std::string& refusal = "") {
  return CLI::Validator(
      [wanted, refusal](std::string& path) -> std::string {
        if (gpupool_cli::extension_of(path) == wanted) return "";
        std::string message = "'" + path + "' is not a " + wanted + " file";
        if (!refusal.empty()) message += ": " + refusal;
        return message;
      },
      "*" + wanted);
}

double gib(std::size_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

int run_info(const pool_flags& flags) {
  gpupool::executor ex(flags.options());
  std::printf("gpupool %s (CUDA backend %s)\n", GPUPOOL_VERSION_STRING,
              GPUPOOL_HAS_CUDA ? "built" : "not built");
  std::printf("backend:          %s\n", gpupool::to_string(ex.backend()));
  std::printf("devices:          %zu\n", ex.devices().size());
  for (const auto& d : ex.devices()) {
    std::printf("  [%d] %s (ordinal %d): %.1f GiB", d.id, d.name.c_str(), d.ordinal,
                gib(d.total_memory));
    if (d.compute_major > 0)  // a compute capability: a GPU
      std::printf(", compute %d.%d, %d SMs", d.compute_major, d.compute_minor, d.multiprocessors);
    std::printf(", %d lanes\n", ex.lanes_per_device());
  }
  const gpupool::executor_settings& settings = ex.settings();
  std::printf("lanes per device: %d (%d in all; %s)\n", ex.lanes_per_device(), ex.lane_count(),
              gpupool::to_string(settings.lanes_from));
  std::printf("slots per lane:   %d\n", ex.slots_per_lane());
  std::printf("host lanes:       %d\n", ex.host_lanes());
  std::printf("chunk bytes:      %zu (%s)\n", ex.chunk_bytes(),
              gpupool::to_string(settings.chunk_from));
  if (!settings.samples.empty()) {
    std::printf(
        "tuning sweep:     lanes  chunk bytes  input GB/s (squares of float64, pageable in, pinned "
        "out)\n");
    for (const auto& s : settings.samples)
      std::printf("                  %5d  %11zu  %10.2f\n", s.lanes_per_device, s.chunk_bytes,
                  s.bytes_per_second / 1e9);
  }
  if (!settings.cache_file.empty())
    std::printf("tuning cache:     %s\n", settings.cache_file.c_str());
  if (!settings.note.empty()) std::printf("tuning note:      %s\n", settings.note.c_str());
  const auto pinned = gpupool::pinned_memory_stats();
  std::printf("pinned cache:     up to %.1f GiB\n", gib(pinned.cache_limit));
  std::printf("kernel cache:     %s\n", gpupool::kernel_cache_directory().c_str());
  std::printf(
      "GPUPOOL_BACKEND=%s GPUPOOL_TUNING=%s GPUPOOL_DEVICES=%s CUDA_VISIBLE_DEVICES=%s "
      "CUDA_DEVICE_MAX_CONNECTIONS=%s\n",
      env_or("GPUPOOL_BACKEND", "(unset)"), env_or("GPUPOOL_TUNING", "(unset)"),
      env_or("GPUPOOL_DEVICES", "(unset)"), env_or("CUDA_VISIBLE_DEVICES", "(unset)"),
      env_or("CUDA_DEVICE_MAX_CONNECTIONS", "(unset)"));
  return 0;
}

struct demo_flags {
  int chunks = 5;
  std::size_t size = 1'000'000;
  int warmup = 3;   // untimed runs between the cold first run and the timed ones
  int repeat = 20;  // timed runs: the steady state
  int show = 5;
  unsigned seed = 42;
  bool json = false;
  std::string summary_path;   // the JSON object --json prints, written here as well
  std::string trace_path;     // Chrome trace of the last run
  std::string timeline_path;  // the last run's records, as JSON (what the timeline is drawn from)
  bool stats = false;         // per-lane stats of the last run
};

bool tracing_wanted(const demo_flags& demo) {
  return !demo.trace_path.empty() || !demo.timeline_path.empty() || demo.stats;
}

// Writes what the demo's flags ask for from the executor's trace.
void write_trace_outputs(const gpupool::trace& t, const demo_flags& demo) {
  if (!demo.trace_path.empty()) {
    gpupool_cli::write_file(demo.trace_path, [&](std::ostream& o) { t.write_chrome_json(o); });
    std::fprintf(stderr, "trace: %s (%zu tasks; open in Perfetto or chrome://tracing)\n",
                 demo.trace_path.c_str(), t.records().size());
  }
  if (!demo.timeline_path.empty()) {
    gpupool_cli::write_file(demo.timeline_path, [&](std::ostream& o) { t.write_records_json(o); });
  }
  if (demo.stats) {
    std::ostringstream table;
    t.write_stats_table(table);
    std::fprintf(stderr, "%s", table.str().c_str());
  }
}

// Elements of `results` that differ from the squares of `chunks` (a missing element counts).
std::size_t wrong_squares(const std::vector<std::vector<double>>& chunks,
                          const std::vector<gpupool::host_vector<double>>& results) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (i >= results.size() || results[i].size() != chunks[i].size()) {
      wrong += chunks[i].size();
      continue;
    }
    for (std::size_t j = 0; j < chunks[i].size(); ++j)
      wrong += results[i][j] != chunks[i][j] * chunks[i][j] ? 1 : 0;
  }
  return wrong;
}

// The motivating program: square `chunks` arrays of `size` float64 and bring them back. The first
// run is reported apart from the others: it pays what a process pays once (pinned and device
// memory obtained, kernels loaded), which a long-running program does not pay per batch. The
// steady state is the timed runs after `warmup` more, as a median with its spread.
int run_demo(const pool_flags& flags, const demo_flags& demo) {
  gpupool_cli::check_writable(demo.trace_path);
  gpupool_cli::check_writable(demo.timeline_path);
  gpupool_cli::check_writable(demo.summary_path);

  std::mt19937_64 rng(demo.seed);
  std::uniform_real_distribution<double> dist(-10.0, 10.0);
  std::vector<std::vector<double>> chunks(static_cast<std::size_t>(demo.chunks));
  for (auto& c : chunks) {
    c.resize(demo.size);
    for (auto& x : c) x = dist(rng);
  }

  using clock = std::chrono::steady_clock;
  using ms = std::chrono::duration<double, std::milli>;
  const auto started = clock::now();
  gpupool::executor ex(flags.options());
  const double start_ms = ms(clock::now() - started).count();

  std::vector<gpupool::host_vector<double>> results;
  const auto square_all = [&] {
    // The previous run's results go back to the pool first, as they would in a program that
    // uses each batch's results before the next: a run then reuses memory instead of taking
    // more (which is the cold run's cost, not the steady state's).
    results.clear();
    const auto t0 = clock::now();
    results = ex.map(gpupool::builtin_kernel::square(), chunks).get();
    return ms(clock::now() - t0).count();
  };

  const int total_runs = 1 + demo.warmup + demo.repeat;
  gpupool_cli::progress_line progress("demo runs", static_cast<std::size_t>(total_runs));
  const double cold_ms = square_all();
  std::size_t wrong = wrong_squares(chunks, results);
  progress.step();
  std::vector<double> times_ms;
  for (int run = 1; run < total_runs; ++run) {
    if (run == total_runs - 1 && tracing_wanted(demo)) ex.set_tracing(true);  // the last run
    const double t = square_all();
    if (run > demo.warmup) times_ms.push_back(t);
    progress.step();
  }
  progress.clear();
  if (tracing_wanted(demo)) write_trace_outputs(ex.trace(), demo);
  wrong += wrong_squares(chunks, results);  // the last run's, checked as the first run's was

  const gpupool_cli::run_times steady = gpupool_cli::summarise_runs(times_ms);
  const double input_bytes =
      static_cast<double>(demo.size) * sizeof(double) * static_cast<double>(chunks.size());
  const auto gb_per_s = [&](double t_ms) { return input_bytes / (t_ms * 1e-3) / 1e9; };

  const nlohmann::json report = {{"backend", gpupool::to_string(ex.backend())},
                                 {"devices", ex.devices().size()},
                                 {"lanes_per_device", ex.lanes_per_device()},
                                 {"chunks", demo.chunks},
                                 {"size", demo.size},
                                 {"seed", demo.seed},
                                 {"start_ms", start_ms},
                                 {"cold_ms", cold_ms},
                                 {"warmup", demo.warmup},
                                 {"repeat", demo.repeat},
                                 {"times_ms", times_ms},
                                 {"median_ms", steady.median},
                                 {"best_ms", steady.min},
                                 {"q1_ms", steady.q1},
                                 {"q3_ms", steady.q3},
                                 {"max_ms", steady.max},
                                 {"input_gb_per_s", gb_per_s(steady.median)},
                                 {"wrong", wrong}};
  if (!demo.summary_path.empty())
    gpupool_cli::write_file(demo.summary_path,
                            [&](std::ostream& o) { o << report.dump() << '\n'; });
  if (demo.json) {
    std::printf("%s\n", report.dump().c_str());
    return wrong == 0 ? 0 : 1;
  }

  for (std::size_t i = 0; i < results.size(); ++i) {
    std::printf("task %zu:", i);
    for (std::size_t j = 0; j < std::min<std::size_t>(results[i].size(), demo.show); ++j)
      std::printf(" %.6g", results[i][j]);
    std::printf(results[i].size() > static_cast<std::size_t>(demo.show) ? " ...\n" : "\n");
  }
  std::printf("backend: %s, %zu device(s) x %d lanes (executor started in %.1f ms)\n",
              gpupool::to_string(ex.backend()), ex.devices().size(), ex.lanes_per_device(),
              start_ms);
  std::printf("squared %d chunks x %zu float64 (%.1f MB in, as much out):\n", demo.chunks,
              demo.size, input_bytes / 1e6);
  std::printf(
      "  steady state: %.3f ms median of %d timed runs after %d warm-up run%s "
      "(min %.3f, IQR %.3f-%.3f, max %.3f ms): %.2f GB/s of input\n",
      steady.median, demo.repeat, demo.warmup, demo.warmup == 1 ? "" : "s", steady.min, steady.q1,
      steady.q3, steady.max, gb_per_s(steady.median));
  std::printf(
      "  cold first run: %.3f ms (%.2f GB/s; once per process: memory is obtained and kernels "
      "loaded; not counted above)\n",
      cold_ms, gb_per_s(cold_ms));
  if (wrong != 0) {
    std::fprintf(stderr, "gpupool demo: %zu results differ from the CPU reference\n", wrong);
    return 1;
  }
  std::printf("all %zu results equal the CPU reference\n", demo.size * chunks.size());
  return 0;
}

// The message of an exception, without the "gpupool: " that the library puts before some
// messages (main adds it to every one).
std::string without_prefix(std::string message) {
  constexpr std::string_view prefix = "gpupool: ";
  while (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
  return message;
}

// The choices of --dtype and --kernel: gpupool's tables, so a new dtype or built-in is offered here
// without a change to this tool.
std::vector<std::string> dtype_names() {
  std::vector<std::string> names;
  for (const gpupool::dtype_info& t : gpupool::dtypes) names.emplace_back(t.name);
  return names;
}

std::vector<std::string> builtin_kernel_names() {
  std::vector<std::string> names;
  for (const gpupool::builtin_kernel_info& k : gpupool::builtin_kernels())
    names.emplace_back(k.name);
  return names;
}

constexpr const char* pictures_elsewhere =
    "this gpupool tool writes no pictures; the `gpupool` command of the Python package "
    "(pip install .; also `python -m gpupool`) takes the same options and draws .png, .svg and "
    ".pdf";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpupool: many worker lanes per GPU, on every GPU, with a CPU stand-in"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("gpupool ") + GPUPOOL_VERSION_STRING);
  pool_flags flags;

  CLI::App* info =
      app.add_subcommand("info", "Print the backend, each device and the configuration");
  flags.add_to(*info);

  demo_flags demo;
  CLI::App* demo_cmd =
      app.add_subcommand("demo", "Square chunks of float64 on every lane and check the results");
  flags.add_to(*demo_cmd);
  demo_cmd->add_option("--chunks", demo.chunks, "number of arrays")->check(CLI::Range(1, 1 << 20));
  demo_cmd
      ->add_option("--size", demo.size, "float64 elements per array (e.g. 100000, 1M; K = 1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 34));
  demo_cmd
      ->add_option("--warmup", demo.warmup,
                   "untimed runs after the cold first run, before the timed ones")
      ->check(CLI::Range(0, 100000));
  demo_cmd
      ->add_option("--repeat", demo.repeat,
                   "timed runs after the warm-up (their median and spread: the steady state)")
      ->check(CLI::Range(1, 100000));
  demo_cmd->add_option("--show", demo.show, "results to print per task")
      ->check(CLI::Range(0, 1000));
  demo_cmd->add_option("--seed", demo.seed, "seed of the random inputs");
  demo_cmd->add_flag("--json", demo.json, "print one JSON object instead of the report");
  demo_cmd
      ->add_option("--summary", demo.summary_path,
                   "also write that JSON object here (.json), whichever is printed")
      ->check(file_type(".json"));
  demo_cmd
      ->add_option("--trace", demo.trace_path,
                   "write the last run's per-task trace here (.json, Chrome trace format)")
      ->check(file_type(".json"));
  demo_cmd
      ->add_option("--timeline", demo.timeline_path,
                   "write the last run's timeline records here (.json; the Python package's "
                   "gpupool command also draws .png, .svg, .pdf)")
      ->check(file_type(".json", pictures_elsewhere));
  demo_cmd->add_flag("--stats", demo.stats, "print the last run's per-lane stats");

  gpupool_cli::bench_flags bench;
  CLI::App* bench_cmd = app.add_subcommand(
      "bench", "Measure the copy limits, then sweep lanes per device x chunk size");
  flags.add_to(*bench_cmd);
  bench_cmd->add_option("--lanes-list", bench.lanes, "lane counts to sweep")
      ->delimiter(',')
      ->check(CLI::Range(1, gpupool::limits::most_lanes_per_device));
  bench_cmd->add_option("--sizes", bench.sizes, "chunk sizes to sweep (e.g. 64K,1M,64M; K = 1024)")
      ->delimiter(',')
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  bench_cmd->add_option("--dtype", bench.dtype, "element type")
      ->check(CLI::IsMember(dtype_names()));
  bench_cmd
      ->add_option("--kernel", bench.kernel,
                   "built-in kernel (those with alpha use alpha = 3; two-input kernels split "
                   "--total over their two arrays)")
      ->check(CLI::IsMember(builtin_kernel_names()));
  bench_cmd->add_option("--total", bench.total, "input bytes per measurement (e.g. 512M)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::uint64_t{8}, std::uint64_t{1} << 40));
  bench_cmd->add_option("--repeat", bench.repeat, "timed runs per point (median reported)")
      ->check(CLI::Range(1, 1000));
  bench_cmd->add_option("--csv", bench.csv_path, "write the points as CSV here (.csv)")
      ->check(file_type(".csv"));
  bench_cmd->add_option("--json", bench.json_path, "write limits and points as JSON here (.json)")
      ->check(file_type(".json"));
  bench_cmd
      ->add_option("--plot", bench.plot_path,
                   "draw throughput curves here (.png, .svg, .pdf: the Python package's gpupool "
                   "command only)")
      ->check(CLI::Validator([](std::string&) -> std::string { return pictures_elsewhere; },
                             "PICTURE"));

  CLI11_PARSE(app, argc, argv);
  // --tuning stands for GPUPOOL_TUNING in this command (the variable wins over the options, the
  // flag over the variable), so what `info` prints is what ran.
  if (!flags.tuning.empty()) ::setenv("GPUPOOL_TUNING", flags.tuning.c_str(), 1);
  try {
    if (info->parsed()) return run_info(flags);
    if (demo_cmd->parsed()) return run_demo(flags, demo);
    if (bench_cmd->parsed()) return gpupool_cli::run_bench(flags.options(), bench);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "gpupool: %s\n", without_prefix(e.what()).c_str());
    return 2;
  }
  return 0;
}
