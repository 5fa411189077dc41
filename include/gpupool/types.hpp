// Small value types shared by the whole public API: element types, backends, devices, kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace gpupool {

/// Element types the built-in kernels understand.
enum class dtype { float32, float64, int32, int64 };

template <class T>
inline constexpr bool is_supported_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t>;

/// The `dtype` of a C++ element type; only the four supported types compile.
template <class T>
constexpr dtype dtype_of() {
  static_assert(is_supported_element_v<T>, "gpupool kernels support float, double, int32, int64");
  if constexpr (std::is_same_v<T, float>) return dtype::float32;
  if constexpr (std::is_same_v<T, double>) return dtype::float64;
  if constexpr (std::is_same_v<T, std::int32_t>) return dtype::int32;
  return dtype::int64;
}

namespace detail {
/// `count * size` in bytes. @throw std::length_error (naming `what`) if the product does not fit
/// in std::size_t: a wrapped size would allocate a small block and let writes overflow it.
[[nodiscard]] std::size_t checked_bytes(std::size_t count, std::size_t size, const char* what);
}  // namespace detail

/// Size in bytes of one element of `t`.
[[nodiscard]] std::size_t size_of(dtype t) noexcept;
[[nodiscard]] const char* to_string(dtype t) noexcept;

/// Which implementation runs the work: CUDA GPUs, or host threads standing in for them.
enum class backend_kind { cpu, cuda };
[[nodiscard]] const char* to_string(backend_kind b) noexcept;

/// What gpupool knows about one device it runs on.
struct device_info {
  int id = 0;       ///< Index among the executor's devices (0..n-1).
  int ordinal = 0;  ///< Backend ordinal (CUDA device number after CUDA_VISIBLE_DEVICES).
  backend_kind backend = backend_kind::cpu;
  std::string name;              ///< e.g. "NVIDIA H200" or "CPU stand-in 0".
  std::size_t total_memory = 0;  ///< Bytes of device memory (host memory for the CPU backend).
  int compute_major = 0;         ///< Compute capability (0 on the CPU backend).
  int compute_minor = 0;
  int multiprocessors = 0;  ///< SMs, or host cores for the CPU backend.
};

/// The built-in elementwise operations.
enum class op {
  square,  ///< out = x * x
  scale,   ///< out = alpha * x
  add,     ///< out = x + y
  axpy,    ///< out = alpha * x + y
};

/// A built-in elementwise kernel with its parameter. Cheap to copy.
class kernel {
 public:
  static kernel square() noexcept { return kernel(op::square, 0.0); }
  static kernel scale(double alpha) noexcept { return kernel(op::scale, alpha); }
  static kernel add() noexcept { return kernel(op::add, 0.0); }
  static kernel axpy(double alpha) noexcept { return kernel(op::axpy, alpha); }

  [[nodiscard]] op operation() const noexcept { return op_; }
  [[nodiscard]] double alpha() const noexcept { return alpha_; }
  /// Number of input arrays: 1 for square and scale, 2 for add and axpy.
  [[nodiscard]] int arity() const noexcept { return op_ == op::add || op_ == op::axpy ? 2 : 1; }
  [[nodiscard]] const char* name() const noexcept;

 private:
  kernel(op o, double alpha) noexcept : op_(o), alpha_(alpha) {}
  op op_;
  double alpha_;
};

}  // namespace gpupool
