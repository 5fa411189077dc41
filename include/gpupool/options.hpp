// Configuration of an executor.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpupool/types.hpp"

namespace gpupool {

/// What submitting does when the work in flight already fills the in-flight budget.
enum class when_full {
  block,  ///< Wait until completions free room (the default).
  raise,  ///< Throw gpupool::out_of_memory naming the sizes; nothing is queued.
};

/// The name of `w`: "block" or "raise".
[[nodiscard]] const char* to_string(when_full w) noexcept;
/// The mode a name of `to_string(when_full)` stands for; nothing for any other text.
[[nodiscard]] std::optional<when_full> when_full_from_name(std::string_view name) noexcept;

/// How `lanes_per_device` and `chunk_bytes` left at 0 (auto) are chosen. The `GPUPOOL_TUNING`
/// environment variable (`auto`, `measured`, `remeasure`, `fixed`) overrides the option.
enum class tuning {
  /// `measured` on CUDA; `fixed` on the CPU backend, whose stand-in devices have no copy engines
  /// to measure.
  automatic,
  /// The best of a short sweep (under a second) of lanes and chunk sizes run on the devices
  /// themselves: measured the first time a machine with these devices asks, then read back
  /// from the cache directory (and kept for the rest of the process).
  measured,
  /// Measured now, and the cached result replaced.
  remeasure,
  /// The fixed defaults: 8 lanes on CUDA (host cores divided among the devices on the CPU
  /// backend, at most 8) and 8 MiB chunks.
  fixed,
};

/// The name of `t`: "auto", "measured", "remeasure" or "fixed" (as GPUPOOL_TUNING spells it).
[[nodiscard]] const char* to_string(tuning t) noexcept;
/// The mode a name of `to_string(tuning)` stands for; nothing for any other text.
[[nodiscard]] std::optional<tuning> tuning_from_name(std::string_view name) noexcept;

/// The bounds an executor keeps its settings within: values outside them are refused, naming
/// the bound. The Python package reads them from here.
namespace limits {
inline constexpr int most_lanes_per_device = 256;
/// Lanes over all of an executor's devices together.
inline constexpr int most_lanes_per_executor = 4096;
inline constexpr int most_slots_per_lane = 64;
/// Devices the CPU backend stands in for (executor_options::cpu_devices, GPUPOOL_CPU_DEVICES).
inline constexpr int most_cpu_devices = 1024;
/// Host lanes an executor may have (executor_options::host_lanes).
inline constexpr int most_host_lanes = 256;
/// The largest call, in bytes in and out together, that may run on host lanes: a call of map or
/// transform_each over host arrays of at most this many bytes (a host lane runs it whole).
inline constexpr std::size_t most_host_task_bytes = std::size_t{256} << 10;
/// Priorities of work (executor_options::priority, task_options::priority): integers from
/// lowest_priority to highest_priority; a higher number is more urgent, and 0 is the default.
inline constexpr int lowest_priority = -3;
inline constexpr int highest_priority = 3;
/// The starvation bound: while work of several priorities waits for a device, its lanes take
/// something other than its oldest work at most this many times in a row (aging); the next take
/// is the oldest. So lower priorities keep at least one take in priority_aging_takes + 1.
inline constexpr unsigned priority_aging_takes = 8;
/// The slowest executor_options::cpu_copy_rate, in bytes per second: below it a copy of a few
/// megabytes would take days, which is a mistaken unit rather than a model of any bus.
inline constexpr double least_cpu_copy_rate = 1024;
}  // namespace limits

/// Throws std::invalid_argument, naming `what` and the range, unless `priority` lies within
/// limits::lowest_priority..limits::highest_priority.
void check_priority(int priority, const char* what = "priority");

/// Aging, the rule by which gpupool's queues serve priorities (and one for code that keeps its
/// own queue of work for lanes): the highest priority's oldest entry is taken, except that after
/// limits::priority_aging_takes takes in a row that passed over the queue's oldest entry, the
/// next take is that oldest entry. Counting takes rather than time bounds a low priority's wait
/// in units of work, whatever the tasks' sizes, with no clock on the queue's path. Returns
/// whether the next take is the oldest entry; `oldest_is_first`: the oldest entry is the highest
/// priority's first (or one priority only is queued); `passed`: the queue's count of takes in a
/// row that passed over its oldest entry, updated here.
[[nodiscard]] inline bool oldest_is_due(bool oldest_is_first, unsigned& passed) noexcept {
  if (oldest_is_first) {
    passed = 0;
    return false;
  }
  if (passed >= limits::priority_aging_takes) {
    passed = 0;
    return true;
  }
  ++passed;
  return false;
}

/// How an executor is set up. Every field has a sensible default; see docs/configuration.md.
struct executor_options {
  /// Which backend to use. Unset: the `GPUPOOL_BACKEND` environment variable (`cpu` or `cuda`),
  /// otherwise CUDA when a usable GPU exists and the CPU backend when not.
  std::optional<backend_kind> backend;

  /// Devices to run on, as backend ordinals (for CUDA, after `CUDA_VISIBLE_DEVICES`), in the
  /// order the executor numbers them. An ordinal named n times makes n devices of one GPU, each
  /// with its own lanes, budgets, statistics and quarantine; they share the GPU's memory (on
  /// CUDA the default in-flight budget is divided among them; `device_memory_budget` is each
  /// one's) and its copy engines. Empty: the
  /// `GPUPOOL_DEVICES` environment variable (ordinals separated by commas, such as `0,0`),
  /// otherwise every visible device once.
  std::vector<int> devices;

