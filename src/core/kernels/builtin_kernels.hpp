// The built-in kernels, each declared once: its name, arity, whether it takes alpha, its formula
// as text, and its arithmetic (written once for the host and the device). The dispatch
// (elementwise_math.hpp), `builtin_kernels()` and through it the Python factories, the
// command-line tool's choices and the docs' check all come from `builtin_ops` below.
//
// Adding a built-in: a value of `op` and its factory in include/gpupool/types.hpp, a
// specialisation here and its place in `builtin_ops`; the row in docs/kernels.md (a test checks
// that the docs list every built-in).
#pragma once

#include "gpupool/types.hpp"

#if defined(__CUDACC__)
#define GPUPOOL_HOST_DEVICE __host__ __device__
#else
#define GPUPOOL_HOST_DEVICE
#endif

namespace gpupool::detail {

template <op O>
struct builtin;

// `apply(x, y, alpha)`: y is the second array's element (zero for one-array kernels), alpha the
// kernel's parameter as T (zero for kernels without one).

template <>
struct builtin<op::square> {
  static constexpr builtin_kernel_info info{op::square, "square", 1, false, "x * x"};
  template <class T>
  GPUPOOL_HOST_DEVICE static T apply(T x, T /*y*/, T /*alpha*/) {
    return x * x;
  }
};

template <>
struct builtin<op::scale> {
  static constexpr builtin_kernel_info info{op::scale, "scale", 1, true, "alpha * x"};
  template <class T>
  GPUPOOL_HOST_DEVICE static T apply(T x, T /*y*/, T alpha) {
    return alpha * x;
  }
};

template <>
struct builtin<op::add> {
  static constexpr builtin_kernel_info info{op::add, "add", 2, false, "x + y"};
  template <class T>
  GPUPOOL_HOST_DEVICE static T apply(T x, T y, T /*alpha*/) {
    return x + y;
  }
};

template <>
struct builtin<op::axpy> {
  static constexpr builtin_kernel_info info{op::axpy, "axpy", 2, true, "alpha * x + y"};
  template <class T>
  GPUPOOL_HOST_DEVICE static T apply(T x, T y, T alpha) {
    return alpha * x + y;
  }
};

template <op... O>
struct op_list {};

/// Every built-in, in the order of `op`.
using builtin_ops = op_list<op::square, op::scale, op::add, op::axpy>;

template <op... O>
constexpr bool builtins_in_enum_order(op_list<O...>) {
  int i = 0;
  return ((builtin<O>::info.operation == O && static_cast<int>(O) == i++) && ...);
}
static_assert(builtins_in_enum_order(builtin_ops{}), "builtin_ops must follow the order of op");

/// Calls `f.template operator()<O>()` for the runtime operation `o`.
template <class F, op First, op... Rest>
void visit_op_in(op o, F& f, op_list<First, Rest...>) {
  if constexpr (sizeof...(Rest) == 0) {
    f.template operator()<First>();
  } else {
    if (o == First) return f.template operator()<First>();
    visit_op_in(o, f, op_list<Rest...>{});
  }
}

template <class F>
void visit_op(op o, F&& f) {
  visit_op_in(o, f, builtin_ops{});
}

}  // namespace gpupool::detail
