#include "core/tuning/tuning.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/backend.hpp"
#include "core/kernels/kernel_cache.hpp"
#include "gpupool/error.hpp"
#include "gpupool/fork.hpp"
#include "gpupool/pinned.hpp"
#include "gpupool/version.hpp"

namespace gpupool {

const char* to_string(tuning t) noexcept {
  switch (t) {
    case tuning::automatic:
      return "auto";
    case tuning::measured:
      return "measured";
    case tuning::remeasure:
      return "remeasure";
    case tuning::fixed:
      return "fixed";
  }
  return "unknown";
}

std::optional<tuning> tuning_from_name(std::string_view name) noexcept {
  for (tuning t : {tuning::automatic, tuning::measured, tuning::remeasure, tuning::fixed})
    if (name == to_string(t)) return t;
  return std::nullopt;
}

const char* to_string(setting_source s) noexcept {
  switch (s) {
    case setting_source::given:
      return "given";
    case setting_source::fixed:
      return "fixed";
    case setting_source::measured:
      return "measured";
    case setting_source::cached:
      return "cached";
  }
  return "unknown";
}

namespace detail {
namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
// A configuration squares enough per device for each lane to run sweep_pieces_per_lane pieces,
// and at least the backend's sweep_bytes_per_device, at most its most_sweep_bytes_per_device (and
// never more than `most_sweep_bytes` over all devices; the sweep's input and output arrays each
// hold that much host memory): with a piece or two per lane a lane never reaches its steady
// state, and bigger chunks looked worse than they run (a fixed size per configuration chose
// chunks smaller than the best). Even the largest configuration takes a small part of a second,
// so the whole sweep stays within its second.
constexpr std::size_t sweep_pieces_per_lane = 8;
constexpr std::size_t most_sweep_bytes = 2048 * mib;
// Beyond the executor's own limits (tuning.hpp), a sane size for a cache entry's chunks.
constexpr std::size_t largest_chunk = std::size_t{1} << 34;
constexpr std::size_t most_samples = 64;
// Rates within this share of the fastest sample's are a tie, which the fewest lanes win: the
// sweep's large pieces rate lane counts within a few percent of each other differently from one
// run to the next, while every lane more is a thread more competing for the host's cores with
// the caller, which small tasks (a Python caller's above all) feel where the sweep does not.
constexpr double lanes_tie = 0.05;

// The cores this process may run on (its CPU affinity, as a container or taskset sets it),
// else the machine's.
unsigned host_cores() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0)
    return static_cast<unsigned>(CPU_COUNT(&allowed));
  return std::max(1u, std::thread::hardware_concurrency());
}

std::string read_host_identity() {
  std::string id;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) id += name;
  id += "|cores=" + std::to_string(std::thread::hardware_concurrency());
  // The CPU model: the host memcpy rate depends on it. Read a bounded prefix of the file.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  for (int i = 0; i < 64 && std::getline(cpuinfo, line); ++i) {
    if (line.rfind("model name", 0) == 0) {
      id.append("|").append(line, 0, 200);
      break;
    }
  }
  return id;
}

// Read once per process: each executor that tunes builds its key from it.
const std::string& host_identity() {
  static const std::string id = read_host_identity();
  return id;
}

// Everything the choice depends on: the machine, the devices (their descriptions and number,
// not their ordinals), gpupool's version, and the settings that constrain the sweep.
std::string tuning_key(const executor_options& o, backend& b, const std::vector<int>& ordinals) {
  std::string key = std::string(tuning_entry_format) + "|gpupool " GPUPOOL_VERSION_STRING "|" +
                    to_string(b.kind()) + "|" + host_identity() +
                    "|devices=" + std::to_string(ordinals.size());
  for (int ordinal : ordinals) {
    const device_info d = b.describe(ordinal);
    key += "|" + d.name + " sm" + std::to_string(d.compute_major) +
           std::to_string(d.compute_minor) + " mem" + std::to_string(d.total_memory) + " mp" +
           std::to_string(d.multiprocessors);
  }
  key += "|lanes=" + std::to_string(o.lanes_per_device) +
         "|chunk=" + std::to_string(o.chunk_bytes) + "|slots=" + std::to_string(o.slots_per_lane) +
         "|device_budget=" + std::to_string(o.device_memory_budget);
  // Added only where they differ from the usual, so that the keys of every other executor (and
  // the entries cached under them) stay as they were. Which devices are one GPU ("0,0" for a GPU
  // as two devices), by order of first appearance so that the ordinals themselves do not count:
  std::map<int, std::size_t> rank;  // each ordinal's place among the distinct ones
  std::string gpus;
  for (int ordinal : ordinals) {
    if (!gpus.empty()) gpus += ',';
    gpus += std::to_string(rank.emplace(ordinal, rank.size()).first->second);
  }
  if (rank.size() != ordinals.size()) key += "|gpus=" + gpus;
  if (o.cpu_copy_rate != 0) {
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.17g", o.cpu_copy_rate);
    key += std::string("|copy_rate=") + rate;
  }
  return key;
}

