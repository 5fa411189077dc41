// User elementwise kernels from a snippet, compiled at run time, in the spirit of CuPy's
// ElementwiseKernel: typed inputs and one typed output plus a C++ body, e.g.
//
//   gpupool::elementwise_kernel k("float64 x, float64 a", "float64 y", "y = a * x * x + sin(x)");
//
// Each input is an array (of the output's length) or a scalar broadcast to every element.
//
// Raw kernels bring their own CUDA source and entry point instead of a body (see raw_kernel).
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpupool/error.hpp"
#include "gpupool/types.hpp"

namespace gpupool {

/// A kernel's source failed to compile. `what()` carries the compiler's log; `line()` is the
/// body's line the first error points at (1-based; 0 if unknown).
class compile_error : public error {
 public:
  compile_error(const std::string& message, std::string log, int line)
      : error(message), log_(std::move(log)), line_(line) {}
  [[nodiscard]] const std::string& log() const noexcept { return log_; }
  [[nodiscard]] int line() const noexcept { return line_; }

 private:
  std::string log_;
  int line_;
};

/// One declared parameter.
struct kernel_parameter {
  std::string name;
  dtype type = dtype::float64;
  /// Raw kernels only: declared as an array ("float32* x"). Elementwise kernels decide arrays
  /// and scalars at each call.
  bool array = false;
};

/// An elementwise kernel: a signature and a body. Cheap to copy; compiled on first use, once per
/// backend, device architecture and array/scalar pattern, and cached in memory and on disk.
class elementwise_kernel {
 public:
  /// @param inputs  comma-separated "type name" pairs; types are float32, float64, int32, int64
  /// @param output  one "type name" pair
  /// @param body    C++ statements that assign the output from the inputs, per element
  /// @param name    a name for traces and messages
  /// @throw std::invalid_argument for a malformed signature (unknown type, bad or repeated name).
  elementwise_kernel(const std::string& inputs, const std::string& output, std::string body,
                     std::string name = "elementwise");

  [[nodiscard]] const std::vector<kernel_parameter>& inputs() const noexcept { return inputs_; }
  [[nodiscard]] const kernel_parameter& output() const noexcept { return output_; }
  [[nodiscard]] const std::string& body() const noexcept { return body_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  std::vector<kernel_parameter> inputs_;
  kernel_parameter output_;
  std::string body_;
  std::string name_;
};

/// How a raw kernel is launched over the `n` elements of one call: `block` threads per block and
/// `grid` blocks, or (grid 0) enough blocks for one thread per element.
struct launch_shape {
  unsigned block = 256;
  unsigned grid = 0;
};

/// A kernel from CUDA source, for users who already have one. The entry point follows the
/// elementwise calling convention:
///
///   __global__ void entry(<inputs>, U* out, unsigned long long n)
///
/// where an input declared "float32* x" arrives as a device array (`const float*`) and one
/// declared "float32 a" as a scalar by value; `out` and every array hold `n` elements. `map` and
/// `transform` split long arrays into pieces and launch once per piece (with `n` the piece's
/// length), so the kernel must compute out[i] from the inputs' element i. Inside a task,
/// `lane::run` launches it once over whole device arrays. The entry may be `extern "C"` or a C++
/// name. Compiled with NVRTC for each device's architecture, cached like elementwise kernels; the
/// CPU backend cannot run it and says so.
class raw_kernel {
 public:
  /// @param source  CUDA C++ source defining `entry` (no host code; standard headers are not
  ///                available, NVRTC's built-ins are)
  /// @param entry   the kernel's name
  /// @param inputs  comma-separated "type* name" (array) or "type name" (scalar) pairs
  /// @param output  one "type* name" (or "type name") pair: the output array
  /// @throw std::invalid_argument for a malformed signature, empty source or bad shape.
  raw_kernel(std::string source, std::string entry, const std::string& inputs,
             const std::string& output, launch_shape shape = {});

  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  [[nodiscard]] const std::string& entry() const noexcept { return entry_; }
  [[nodiscard]] const std::string& name() const noexcept { return entry_; }
  [[nodiscard]] const std::vector<kernel_parameter>& inputs() const noexcept { return inputs_; }
  [[nodiscard]] const kernel_parameter& output() const noexcept { return output_; }
  [[nodiscard]] launch_shape shape() const noexcept { return shape_; }

 private:
  std::string source_;
  std::string entry_;
  std::vector<kernel_parameter> inputs_;
  kernel_parameter output_;
  launch_shape shape_;
};

/// One input of a call: an array of the output's length, or a scalar. Arrays are read in place
/// and must stay alive until the call's future is ready. (Host memory for `transform`; device
/// memory for `lane::run` and `executor::map_on_device`, where a device_array converts too.)
class kernel_argument {
 public:
  template <class T>
  kernel_argument(std::span<const T> array)  // NOLINT: implicit on purpose
      : type_(dtype_of<T>()), data_(array.data()), count_(array.size()), is_array_(true) {}
  template <class T>
  kernel_argument(const std::vector<T>& array)  // NOLINT: implicit on purpose
      : kernel_argument(std::span<const T>(array)) {}
  /// A scalar, converted to the parameter's type at the call by NumPy's "same_kind" rule: an
  /// integer goes to any parameter type (an integer parameter must hold its value); a
  /// floating-point value only to a floating-point parameter (float32 must hold its
  /// magnitude). Anything else is refused at the call with argument_kind_error or
  /// argument_range_error; nothing is converted out of range.
  kernel_argument(double value) noexcept  // NOLINT: implicit on purpose
      : value_(value) {}
  kernel_argument(int value) noexcept  // NOLINT: implicit on purpose
      : value_(value), integer_(value), is_integer_(true) {}
  kernel_argument(long value) noexcept  // NOLINT: implicit on purpose
      : value_(static_cast<double>(value)), integer_(value), is_integer_(true) {}
  kernel_argument(long long value) noexcept  // NOLINT: implicit on purpose
      : value_(static_cast<double>(value)), integer_(value), is_integer_(true) {}

  [[nodiscard]] bool is_array() const noexcept { return is_array_; }
  [[nodiscard]] dtype type() const noexcept { return type_; }
  [[nodiscard]] const void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  /// A scalar's value as a double (an integer's rounded to the nearest double).
  [[nodiscard]] double value() const noexcept { return value_; }
  /// True for a scalar given as an integer; integer() is then its exact value (0 otherwise).
  [[nodiscard]] bool is_integer() const noexcept { return is_integer_; }
  [[nodiscard]] std::int64_t integer() const noexcept { return integer_; }

 private:
  dtype type_ = dtype::float64;
  const void* data_ = nullptr;
  std::size_t count_ = 0;
  bool is_array_ = false;
  double value_ = 0.0;
  std::int64_t integer_ = 0;
  bool is_integer_ = false;
};

/// One call of a compiled kernel over arrays already in one device's memory (see
/// executor::map_on_device): device arrays and scalars in; `count` elements of the output's type
/// written to `out`, device memory of `count` elements.
struct device_call {
  std::vector<kernel_argument> inputs;
  void* out = nullptr;
  std::size_t count = 0;
};

/// How many kernels this process compiled (rather than found in a cache). Thread-safe.
[[nodiscard]] std::size_t kernels_compiled() noexcept;

/// Where compiled kernels are kept between processes: GPUPOOL_CACHE_DIR, else
/// $XDG_CACHE_HOME/gpupool, else ~/.cache/gpupool. Safe to delete or move.
[[nodiscard]] std::string kernel_cache_directory();

}  // namespace gpupool
