// The one way gpupool checks a CUDA runtime call: evaluate it once, clear the error, throw a
// cuda_error naming the error, the call and the place.
#pragma once

#include <cuda_runtime_api.h>

namespace gpupool::detail::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line);

}  // namespace gpupool::detail::cuda

#define GPUPOOL_CUDA_CHECK(call)                                                             \
  do {                                                                                       \
    const cudaError_t gpupool_status_ = (call);                                              \
    if (gpupool_status_ != cudaSuccess) {                                                    \
      (void)cudaGetLastError();                                                              \
      ::gpupool::detail::cuda::throw_cuda_error(gpupool_status_, #call, __FILE__, __LINE__); \
    }                                                                                        \
  } while (0)
