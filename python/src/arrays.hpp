// Host arrays and numbers taken from Python (checked at the call, before any work starts), the
// exports held while lanes read them, pinned result blocks, and the future of an array result.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// Pinned memory for one result; returned to gpupool's pinned cache when the last owner (this, or
// the NumPy array it became) lets go.
class pinned_block {
 public:
  explicit pinned_block(std::size_t bytes) : data_(gpupool::allocate_pinned(bytes)) {}
  pinned_block(const pinned_block&) = delete;
  pinned_block& operator=(const pinned_block&) = delete;
  ~pinned_block() { gpupool::deallocate_pinned(data_, 0); }
  [[nodiscard]] void* data() const noexcept { return data_; }

 private:
  void* data_;
};

// A NumPy array of `shape` and `type` over `block`, which it owns from now on (the block goes
// back to the pinned cache when the array dies).
nb::object pinned_array(std::unique_ptr<pinned_block> block, const std::vector<std::size_t>& shape,
                        nb::dlpack::dtype type);

// As pinned_array, over a block with other owners too (a slab that several results share, each a
// view of this array): the array keeps the block alive, and so does every view made of it.
// `strides` (in elements, one per dimension) lay the array out otherwise than C-contiguous.
nb::object shared_pinned_array(std::shared_ptr<pinned_block> block,
                               const std::vector<std::size_t>& shape, nb::dlpack::dtype type,
                               const std::int64_t* strides = nullptr);

// gpupool's dtypes by name, for messages: "float32, float64, int32" + last + "int64".
std::string dtype_names(const char* last);

const char* dtype_name(nb::dlpack::dtype t);
gpupool::dtype dtype_from_name(const std::string& name);
// gpupool's dtype of a checked array's element type (TypeError for one gpupool does not take).
gpupool::dtype gpupool_dtype(nb::dlpack::dtype t);
nb::dlpack::dtype dlpack_of(gpupool::dtype t);

// Checks one input at the call, before any work starts.
// `parameter` names a compiled kernel's parameter, which may also take a number.
input_array as_input(nb::handle obj, std::size_t index, const char* which,
                     const std::string& parameter = {});

// A checked host array as a map holds it while lanes read it: its memory, element type and shape,
// and what keeps the memory alive (the array itself, or the export as_input made of it).
class host_array {
 public:
  host_array() = default;
  explicit host_array(input_array view);
  // An exact numpy.ndarray read through the buffer protocol (see read_host_array).
  host_array(nb::object array, const void* data, nb::dlpack::dtype type, std::size_t ndim,
             const Py_ssize_t* shape);

  [[nodiscard]] const void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t nbytes() const noexcept { return size_ * (type_.bits / 8); }
  [[nodiscard]] nb::dlpack::dtype dtype() const noexcept { return type_; }
  [[nodiscard]] std::size_t ndim() const noexcept { return ndim_; }
  [[nodiscard]] std::vector<std::size_t> shape() const;
  [[nodiscard]] bool same_shape(const host_array& other) const noexcept;

 private:
  // Small: a map holds one or two per call, thousands of calls at once.
  std::unique_ptr<input_array> view_;  // as_input's export, when the array was read that way
  nb::object array_;  // the NumPy array, when it was read through the buffer protocol
  const void* data_ = nullptr;
  std::size_t size_ = 0;
  nb::dlpack::dtype type_{};
  std::uint32_t ndim_ = 1;
  // The extents, for two dimensions or more (a 1-d array's is its size, a 0-d array has none).
  std::unique_ptr<std::size_t[]> shape_;
};

// As as_input: the common case (an exact numpy.ndarray, C-contiguous, of a dtype gpupool takes)
// read through the buffer protocol, which costs a fraction of a DLPack import; every other
// object, and every array refused, goes through as_input, so that refusals read the same.
host_array read_host_array(nb::handle obj, std::size_t index, const char* which);
// An array a call writes: an exact numpy.ndarray, C-contiguous, of a dtype gpupool takes, read
// through one writable buffer export, so that the memory checked writable is the memory
// written. Throws TypeError for another object or dtype, ValueError for a read-only array or
// one not C-contiguous (as read_host_array words them, naming `which`[`index`]).
host_array read_writable_host_array(nb::handle obj, std::size_t index, const char* which);

// A checked host array as a kernel argument (its dtype is checked against the parameter later).
gpupool::kernel_argument argument_of(const input_array& a, const std::string& name);

// What kind of number a value is, as NumPy's casting rules see it.
enum class number_kind { boolean, integer, real, complex };

struct number {
  number_kind kind;
  nb::object value;  // a Python bool, int, float or complex
};

const char* kind_name(number_kind k);
std::optional<number_kind> python_number_kind(PyObject* p);

// `value` as a number if it is one: a Python bool, int, float or complex, or a NumPy scalar or
// 0-d array (whose item() is one of those, of the same kind). Nothing for anything else.
std::optional<number> as_number(nb::handle value);

// A short text of `value` for messages: huge ints are refused by str() (and would flood them).
std::string describe_value(nb::handle value);

// `n` (a number given for `where`, whose type is `type`) as a kernel argument, by NumPy's
// "same_kind" casting rule: a bool becomes any type, an int an int or a float, a float only a
// float; a complex nothing here. A value the type cannot hold is refused (OverflowError), never
// converted out of range: in C++ that would be undefined or silently change the number.
gpupool::kernel_argument scalar_argument(const number& n, gpupool::dtype type,
                                         const std::string& where);

std::vector<std::size_t> shape_of(const input_array& a);

}  // namespace gpupool_python
