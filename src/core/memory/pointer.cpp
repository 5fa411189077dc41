// Pointer descriptions and waiting on foreign streams, for front ends that accept device arrays.
#include "gpupool/pointer.hpp"

#include "core/memory/host_memory.hpp"
#include "core/memory/pinned_cache.hpp"

namespace gpupool {
namespace detail {

pointer_info describe_pointer(const void* p, const pinned_cache& cache,
                              const host_memory& memory) noexcept {
  if (p == nullptr) return {};
  if (cache.owns(p)) return {memory_kind::pinned_host, -1};
  return memory.describe(p);
}

}  // namespace detail

const char* to_string(memory_kind kind) noexcept {
  switch (kind) {
    case memory_kind::pinned_host:
      return "pinned_host";
    case memory_kind::device:
      return "device";
    case memory_kind::managed:
      return "managed";
    case memory_kind::unknown:
      break;
  }
  return "unknown";
}

pointer_info describe_pointer(const void* p) noexcept {
  return detail::describe_pointer(p, detail::process_pinned_cache(), detail::process_host_memory());
}

void wait_for_stream(std::uintptr_t stream) {
  detail::process_host_memory().wait_for_stream(stream);
}

}  // namespace gpupool
