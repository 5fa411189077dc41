// Pointer descriptions and waiting on foreign streams, for front ends that accept device arrays.
#include "gpupool/pointer.hpp"

#include "core/backend.hpp"
#include "gpupool/pinned.hpp"
#include "gpupool/version.hpp"

#if GPUPOOL_HAS_CUDA
#include "cuda/host_memory.hpp"
#endif

namespace gpupool {

pointer_info describe_pointer(const void* p) noexcept {
  if (p == nullptr) return {};
#if GPUPOOL_HAS_CUDA
  if (detail::cuda_runtime_usable()) {
    int kind = 0;
    int device = -1;
    detail::cuda::describe(p, kind, device);
    constexpr memory_kind kinds[] = {memory_kind::unknown, memory_kind::pinned_host,
                                     memory_kind::device, memory_kind::managed};
    return {kinds[kind], device};
  }
#endif
  return is_pinned(p) ? pointer_info{memory_kind::pinned_host, -1} : pointer_info{};
}

void wait_for_stream([[maybe_unused]] std::uintptr_t stream) {
#if GPUPOOL_HAS_CUDA
  if (detail::cuda_runtime_usable()) detail::cuda::synchronize_stream(stream);
#endif
}

}  // namespace gpupool
