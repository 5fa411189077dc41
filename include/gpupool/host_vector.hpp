// The container `map` returns results in: a std::vector whose elements are not zeroed when it is
// sized (gpupool overwrites every element anyway, and zeroing megabytes on one thread before the
// copy-out cost more than the copy itself), and whose storage of a page or more is pinned, so
// that a result is downloaded straight into it instead of through a staging buffer.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpupool/pinned.hpp"

namespace gpupool {

/// Blocks of at least `pinned_from_bytes` (a page) come from gpupool's pinned cache, so a result
/// is downloaded straight into it; smaller ones from the ordinary heap. The results of a batch of
/// small calls a lane runs together (up to 64 KiB each) share pinned slabs of up to 64 results
/// and about 1 MiB, laid end to end so that one download writes them all: such a result costs no
/// block of its own, and a slab goes back to the cache once its last result is freed (or grows
/// out of it). So a result kept alone while the others of its slab are freed holds the whole
/// slab; keep a copy instead where that matters. A pinned block of its own is reused as it is:
/// from the heap, results were fresh pages the kernel zeroed at first touch, a large share of a
/// lane's time on small tasks.
template <class T>
struct result_allocator {
  using value_type = T;
  static constexpr std::size_t pinned_from_bytes = std::size_t{4} << 10;

  result_allocator() noexcept = default;
  template <class U>
  result_allocator(const result_allocator<U>& /*other*/) noexcept {}  // NOLINT: allocator rebind

  T* allocate(std::size_t n) {
    const std::size_t bytes = detail::checked_bytes(n, sizeof(T), "host_vector");
    if (bytes >= pinned_from_bytes) {
      // A result of a batch of calls lies end to end with the batch's others in a shared pinned
      // block where a lane has one open: one download writes them all.
      if constexpr (alignof(T) <= alignof(std::max_align_t))
        if (void* carved = detail::carve_result(bytes)) return static_cast<T*>(carved);
      try {
        return static_cast<T*>(allocate_pinned(bytes));
      } catch (...) {
        // Page-locked memory can run out (or be refused) where the heap still has room: the
        // result is then downloaded through a staging buffer, as any pageable output is.
      }
    }
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    // `n` is what was asked of allocate() for `p`; a large block came from the pinned cache (a
    // block of its own, or a share of a slab) unless pinning failed then, which the cache tells
    // as it takes the block back (memory pinned some other way since, by cudaHostRegister say,
    // is still the heap's).
    if (n * sizeof(T) >= pinned_from_bytes && detail::deallocate_if_pinned_block(p)) return;
    std::allocator<T>().deallocate(p, n);
  }
  template <class U>
  bool operator==(const result_allocator<U>& /*other*/) const noexcept {
    return true;
  }
};

/// An allocator that default-initialises (for numbers: leaves uninitialised) instead of
/// value-initialising (zeroing) on `resize(n)` or `vector(n)`.
template <class T, class Base = std::allocator<T>>
class default_init_allocator : public Base {
  using traits = std::allocator_traits<Base>;

 public:
  using value_type = T;
  template <class U>
  struct rebind {
    using other = default_init_allocator<U, typename traits::template rebind_alloc<U>>;
  };

  using Base::Base;
  default_init_allocator() = default;
  template <class U, class B>
  default_init_allocator(const default_init_allocator<U, B>& other) noexcept  // NOLINT: rebind
      : Base(static_cast<const B&>(other)) {}

  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    traits::construct(static_cast<Base&>(*this), p, std::forward<Args>(args)...);
  }
};

/// A std::vector that `map` fills with results: the whole std::vector interface, only its
/// allocator differs (no zeroing; pinned storage from a page up, see result_allocator).
/// `std::vector<T>(v.begin(), v.end())` converts when a plain one is needed.
template <class T>
using host_vector = std::vector<T, default_init_allocator<T, result_allocator<T>>>;

}  // namespace gpupool