// What this process knows of a key: a sweep's samples (empty if measuring failed), the cache
// file, and what went wrong, if anything.
struct memo_entry {
  std::vector<tuning_sample> samples;
  std::string cache_file;
  std::string note;
  bool measured_here = false;  // by this process (else read from the cache)
};

// One measurement at a time in this process (two at once would each measure half the machine),
// and each key measured at most once per process, failures included.
struct memo {
  std::mutex mutex;
  std::map<std::string, memo_entry> by_key;
};

// Made at the first use, never destroyed (executors may be made during exit); a forked child
// starts with a fresh one (fork() may have copied the mutex locked by a thread that is not in the
// child).
constinit fork_fresh<memo> memos;

memo& the_memo() {
  return memos.get();
}

std::atomic<double> sweep_seconds{1.0};

// Another process measuring the same key on the same machine would measure half of it: holds an
// exclusive lock on `<entry>.lock` beside the entry while this process reads, measures and
// writes it. Without a lock file (a read-only folder, say) it simply goes on unlocked.
class entry_lock {
 public:
  explicit entry_lock(const std::string& entry) {
    if (entry.empty()) return;
    const std::string path = entry + ".lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  entry_lock(const entry_lock&) = delete;
  entry_lock& operator=(const entry_lock&) = delete;
  ~entry_lock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }

 private:
  int fd_ = -1;
};

// A configuration that computed a wrong result: the whole sweep is void.
class wrong_result : public error {
 public:
  using error::error;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Squares `count` elements of `in` into `out` with `lanes` and `chunk`: the median of `repeats`
// timed passes after one warm-up, checked.
tuning_sample measure_one(const executor_options& base, const sweep_runner& runner, int lanes,
                          std::size_t chunk, const std::vector<double>& in,
                          pinned_vector<double>& out, std::size_t count, int repeats) {
  executor_options o = base;
  o.lanes_per_device = lanes;
  o.chunk_bytes = chunk;
  o.tuning = tuning::fixed;
  o.quiet = true;
  const std::unique_ptr<sweep_configuration> configuration = runner(o);
  if (!configuration) throw error("gpupool: the tuning sweep made no configuration");
  count = std::min({count, in.size(), out.size()});
  const std::span<const double> input(in.data(), count);
  const std::span<double> output(out.data(), count);
  configuration->square(input, output);  // warm-up: streams, pools, pages
  // Every timed pass writes every element: a wrong value left after them is a wrong result.
  std::fill(output.begin(), output.end(), -1.0);
  std::vector<double> seconds;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
    configuration->square(input, output);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  for (std::size_t i = 0; i < count; ++i)
    if (out[i] != in[i] * in[i])
      throw wrong_result("gpupool: tuning with " + std::to_string(lanes) + " lanes and " +
                         std::to_string(chunk) + "-byte chunks computed " + std::to_string(out[i]) +
                         " for element " + std::to_string(i) + " (expected " +
                         std::to_string(in[i] * in[i]) + "); nothing measured is used");
  const double t = median(std::move(seconds));
  return {configuration->lanes_per_device(), configuration->chunk_bytes(),
          static_cast<double>(count * sizeof(double)) / std::max(t, 1e-9)};
}

}  // namespace

int default_lanes(const backend_traits& traits, std::size_t devices) {
  return traits.default_lanes(std::max<std::size_t>(devices, 1), host_cores());
}

