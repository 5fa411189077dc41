// Whether a backend can run in this process, without starting an executor.
#pragma once

#include <string>

namespace gpupool {

struct backend_availability {
  bool usable = false;
  int devices = 0;     ///< Devices visible to the backend.
  std::string reason;  ///< Why not, when not usable.
};

/// Whether the CUDA backend can run here: built in, a driver present, at least one visible GPU.
/// Never throws; the answer is computed once per process. Thread-safe.
[[nodiscard]] backend_availability cuda_availability() noexcept;

}  // namespace gpupool