  /// Lanes ("threads per GPU") per device, 1 to limits::most_lanes_per_device. 0: chosen as
  /// `tuning` says.
  int lanes_per_device = 0;

  /// Tasks one lane keeps in flight at once (its pipeline depth), 1 to
  /// limits::most_slots_per_lane; each has its own staging slot.
  int slots_per_lane = 2;

  /// Largest piece of an array moved through a staging slot at once. `map` and `transform` split
  /// larger arrays into pieces of this size. 0: chosen as `tuning` says.
  std::size_t chunk_bytes = 0;

  /// How `lanes_per_device` and `chunk_bytes` left at 0 are chosen; values given always win.
  gpupool::tuning tuning = gpupool::tuning::automatic;

  /// Device memory gpupool may hold per device, in bytes; 0 means no limit beyond the device's
  /// own. Staging slots are sized to fit it; larger requests throw out_of_memory.
  std::size_t device_memory_budget = 0;

  /// Bytes of work in flight (queued or running) per device: the input and output bytes of the
  /// `map` inputs, transforms and run-time compiled kernels over host arrays, and what
  /// `submit_sized` declares, which device memory and pinned staging must carry. The executor
  /// admits up to this times the number of devices in all. 0: the default, half of a CUDA
  /// device's memory free when the executor is made (device_info::free_memory), 1 GiB per CPU
  /// stand-in device. SIZE_MAX: no limit (and nothing counted).
  std::size_t in_flight_budget = 0;

  /// What a submit past `in_flight_budget` does: wait for room, or throw out_of_memory.
  /// Submits from inside a task never wait (a lane waiting for lanes could wait forever): they
  /// are admitted over the budget.
  gpupool::when_full when_full = gpupool::when_full::block;

  /// Number of devices the CPU backend stands in for (so multi-device scheduling runs without
  /// GPUs). 0: the `GPUPOOL_CPU_DEVICES` environment variable, otherwise 1.
  int cpu_devices = 0;

  /// The copy rate of each CPU stand-in device, in bytes per second each way: its copies to and
  /// from "device memory" take at least their bytes at this rate, one at a time per direction
  /// and device, as a GPU's copy engines carry every lane's copies. So a stand-in device can
  /// model a GPU's pace without using host cores while it waits (docs/scaling.md). 0: no limit;
  /// otherwise at least limits::least_cpu_copy_rate. Each executor paces its own stand-ins (two
  /// executors on one stand-in each get the whole rate). Ignored by the CUDA backend.
  double cpu_copy_rate = 0;

  /// The priority of work submitted without one (see task_options::priority), from
  /// limits::lowest_priority to limits::highest_priority; higher is more urgent. On CUDA it is
  /// also the lanes' stream priority: above 0, that many levels above the device's least (its
  /// default); a level the device lacks makes the executor's construction throw
  /// std::invalid_argument naming the device's range.
  int priority = 0;

  /// Host lanes: threads beside the devices' lanes that run small calls of built-in kernels over
  /// host arrays (map, transform_each; each at most limits::most_host_task_bytes in and out) on
  /// the host itself, reading the inputs and writing the results directly, without staging or
  /// copies. Such calls are shared between the host lanes and the devices so that both would
  /// finish together, by a model of each side's latency and pace fitted from earlier calls
  /// (executor::placement() reports it); everything else runs on the devices. 0 to limits::most_host_lanes; 0 (the default):
  /// none, every call runs on the devices.
  int host_lanes = 0;

  /// Nothing on stderr from this executor: no notice when gpupool falls back to the CPU backend,
  /// no message when a device is taken out of service, no note of a tuning sweep that failed.
  bool quiet = false;
};

/// Options of one call that queues work (submit, map, transform_each, ...).
struct task_options {
  /// The priority of the call's work: the next free lane of any device takes the queued work of
  /// the highest priority first, first come first served within a priority, with aging so that
  /// lower priorities still progress (see docs/configuration.md, "Priorities"). From
  /// limits::lowest_priority to limits::highest_priority, higher is more urgent; unset: the
  /// executor's (executor_options::priority). Every piece of a map or transform_each carries
  /// it (the single-array `transform` overloads run at the executor's priority). Work a task
  /// submits from its lane does not inherit it: give it its own.
  std::optional<int> priority;
};

/// Where a setting of a running executor came from.
enum class setting_source {
  given,     ///< Set in the options.
  fixed,     ///< The fixed default (tuning::fixed, or the CPU backend's automatic choice).
  measured,  ///< Measured by this executor's constructor (and cached).
  cached,    ///< Read back from an earlier measurement on this machine with these devices.
};

/// The name of `s`: "given", "fixed", "measured" or "cached".
[[nodiscard]] const char* to_string(setting_source s) noexcept;

/// One configuration a tuning sweep ran, and the input bandwidth it reached (bytes of input per
/// second, the squares of 8-byte floats from pageable host memory, results checked).
struct tuning_sample {
  int lanes_per_device = 0;
  std::size_t chunk_bytes = 0;
  double bytes_per_second = 0;
};

/// What an executor runs with, and why.
struct executor_settings {
  int lanes_per_device = 0;
  std::size_t chunk_bytes = 0;
  setting_source lanes_from = setting_source::fixed;
  setting_source chunk_from = setting_source::fixed;
  /// The sweep the measured or cached values came from, in the order it ran; empty otherwise.
  std::vector<tuning_sample> samples;
  /// The cache entry read or written ("" if none).
  std::string cache_file;
  /// Why a measurement was not used or not cached, if something went wrong ("" otherwise).
  std::string note;
};

}  // namespace gpupool