int default_lanes(backend_kind kind, std::size_t devices) {
  return default_lanes(traits_of(kind), devices);
}

tuning tuning_mode(tuning requested) {
  const char* value = std::getenv("GPUPOOL_TUNING");
  if (value == nullptr || *value == '\0') return requested;
  if (auto t = tuning_from_name(value)) return *t;
  throw std::invalid_argument(
      "gpupool: GPUPOOL_TUNING must be auto, measured, remeasure or fixed, not '" +
      std::string(std::string_view(value).substr(0, 64)) + "'");
}

double set_sweep_seconds(double seconds) {
  return sweep_seconds.exchange(seconds);
}

void forget_measurements() {
  memo& m = the_memo();
  std::lock_guard lock(m.mutex);
  m.by_key.clear();
}

sweep_plan plan_for(const executor_options& options, const backend_traits& traits,
                    std::size_t devices) {
  sweep_plan plan;
  devices = std::max<std::size_t>(devices, 1);
  if (options.lanes_per_device != 0)
    plan.lanes = {options.lanes_per_device};
  else
    plan.lanes = traits.sweep_lanes(devices, host_cores());
  if (options.chunk_bytes != 0)
    plan.chunks = {options.chunk_bytes};
  else
    plan.chunks.assign(traits.sweep_chunks.begin(), traits.sweep_chunks.end());
  plan.bytes_per_device = std::min(traits.sweep_bytes_per_device, most_sweep_bytes / devices);
  plan.most_bytes_per_device =
      std::min(traits.most_sweep_bytes_per_device, most_sweep_bytes / devices);
  plan.pieces_per_lane = sweep_pieces_per_lane;
  plan.seconds = sweep_seconds.load();
  return plan;
}

sweep_plan plan_for(const executor_options& options, backend_kind kind, std::size_t devices) {
  return plan_for(options, traits_of(kind), devices);
}

sweep_result run_sweep(const executor_options& options, const sweep_plan& plan,
                       const sweep_runner& runner) {
  if (plan.lanes.empty() || plan.chunks.empty())
    throw std::invalid_argument("gpupool: a tuning sweep needs lanes and chunk sizes to try");
  const std::size_t devices = std::max<std::size_t>(options.devices.size(), 1);
  const std::size_t most_per_device = std::max(plan.bytes_per_device, plan.most_bytes_per_device);
  // Elements one configuration squares over all devices.
  auto elements_for = [&](int lanes, std::size_t chunk) {
    const std::size_t wanted = static_cast<std::size_t>(lanes) * chunk * plan.pieces_per_lane;
    const std::size_t per_device = std::clamp(wanted, plan.bytes_per_device, most_per_device);
    return std::max<std::size_t>(per_device * devices / sizeof(double), 1);
  };
  std::size_t count = 0;
  for (int lanes : plan.lanes)
    for (std::size_t chunk : plan.chunks) count = std::max(count, elements_for(lanes, chunk));
  // Pageable in and pinned out, as maps run (their results land in pinned blocks): a pageable
  // output would add a second host copy per piece, which a map never pays.
  std::vector<double> in(count);
  pinned_vector<double> out(count);
  // Squares exact in doubles, so the check compares exactly. Writing `out` here too takes its
  // first-touch page faults out of the measurements.
  for (std::size_t i = 0; i < count; ++i) {
    in[i] = static_cast<double>(i % 4096) * 0.25;
    out[i] = 0.0;
  }

  sweep_result result;
  result.planned = plan.lanes.size() + plan.chunks.size() - 1;
  // The clock starts once the first configuration has run: it pays for what any executor pays
  // once per process (the devices' contexts, the first pinned blocks), not for measuring.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  auto run = [&](int lanes, std::size_t chunk) {
    if (deadline && std::chrono::steady_clock::now() >= *deadline) return false;
    try {
      result.samples.push_back(measure_one(options, runner, lanes, chunk, in, out,
                                           elements_for(lanes, chunk), plan.repeats));
    } catch (const wrong_result&) {
      throw;
    } catch (const std::exception& e) {
      // The other candidates may run (this one asked for too much memory, say).
      if (result.failure.empty()) result.failure = e.what();
    }
    if (!deadline)
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(plan.seconds));
    return true;
  };
  auto best_lanes_so_far = [&] {
    if (result.samples.empty())
      throw error("gpupool: no tuning configuration could run: " + result.failure);
    return best_of(result.samples).lanes_per_device;
  };
  // Lanes first, at the middle chunk size; then the chunk sizes at the best lane count.
  const std::size_t middle = plan.chunks[plan.chunks.size() / 2];
  for (int lanes : plan.lanes)
    if (!run(lanes, middle)) return result;
  const int best_lanes = best_lanes_so_far();
  for (std::size_t chunk : plan.chunks)
    if (chunk != middle && !run(best_lanes, chunk)) return result;
  (void)best_lanes_so_far();
  return result;
}

