// Host array and number intake, array results in pinned memory, and the pinned-memory calls.
#include "arrays.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>

namespace gpupool_python {

nb::object pinned_array(std::unique_ptr<pinned_block> block, const std::vector<std::size_t>& shape,
                        nb::dlpack::dtype type) {
  pinned_block* owned = block.release();
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<pinned_block*>(p); });
  return nb::cast(
      nb::ndarray<nb::numpy>(owned->data(), shape.size(), shape.data(), owner, nullptr, type));
}

nb::object shared_pinned_array(std::shared_ptr<pinned_block> block,
                               const std::vector<std::size_t>& shape, nb::dlpack::dtype type,
                               const std::int64_t* strides) {
  void* data = block->data();
  auto* owned = new std::shared_ptr<pinned_block>(std::move(block));
  nb::capsule owner(
      owned, [](void* p) noexcept { delete static_cast<std::shared_ptr<pinned_block>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy>(data, shape.size(), shape.data(), owner, strides, type));
}

std::string dtype_names(const char* last) {
  std::string out;
  for (std::size_t i = 0; i < std::size(gpupool::dtypes); ++i)
    out += (i == 0                                ? ""
            : i + 1 == std::size(gpupool::dtypes) ? last
                                                  : ", ") +
           std::string(gpupool::dtypes[i].name);
  return out;
}

nb::dlpack::dtype dlpack_of(gpupool::dtype t) {
  return gpupool::visit_dtype(t, []<class T>() { return nb::dtype<T>(); });
}

const char* dtype_name(nb::dlpack::dtype t) {
  for (const gpupool::dtype_info& info : gpupool::dtypes)
    if (dlpack_of(info.type) == t) return info.name;
  return nullptr;
}

gpupool::dtype dtype_from_name(const std::string& name) {
  for (const gpupool::dtype_info& info : gpupool::dtypes)
    if (name == info.name) return info.type;
  throw nb::type_error(
      ("gpupool: unsupported dtype " + name + "; expected " + dtype_names(" or ")).c_str());
}

gpupool::dtype gpupool_dtype(nb::dlpack::dtype t) {
  for (const gpupool::dtype_info& info : gpupool::dtypes)
    if (dlpack_of(info.type) == t) return info.type;
  throw nb::type_error(("gpupool: unsupported dtype; expected " + dtype_names(" or ")).c_str());
}

bool is_c_contiguous(const input_array& a) {
  if (a.size() == 0) return true;  // an empty array's strides mean nothing
  std::int64_t expected = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) return false;
    expected *= static_cast<std::int64_t>(a.shape(i));
  }
  return true;
}

input_array as_input(nb::handle obj, std::size_t index, const char* which,
                     const std::string& parameter) {
  // Named only in a refusal: a map checks every one of thousands of arrays through here.
  const auto where_of = [&] {
    std::string where = std::string(which) + "[" + std::to_string(index) + "]";
    if (!parameter.empty()) where += " ('" + parameter + "')";
    return where;
  };
  input_array a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) {
    const std::string where = where_of();
    std::string what = nb::type_name(obj.type()).c_str();
    if (nb::hasattr(obj, "dtype"))
      what += " of dtype " +
              std::string(nb::steal<nb::str>(PyObject_Str(obj.attr("dtype").ptr())).c_str());
    throw nb::type_error(
        ("gpupool: " + where + " is a " + what +
         (parameter.empty() ? "; expected an array" : "; expected a number or an array") + " of " +
         dtype_names(" or "))
            .c_str());
  }
  if (a.device_type() != nb::device::cpu::value)
    throw nb::type_error(("gpupool: " + where_of() +
                          " lives on a GPU while the first array is a host array; pass host "
                          "arrays and device arrays in separate calls")
                             .c_str());
  if (dtype_name(a.dtype()) == nullptr)
    throw nb::type_error(
        ("gpupool: " + where_of() + " has the unsupported dtype " +
         (nb::hasattr(obj, "dtype")
              ? std::string(nb::steal<nb::str>(PyObject_Str(obj.attr("dtype").ptr())).c_str())
              : std::string("(unnamed)")) +
         "; supported: " + dtype_names(", "))
            .c_str());
  if (!is_c_contiguous(a))
    throw nb::value_error(
        ("gpupool: " + where_of() + " is not C-contiguous; pass numpy.ascontiguousarray(...) of it")
            .c_str());
  return a;
}

