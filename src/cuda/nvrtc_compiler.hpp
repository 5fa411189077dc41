// Compiling elementwise kernels for a GPU architecture with NVRTC, cached in memory and on disk.
// Host-side only: it makes CUBIN images; loading and launching them is the backend's job.
// NVRTC is loaded at run time (dlopen), so programs start where it is not installed.
#pragma once

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

}  // namespace gpupool::detail::cuda
