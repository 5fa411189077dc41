#include <cuda_runtime.h>

#include "cuda/cuda_check.hpp"
#include "cuda/global_clock.cuh"
#include "cuda/timestamp.hpp"

namespace gpupool::detail::cuda {
namespace {

__global__ void write_global_timer(std::uint64_t* where) {
  *where = global_clock();
}

}  // namespace

void record_timestamp(std::uint64_t* where, void* stream) {
  write_global_timer<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(where);
  GPUPOOL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gpupool::detail::cuda
