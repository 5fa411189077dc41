#include <cuda_runtime.h>

#include "cuda/cuda_check.hpp"
#include "cuda/timestamp.hpp"

namespace gpupool::detail::cuda {
namespace {

__global__ void write_global_timer(std::uint64_t* where) {
  std::uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  *where = now;
}

}  // namespace

void record_timestamp(std::uint64_t* where, void* stream) {
  write_global_timer<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(where);
  GPUPOOL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gpupool::detail::cuda
