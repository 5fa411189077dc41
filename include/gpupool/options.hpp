// Configuration of an executor.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "gpupool/types.hpp"

namespace gpupool {

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

  /// Number of devices the CPU backend stands in for (so multi-device scheduling runs without
  /// GPUs). 0: the `GPUPOOL_CPU_DEVICES` environment variable, otherwise 1.
  int cpu_devices = 0;

  /// Suppresses the one-line notice printed when gpupool falls back to the CPU backend.
  bool quiet = false;
};

}  // namespace gpupool
