// Host array and number intake, array results in pinned memory, and the pinned-memory calls.
#include "arrays.hpp"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

namespace gpupool_python {

const char* dtype_name(nb::dlpack::dtype t) {
  if (t == nb::dtype<float>()) return "float32";
  if (t == nb::dtype<double>()) return "float64";
  if (t == nb::dtype<std::int32_t>()) return "int32";
  if (t == nb::dtype<std::int64_t>()) return "int64";
  return nullptr;
}

gpupool::dtype dtype_from_name(const std::string& name) {
  if (name == "float32") return gpupool::dtype::float32;
  if (name == "float64") return gpupool::dtype::float64;
  if (name == "int32") return gpupool::dtype::int32;
  if (name == "int64") return gpupool::dtype::int64;
  throw nb::type_error(
      ("gpupool: unsupported dtype " + name + "; expected float32, float64, int32 or int64")
          .c_str());
}

nb::dlpack::dtype dlpack_of(gpupool::dtype t) {
  switch (t) {
    case gpupool::dtype::float32:
      return nb::dtype<float>();
    case gpupool::dtype::float64:
      return nb::dtype<double>();
    case gpupool::dtype::int32:
      return nb::dtype<std::int32_t>();
    case gpupool::dtype::int64:
      return nb::dtype<std::int64_t>();
  }
  return nb::dtype<double>();
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
  std::string where = std::string(which) + "[" + std::to_string(index) + "]";
  if (!parameter.empty()) where += " ('" + parameter + "')";
  input_array a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) {
    std::string what = nb::type_name(obj.type()).c_str();
    if (nb::hasattr(obj, "dtype"))
      what += " of dtype " +
              std::string(nb::steal<nb::str>(PyObject_Str(obj.attr("dtype").ptr())).c_str());
    throw nb::type_error(
        ("gpupool: " + where + " is a " + what +
         (parameter.empty() ? "; expected an array" : "; expected a number or an array") +
         " of float32, float64, int32 or int64")
            .c_str());
  }
  if (a.device_type() != nb::device::cpu::value)
    throw nb::type_error(("gpupool: " + where +
                          " lives on a GPU while the first array is a host array; pass host "
                          "arrays and device arrays in separate calls")
                             .c_str());
  if (dtype_name(a.dtype()) == nullptr)
    throw nb::type_error(
        ("gpupool: " + where + " has the unsupported dtype " +
         (nb::hasattr(obj, "dtype")
              ? std::string(nb::steal<nb::str>(PyObject_Str(obj.attr("dtype").ptr())).c_str())
              : std::string("(unnamed)")) +
         "; supported: float32, float64, int32, int64")
            .c_str());
  if (!is_c_contiguous(a))
    throw nb::value_error(
        ("gpupool: " + where + " is not C-contiguous; pass numpy.ascontiguousarray(...) of it")
            .c_str());
  return a;
}

gpupool::kernel_argument argument_of(const input_array& a, const std::string& /*name*/) {
  const auto t = a.dtype();
  const std::size_t n = a.size();
  if (t == nb::dtype<float>())
    return std::span<const float>(static_cast<const float*>(a.data()), n);
  if (t == nb::dtype<double>())
    return std::span<const double>(static_cast<const double*>(a.data()), n);
  if (t == nb::dtype<std::int32_t>())
    return std::span<const std::int32_t>(static_cast<const std::int32_t*>(a.data()), n);
  return std::span<const std::int64_t>(static_cast<const std::int64_t*>(a.data()), n);
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
  const bool integer_type = type == gpupool::dtype::int32 || type == gpupool::dtype::int64;
  const std::string type_name = gpupool::to_string(type);
  const std::string what = "gpupool: " + where + " is " + describe_value(n.value) +
                           (n.kind == number_kind::integer ? ", an " : ", a ") + kind_name(n.kind);
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
        const long long low = type == gpupool::dtype::int32
                                  ? std::numeric_limits<std::int32_t>::min()
                                  : std::numeric_limits<std::int64_t>::min();
        const long long high = type == gpupool::dtype::int32
                                   ? std::numeric_limits<std::int32_t>::max()
                                   : std::numeric_limits<std::int64_t>::max();
        if (overflow != 0 || v < low || v > high)
          throw_python(PyExc_OverflowError, what + ", out of range for " + type_name + " (" +
                                                std::to_string(low) + ".." + std::to_string(high) +
                                                ")");
        return gpupool::kernel_argument(static_cast<long>(v));
      }
      const double d = PyLong_AsDouble(p);
      if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        throw_python(PyExc_OverflowError, what + ", too large for " + type_name);
      }
      if (type == gpupool::dtype::float32 && std::fabs(d) > FLT_MAX)
        throw_python(PyExc_OverflowError,
                     what + ", out of range for float32 (largest magnitude 3.4028235e+38)");
      return gpupool::kernel_argument(d);
    }
    case number_kind::real: {
      if (integer_type)
        throw_python(PyExc_TypeError,
                     what + "; NumPy's same_kind casting does not turn a float into " + type_name +
                         " (it would drop the fraction): pass an int");
      const double d = PyFloat_AsDouble(p);
      if (type == gpupool::dtype::float32 && std::isfinite(d) && std::fabs(d) > FLT_MAX)
        throw_python(PyExc_OverflowError,
                     what + ", out of range for float32 (largest magnitude 3.4028235e+38)");
      return gpupool::kernel_argument(d);
    }
    case number_kind::complex:
      break;
  }
  throw_python(PyExc_TypeError, what + "; NumPy's same_kind casting does not turn a complex into " +
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
        static const char* names[] = {"unknown", "pinned_host", "device", "managed"};
        return nb::make_tuple(names[static_cast<int>(info.kind)], info.device);
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
