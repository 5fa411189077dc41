// Host-side memory queries for the core (pinned allocator, pointer descriptions). No CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpupool::detail::cuda {

/// Page-locked, portable (usable by every device) host memory. @throw std::bad_alloc.
void* host_alloc(std::size_t bytes);
void host_free(void* p) noexcept;
/// True for page-locked or registered host memory.
bool host_is_pinned(const void* p) noexcept;
/// cudaPointerGetAttributes, reduced: kind 0 unknown, 1 pinned host, 2 device, 3 managed.
void describe(const void* p, int& kind, int& device) noexcept;
/// cudaStreamSynchronize on a stream handle given as an integer. @throw cuda_error.
void synchronize_stream(std::uintptr_t stream);

}  // namespace gpupool::detail::cuda
