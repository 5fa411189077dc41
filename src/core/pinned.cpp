// Pinned host memory for users and for the lanes' staging slots. With a usable GPU it is
// page-locked by CUDA; otherwise ordinary aligned memory that gpupool still tracks, so the CPU
// backend takes the same "already pinned, skip staging" paths that the CUDA backend does.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <shared_mutex>

#include "core/backend.hpp"
#include "gpupool/pinned.hpp"
#include "gpupool/version.hpp"

#if GPUPOOL_HAS_CUDA
#include "cuda/host_memory.hpp"
#endif

namespace gpupool {
namespace {

constexpr std::size_t host_alignment = 4096;

// Every live allocation_pinned block, by start address, for is_pinned and the byte count.
class pinned_registry {
 public:
  void add(void* p, std::size_t bytes) {
    std::unique_lock lock(mutex_);
    blocks_[reinterpret_cast<std::uintptr_t>(p)] = bytes;
    bytes_ += bytes;
  }
  void remove(void* p) noexcept {
    std::unique_lock lock(mutex_);
    auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == blocks_.end()) return;
    bytes_ -= it->second;
    blocks_.erase(it);
  }
  bool contains(const void* p) const noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    std::shared_lock lock(mutex_);
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin()) return false;
    --it;
    return address < it->first + it->second;
  }
  std::size_t bytes() const noexcept {
    std::shared_lock lock(mutex_);
    return bytes_;
  }

 private:
  mutable std::shared_mutex mutex_;
  std::map<std::uintptr_t, std::size_t> blocks_;
  std::size_t bytes_ = 0;
};

pinned_registry& registry() {
  static pinned_registry r;
  return r;
}

#if GPUPOOL_HAS_CUDA
bool use_cuda_host_memory() {
  static const bool usable = [] {
    const char* forced = std::getenv("GPUPOOL_BACKEND");
    if (forced != nullptr && std::strcmp(forced, "cpu") == 0) return false;
    return detail::probe_cuda().usable;
  }();
  return usable;
}
#endif

}  // namespace

void* allocate_pinned(std::size_t bytes) {
  const std::size_t size = bytes == 0 ? 1 : bytes;
  void* p = nullptr;
#if GPUPOOL_HAS_CUDA
  if (use_cuda_host_memory()) p = detail::cuda::host_alloc(size);  // throws std::bad_alloc
#endif
  if (p == nullptr) {
    const std::size_t rounded = (size + host_alignment - 1) / host_alignment * host_alignment;
    p = std::aligned_alloc(host_alignment, rounded);
    if (p == nullptr) throw std::bad_alloc();
  }
  registry().add(p, size);
  return p;
}

void deallocate_pinned(void* p, std::size_t /*bytes*/) noexcept {
  if (p == nullptr) return;
  registry().remove(p);
#if GPUPOOL_HAS_CUDA
  if (use_cuda_host_memory()) {
    detail::cuda::host_free(p);
    return;
  }
#endif
  std::free(p);
}

bool is_pinned(const void* p) noexcept {
  if (p == nullptr) return false;
  if (registry().contains(p)) return true;
#if GPUPOOL_HAS_CUDA
  if (use_cuda_host_memory()) return detail::cuda::host_is_pinned(p);
#endif
  return false;
}

std::size_t pinned_bytes_in_use() noexcept {
  return registry().bytes();
}

}  // namespace gpupool
