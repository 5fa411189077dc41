// Compiling elementwise kernels for a GPU architecture with NVRTC, cached in memory and on disk.
// Host-side only: it makes CUBIN images; loading and launching them is the backend's job.
// NVRTC is loaded at run time (dlopen), so programs start where it is not installed.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "gpupool/elementwise.hpp"

namespace gpupool::detail::cuda {

/// Whether NVRTC can be loaded here, and if not, why.
bool nvrtc_available(std::string* reason = nullptr);

/// The CUBIN image of `k` (for the array/scalar pattern `is_array`) for compute capability
/// `major`.`minor`. Thread-safe; compiles once per process, and not at all when the disk cache
/// has it. @throw compile_error with NVRTC's log; gpupool::error if NVRTC cannot be loaded.
std::shared_ptr<const std::string> compile_cubin(const elementwise_kernel& k,
                                                 const std::vector<bool>& is_array, int major,
                                                 int minor);

/// A raw kernel's CUBIN and the name its entry point has in it (mangled unless `extern "C"`).
struct raw_cubin {
  std::string image;
  std::string entry;
};

/// The CUBIN of a raw kernel's source for compute capability `major`.`minor`; cached like
/// compile_cubin. @throw compile_error with NVRTC's log (and the source line), also when the
/// source has no kernel named `k.entry()`.
std::shared_ptr<const raw_cubin> compile_raw_cubin(const raw_kernel& k, int major, int minor);

/// Compiled kernels loaded into the process now (cudaLibrary handles, shared by every executor
/// that uses them and unloaded when the last lets go). Defined by the CUDA backend.
std::size_t loaded_libraries_alive();

}  // namespace gpupool::detail::cuda
