// The container `map` returns results in: a std::vector whose elements are not zeroed when it is
// sized. gpupool overwrites every element anyway, and zeroing megabytes on one thread before the
// copy-out cost more than the copy itself.
#pragma once

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpupool {

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
/// allocator differs. `std::vector<T>(v.begin(), v.end())` converts when a plain one is needed.
template <class T>
using host_vector = std::vector<T, default_init_allocator<T>>;

}  // namespace gpupool
