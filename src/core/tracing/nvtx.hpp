// NVTX ranges for each stage of a task, so Nsight Systems shows what gpupool's own trace shows.
// Built only with -DGPUPOOL_WITH_NVTX=ON; otherwise the macro is nothing at all.
#pragma once

#if defined(GPUPOOL_NVTX)
#include <nvtx3/nvtx3.hpp>

namespace gpupool::detail {
struct nvtx_domain {
  static constexpr const char* name{"gpupool"};
};
}  // namespace gpupool::detail

#define GPUPOOL_NVTX_CONCAT_INNER(a, b) a##b
#define GPUPOOL_NVTX_CONCAT(a, b) GPUPOOL_NVTX_CONCAT_INNER(a, b)
/// Marks the rest of the enclosing scope as the stage `name` (a string literal).
#define GPUPOOL_NVTX_RANGE(name)                                                \
  ::nvtx3::scoped_range_in<::gpupool::detail::nvtx_domain> GPUPOOL_NVTX_CONCAT( \
      gpupool_nvtx_range_, __LINE__) {                                          \
    name                                                                        \
  }
#else
#define GPUPOOL_NVTX_RANGE(name) static_cast<void>(0)
#endif
