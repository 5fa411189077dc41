// Launches of the built-in elementwise kernels. No CUDA headers here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpupool/types.hpp"

namespace gpupool::detail::cuda {

/// Where a kernel stamps its own start and finish with the GPU's global nanosecond clock.
struct kernel_clock {
  std::uint64_t* begin;       ///< pinned host memory: written by block 0 as it starts
  std::uint64_t* end;         ///< pinned host memory: written by the last block to finish
  unsigned int* blocks_done;  ///< device memory, zero before the launch (and left zero after)
};

/// Enqueues out = k(x[, y]) over `count` elements on `stream` (a cudaStream_t); with `clock`,
/// the kernel also stamps its start and finish there.
/// @throw cuda_error if the launch fails.
void launch_elementwise(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
                        std::size_t count, void* stream, const kernel_clock* clock = nullptr);

}  // namespace gpupool::detail::cuda
