#include <cuda_runtime.h>

#include "core/kernels/elementwise_math.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/elementwise.hpp"
#include "cuda/global_clock.cuh"

namespace gpupool::detail::cuda {
namespace {

constexpr int threads_per_block = 256;
// Enough blocks to fill any current GPU several times over; the grid-stride loop covers the rest.
constexpr std::size_t most_blocks = 8192;

// `clock.begin` null: no stamps (one uniform branch per block, not a second set of kernels).
template <op O, class T>
__global__ void elementwise_kernel(const T* __restrict__ x, const T* __restrict__ y,
                                   T* __restrict__ out, std::size_t count, T alpha,
                                   kernel_clock clock) {
  const bool stamped = clock.begin != nullptr;
  if (stamped && blockIdx.x == 0 && threadIdx.x == 0) *clock.begin = global_clock();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    out[i] = elementwise<O, T>(x[i], y != nullptr ? y[i] : T{}, alpha);
  }
  if (stamped) {
    // The last block to finish stamps the end and resets the counter for the stream's next
    // stamped launch (kernels of one stream run one after another).
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(clock.blocks_done, 1u) == gridDim.x - 1) {
        *clock.end = global_clock();
        *clock.blocks_done = 0;
      }
    }
  }
}

}  // namespace

void launch_elementwise(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
                        std::size_t count, void* stream, const kernel_clock* clock) {
  if (count == 0) return;
  const kernel_clock stamps = clock != nullptr ? *clock : kernel_clock{nullptr, nullptr, nullptr};
  const std::size_t blocks =
      std::min(most_blocks, (count + threads_per_block - 1) / threads_per_block);
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_elementwise(k.operation(), t, [&]<op O, class T>() {
    elementwise_kernel<O, T><<<static_cast<unsigned>(blocks), threads_per_block, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(y), static_cast<T*>(out), count,
        alpha_as<T>(k.alpha(), k.name()), stamps);
  });
  GPUPOOL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gpupool::detail::cuda
