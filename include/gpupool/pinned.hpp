// Pinned (page-locked) host memory, so inputs and outputs can skip the staging copy.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace gpupool {

/// Allocates `bytes` of pinned host memory, usable by every device. Page-locking is slow
/// (driver-wide locks, first-touch costs): allocate once and reuse. On a machine without a usable
/// GPU this is ordinary aligned host memory, still recognised by `is_pinned`.
/// @throw std::bad_alloc if the memory cannot be had. Thread-safe.
[[nodiscard]] void* allocate_pinned(std::size_t bytes);

/// Frees memory from `allocate_pinned`. Thread-safe; never throws.
void deallocate_pinned(void* p, std::size_t bytes) noexcept;

/// True if `p` points into pinned (page-locked or registered) host memory that devices can copy
/// from asynchronously, including memory from `allocate_pinned`. Thread-safe.
[[nodiscard]] bool is_pinned(const void* p) noexcept;

/// Bytes currently held by `allocate_pinned` allocations (the user's and gpupool's own staging).
[[nodiscard]] std::size_t pinned_bytes_in_use() noexcept;

/// A standard allocator over `allocate_pinned`.
template <class T>
struct pinned_allocator {
  using value_type = T;
  pinned_allocator() noexcept = default;
  template <class U>
  pinned_allocator(const pinned_allocator<U>& /*other*/) noexcept {}  // NOLINT: allocator rebind
  T* allocate(std::size_t n) { return static_cast<T*>(allocate_pinned(n * sizeof(T))); }
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
