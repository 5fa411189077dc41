// Pinned (page-locked) host memory, so inputs and outputs can skip the staging copy.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#include "gpupool/types.hpp"

namespace gpupool {

/// Allocates `bytes` of pinned host memory, usable by every device. Page-locking is slow
/// (driver-wide locks, first-touch costs), so freed blocks are cached and handed out again: a
/// steady workload page-locks nothing after its first round. On a machine without a usable GPU
/// this is ordinary aligned host memory, still recognised by `is_pinned`.
/// @throw std::bad_alloc if the memory cannot be had. Thread-safe.
[[nodiscard]] void* allocate_pinned(std::size_t bytes);

/// Returns memory from `allocate_pinned` to the cache (or frees it when the cache is full).
/// Thread-safe; never throws.
void deallocate_pinned(void* p, std::size_t bytes) noexcept;

namespace detail {
/// Returns `p` to the pinned cache, as deallocate_pinned does, if it is the start of a block
/// that allocate_pinned handed out, or frees it as a result carved from a result slab if it lies
/// inside one (carve_result); otherwise does nothing and returns false. For allocators that fall
/// back to other memory (result_allocator): one lookup tells where a block came from and frees
/// it. Thread-safe.
[[nodiscard]] bool deallocate_if_pinned_block(void* p) noexcept;
/// `bytes` for a result from the result slabs the calling thread has open (a lane starting the
/// calls of a batch), end to end with the batch's other results; null where none is open.
/// Thread-safe.
[[nodiscard]] void* carve_result(std::size_t bytes) noexcept;
}  // namespace detail

/// Pinned memory held by gpupool's allocator.
struct pinned_stats {
  std::size_t in_use = 0;       ///< Bytes handed out and not yet returned (rounded to size class).
  std::size_t cached = 0;       ///< Bytes returned and kept for reuse.
  std::size_t cache_limit = 0;  ///< Most bytes kept for reuse.
};
[[nodiscard]] pinned_stats pinned_memory_stats() noexcept;

/// Sets how many freed bytes are kept for reuse (default: a quarter of host memory, or
/// GPUPOOL_PINNED_CACHE_BYTES), freeing cached blocks beyond it. Thread-safe.
void set_pinned_cache_limit(std::size_t bytes);

/// Frees every cached block now. Thread-safe.
void trim_pinned_cache();

/// True if `p` points into pinned (page-locked or registered) host memory that devices can copy
/// from asynchronously, including memory from `allocate_pinned`. Thread-safe.
[[nodiscard]] bool is_pinned(const void* p) noexcept;

/// Bytes currently handed out by `allocate_pinned` (the user's and gpupool's own staging), by
/// size class; cached blocks are not counted.
[[nodiscard]] std::size_t pinned_bytes_in_use() noexcept;

/// A standard allocator over `allocate_pinned`.
template <class T>
struct pinned_allocator {
  using value_type = T;
  pinned_allocator() noexcept = default;
  template <class U>
  pinned_allocator(const pinned_allocator<U>& /*other*/) noexcept {}  // NOLINT: allocator rebind
  T* allocate(std::size_t n) {
    return static_cast<T*>(
        allocate_pinned(detail::checked_bytes(n, sizeof(T), "pinned_allocator::allocate")));
  }
  void deallocate(T* p, std::size_t n) noexcept { deallocate_pinned(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const pinned_allocator<U>& /*other*/) const noexcept {
    return true;
  }
};

/// A std::vector whose storage is pinned.
template <class T>
using pinned_vector = std::vector<T, pinned_allocator<T>>;

}  // namespace gpupool
