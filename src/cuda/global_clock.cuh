// The GPU's global nanosecond clock, as device code reads it (for trace stamps).
#pragma once

#include <cstdint>

namespace gpupool::detail::cuda {

__device__ inline std::uint64_t global_clock() {
  std::uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

}  // namespace gpupool::detail::cuda
