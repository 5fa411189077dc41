// Pinned host memory for users, for results and for the lanes' staging slots. With a usable GPU
// it is page-locked by CUDA; otherwise ordinary aligned memory that gpupool still tracks, so the
// CPU backend takes the same "already pinned, skip staging" paths that the CUDA backend does.
//
// Page-locking is slow (driver-wide locks; first touch), so freed blocks are kept in a cache,
// by size class, up to a limit, and handed out again.
#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <stdexcept>
#include <string>

#include "core/backend.hpp"
#include "gpupool/pinned.hpp"
#include "gpupool/version.hpp"

#if GPUPOOL_HAS_CUDA
#include "cuda/host_memory.hpp"
#endif

namespace gpupool {
namespace {

constexpr std::size_t host_alignment = 4096;

#if GPUPOOL_HAS_CUDA
bool use_cuda_host_memory() {
  return detail::cuda_runtime_usable();
}
#endif

// More than any machine's memory: larger requests are refused before any rounding, which would
// wrap around (SIZE_MAX - 7 would round to 0) and hand out a block smaller than asked for.
constexpr std::size_t largest_request = std::numeric_limits<std::size_t>::max() / 2;

// Rounds a request (at most largest_request) up to its size class: whole pages up to 64 KiB,
// then four classes per power of two, so a cached block is never more than 25% larger than what
// is asked for.
std::size_t size_class(std::size_t bytes) {
  if (bytes <= (std::size_t{64} << 10))
    return (bytes + host_alignment - 1) / host_alignment * host_alignment;
  std::size_t power = std::size_t{1} << (63 - __builtin_clzll(bytes));
  const std::size_t step = power / 4;
  return (bytes + step - 1) / step * step;
}

void* page_lock_new(std::size_t bytes) {
#if GPUPOOL_HAS_CUDA
  if (use_cuda_host_memory()) return detail::cuda::host_alloc(bytes);  // throws std::bad_alloc
#endif
  void* p = std::aligned_alloc(host_alignment, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void page_unlock(void* p) noexcept {
#if GPUPOOL_HAS_CUDA
  if (use_cuda_host_memory()) {
    detail::cuda::host_free(p);
    return;
  }
#endif
  std::free(p);
}

std::size_t default_cache_limit() {
  if (const char* value = std::getenv("GPUPOOL_PINNED_CACHE_BYTES")) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(value, &end, 10);
    if (end != value && *end == '\0') return static_cast<std::size_t>(n);
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return std::size_t{1} << 30;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size) / 4;
}

// Every pinned block gpupool made, by start address (for is_pinned), and the cache of free ones.
class pinned_store {
 public:
  void* acquire(std::size_t bytes) {
    if (bytes > largest_request)
      throw std::length_error("gpupool::allocate_pinned: " + std::to_string(bytes) +
                              " bytes is more than any allocation can hold");
    const std::size_t capacity = size_class(bytes == 0 ? 1 : bytes);
    {
      std::unique_lock lock(mutex_);
      auto hit = free_.find(capacity);
      if (hit != free_.end()) {
        void* p = hit->second;
        free_.erase(hit);
        cached_ -= capacity;
        in_use_ += capacity;
        return p;
      }
    }
    void* p = page_lock_new(capacity);  // slow: outside the lock
    std::unique_lock lock(mutex_);
    blocks_[reinterpret_cast<std::uintptr_t>(p)] = capacity;
    in_use_ += capacity;
    return p;
  }

  void release(void* p) noexcept {
    std::size_t capacity = 0;
    {
      std::unique_lock lock(mutex_);
      auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == blocks_.end()) return;
      capacity = it->second;
      in_use_ -= capacity;
      if (cached_ + capacity <= limit_) {
        free_.emplace(capacity, p);
        cached_ += capacity;
        return;
      }
      blocks_.erase(it);
    }
    page_unlock(p);
  }

  bool contains(const void* p) const noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    std::shared_lock lock(mutex_);
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin()) return false;
    --it;
    return address < it->first + it->second;
  }

  void set_limit(std::size_t bytes) {
    std::unique_lock lock(mutex_);
    limit_ = bytes;
    trim_locked(lock);
  }

  void trim() {
    std::unique_lock lock(mutex_);
    const std::size_t keep = limit_;
    limit_ = 0;
    trim_locked(lock);
    limit_ = keep;
  }

  pinned_stats stats() const {
    std::shared_lock lock(mutex_);
    return {in_use_, cached_, limit_};
  }

 private:
  // Frees cached blocks, largest first, until the cache fits its limit.
  void trim_locked(std::unique_lock<std::shared_mutex>& lock) {
    while (cached_ > limit_ && !free_.empty()) {
      auto last = std::prev(free_.end());
      void* p = last->second;
      cached_ -= last->first;
      blocks_.erase(reinterpret_cast<std::uintptr_t>(p));
      free_.erase(last);
      lock.unlock();
      page_unlock(p);
      lock.lock();
    }
  }

  mutable std::shared_mutex mutex_;
  std::map<std::uintptr_t, std::size_t> blocks_;  // address -> capacity, in use or cached
  std::multimap<std::size_t, void*> free_;        // capacity -> cached block
  std::size_t in_use_ = 0;
  std::size_t cached_ = 0;
  std::size_t limit_ = default_cache_limit();
};

pinned_store& store() {
  // Never destroyed: blocks may be released by static destructors after main returns.
  static auto* s = new pinned_store();
  return *s;
}

}  // namespace

void* allocate_pinned(std::size_t bytes) {
  return store().acquire(bytes);
}

void deallocate_pinned(void* p, std::size_t /*bytes*/) noexcept {
  if (p != nullptr) store().release(p);
}

bool is_pinned(const void* p) noexcept {
  if (p == nullptr) return false;
  if (store().contains(p)) return true;
#if GPUPOOL_HAS_CUDA
  if (use_cuda_host_memory()) return detail::cuda::host_is_pinned(p);
#endif
  return false;
}

std::size_t pinned_bytes_in_use() noexcept {
  return store().stats().in_use;
}

pinned_stats pinned_memory_stats() noexcept {
  return store().stats();
}

void set_pinned_cache_limit(std::size_t bytes) {
  store().set_limit(bytes);
}

void trim_pinned_cache() {
  store().trim();
}

}  // namespace gpupool