host_array::host_array(input_array view)
    : view_(std::make_unique<input_array>(std::move(view))),
      data_(view_->data()),
      size_(view_->size()),
      type_(view_->dtype()),
      ndim_(static_cast<std::uint32_t>(view_->ndim())) {
  if (ndim_ < 2) return;
  shape_ = std::make_unique<std::size_t[]>(ndim_);
  for (std::size_t i = 0; i < ndim_; ++i) shape_[i] = view_->shape(i);
}

host_array::host_array(nb::object array, const void* data, nb::dlpack::dtype type, std::size_t ndim,
                       const Py_ssize_t* shape)
    : array_(std::move(array)),
      data_(data),
      size_(1),
      type_(type),
      ndim_(static_cast<std::uint32_t>(ndim)) {
  if (ndim_ >= 2) shape_ = std::make_unique<std::size_t[]>(ndim_);
  for (std::size_t i = 0; i < ndim_; ++i) {
    const auto extent = static_cast<std::size_t>(shape[i]);
    size_ *= extent;
    if (ndim_ >= 2) shape_[i] = extent;
  }
}

std::vector<std::size_t> host_array::shape() const {
  if (ndim_ == 1) return {size_};
  if (ndim_ == 0) return {};
  return std::vector<std::size_t>(shape_.get(), shape_.get() + ndim_);
}

bool host_array::same_shape(const host_array& other) const noexcept {
  if (ndim_ != other.ndim_ || size_ != other.size_) return false;
  return ndim_ < 2 || std::equal(shape_.get(), shape_.get() + ndim_, other.shape_.get());
}

namespace {

// numpy.ndarray, once NumPy has been imported (nothing before: no array can be one then).
PyTypeObject* numpy_array_type() {
  static PyTypeObject* type = nullptr;  // kept for the process's life, as the module is
  if (type != nullptr) return type;
  PyObject* numpy = PyImport_GetModule(nb::str("numpy").ptr());
  if (numpy == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* ndarray = PyObject_GetAttrString(numpy, "ndarray");
  Py_DECREF(numpy);
  if (ndarray == nullptr || !PyType_Check(ndarray)) {
    Py_XDECREF(ndarray);
    PyErr_Clear();
    return nullptr;
  }
  type = reinterpret_cast<PyTypeObject*>(ndarray);  // the reference is kept
  return type;
}

// The dtype of a native-order buffer format gpupool takes, or nothing (as_input then decides).
std::optional<nb::dlpack::dtype> buffer_dtype(const char* format, Py_ssize_t itemsize) {
  if (format == nullptr || format[0] == '\0' || format[1] != '\0') return std::nullopt;
  switch (format[0]) {
    case 'f':
      if (itemsize == 4) return dlpack_of(gpupool::dtype::float32);
      break;
    case 'd':
      if (itemsize == 8) return dlpack_of(gpupool::dtype::float64);
      break;
    case 'i':
    case 'l':
    case 'q':
      if (itemsize == 4) return dlpack_of(gpupool::dtype::int32);
      if (itemsize == 8) return dlpack_of(gpupool::dtype::int64);
      break;
    default:
      break;
  }
  return std::nullopt;
}

bool is_numpy_array(nb::handle obj) {
  PyTypeObject* ndarray = numpy_array_type();
  return ndarray != nullptr && Py_TYPE(obj.ptr()) == ndarray;
}

// `extra_flags`: more the export must give (PyBUF_WRITABLE).
std::optional<host_array> read_numpy_array(nb::handle obj, int extra_flags = 0) {
  if (!is_numpy_array(obj)) return std::nullopt;
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | extra_flags) != 0) {
    PyErr_Clear();  // not C-contiguous, say: as_input says why
    return std::nullopt;
  }
  // The array, held by the host_array, keeps its memory: the buffer itself is not kept.
  struct released {
    Py_buffer& view;
    ~released() { PyBuffer_Release(&view); }
  } release{view};
  const std::optional<nb::dlpack::dtype> type = buffer_dtype(view.format, view.itemsize);
  if (!type) return std::nullopt;
  return host_array(nb::borrow(obj), view.buf, *type, static_cast<std::size_t>(view.ndim),
                    view.shape);
}

}  // namespace

