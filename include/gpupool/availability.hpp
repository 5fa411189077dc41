// Whether a backend can run in this process, without starting an executor.
#pragma once

#include <string>

#include "gpupool/types.hpp"

namespace gpupool {

struct backend_availability {
  bool usable = false;
  int devices = 0;     ///< Devices visible to the backend.
  std::string reason;  ///< Why not, when not usable.
};

/// Whether the CUDA backend can run here: built in, a driver present, at least one visible GPU.
/// Never throws; the answer is computed once per process. Thread-safe.
[[nodiscard]] backend_availability cuda_availability() noexcept;

/// Whether the devices of backend `kind` hold their arrays in CUDA device memory, so that CUDA
/// arrays (CuPy's, PyTorch's) can be handed to them directly. A property of the backend (its
/// traits), so that callers need not ask which backend it is.
[[nodiscard]] bool takes_cuda_arrays(backend_kind kind);

}  // namespace gpupool
