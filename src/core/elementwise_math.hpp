// The arithmetic of the built-in kernels, written once for the host and the device.
#pragma once

#include <cstddef>

#include "gpupool/types.hpp"

#if defined(__CUDACC__)
#define GPUPOOL_HOST_DEVICE __host__ __device__
#else
#define GPUPOOL_HOST_DEVICE
#endif

namespace gpupool::detail {

template <op O, class T>
GPUPOOL_HOST_DEVICE inline T elementwise(T x, T y, T alpha) {
  if constexpr (O == op::square) return x * x;
  if constexpr (O == op::scale) return alpha * x;
  if constexpr (O == op::add) return x + y;
  if constexpr (O == op::axpy) return alpha * x + y;
}

/// Calls `f.template operator()<O, T>()` for the runtime (op, dtype) pair.
template <class F>
inline void dispatch_elementwise(op o, dtype t, F&& f) {
  auto by_type = [&]<op O>() {
    switch (t) {
      case dtype::float32:
        f.template operator()<O, float>();
        break;
      case dtype::float64:
        f.template operator()<O, double>();
        break;
      case dtype::int32:
        f.template operator()<O, std::int32_t>();
        break;
      case dtype::int64:
        f.template operator()<O, std::int64_t>();
        break;
    }
  };
  switch (o) {
    case op::square:
      by_type.template operator()<op::square>();
      break;
    case op::scale:
      by_type.template operator()<op::scale>();
      break;
    case op::add:
      by_type.template operator()<op::add>();
      break;
    case op::axpy:
      by_type.template operator()<op::axpy>();
      break;
  }
}

}  // namespace gpupool::detail