const tuning_sample& best_of(const std::vector<tuning_sample>& samples) {
  if (samples.empty()) throw std::invalid_argument("gpupool: no tuning samples");
  double fastest = 0.0;
  for (const auto& s : samples) fastest = std::max(fastest, s.bytes_per_second);
  const tuning_sample* best = nullptr;
  for (const auto& s : samples) {
    if (!(s.bytes_per_second >= (1.0 - lanes_tie) * fastest)) continue;  // NaN too
    if (best == nullptr || s.lanes_per_device < best->lanes_per_device ||
        (s.lanes_per_device == best->lanes_per_device &&
         s.bytes_per_second > best->bytes_per_second))
      best = &s;
  }
  return best != nullptr ? *best : samples.front();  // no rate to compare at all
}

std::string tuning_entry_json(const std::vector<tuning_sample>& samples) {
  nlohmann::json entry = {{"format", tuning_entry_format}, {"samples", nlohmann::json::array()}};
  for (const auto& s : samples)
    entry["samples"].push_back({{"lanes_per_device", s.lanes_per_device},
                                {"chunk_bytes", s.chunk_bytes},
                                {"bytes_per_second", s.bytes_per_second}});
  return entry.dump();
}

std::vector<tuning_sample> parse_tuning_entry(const std::string& text) {
  const nlohmann::json entry = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!entry.is_object() || entry.value("format", nlohmann::json()) != tuning_entry_format)
    return {};
  const auto found = entry.find("samples");
  if (found == entry.end() || !found->is_array() || found->empty() || found->size() > most_samples)
    return {};
  std::vector<tuning_sample> samples;
  for (const auto& s : *found) {
    if (!s.is_object()) return {};
    const auto lanes = s.find("lanes_per_device");
    const auto chunk = s.find("chunk_bytes");
    const auto rate = s.find("bytes_per_second");
    if (lanes == s.end() || chunk == s.end() || rate == s.end() || !lanes->is_number_unsigned() ||
        !chunk->is_number_unsigned() || !rate->is_number())
      return {};
    const auto l = lanes->get<std::uint64_t>();
    const auto c = chunk->get<std::uint64_t>();
    const auto r = rate->get<double>();
    if (l < 1 || l > most_lanes_per_device || c < smallest_chunk || c > largest_chunk ||
        !std::isfinite(r) || r <= 0)
      return {};
    samples.push_back({static_cast<int>(l), static_cast<std::size_t>(c), r});
  }
  return samples;
}

namespace {

// Whether every sample is one `plan` could have produced (a cache entry from a different plan,
// or edited by hand, is not used).
bool fits_plan(const std::vector<tuning_sample>& samples, const sweep_plan& plan) {
  const std::size_t largest = *std::max_element(plan.chunks.begin(), plan.chunks.end());
  for (const auto& s : samples)
    if (std::find(plan.lanes.begin(), plan.lanes.end(), s.lanes_per_device) == plan.lanes.end() ||
        s.chunk_bytes > largest)
      return false;
  return true;
}

// Measures for `key` (the memo's lock held): the entry to remember, cached when the sweep was
// whole.
memo_entry measure(const executor_options& o, backend& b, const std::vector<int>& ordinals,
                   const std::string& key, const std::string& file, const sweep_plan& plan,
                   const sweep_runner& runner) {
  memo_entry entry;
  entry.measured_here = true;
  executor_options sweep = o;
  sweep.backend = b.kind();
  sweep.devices = ordinals;
  sweep_result result;
  try {
    result = run_sweep(sweep, plan, runner);
  } catch (const std::exception& e) {
    entry.note = std::string("measuring failed, fixed defaults used: ") + e.what();
    if (!o.quiet) std::fprintf(stderr, "%s\n", entry.note.c_str());
    return entry;
  }
  trim_pinned_cache();  // the sizes tried and not chosen: page-locked memory is scarce
  entry.samples = std::move(result.samples);
  if (entry.samples.size() < result.planned || !result.failure.empty()) {
    // A partial sweep (cut short by its deadline, or a configuration that could not run) is
    // used by this process but not kept for others.
    entry.note = "not cached: " + std::to_string(entry.samples.size()) + " of " +
                 std::to_string(result.planned) + " configurations ran" +
                 (result.failure.empty() ? "" : " (" + result.failure + ")");
    return entry;
  }
  if (file.empty()) return entry;
  try {
    store_entry(file, key, tuning_entry_json(entry.samples));
    entry.cache_file = file;
  } catch (const std::exception& e) {
    entry.note = std::string("not cached: ") + e.what();
  }
  return entry;
}

}  // namespace

