// What the CUDA backend is like (backend_traits): its defaults and what it can do. Header-only,
// so that builds without the toolkit (cuda_unavailable.cpp) describe it the same way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/backend.hpp"
#include "cuda/cuda_source.hpp"

namespace gpupool::detail::cuda_traits_detail {

constexpr std::size_t mib = std::size_t{1} << 20;

/// Threads one multiprocessor keeps resident on the GPUs gpupool targets (Volta, Ampere A100,
/// Hopper: 2048; some consumer parts hold fewer, which only makes the estimate generous).
inline constexpr std::size_t resident_threads_per_multiprocessor = 2048;
/// How many times over a batch must fill the GPU before a device map is cut finer.
inline constexpr std::size_t waves_per_device_batch = 8;

// Chosen by measurement: on a few large arrays, 8 lanes finish sooner than 4 or 16 (see
// docs/performance.md).
inline int default_lanes(std::size_t /*devices*/, unsigned /*host_cores*/) {
  return 8;
}

// Half the device's memory free when the executor was made (at least one byte): the rest is left
// to the staging slots, the tasks' own allocations and what other processes may still take;
// memory they hold already is not counted on.
inline std::size_t default_in_flight_budget(const device_info& d) {
  return std::max<std::size_t>(d.free_memory / 2, 1);
}

// Enough to fill the GPU waves_per_device_batch times over: a batch that big already keeps every
// multiprocessor busy on its own, and cutting a map finer only costs time (more launches, more
// lanes waiting on the GPU); a floor of fewer waves was slower too (docs/performance.md). A GPU
// that reports no multiprocessors counts as one.
inline std::size_t least_device_batch_elements(const device_info& d) {
  return static_cast<std::size_t>(std::max(d.multiprocessors, 1)) *
         resident_threads_per_multiprocessor * waves_per_device_batch;
}

// 4 to 16 lanes: fewer never keep a GPU's copy engines and multiprocessors busy together. More
// than 4 only where every device's lanes together leave a host core to the caller's thread:
// lanes stage, complete and wait on the host, and a caller that must share a core with them
// feeds small tasks slower than fewer lanes take them.
inline std::vector<int> sweep_lanes(std::size_t devices, unsigned host_cores) {
  std::vector<int> lanes{4};
  for (int more : {8, 16})
    if (static_cast<std::size_t>(more) * std::max<std::size_t>(devices, 1) < host_cores)
      lanes.push_back(more);
  return lanes;
}

inline constexpr std::size_t sweep_chunks[] = {1 * mib, 2 * mib, 4 * mib, 8 * mib};

inline constexpr cuda_kernel_generator generator{};

}  // namespace gpupool::detail::cuda_traits_detail

namespace gpupool::detail {

/// The CUDA backend's traits (its registration and its backend return them).
inline constexpr backend_traits cuda_traits{
    .default_lanes = &cuda_traits_detail::default_lanes,
    .default_in_flight_budget = &cuda_traits_detail::default_in_flight_budget,
    .least_device_batch_elements = &cuda_traits_detail::least_device_batch_elements,
    .automatic_tuning = tuning::measured,
    .sweep_lanes = &cuda_traits_detail::sweep_lanes,
    .sweep_chunks = cuda_traits_detail::sweep_chunks,
    // 16 lanes x 4 MiB get their 8 pieces per lane on up to four GPUs, 16 x 8 MiB four pieces
    // on one or two.
    .sweep_bytes_per_device = 128 * cuda_traits_detail::mib,
    .most_sweep_bytes_per_device = 512 * cuda_traits_detail::mib,
    .device_memory_is_host = false,
    .cuda_device_pointers = true,
    .runs_raw_kernels = true,
    // Pinned memory is mapped into every device's address space under unified addressing.
    .kernels_reach_pinned_host = true,
    .generator = &cuda_traits_detail::generator,
};

}  // namespace gpupool::detail
