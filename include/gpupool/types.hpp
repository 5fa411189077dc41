// Small value types shared by the whole public API: element types, backends, devices, kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace gpupool {

/// Element types the built-in kernels understand.
enum class dtype { float32, float64, int32, int64 };

/// One element type, described once: every name, size and C++ spelling of a dtype (in
/// signatures, messages, generated source, the Python binding and the command-line tool) comes
/// from `dtypes` below, and its C++ type from `detail::element_types` in the same order. Adding
/// a dtype: its enum value, its row, its C++ type (a static_assert checks the three agree).
struct dtype_info {
  dtype type;
  const char* name;       ///< "float32": in signatures and messages; NumPy's name too
  std::size_t size;       ///< bytes per element
  bool is_integer;        ///< an integer type (scalars must be whole numbers it holds)
  const char* host_name;  ///< its C++ spelling with <cstdint> ("std::int32_t")
  const char* cuda_name;  ///< its spelling with built-in names only, for NVRTC ("int")
  const char* alias;      ///< a C++ name also accepted in signatures ("int"), or ""
};

/// Every dtype, in the order of the enum.
inline constexpr dtype_info dtypes[] = {
    {dtype::float32, "float32", 4, false, "float", "float", "float"},
    {dtype::float64, "float64", 8, false, "double", "double", "double"},
    {dtype::int32, "int32", 4, true, "std::int32_t", "int", "int"},
    {dtype::int64, "int64", 8, true, "std::int64_t", "long long", ""},
};

/// The description of `t`.
[[nodiscard]] constexpr const dtype_info& info_of(dtype t) noexcept {
  return dtypes[static_cast<std::size_t>(t)];
}

namespace detail {
template <class... T>
struct type_list {};
/// The C++ element type of each entry of `dtypes`, in the same order.
using element_types = type_list<float, double, std::int32_t, std::int64_t>;

template <class T, class... List>
constexpr std::size_t index_in(type_list<List...>) {
  std::size_t i = 0;
  (void)((std::is_same_v<T, List> ? false : (++i, true)) && ...);
  return i;
}

template <class... T>
constexpr bool table_matches(type_list<T...>) {
  std::size_t i = 0;
  return sizeof...(T) == std::size(dtypes) &&
         ((dtypes[i].type == static_cast<dtype>(i) && dtypes[i].size == sizeof(T) &&
           dtypes[i].is_integer == std::is_integral_v<T> && (++i, true)) &&
          ...);
}
static_assert(table_matches(element_types{}), "dtypes and element_types disagree");
}  // namespace detail

template <class T>
inline constexpr bool is_supported_element_v =
    detail::index_in<T>(detail::element_types{}) < std::size(dtypes);

/// The `dtype` of a C++ element type; only the supported types (`dtypes`) compile.
template <class T>
constexpr dtype dtype_of() {
  static_assert(is_supported_element_v<T>,
                "gpupool kernels support the element types of gpupool::dtypes only");
  return dtypes[detail::index_in<T>(detail::element_types{})].type;
}

namespace detail {
template <class F, class First, class... Rest>
constexpr decltype(auto) visit_dtype_in(dtype t, F& f, type_list<First, Rest...>) {
  if constexpr (sizeof...(Rest) == 0) {
    return f.template operator()<First>();
  } else {
    if (t == dtype_of<First>()) return f.template operator()<First>();
    return visit_dtype_in(t, f, type_list<Rest...>{});
  }
}
}  // namespace detail