host_array read_host_array(nb::handle obj, std::size_t index, const char* which) {
  if (std::optional<host_array> a = read_numpy_array(obj)) return std::move(*a);
  return host_array(as_input(obj, index, which));
}

host_array read_writable_host_array(nb::handle obj, std::size_t index, const char* which) {
  // Named only when refused: this runs once per output of a call.
  const auto name = [&] { return std::string(which) + "[" + std::to_string(index) + "]"; };
  if (!is_numpy_array(obj))
    throw nb::type_error(("gpupool: " + name() + " is a " +
                          nb::cast<std::string>(nb::str(obj.type().attr("__name__"))) +
                          "; give a numpy.ndarray")
                             .c_str());
  if (std::optional<host_array> a = read_numpy_array(obj, PyBUF_WRITABLE)) return std::move(*a);
  // Refused: read_host_array says why where it would refuse it too (not C-contiguous, a dtype
  // gpupool does not take); what it takes was refused for being read-only.
  (void)read_host_array(obj, index, which);
  throw nb::value_error(("gpupool: " + name() + " is read-only").c_str());
}

gpupool::kernel_argument argument_of(const input_array& a, const std::string& /*name*/) {
  return gpupool::visit_dtype(gpupool_dtype(a.dtype()), [&]<class T>() {
    return gpupool::kernel_argument(std::span<const T>(static_cast<const T*>(a.data()), a.size()));
  });
}

const char* kind_name(number_kind k) {
  switch (k) {
    case number_kind::boolean:
      return "bool";
    case number_kind::integer:
      return "int";
    case number_kind::real:
      return "float";
    case number_kind::complex:
      return "complex";
  }
  return "number";
}

std::optional<number_kind> python_number_kind(PyObject* p) {
  if (PyBool_Check(p)) return number_kind::boolean;
  if (PyLong_Check(p)) return number_kind::integer;
  if (PyFloat_Check(p)) return number_kind::real;
  if (PyComplex_Check(p)) return number_kind::complex;
  return std::nullopt;
}

// `value` as a number if it is one: a Python bool, int, float or complex, or a NumPy scalar or
// 0-d array (whose item() is one of those, of the same kind). Nothing for anything else.
std::optional<number> as_number(nb::handle value) {
  if (auto kind = python_number_kind(value.ptr())) return number{*kind, nb::borrow(value)};
  if (PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr())) return std::nullopt;
  if (!nb::hasattr(value, "ndim") || !nb::hasattr(value, "item")) return std::nullopt;
  nb::object ndim = value.attr("ndim");
  if (!PyLong_Check(ndim.ptr()) || PyLong_AsLong(ndim.ptr()) != 0) return std::nullopt;
  nb::object item = value.attr("item")();
  if (auto kind = python_number_kind(item.ptr())) return number{*kind, item};
  return std::nullopt;
}

std::string describe_value(nb::handle value) {
  PyObject* text = PyObject_Repr(value.ptr());
  if (text == nullptr) {
    PyErr_Clear();
    return "a value that has no repr";
  }
  std::string out = nb::steal<nb::str>(text).c_str();
  if (out.size() > 60) out = out.substr(0, 40) + "..." + out.substr(out.size() - 10);
  return out;
}

