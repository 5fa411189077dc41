// Choosing lanes per device and the chunk size an executor runs with: the values given, the
// fixed defaults, or a short measurement on the devices themselves, cached per machine and
// device model in the cache directory.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tuning/sweep_runner.hpp"
#include "gpupool/options.hpp"

namespace gpupool::detail {

class backend;

/// The fixed default chunk size (8 MiB: an array of up to 8 MiB goes in one piece).
inline constexpr std::size_t default_chunk_bytes = std::size_t{8} << 20;
/// The format of a tuning cache entry (and the start of its key); a different one is a miss.
/// 2: configurations sized by lanes x chunk (format 1's fixed 128 MiB favoured small chunks).
/// 3: results written to pinned memory, as maps write them (2 paid a second host copy).
inline constexpr const char* tuning_entry_format = "gpupool-tuning 3";
/// The executor's limits on the two settings (it refuses values outside them; a cache entry
/// outside them is not used).
inline constexpr int most_lanes_per_device = limits::most_lanes_per_device;
inline constexpr std::size_t smallest_chunk = 4096;

struct backend_traits;

/// The fixed default lanes per device on a backend with `traits` (or of `kind`) with `devices`
/// devices, on this host.
[[nodiscard]] int default_lanes(const backend_traits& traits, std::size_t devices);
[[nodiscard]] int default_lanes(backend_kind kind, std::size_t devices);

/// The effective tuning mode: `GPUPOOL_TUNING` (auto, measured, remeasure, fixed) when set,
/// else `requested`. @throw std::invalid_argument for any other value of the variable.
[[nodiscard]] tuning tuning_mode(tuning requested);

/// One configuration a sweep measures, ready to run (on an executor: sweep_runner.hpp). Tuning
/// times it and checks its results; it only has to run.
class sweep_configuration {
 public:
  virtual ~sweep_configuration() = default;
  /// The values it runs with (the executor fits a chunk size to its limits).
  [[nodiscard]] virtual int lanes_per_device() const = 0;
  [[nodiscard]] virtual std::size_t chunk_bytes() const = 0;
  /// Squares `in` into `out` (the same length) and returns when every element is written.
  virtual void square(std::span<const double> in, std::span<double> out) = 0;
};

/// Makes the configuration `options` describe (their lanes per device, chunk size, backend and
/// devices; tuning fixed). Throws what making it throws (no memory, no thread, a value out of
/// range): the sweep leaves that configuration out.
using sweep_runner = std::function<std::unique_ptr<sweep_configuration>(const executor_options&)>;

/// The settings an executor over `ordinals` of `b` runs with: the options' values where given,
/// else measured (or read back from an earlier measurement) where the mode calls for it, else the
/// fixed defaults. A measurement that fails leaves the fixed defaults and says why in `note`;
/// it never fails the executor. The executor checks given values against the limits before it
/// calls this (nothing is measured for values it refuses), and the chosen ones after.
/// What the sweep measures is made by `runner`.
[[nodiscard]] executor_settings choose_settings(const executor_options& options, backend& b,
                                                const std::vector<int>& ordinals,
                                                const sweep_runner& runner);

/// choose_settings measuring on executors (executor_sweep_runner), for the executor itself;
/// instantiated only where `Executor` is complete.
template <class Executor = executor>
[[nodiscard]] executor_settings choose_settings(const executor_options& options, backend& b,
                                                const std::vector<int>& ordinals) {
  return choose_settings(options, b, ordinals, executor_sweep_runner<Executor>());
}

/// What a sweep measures and how long it may take (tests shrink it).
struct sweep_plan {
  std::vector<int> lanes;           // candidates, in order
  std::vector<std::size_t> chunks;  // candidates, in order
  // Each configuration squares lanes x chunk x pieces_per_lane bytes per device (so that every
  // lane runs that many pieces: a steady state, not the ramp of a few), at least
  // bytes_per_device and at most most_bytes_per_device (0: bytes_per_device).
  std::size_t bytes_per_device = 0;
  std::size_t most_bytes_per_device = 0;
  std::size_t pieces_per_lane = 8;
  // No new configuration starts this long after the first one ended (the first pays for what
  // every executor pays once per process: device contexts, the first pinned blocks).
  double seconds = 1.0;
  int repeats = 3;  // timed passes per configuration (the median counts), after one warm-up
};

/// What a sweep ran: its samples, how many configurations it planned, and why the first one
/// that could not run did not ("" if every one ran).
struct sweep_result {
  std::vector<tuning_sample> samples;
  std::size_t planned = 0;
  std::string failure;
};

/// Sets the `seconds` of the plans plan_for makes from now on (1 by default; tests on slow
/// builds lengthen it); returns the previous value.
double set_sweep_seconds(double seconds);

/// Forgets what this process measured or read (tests: the next executor reads the cache file).
void forget_measurements();

/// The plan for a backend with `traits` (or of `kind`) with `devices` devices (lanes and chunks
/// the options give are the only candidates for that setting).
[[nodiscard]] sweep_plan plan_for(const executor_options& options, const backend_traits& traits,
                                  std::size_t devices);
[[nodiscard]] sweep_plan plan_for(const executor_options& options, backend_kind kind,
                                  std::size_t devices);

/// Runs `plan` on configurations `runner` makes from `options` (backend and devices as given):
/// lanes first, at the middle chunk size, then chunk sizes at the best lane count. Each
/// configuration squares the same pageable array of doubles and is checked before its time
/// counts. A configuration that cannot be made (no memory, no thread, a value out of range) is
/// left out. @throw gpupool::error when a result is wrong, or when no configuration could run.
[[nodiscard]] sweep_result run_sweep(const executor_options& options, const sweep_plan& plan,
                                     const sweep_runner& runner);

/// The best sample: of those within 5% of the highest bandwidth, the one with the fewest lanes
/// per device (the fastest of those; the first of equals). `samples` must not be empty.
[[nodiscard]] const tuning_sample& best_of(const std::vector<tuning_sample>& samples);

/// A sweep's result as the cache stores it, and back. `parse_tuning_entry` returns nothing for
/// anything but a well-formed entry with values inside the limits.
[[nodiscard]] std::string tuning_entry_json(const std::vector<tuning_sample>& samples);
[[nodiscard]] std::vector<tuning_sample> parse_tuning_entry(const std::string& text);

}  // namespace gpupool::detail
