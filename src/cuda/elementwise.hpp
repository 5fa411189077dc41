// Launches of the built-in elementwise kernels. No CUDA headers here.
#pragma once

#include <cstddef>

#include "gpupool/types.hpp"

namespace gpupool::detail::cuda {

/// Enqueues out = k(x[, y]) over `count` elements on `stream` (a cudaStream_t).
/// @throw cuda_error if the launch fails.
void launch_elementwise(const kernel& k, dtype t, const void* x, const void* y, void* out,
                        std::size_t count, void* stream);

}  // namespace gpupool::detail::cuda