/// Calls `f.template operator()<T>()` with the C++ element type `T` of `t` and returns what it
/// returns (the same type for every T): the one dtype dispatch, for every caller.
template <class F>
constexpr decltype(auto) visit_dtype(dtype t, F&& f) {
  return detail::visit_dtype_in(t, f, detail::element_types{});
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

/// Every backend and the name users give it (GPUPOOL_BACKEND, the Python `backend=` option, the
/// tool's --backend): adding a backend adds its row here.
struct backend_name {
  backend_kind kind;
  const char* name;
};
inline constexpr backend_name backend_names[] = {{backend_kind::cpu, "cpu"},
                                                 {backend_kind::cuda, "cuda"}};

[[nodiscard]] const char* to_string(backend_kind b) noexcept;
/// The backend called `name` (exactly, as in backend_names), or nothing.
[[nodiscard]] std::optional<backend_kind> backend_from_name(std::string_view name) noexcept;
/// "'cpu' or 'cuda'": the names, for messages.
[[nodiscard]] std::string backend_name_list();

/// What gpupool knows about one device it runs on.
struct device_info {
  int id = 0;       ///< Index among the executor's devices (0..n-1).
  int ordinal = 0;  ///< Backend ordinal (CUDA device number after CUDA_VISIBLE_DEVICES).
  backend_kind backend = backend_kind::cpu;
  std::string name;              ///< e.g. "NVIDIA H200" or "CPU stand-in 0".
  std::size_t total_memory = 0;  ///< Bytes of device memory (host memory for the CPU backend).
  /// Bytes of it free when the executor was made (host memory available, for the CPU backend),
  /// divided evenly among the executor's devices of the same ordinal.
  std::size_t free_memory = 0;
  int compute_major = 0;  ///< Compute capability (0 on the CPU backend).
  int compute_minor = 0;
  int multiprocessors = 0;  ///< SMs, or host cores for the CPU backend.
};

/// The built-in elementwise operations. Each is declared once, with its name, arity and formula,
/// in src/core/kernels/builtin_kernels.hpp; `builtin_kernels()` lists them.
enum class op {
  square,  ///< out = x * x
  scale,   ///< out = alpha * x
  add,     ///< out = x + y
  axpy,    ///< out = alpha * x + y
};

/// What a built-in kernel is: the C++ dispatch, the Python factories (gpupool.kernels), the
/// command-line tool's choices and the docs all read this.
struct builtin_kernel_info {
  op operation;
  const char* name;     ///< "axpy"
  int arity;            ///< input arrays: 1 or 2
  bool takes_alpha;     ///< has a scalar parameter `alpha`
  const char* formula;  ///< "alpha * x + y": the output from the inputs x (and y) and alpha
};

/// Every built-in kernel, in the order of `op`.
[[nodiscard]] std::span<const builtin_kernel_info> builtin_kernels() noexcept;
/// The description of `o`.
[[nodiscard]] const builtin_kernel_info& info_of(op o) noexcept;

/// A built-in elementwise kernel (one of `builtin_kernels()`, chosen by its `op`) with its
/// parameter alpha: what `executor::map`, `executor::transform` and `lane::apply` run. Kernels
/// compiled at run time are `elementwise_kernel` and `raw_kernel` (gpupool/elementwise.hpp).
/// Cheap to copy.
class builtin_kernel {
 public:
  static builtin_kernel square() noexcept { return builtin_kernel(op::square, 0.0); }
  static builtin_kernel scale(double alpha) noexcept { return builtin_kernel(op::scale, alpha); }
  static builtin_kernel add() noexcept { return builtin_kernel(op::add, 0.0); }
  static builtin_kernel axpy(double alpha) noexcept { return builtin_kernel(op::axpy, alpha); }
  /// Any built-in by its operation (`alpha` is ignored by those that take none).
  static builtin_kernel of(op o, double alpha = 0.0) noexcept {
    return builtin_kernel(o, info_of(o).takes_alpha ? alpha : 0.0);
  }

  [[nodiscard]] op operation() const noexcept { return op_; }
  [[nodiscard]] double alpha() const noexcept { return alpha_; }
  /// Number of input arrays: 1 for square and scale, 2 for add and axpy.
  [[nodiscard]] int arity() const noexcept { return info_of(op_).arity; }
  [[nodiscard]] bool takes_alpha() const noexcept { return info_of(op_).takes_alpha; }
  [[nodiscard]] const char* name() const noexcept { return info_of(op_).name; }

 private:
  builtin_kernel(op o, double alpha) noexcept : op_(o), alpha_(alpha) {}
  op op_;
  double alpha_;
};

/// One call of executor::transform_each: `count` elements of `x` (and `y`, for a two-input
/// kernel; else null) in, `count` elements to `out`, all of the call's element type.
struct transform_call {
  const void* x = nullptr;
  const void* y = nullptr;
  void* out = nullptr;
  std::size_t count = 0;

  /// Whether `out` (elements of `element_bytes` each) is null, one of the inputs itself, or
  /// apart from both: then one pass over the elements in order may write each result over the
  /// output as it goes, where an output overlapping an input part way would overwrite elements
  /// of it not yet read.
  [[nodiscard]] bool output_in_place_or_apart(std::size_t element_bytes) const noexcept {
    if (out == nullptr) return true;
    const std::size_t bytes = count * element_bytes;
    const auto o = reinterpret_cast<std::uintptr_t>(out);
    const auto in_place_or_apart = [&](const void* in) {
      if (in == nullptr || in == out) return true;
      const auto i = reinterpret_cast<std::uintptr_t>(in);
      return o + bytes <= i || i + bytes <= o;
    };
    return in_place_or_apart(x) && in_place_or_apart(y);
  }
};

/// The old name of `builtin_kernel`, kept so that code written against it still compiles.
using kernel [[deprecated("gpupool::kernel is now gpupool::builtin_kernel")]] = builtin_kernel;

}  // namespace gpupool
