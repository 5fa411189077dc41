// How the built-in kernels (builtin_kernels.hpp) compute: integers wrap as NumPy's do, alpha is
// checked against the element type, and one dispatch turns a runtime (op, dtype) into code.
#pragma once

#include <cstddef>
#include <type_traits>

#include <cmath>
#include <limits>
#include <string>

#include "core/kernels/builtin_kernels.hpp"
#include "gpupool/error.hpp"
#include "gpupool/types.hpp"

namespace gpupool::detail {

// Integer types compute in their unsigned counterpart, so overflow wraps modulo 2^N as NumPy's
// integer arithmetic does, rather than being undefined; the conversion back is modular (C++20).
template <op O, class T>
GPUPOOL_HOST_DEVICE inline T elementwise(T x, T y, T alpha) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(
        elementwise<O, U>(static_cast<U>(x), static_cast<U>(y), static_cast<U>(alpha)));
  } else {
    return builtin<O>::template apply<T>(x, y, alpha);
  }
}

/// Host code only. A built-in kernel's alpha (a double) as element type T, never converted out of
/// range: for integer types it must be a whole number the type holds (2.0 for int32, not 0.5, NaN
/// or 2**40); for float32 its magnitude must fit. @throw argument_kind_error, argument_range_error.
template <class T>
T alpha_as(double alpha, const char* kernel_name) {
  const std::string what = std::string("gpupool: kernel '") + kernel_name + "': alpha ";
  if constexpr (std::is_integral_v<T>) {
    const char* type = info_of(dtype_of<T>()).name;
    if (!std::isfinite(alpha) || std::trunc(alpha) != alpha)
      throw argument_kind_error(what + "= " + std::to_string(alpha) +
                                " is not a whole number, "
                                "but the arrays are " +
                                type +
                                " (NumPy's same_kind rule casts no float to an integer type)");
    // 2^63 and 2^31 are exact doubles; [-2^(N-1), 2^(N-1)) is the type's range.
    const double limit = std::ldexp(1.0, static_cast<int>(sizeof(T) * 8 - 1));
    if (alpha < -limit || alpha >= limit)
      throw argument_range_error(what + "= " + std::to_string(alpha) + " is out of the range of " +
                                 type);
    return static_cast<T>(alpha);
  } else if constexpr (std::is_same_v<T, float>) {
    if (std::isfinite(alpha) && std::fabs(alpha) > std::numeric_limits<float>::max())
      throw argument_range_error(what + "= " + std::to_string(alpha) +
                                 " is out of the range of float32");
    return static_cast<float>(alpha);
  } else {
    return alpha;
  }
}

/// Calls `f.template operator()<O, T>()` for the runtime (op, dtype) pair.
template <class F>
inline void dispatch_elementwise(op o, dtype t, F&& f) {
  visit_op(o, [&]<op O>() { visit_dtype(t, [&]<class T>() { f.template operator()<O, T>(); }); });
}

/// Host code only. `out[i] = k(x[i], y[i])` for `n` elements of type `t` (`y` null for a kernel
/// of one input), in order: `out` may be `x` or `y` itself, but must not overlap them otherwise.
/// @throw as alpha_as, for an alpha the type cannot hold.
inline void apply_on_host(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
                          std::size_t n) {
  dispatch_elementwise(k.operation(), t, [&]<op O, class T>() {
    const T* xs = static_cast<const T*>(x);
    const T* ys = static_cast<const T*>(y);
    T* os = static_cast<T*>(out);
    const T a = alpha_as<T>(k.alpha(), k.name());
    for (std::size_t i = 0; i < n; ++i) os[i] = elementwise<O, T>(xs[i], ys ? ys[i] : T{}, a);
  });
}

}  // namespace gpupool::detail