executor_settings choose_settings(const executor_options& o, backend& b,
                                  const std::vector<int>& ordinals, const sweep_runner& runner) {
  executor_settings s;
  s.lanes_per_device =
      o.lanes_per_device != 0 ? o.lanes_per_device : default_lanes(b.traits(), ordinals.size());
  s.lanes_from = o.lanes_per_device != 0 ? setting_source::given : setting_source::fixed;
  s.chunk_bytes = o.chunk_bytes != 0 ? o.chunk_bytes : default_chunk_bytes;
  s.chunk_from = o.chunk_bytes != 0 ? setting_source::given : setting_source::fixed;
  tuning mode = tuning_mode(o.tuning);  // read (and a bad value refused) on every path
  if (o.lanes_per_device != 0 && o.chunk_bytes != 0) return s;
  if (mode == tuning::automatic) mode = b.traits().automatic_tuning;
  if (mode == tuning::fixed) return s;

  const std::string key = tuning_key(o, b, ordinals);
  const sweep_plan plan = plan_for(o, b.traits(), ordinals.size());
  std::string folder;
  std::string file;
  std::string folder_note;
  try {
    folder = cache_folder("tuning", if_cache_unusable::fail);
    file = folder + "/" + entry_file_name(key, ".json");
  } catch (const std::exception& e) {
    folder_note = std::string("not cached: ") + e.what();
  }
  memo& m = the_memo();
  std::lock_guard lock(m.mutex);
  // Once per process and key: a later executor (remeasure included) uses what the first found.
  const std::string memo_key = key + "|" + folder;  // another cache folder, another entry
  auto known = m.by_key.find(memo_key);
  if (known != m.by_key.end() && mode == tuning::remeasure && !known->second.measured_here) {
    m.by_key.erase(known);  // read from the cache: remeasure does measure, once
    known = m.by_key.end();
  }
  setting_source source = setting_source::cached;
  if (known == m.by_key.end()) {
    entry_lock other_processes(file);
    memo_entry entry;
    if (mode == tuning::measured && !file.empty()) {
      if (auto image = load_entry(file, key)) {
        entry.samples = parse_tuning_entry(*image);
        if (!entry.samples.empty() && fits_plan(entry.samples, plan))
          entry.cache_file = file;
        else
          entry.samples.clear();
      }
    }
    if (entry.samples.empty()) {
      entry = measure(o, b, ordinals, key, file, plan, runner);
      source = setting_source::measured;
    }
    if (entry.note.empty()) entry.note = folder_note;
    known = m.by_key.emplace(memo_key, std::move(entry)).first;
  }
  const memo_entry& entry = known->second;
  s.cache_file = entry.cache_file;
  s.note = entry.note;
  if (entry.samples.empty()) return s;  // measuring failed: the fixed defaults, and why
  const tuning_sample& best = best_of(entry.samples);
  if (o.lanes_per_device == 0) {
    s.lanes_per_device = best.lanes_per_device;
    s.lanes_from = source;
  }
  if (o.chunk_bytes == 0) {
    s.chunk_bytes = best.chunk_bytes;
    s.chunk_from = source;
  }
  s.samples = entry.samples;
  return s;
}

}  // namespace detail
}  // namespace gpupool