gpupool::kernel_argument scalar_argument(const number& n, gpupool::dtype type,
                                         const std::string& where) {
  const bool integer_type = gpupool::info_of(type).is_integer;
  // The type's range: integers from low to high; floating point up to `largest` in magnitude.
  const auto [low, high, largest] = gpupool::visit_dtype(type, []<class T>() {
    using limits = std::numeric_limits<T>;
    if constexpr (std::is_integral_v<T>)
      return std::tuple<long long, long long, double>{limits::min(), limits::max(), 0.0};
    else
      return std::tuple<long long, long long, double>{0, 0, static_cast<double>(limits::max())};
  });
  // The refusals are spelled out only when one is made: a value that passes costs no repr.
  const std::string type_name = gpupool::to_string(type);
  // (`largest` copied in: a lambda may capture a structured binding only from C++20 compilers
  // newer than clang 14.)
  const auto out_of_float_range = [&, largest = largest] {
    char largest_text[32];
    std::snprintf(largest_text, sizeof largest_text, "%.8g", largest);
    return ", out of range for " + type_name + " (largest magnitude " + largest_text + ")";
  };
  const auto what = [&] {
    return "gpupool: " + where + " is " + describe_value(n.value) +
           (n.kind == number_kind::integer ? ", an " : ", a ") + kind_name(n.kind);
  };
  PyObject* p = n.value.ptr();
  switch (n.kind) {
    case number_kind::boolean: {
      const long b = p == Py_True ? 1 : 0;
      if (integer_type) return gpupool::kernel_argument(b);
      return gpupool::kernel_argument(static_cast<double>(b));
    }
    case number_kind::integer: {
      if (integer_type) {
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
        if (v == -1 && PyErr_Occurred()) throw nb::python_error();
        if (overflow != 0 || v < low || v > high)
          throw_python(PyExc_OverflowError, what() + ", out of range for " + type_name + " (" +
                                                std::to_string(low) + ".." + std::to_string(high) +
                                                ")");
        return gpupool::kernel_argument(static_cast<long>(v));
      }
      const double d = PyLong_AsDouble(p);
      if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        throw_python(PyExc_OverflowError, what() + ", too large for " + type_name);
      }
      if (std::fabs(d) > largest) throw_python(PyExc_OverflowError, what() + out_of_float_range());
      return gpupool::kernel_argument(d);
    }
    case number_kind::real: {
      if (integer_type)
        throw_python(PyExc_TypeError,
                     what() + "; NumPy's same_kind casting does not turn a float into " +
                         type_name + " (it would drop the fraction): pass an int");
      const double d = PyFloat_AsDouble(p);
      if (std::isfinite(d) && std::fabs(d) > largest)
        throw_python(PyExc_OverflowError, what() + out_of_float_range());
      return gpupool::kernel_argument(d);
    }
    case number_kind::complex:
      break;
  }
  throw_python(PyExc_TypeError, what() +
                                    "; NumPy's same_kind casting does not turn a complex into " +
                                    type_name + ": pass a real number");
}

std::vector<std::size_t> shape_of(const input_array& a) {
  std::vector<std::size_t> shape(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) shape[i] = a.shape(i);
  return shape;
}

void bind_arrays(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "allocate_pinned",
      [](std::size_t nbytes) {
        // No array may be larger (NumPy's limit too); the size-class rounding needs headroom.
        if (nbytes > static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()))
          throw_python(PyExc_OverflowError, "gpupool: allocate_pinned: " + std::to_string(nbytes) +
                                                " bytes is too large");
        void* p = gpupool::allocate_pinned(nbytes);
        nb::capsule owner(p, [](void* q) noexcept { gpupool::deallocate_pinned(q, 0); });
        std::size_t shape[1] = {nbytes};
        return nb::ndarray<nb::numpy, std::uint8_t>(p, 1, shape, owner);
      },
      "nbytes"_a);
  m.def(
      "is_pinned",
      [](std::uintptr_t address) {
        return gpupool::is_pinned(reinterpret_cast<const void*>(address));
      },
      "address"_a);
  m.def(
      "describe_pointer",
      [](std::uintptr_t address) {
        const auto info = gpupool::describe_pointer(reinterpret_cast<const void*>(address));
        return nb::make_tuple(gpupool::to_string(info.kind), info.device);
      },
      "address"_a);
  m.def(
      "wait_for_stream",
      [](std::uintptr_t stream) {
        nb::gil_scoped_release nogil;
        gpupool::wait_for_stream(stream);
      },
      "stream"_a);
  m.def("pinned_bytes_in_use", &gpupool::pinned_bytes_in_use);
  m.def("pinned_memory_stats", []() {
    const auto s = gpupool::pinned_memory_stats();
    nb::dict d;
    d["in_use"] = s.in_use;
    d["cached"] = s.cached;
    d["cache_limit"] = s.cache_limit;
    return d;
  });
  m.def("set_pinned_cache_limit", &gpupool::set_pinned_cache_limit, "nbytes"_a);
  m.def("trim_pinned_cache", &gpupool::trim_pinned_cache);
}

}  // namespace gpupool_python
