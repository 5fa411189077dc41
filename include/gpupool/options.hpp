// Configuration of an executor.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "gpupool/types.hpp"

namespace gpupool {

/// What submitting does when the work in flight already fills the in-flight budget.
enum class when_full {
  block,  ///< Wait until completions free room (the default).
  raise,  ///< Throw gpupool::out_of_memory naming the sizes; nothing is queued.
};

/// How an executor is set up. Every field has a sensible default; see docs/configuration.md.
struct executor_options {
  /// Which backend to use. Unset: the `GPUPOOL_BACKEND` environment variable (`cpu` or `cuda`),
  /// otherwise CUDA when a usable GPU exists and the CPU backend when not.
  std::optional<backend_kind> backend;

  /// Devices to run on, as backend ordinals (for CUDA, after `CUDA_VISIBLE_DEVICES`).
  /// Empty: every visible device.
  std::vector<int> devices;

  /// Lanes ("threads per GPU") per device. 0: the backend's default (8 on CUDA; on the CPU
  /// backend, host cores divided among the devices, at least 1).
  int lanes_per_device = 0;

  /// Tasks one lane keeps in flight at once (its pipeline depth); each has its own staging slot.
  int slots_per_lane = 2;

  /// Largest piece of an array moved through a staging slot at once. `map` and `transform` split
  /// larger arrays into pieces of this size.
  std::size_t chunk_bytes = std::size_t{8} << 20;

  /// Device memory gpupool may hold per device, in bytes; 0 means no limit beyond the device's
  /// own. Staging slots are sized to fit it; larger requests throw out_of_memory.
  std::size_t device_memory_budget = 0;

  /// Bytes of work in flight (queued or running) per device: the input and output bytes of the
  /// `map` inputs, transforms and run-time compiled kernels over host arrays, and what
  /// `submit_sized` declares, which device memory and pinned staging must carry. The executor
  /// admits up to this times the number of devices in all. 0: the default, half of a CUDA
  /// device's memory, 1 GiB per CPU stand-in device. SIZE_MAX: no limit (and nothing counted).
  std::size_t in_flight_budget = 0;

  /// What a submit past `in_flight_budget` does: wait for room, or throw out_of_memory.
  /// Submits from inside a task never wait (a lane waiting for lanes could wait forever): they
  /// are admitted over the budget.
  gpupool::when_full when_full = gpupool::when_full::block;

  /// Number of devices the CPU backend stands in for (so multi-device scheduling runs without
  /// GPUs). 0: the `GPUPOOL_CPU_DEVICES` environment variable, otherwise 1.
  int cpu_devices = 0;

  /// Suppresses the one-line notice printed when gpupool falls back to the CPU backend.
  bool quiet = false;
};

}  // namespace gpupool
