// Pinned host memory from CUDA, for gpupool's pinned allocator. No CUDA headers here.
#pragma once

#include <cstddef>

namespace gpupool::detail::cuda {

/// Page-locked, portable (usable by every device) host memory. @throw std::bad_alloc.
void* host_alloc(std::size_t bytes);
void host_free(void* p) noexcept;
/// True for page-locked or registered host memory.
bool host_is_pinned(const void* p) noexcept;

}  // namespace gpupool::detail::cuda
