// Page-locked host memory from the CUDA runtime, for the CUDA backend's pinned resource and its
// timers' stamps. No CUDA headers.
#pragma once

#include <cstddef>

namespace gpupool::detail::cuda {

/// Page-locked, portable (usable by every device) host memory. @throw std::bad_alloc.
void* host_alloc(std::size_t bytes);
/// Tolerates a runtime already unloading at process exit. Never throws.
void host_free(void* p) noexcept;

}  // namespace gpupool::detail::cuda
