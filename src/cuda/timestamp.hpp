// Stream-ordered timestamps written by the GPU itself. No CUDA headers here.
#pragma once

#include <cstdint>

namespace gpupool::detail::cuda {

/// Enqueues a one-thread kernel on `stream` (a cudaStream_t) that writes the device's global
/// nanosecond clock to `where` (pinned host memory) once the stream reaches it.
/// @throw cuda_error if the launch fails.
void record_timestamp(std::uint64_t* where, void* stream);

}  // namespace gpupool::detail::cuda
