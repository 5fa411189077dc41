// gpupool._ext: the thin binding between the C++ core and the Python package. It adapts only:
// the GIL (released in every blocking call and for all array work), exceptions, and the array
// protocols. The Executor semantics live in python/gpupool/_executor.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cfloat>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpupool/gpupool.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Exception types, created at import.
PyObject* error_type = nullptr;
PyObject* cuda_error_type = nullptr;
PyObject* out_of_memory_type = nullptr;
PyObject* backend_unavailable_type = nullptr;
PyObject* compile_error_type = nullptr;
PyObject* cancelled_type = nullptr;  // concurrent.futures.CancelledError

// The Python exception object a C++ exception becomes (with the GIL held).
nb::object python_exception(const std::exception_ptr& failure);

bool interpreter_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// Executors whose last reference died inside one of their own tasks are stopped by a thread of
// their own (a lane cannot wait for itself). Those threads, and the lanes they stop, may still
// release Python objects; the interpreter's exit waits for them (join_orphaned_executors, called
// before finalization) so that none reaches for Python once it is finalizing. Leaked on purpose:
// a detached thread may outlive static destruction.
struct orphaned_executors {
  std::mutex mutex;
  std::condition_variable stopped;
  int stopping = 0;
};
orphaned_executors& orphans() {
  static auto* const state = new orphaned_executors;
  return *state;
}

// A strong reference to a Python object that may be released on a lane thread, without the GIL.
class py_ref {
 public:
  explicit py_ref(nb::handle h) : object_(h.inc_ref().ptr()) {}
  py_ref(const py_ref&) = delete;
  py_ref& operator=(const py_ref&) = delete;
  ~py_ref() {
    if (object_ == nullptr || !interpreter_alive()) return;  // at exit: leak rather than crash
    nb::gil_scoped_acquire gil;
    Py_DECREF(object_);
  }
  [[nodiscard]] nb::handle get() const { return object_; }

 private:
  PyObject* object_;
};

// The lane whose task this thread is running, for gpupool.current_lane().
thread_local gpupool::lane* current_lane = nullptr;

class lane_scope {
 public:
  explicit lane_scope(gpupool::lane* l) : previous_(current_lane) { current_lane = l; }
  lane_scope(const lane_scope&) = delete;
  lane_scope& operator=(const lane_scope&) = delete;
  ~lane_scope() { current_lane = previous_; }

 private:
  gpupool::lane* previous_;
};

// Python's view of a lane: valid only inside its task, on its thread.
class py_lane {
 public:
  explicit py_lane(gpupool::lane* l) : lane_(l) {}
  gpupool::lane& get() const {
    if (current_lane != lane_)
      throw std::runtime_error("gpupool: a Lane is usable only inside the task it was given to");
    return *lane_;
  }

 private:
  gpupool::lane* lane_;
};

using input_array = nb::ndarray<nb::ro>;

// The exports (Py_buffer or DLPack) of a task's host inputs, held from the call until the task
// has ended: the lanes read the inputs in place, so their owners must not resize or free that
// memory meanwhile. While an export is held a bytearray or array.array refuses to resize
// (BufferError) and NumPy refuses to resize its array, instead of freeing memory a lane reads.
// Released exactly once, by whichever comes first: the task's completion callback (on a lane,
// or on the thread that cancelled it), the future's result()/done(), or the future's end.
class input_exports {
 public:
  explicit input_exports(std::vector<input_array> views) : views_(std::move(views)) {}
  input_exports(const input_exports&) = delete;
  input_exports& operator=(const input_exports&) = delete;
  ~input_exports() { release(); }

  // Any thread, with or without the GIL. The exports are taken out and let go under the GIL, so
  // a thread holding the GIL (result() after the wait) never finds them taken but not yet let
  // go by a lane waiting for the GIL. Once the interpreter is finalizing, taking the GIL could
  // hang or end the thread: leak them instead.
  void release() noexcept {
    {
      std::lock_guard lock(mutex_);
      if (views_.empty()) return;
    }
    if (!interpreter_alive()) {
      std::lock_guard lock(mutex_);
      static_cast<void>(new std::vector<input_array>(std::move(views_)));  // deliberately leaked
      views_.clear();
      return;
    }
    nb::gil_scoped_acquire gil;
    std::vector<input_array> views;
    {
      std::lock_guard lock(mutex_);
      views.swap(views_);
    }
    views.clear();
  }

 private:
  std::mutex mutex_;
  std::vector<input_array> views_;
};

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

// The result of a built-in kernel over one array. The result is written by the device straight
// into pinned memory that becomes the NumPy array handed out, so no host copy follows the
// download. Waits without the GIL; keeps the inputs alive until the work is over.
class array_future {
 public:
  // Result in `out`, handed out as a NumPy array of `type` and `shape`.
  // The task reads `inputs` in place: their exports are held until it has ended.
  array_future(gpupool::future<void> f, std::unique_ptr<pinned_block> out, nb::dlpack::dtype type,
               std::vector<std::size_t> shape, nb::object x, nb::object y,
               std::vector<input_array> inputs)
      : future_(std::move(f)),
        out_(std::move(out)),
        type_(type),
        shape_(std::move(shape)),
        x_(std::move(x)),
        y_(std::move(y)),
        inputs_(std::make_shared<input_exports>(std::move(inputs))) {
    // Registered first, so the exports are let go before any caller's done callback runs.
    future_.on_complete([inputs = inputs_](gpupool::future<void>&) { inputs->release(); });
  }
  // Result written into `result`, an array the caller made (on a device), handed out as is.
  array_future(gpupool::future<void> f, nb::object result, nb::object keep_alive)
      : future_(std::move(f)), x_(std::move(keep_alive)), result_(std::move(result)) {}
  array_future(const array_future&) = delete;
  array_future& operator=(const array_future&) = delete;
  ~array_future() {
    // The lanes may still read the inputs and write the output: never let them go before the
    // work is over.
    if (!future_.ready()) {
      future_.cancel();
      nb::gil_scoped_release nogil;
      future_.wait();
    }
    if (inputs_) inputs_->release();
  }

  // The completion callback runs after waiters wake, so a caller that saw the task end lets the
  // exports go itself: once done() or result() says the work is over, the inputs are free.
  bool done() const {
    if (!future_.ready()) return false;
    if (inputs_) inputs_->release();
    return true;
  }
  bool cancel() { return future_.cancel(); }
  bool cancelled() const { return future_.status() == gpupool::task_status::cancelled; }

  // Waits at most `timeout` seconds (forever if None). Raises TimeoutError if not done.
  nb::object result(std::optional<double> timeout) {
    bool finished = true;
    {
      nb::gil_scoped_release nogil;
      if (timeout)
        finished = future_.wait_for(std::chrono::duration<double>(*timeout));
      else
        future_.wait();
    }
    if (!finished) {
      PyErr_SetString(PyExc_TimeoutError, "gpupool: the result was not ready in time");
      throw nb::python_error();
    }
    if (inputs_) inputs_->release();
    future_.get();  // rethrows the task's failure
    if (!result_.is_valid()) result_ = make_array();
    return result_;
  }

  // Calls `callback()` (with the GIL) once the work has ended, possibly right away.
  void add_done_callback(nb::callable callback) {
    auto ref = std::make_shared<py_ref>(callback);
    future_.on_complete([ref](gpupool::future<void>&) {
      if (!interpreter_alive()) return;
      nb::gil_scoped_acquire gil;
      try {
        ref->get()();
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("gpupool: in a done callback");
      }
    });
  }

 private:
  nb::object make_array() {
    pinned_block* block = out_.release();
    nb::capsule owner(block, [](void* p) noexcept { delete static_cast<pinned_block*>(p); });
    return nb::cast(
        nb::ndarray<nb::numpy>(block->data(), shape_.size(), shape_.data(), owner, nullptr, type_));
  }

  gpupool::future<void> future_;
  std::unique_ptr<pinned_block> out_;
  nb::dlpack::dtype type_;
  std::vector<std::size_t> shape_;
  nb::object x_;
  nb::object y_;
  nb::object result_;
  std::shared_ptr<input_exports> inputs_;
};

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

// Checks one input at the call, before any work starts.
// `parameter` names a compiled kernel's parameter, which may also take a number.
input_array as_input(nb::handle obj, std::size_t index, const char* which,
                     const std::string& parameter = {}) {
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

// A checked host array as a kernel argument (its dtype is checked against the parameter later).
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

// What kind of number a value is, as NumPy's casting rules see it.
enum class number_kind { boolean, integer, real, complex };

struct number {
  number_kind kind;
  nb::object value;  // a Python bool, int, float or complex
};

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

// A short text of `value` for messages: huge ints are refused by str() (and would flood them).
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

[[noreturn]] void throw_python(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

// `n` (a number given for `where`, whose type is `type`) as a kernel argument, by NumPy's
// "same_kind" casting rule: a bool becomes any type, an int an int or a float, a float only a
// float; a complex nothing here. A value the type cannot hold is refused (OverflowError), never
// converted out of range: in C++ that would be undefined or silently change the number.
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
// The alpha of scale/axpy as the caller gave it (a Python bool, int or float), kept on the Kernel
// object: the C++ kernel carries a double, which tells neither 2 from 2.0 nor every int64 apart.
constexpr const char* alpha_attribute = "_alpha_value";

nb::object alpha_kernel(gpupool::kernel (*make)(double), const char* op_name, nb::handle alpha) {
  const std::string where = std::string("alpha of gpupool.kernels.") + op_name;
  const auto n = as_number(alpha);
  if (!n || n->kind == number_kind::complex)
    throw_python(PyExc_TypeError, "gpupool: " + where + " is " + describe_value(alpha) + ", a " +
                                      (n ? std::string("complex")
                                         : std::string(nb::type_name(alpha.type()).c_str())) +
                                      "; expected a real number (bool, int or float)");
  double value = 0.0;
  if (n->kind == number_kind::boolean) {
    value = n->value.ptr() == Py_True ? 1.0 : 0.0;
  } else if (n->kind == number_kind::integer) {
    value = PyLong_AsDouble(n->value.ptr());
    if (value == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      throw_python(PyExc_OverflowError, "gpupool: " + where + " is " + describe_value(alpha) +
                                            ", too large for any dtype gpupool supports");
    }
  } else {
    value = PyFloat_AsDouble(n->value.ptr());
  }
  nb::object kernel = nb::cast(make(value));
  kernel.attr(alpha_attribute) = n->value;
  return kernel;
}

// Refuses, before any work starts, a scale/axpy whose alpha arrays of `type` cannot take by
// NumPy's same_kind rule (0.5 for int32 would make zeros), or whose value `type` cannot hold.
void check_alpha(nb::handle kernel_object, const gpupool::kernel& k, gpupool::dtype type,
                 const std::string& arrays) {
  if (k.operation() != gpupool::op::scale && k.operation() != gpupool::op::axpy) return;
  nb::object given = nb::getattr(kernel_object, alpha_attribute, nb::none());
  const auto kind = python_number_kind(given.ptr());
  const number n = kind ? number{*kind, given} : number{number_kind::real, nb::float_(k.alpha())};
  const std::string where = std::string("alpha of gpupool.kernels.") + k.name() + " (for " +
                            arrays + " of " + gpupool::to_string(type) + ")";
  const auto argument = scalar_argument(n, type, where);
  if (n.kind != number_kind::integer ||
      (type != gpupool::dtype::int32 && type != gpupool::dtype::int64))
    return;
  // The kernel computes with static_cast<T>(alpha): the double must be that int exactly.
  const double a = k.alpha();
  constexpr double two_to_63 = 9223372036854775808.0;
  if (!(a >= -two_to_63 && a < two_to_63) || static_cast<std::int64_t>(a) != argument.integer())
    throw_python(PyExc_OverflowError,
                 "gpupool: " + where + " is " + describe_value(given) +
                     ", which a built-in kernel cannot carry exactly (it holds alpha as a "
                     "float64); use gpupool.elementwise for such integers");
}

// A str argument of `function` (a kernel's declaration or source), refused clearly otherwise.
std::string text_argument(nb::handle value, const char* function, const char* parameter) {
  if (!PyUnicode_Check(value.ptr()))
    throw_python(PyExc_TypeError, std::string("gpupool: ") + function + ": " + parameter +
                                      " must be a str, not " + nb::type_name(value.type()).c_str());
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(value.ptr(), &size);  // lone surrogates: an error
  if (text == nullptr) throw nb::python_error();
  return std::string(text, static_cast<std::size_t>(size));
}

// An int argument (anything with __index__, not a bool) from `low` to `high`.
unsigned count_argument(nb::handle value, const char* function, const char* parameter, unsigned low,
                        unsigned high) {
  const std::string where = std::string("gpupool: ") + function + ": " + parameter;
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr()))
    throw_python(PyExc_TypeError,
                 where + " must be an int, not " + nb::type_name(value.type()).c_str());
  nb::object index = nb::steal(PyNumber_Index(value.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long n = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (n == -1 && PyErr_Occurred()) throw nb::python_error();
  if (overflow != 0 || n < static_cast<long long>(low) || n > static_cast<long long>(high))
    throw_python(PyExc_ValueError, where + " must be from " + std::to_string(low) + " to " +
                                       std::to_string(high) + ", not " + describe_value(value));
  return static_cast<unsigned>(n);
}

std::vector<std::size_t> shape_of(const input_array& a) {
  std::vector<std::size_t> shape(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) shape[i] = a.shape(i);
  return shape;
}

class py_executor {
 public:
  py_executor(int threads_per_gpu, std::optional<std::vector<int>> devices,
              std::optional<std::string> backend, int slots_per_lane, std::size_t chunk_bytes,
              std::size_t device_memory_budget, int cpu_devices) {
    gpupool::executor_options o;
    if (backend) {
      if (*backend == "cpu")
        o.backend = gpupool::backend_kind::cpu;
      else if (*backend == "cuda")
        o.backend = gpupool::backend_kind::cuda;
      else
        throw nb::value_error(
            ("gpupool: backend must be 'cpu' or 'cuda', not '" + *backend + "'").c_str());
    }
    if (devices) o.devices = *devices;
    o.lanes_per_device = threads_per_gpu;
    o.slots_per_lane = slots_per_lane;
    o.chunk_bytes = chunk_bytes;
    o.device_memory_budget = device_memory_budget;
    o.cpu_devices = cpu_devices;
    nb::gil_scoped_release nogil;
    executor_ = std::make_unique<gpupool::executor>(o);
  }
  py_executor(const py_executor&) = delete;
  py_executor& operator=(const py_executor&) = delete;
  ~py_executor() {
    if (executor_ && executor_->is_lane_thread()) {
      // The last reference died inside one of its own tasks: a lane cannot wait for itself,
      // so another thread drains and stops the executor.
      {
        std::lock_guard lock(orphans().mutex);
        ++orphans().stopping;
      }
      std::thread([e = std::move(executor_)]() mutable {
        e.reset();
        std::lock_guard lock(orphans().mutex);
        --orphans().stopping;
        orphans().stopped.notify_all();
      }).detach();
      return;
    }
    // Draining may need the GIL (queued Python tasks): let the lanes have it.
    nb::gil_scoped_release nogil;
    executor_.reset();
  }

  gpupool::executor& get() const {
    if (!executor_) throw std::runtime_error("gpupool: the executor is closed");
    return *executor_;
  }

  // Runs `call()` on a lane (of `device`, if given) with the GIL and the lane current. `call`
  // returns a callable (or None) that hands the outcome over; it is called once the lane's
  // stream has finished what `call` enqueued, so results made on the GPU are complete by then.
  // If the lane fails the task after `call` returned (a CUDA error), or the task is cancelled
  // before it starts (by shutdown), `on_error(exception)` is called instead (a CancelledError for
  // a cancellation). Returns `cancel()`: true if the task had not started and is now cancelled.
  nb::object submit_call(nb::callable call, nb::callable on_error, std::optional<int> device) {
    using deliverer = std::shared_ptr<py_ref>;
    auto ref = std::make_shared<py_ref>(call);
    auto task = [ref](gpupool::lane& l) -> deliverer {
      if (!interpreter_alive()) return nullptr;
      nb::gil_scoped_acquire gil;
      lane_scope scope(&l);
      try {
        nb::object deliver = ref->get()();
        return deliver.is_none() ? nullptr : std::make_shared<py_ref>(deliver);
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("gpupool: in a lane task");
        return nullptr;
      }
    };
    auto f = device ? get().submit_to(*device, std::move(task)) : get().submit(std::move(task));
    auto error_ref = std::make_shared<py_ref>(on_error);
    auto handle = std::make_shared<gpupool::future<deliverer>>(std::move(f));
    handle->on_complete([error_ref](gpupool::future<deliverer>& done) {
      if (!interpreter_alive()) return;
      deliverer deliver;
      std::exception_ptr failure;
      try {
        deliver = done.get();
      } catch (...) {
        failure = std::current_exception();
      }
      nb::gil_scoped_acquire gil;
      try {
        if (failure) {
          error_ref->get()(python_exception(failure));
        } else if (deliver) {
          deliver->get()();
        }
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("gpupool: handing over a task's result");
      }
    });
    return nb::cpp_function([handle]() { return handle->cancel(); });
  }

  std::vector<std::unique_ptr<array_future>> map_kernel(
      nb::pointer_and_handle<gpupool::kernel> kernel, nb::sequence xs,
      std::optional<nb::sequence> ys) {
    const gpupool::kernel& k = *kernel.p;
    const std::size_t n = nb::len(xs);
    if (k.arity() == 2 && !ys)
      throw nb::value_error(
          ("gpupool: kernel '" + std::string(k.name()) + "' takes two arrays").c_str());
    if (k.arity() == 1 && ys)
      throw nb::value_error(
          ("gpupool: kernel '" + std::string(k.name()) + "' takes one array").c_str());
    if (ys && nb::len(*ys) != n)
      throw nb::value_error(("gpupool: the two input lists differ in length (" + std::to_string(n) +
                             " arrays and " + std::to_string(nb::len(*ys)) + ")")
                                .c_str());

    std::vector<input_array> x(n), y(ys ? n : 0);
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = as_input(xs[i], i, "x");
      check_alpha(kernel.h, k, dtype_from_name(dtype_name(x[i].dtype())),
                  "x[" + std::to_string(i) + "]");
      if (ys) {
        y[i] = as_input((*ys)[i], i, "y");
        const std::string pair = "x[" + std::to_string(i) + "] and y[" + std::to_string(i) + "]";
        if (y[i].dtype() != x[i].dtype())
          throw nb::value_error(("gpupool: " + pair + " differ in dtype (" +
                                 dtype_name(x[i].dtype()) + " and " + dtype_name(y[i].dtype()) +
                                 "); the two arrays of a call must have the same dtype")
                                    .c_str());
        if (shape_of(y[i]) != shape_of(x[i]))
          throw nb::value_error(("gpupool: " + pair + " differ in length or shape (" +
                                 std::to_string(x[i].size()) + " and " +
                                 std::to_string(y[i].size()) +
                                 " elements); the two arrays of a call must have the same shape")
                                    .c_str());
      }
    }

    std::vector<std::unique_ptr<array_future>> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto result = std::make_unique<pinned_block>(x[i].nbytes());
      auto f = launch(k, x[i], ys ? &y[i] : nullptr, result->data());
      std::vector<input_array> views{x[i]};
      if (ys) views.push_back(y[i]);
      out.push_back(std::make_unique<array_future>(
          std::move(f), std::move(result), x[i].dtype(), shape_of(x[i]), nb::borrow(xs[i]),
          ys ? nb::borrow((*ys)[i]) : nb::none(), std::move(views)));
    }
    return out;
  }

  // Runs a run-time compiled kernel over host arrays (and broadcast scalars): one call, whose
  // result is a new NumPy array (in pinned memory) shaped like the first array argument.
  // A compiled kernel (elementwise or raw) over host arrays and numbers; the result is a new
  // array in pinned memory shaped like the first array argument.
  template <class K>
  std::unique_ptr<array_future> launch_compiled(const K& k, nb::sequence args) {
    const std::size_t n = nb::len(args);
    if (n != k.inputs().size())
      throw nb::type_error(("gpupool: kernel '" + k.name() + "' takes " +
                            std::to_string(k.inputs().size()) + " argument(s), " +
                            std::to_string(n) + " given")
                               .c_str());
    std::vector<gpupool::kernel_argument> arguments;
    std::vector<input_array> arrays;  // keeps the array views while the arguments point in
    arrays.reserve(n);
    const input_array* first = nullptr;
    for (std::size_t i = 0; i < n; ++i) {
      nb::handle a = args[i];
      const std::string& name = k.inputs()[i].name;
      if (auto number = as_number(a)) {
        arguments.push_back(scalar_argument(
            *number, k.inputs()[i].type,
            "argument[" + std::to_string(i) + "] ('" + name + "') of kernel '" + k.name() + "'"));
      } else {
        arrays.push_back(as_input(a, i, "argument", name));
        const input_array& view = arrays.back();
        if (first == nullptr) first = &view;
        arguments.push_back(argument_of(view, name));
      }
    }
    if (first == nullptr)
      throw nb::type_error(
          ("gpupool: pass at least one array to kernel '" + k.name() + "'").c_str());
    const std::size_t count = first->size();
    const auto out_type = k.output().type;
    auto result = std::make_unique<pinned_block>(count * gpupool::size_of(out_type));
    gpupool::future<void> f;
    {
      nb::gil_scoped_release nogil;  // compiling can take a while
      if constexpr (std::is_same_v<K, gpupool::raw_kernel>)
        f = get().launch_raw(k, arguments, out_type, result->data(), count);
      else
        f = get().launch_elementwise(k, arguments, out_type, result->data(), count);
    }
    const std::vector<std::size_t> shape = shape_of(*first);
    return std::make_unique<array_future>(std::move(f), std::move(result), dlpack_of(out_type),
                                          shape, nb::borrow(args), nb::none(), std::move(arrays));
  }

  // A compiled kernel over many calls on arrays already on GPU `ordinal`. `calls[i]` lists the
  // call's arguments: numbers, or (address, element count, dtype name) for device arrays;
  // `outs[i]` is the address of its output of `counts[i]` elements. One future for all calls;
  // its result is `result` (the output arrays, made by the caller).
  template <class K>
  std::unique_ptr<array_future> map_on_device(const K& k, int ordinal, nb::list calls,
                                              const std::vector<std::uintptr_t>& outs,
                                              const std::vector<std::size_t>& counts,
                                              nb::object result, nb::object keep_alive) {
    const int device = device_of_ordinal(ordinal);
    if (outs.size() != nb::len(calls) || counts.size() != outs.size())
      throw nb::value_error("gpupool: calls, outputs and counts differ in number");
    std::vector<gpupool::device_call> work(outs.size());
    for (std::size_t c = 0; c < work.size(); ++c) {
      nb::list args = nb::borrow<nb::list>(calls[c]);
      auto& inputs = work[c].inputs;
      inputs.reserve(nb::len(args));
      if (nb::len(args) != k.inputs().size())
        throw nb::type_error(("gpupool: kernel '" + k.name() + "' takes " +
                              std::to_string(k.inputs().size()) + " argument(s), " +
                              std::to_string(nb::len(args)) + " given")
                                 .c_str());
      for (std::size_t i = 0; i < nb::len(args); ++i) {
        nb::handle a = args[i];
        if (auto number = as_number(a)) {
          inputs.push_back(scalar_argument(*number, k.inputs()[i].type,
                                           "argument[" + std::to_string(i) + "] ('" +
                                               k.inputs()[i].name + "') of kernel '" + k.name() +
                                               "'"));
        } else {
          auto [address, count, type] =
              nb::cast<std::tuple<std::uintptr_t, std::size_t, std::string>>(a);
          inputs.push_back(device_argument(address, count, dtype_from_name(type)));
        }
      }
      work[c].out = reinterpret_cast<void*>(outs[c]);
      work[c].count = counts[c];
    }
    gpupool::future<void> f;
    {
      nb::gil_scoped_release nogil;
      f = get().map_on_device(device, k, work);
    }
    return std::make_unique<array_future>(std::move(f), std::move(result), std::move(keep_alive));
  }

  // Runs a built-in kernel over arrays already on GPU `ordinal`, on a lane of that device:
  // out = k(x[, y]), `count` elements of `type`. No host copy is made.
  std::unique_ptr<array_future> launch_device(nb::pointer_and_handle<gpupool::kernel> kernel,
                                              std::uintptr_t x, std::uintptr_t y,
                                              std::uintptr_t out, std::size_t count,
                                              const std::string& type, int ordinal,
                                              nb::object result, nb::object keep_alive) {
    const int device = device_of_ordinal(ordinal);
    const gpupool::kernel k = *kernel.p;  // copied into the task
    if (k.arity() == 2 && y == 0) throw nb::value_error("gpupool: this kernel takes two arrays");
    const gpupool::dtype t = dtype_from_name(type);
    check_alpha(kernel.h, k, t, "the device array");
    auto f = get().submit_to(device, [=](gpupool::lane& l) {
      l.apply_bytes(k, t, reinterpret_cast<const void*>(x), reinterpret_cast<const void*>(y),
                    reinterpret_cast<void*>(out), count);
    });
    return std::make_unique<array_future>(std::move(f), std::move(result), std::move(keep_alive));
  }

  void shutdown(bool cancel_pending) {
    if (executor_ && executor_->is_lane_thread())
      throw nb::value_error("gpupool: an executor cannot be shut down by its own tasks");
    nb::gil_scoped_release nogil;
    if (executor_) executor_->shutdown(cancel_pending);
  }

 private:
  int device_of_ordinal(int ordinal) {
    for (const auto& d : get().devices())
      if (d.ordinal == ordinal) return d.id;
    throw nb::value_error(("gpupool: the array lives on GPU " + std::to_string(ordinal) +
                           ", which this executor does not use")
                              .c_str());
  }

  static gpupool::kernel_argument device_argument(std::uintptr_t address, std::size_t count,
                                                  gpupool::dtype t) {
    switch (t) {
      case gpupool::dtype::float32:
        return std::span<const float>(reinterpret_cast<const float*>(address), count);
      case gpupool::dtype::float64:
        return std::span<const double>(reinterpret_cast<const double*>(address), count);
      case gpupool::dtype::int32:
        return std::span<const std::int32_t>(reinterpret_cast<const std::int32_t*>(address), count);
      case gpupool::dtype::int64:
        break;
    }
    return std::span<const std::int64_t>(reinterpret_cast<const std::int64_t*>(address), count);
  }

  template <class T>
  gpupool::future<void> launch_typed(const gpupool::kernel& k, const input_array& x,
                                     const input_array* y, void* out) {
    const std::size_t n = x.size();
    const std::span<const T> sx(static_cast<const T*>(x.data()), n);
    const std::span<T> so(static_cast<T*>(out), n);
    if (y == nullptr) return get().transform<T>(k, sx, so);
    return get().transform<T>(k, sx, std::span<const T>(static_cast<const T*>(y->data()), n), so);
  }

  gpupool::future<void> launch(const gpupool::kernel& k, const input_array& x, const input_array* y,
                               void* out) {
    const auto t = x.dtype();
    if (t == nb::dtype<float>()) return launch_typed<float>(k, x, y, out);
    if (t == nb::dtype<double>()) return launch_typed<double>(k, x, y, out);
    if (t == nb::dtype<std::int32_t>()) return launch_typed<std::int32_t>(k, x, y, out);
    return launch_typed<std::int64_t>(k, x, y, out);
  }

  std::unique_ptr<gpupool::executor> executor_;
};

nb::object span_value(const gpupool::span_us& s) {
  if (!s.present()) return nb::none();
  return nb::make_tuple(s.begin, s.end);
}

nb::dict record_dict(const gpupool::task_record& r) {
  nb::dict d;
  d["id"] = r.id;
  d["name"] = r.name;
  d["device"] = r.device;
  d["lane"] = r.lane;
  d["submitted"] = r.submitted;
  d["started"] = r.started;
  d["stage_in"] = span_value(r.stage_in);
  d["upload"] = span_value(r.upload);
  d["kernel"] = span_value(r.kernel);
  d["download"] = span_value(r.download);
  d["stage_out"] = span_value(r.stage_out);
  d["done"] = r.done;
  d["bytes_in"] = r.bytes_in;
  d["bytes_out"] = r.bytes_out;
  d["failed"] = r.failed;
  return d;
}

nb::dict stats_dict(const gpupool::lane_stats& s) {
  nb::dict d;
  d["device"] = s.device;
  d["lane"] = s.lane < 0 ? nb::none() : nb::cast(s.lane);
  d["tasks"] = s.tasks;
  d["bytes_in"] = s.bytes_in;
  d["bytes_out"] = s.bytes_out;
  d["busy_us"] = s.busy_us;
  d["wall_us"] = s.wall_us;
  d["queue_wait_p50_us"] = s.queue_wait_p50_us;
  d["queue_wait_p99_us"] = s.queue_wait_p99_us;
  d["input_gb_per_s"] = s.input_gb_per_s();
  return d;
}

template <class Write>
std::string to_text(Write write) {
  std::ostringstream out;
  write(out);
  return out.str();
}

nb::dict device_dict(const gpupool::device_info& d, int lanes) {
  nb::dict out;
  out["id"] = d.id;
  out["ordinal"] = d.ordinal;
  out["name"] = d.name;
  out["backend"] = gpupool::to_string(d.backend);
  out["total_memory"] = d.total_memory;
  out["compute_capability"] = nb::make_tuple(d.compute_major, d.compute_minor);
  out["multiprocessors"] = d.multiprocessors;
  out["lanes"] = lanes;
  return out;
}

void translate_exceptions(const std::exception_ptr& p, void* /*payload*/);

nb::object python_exception(const std::exception_ptr& failure) {
  try {
    translate_exceptions(failure, nullptr);  // gpupool's own types
  } catch (...) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::exception& e) {
      PyErr_SetString(error_type, e.what());
    } catch (...) {
      PyErr_SetString(error_type, "gpupool: unknown failure");
    }
  }
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  return nb::steal(value);
}

void translate_exceptions(const std::exception_ptr& p, void* /*payload*/) {
  try {
    std::rethrow_exception(p);
  } catch (const gpupool::cuda_error& e) {
    nb::object instance = nb::borrow(cuda_error_type)(e.what());
    instance.attr("name") = e.name();
    instance.attr("code") = e.code();
    instance.attr("call") = e.call();
    PyErr_SetObject(cuda_error_type, instance.ptr());
  } catch (const gpupool::compile_error& e) {
    nb::object instance = nb::borrow(compile_error_type)(e.what());
    instance.attr("log") = e.log();
    instance.attr("line") = e.line();
    PyErr_SetObject(compile_error_type, instance.ptr());
  } catch (const gpupool::out_of_memory& e) {
    PyErr_SetString(out_of_memory_type, e.what());
  } catch (const gpupool::cancelled_error& e) {
    PyErr_SetString(cancelled_type, e.what());
  } catch (const gpupool::backend_unavailable& e) {
    PyErr_SetString(backend_unavailable_type, e.what());
  } catch (const gpupool::argument_kind_error& e) {
    // NumPy's same_kind rule refused the scalar's kind (a float for an integer parameter).
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const gpupool::argument_range_error& e) {
    PyErr_SetString(PyExc_OverflowError, e.what());
  } catch (const gpupool::error& e) {
    PyErr_SetString(error_type, e.what());
  } catch (...) {
    // Not ours: nanobind's own translators handle the standard exceptions.
    if (!PyErr_Occurred()) std::rethrow_exception(p);
  }
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "gpupool's C++ core (internal; use the gpupool package)";

  error_type = PyErr_NewExceptionWithDoc("gpupool.GpupoolError", "Base of gpupool's own errors.",
                                         PyExc_RuntimeError, nullptr);
  cuda_error_type = PyErr_NewExceptionWithDoc(
      "gpupool.CudaError",
      "A CUDA call failed. Attributes: name (e.g. 'cudaErrorInvalidValue'), code, call.",
      error_type, nullptr);
  nb::object oom_bases = nb::make_tuple(nb::handle(error_type), nb::handle(PyExc_MemoryError));
  out_of_memory_type = PyErr_NewExceptionWithDoc(
      "gpupool.OutOfMemoryError", "Device memory (or the configured budget) ran out.",
      oom_bases.ptr(), nullptr);
  backend_unavailable_type =
      PyErr_NewExceptionWithDoc("gpupool.BackendUnavailableError",
                                "The requested backend cannot run here.", error_type, nullptr);
  compile_error_type = PyErr_NewExceptionWithDoc(
      "gpupool.CompileError",
      "A run-time compiled kernel did not compile. Attributes: log (the compiler's output), "
      "line (the body's line of the first error, 0 if unknown).",
      error_type, nullptr);
  cancelled_type =
      nb::module_::import_("concurrent.futures").attr("CancelledError").inc_ref().ptr();
  m.attr("GpupoolError") = nb::handle(error_type);
  m.attr("CudaError") = nb::handle(cuda_error_type);
  m.attr("OutOfMemoryError") = nb::handle(out_of_memory_type);
  m.attr("BackendUnavailableError") = nb::handle(backend_unavailable_type);
  m.attr("CompileError") = nb::handle(compile_error_type);
  nb::register_exception_translator(translate_exceptions);

  nb::class_<gpupool::kernel>(m, "Kernel", "A built-in elementwise kernel.", nb::dynamic_attr())
      .def_static("square", &gpupool::kernel::square, "out = x * x")
      .def_static(
          "scale",
          [](nb::handle alpha) { return alpha_kernel(&gpupool::kernel::scale, "scale", alpha); },
          "alpha"_a.none(), "out = alpha * x")
      .def_static("add", &gpupool::kernel::add, "out = x + y")
      .def_static(
          "axpy",
          [](nb::handle alpha) { return alpha_kernel(&gpupool::kernel::axpy, "axpy", alpha); },
          "alpha"_a.none(), "out = alpha * x + y")
      .def_prop_ro("name", [](const gpupool::kernel& k) { return std::string(k.name()); })
      .def_prop_ro("arity", &gpupool::kernel::arity)
      .def_prop_ro("alpha", &gpupool::kernel::alpha)
      .def("__repr__", [](const gpupool::kernel& k) {
        std::string s = std::string("gpupool.kernels.") + k.name();
        if (k.operation() == gpupool::op::scale || k.operation() == gpupool::op::axpy)
          s += "(" + std::to_string(k.alpha()) + ")";
        return s;
      });

  nb::class_<gpupool::elementwise_kernel>(
      m, "ElementwiseKernel",
      "An elementwise kernel compiled at run time from typed parameters and a C++ body.")
      .def(
          "__init__",
          [](gpupool::elementwise_kernel* self, nb::handle inputs, nb::handle output,
             nb::handle body, nb::handle name) {
            new (self) gpupool::elementwise_kernel(text_argument(inputs, "elementwise", "inputs"),
                                                   text_argument(output, "elementwise", "output"),
                                                   text_argument(body, "elementwise", "body"),
                                                   text_argument(name, "elementwise", "name"));
          },
          "inputs"_a.none(), "output"_a.none(), "body"_a.none(), "name"_a.none() = "elementwise")
      .def_prop_ro("name", &gpupool::elementwise_kernel::name)
      .def_prop_ro("body", &gpupool::elementwise_kernel::body)
      .def_prop_ro("inputs",
                   [](const gpupool::elementwise_kernel& k) {
                     nb::list out;
                     for (const auto& p : k.inputs())
                       out.append(nb::make_tuple(gpupool::to_string(p.type), p.name));
                     return out;
                   })
      .def_prop_ro("output",
                   [](const gpupool::elementwise_kernel& k) {
                     return nb::make_tuple(gpupool::to_string(k.output().type), k.output().name);
                   })
      .def("__repr__", [](const gpupool::elementwise_kernel& k) {
        return "gpupool.elementwise('" + k.name() + "')";
      });

  nb::class_<gpupool::launch_shape>(m, "LaunchShape", "How a raw kernel is launched.")
      .def_ro("block", &gpupool::launch_shape::block)
      .def_ro("grid", &gpupool::launch_shape::grid);

  nb::class_<gpupool::raw_kernel>(m, "RawKernel",
                                  "A kernel from CUDA source with a named entry point.")
      .def(
          "__init__",
          [](gpupool::raw_kernel* self, nb::handle source, nb::handle entry, nb::handle inputs,
             nb::handle output, nb::handle block, nb::handle grid) {
            new (self) gpupool::raw_kernel(
                text_argument(source, "raw_kernel", "source"),
                text_argument(entry, "raw_kernel", "entry"),
                text_argument(inputs, "raw_kernel", "inputs"),
                text_argument(output, "raw_kernel", "output"),
                gpupool::launch_shape{count_argument(block, "raw_kernel", "block", 1, 1024),
                                      count_argument(grid, "raw_kernel", "grid", 0,
                                                     std::numeric_limits<unsigned>::max())});
          },
          "source"_a.none(), "entry"_a.none(), "inputs"_a.none(), "output"_a.none(),
          "block"_a.none() = 256u, "grid"_a.none() = 0u)
      .def_prop_ro("name", &gpupool::raw_kernel::name)
      .def_prop_ro("source", &gpupool::raw_kernel::source)
      .def_prop_ro("shape", &gpupool::raw_kernel::shape)
      .def_prop_ro("inputs",
                   [](const gpupool::raw_kernel& k) {
                     nb::list out;
                     for (const auto& p : k.inputs())
                       out.append(nb::make_tuple(gpupool::to_string(p.type), p.name, p.array));
                     return out;
                   })
      .def_prop_ro("output",
                   [](const gpupool::raw_kernel& k) {
                     return nb::make_tuple(gpupool::to_string(k.output().type), k.output().name);
                   })
      .def("__repr__",
           [](const gpupool::raw_kernel& k) { return "gpupool.raw_kernel('" + k.name() + "')"; });

  nb::class_<array_future>(m, "ArrayFuture", "The result of a built-in kernel over one array.")
      .def("result", &array_future::result, "timeout"_a = nb::none())
      .def("done", &array_future::done)
      .def("cancel", &array_future::cancel)
      .def("cancelled", &array_future::cancelled)
      .def("add_done_callback", &array_future::add_done_callback, "callback"_a);

  nb::class_<gpupool::trace>(m, "Trace", "A snapshot of an executor's per-task trace.")
      .def_prop_ro(
          "backend",
          [](const gpupool::trace& t) { return std::string(gpupool::to_string(t.backend())); })
      .def(
          "records",
          [](const gpupool::trace& t) {
            nb::list out;
            for (const auto& r : t.records()) out.append(record_dict(r));
            return out;
          },
          "One dict per task (per piece for map/transform), in submission order; times in\n"
          "microseconds since the executor started, stages as (begin, end) or None.")
      .def(
          "stats",
          [](const gpupool::trace& t) {
            nb::list out;
            for (const auto& s : t.stats()) out.append(stats_dict(s));
            return out;
          },
          "Per lane, then per device (lane None): tasks, bytes, busy time, queue wait, GB/s.")
      .def(
          "chrome_json",
          [](const gpupool::trace& t) {
            return to_text([&](std::ostream& o) { t.write_chrome_json(o); });
          },
          "The trace in Chrome trace format (Perfetto, chrome://tracing).")
      .def(
          "stats_table",
          [](const gpupool::trace& t) {
            return to_text([&](std::ostream& o) { t.write_stats_table(o); });
          },
          "The stats as an aligned text table.")
      .def("__len__", [](const gpupool::trace& t) { return t.records().size(); });

  nb::class_<py_lane>(m, "Lane", "The lane a task runs on; valid only inside that task.")
      .def_prop_ro("device", [](const py_lane& l) { return l.get().device(); })
      .def_prop_ro("index", [](const py_lane& l) { return l.get().index(); })
      .def_prop_ro("index_on_device", [](const py_lane& l) { return l.get().index_on_device(); })
      .def_prop_ro(
          "backend",
          [](const py_lane& l) { return std::string(gpupool::to_string(l.get().backend())); })
      .def_prop_ro("stream",
                   [](const py_lane& l) {
                     return reinterpret_cast<std::uintptr_t>(l.get().native_stream());
                   })
      .def("__cuda_stream__",
           [](const py_lane& l) {
             // The CUDA stream protocol: (version, handle).
             return nb::make_tuple(0, reinterpret_cast<std::uintptr_t>(l.get().native_stream()));
           })
      .def("synchronize",
           [](const py_lane& l) {
             auto& lane = l.get();
             nb::gil_scoped_release nogil;
             lane.synchronize();
           })
      .def(
          "upload",
          [](nb::handle self, nb::handle array) {
            return nb::module_::import_("gpupool._executor").attr("_lane_upload")(self, array);
          },
          "array"_a,
          "Copies a host array to a new CuPy array on this lane's device, ordered on the lane's\n"
          "stream (through the lane's pinned staging slot, or directly when the array is pinned).")
      .def(
          "download",
          [](nb::handle self, nb::handle device_array, nb::handle out) {
            return nb::module_::import_("gpupool._executor")
                .attr("_lane_download")(self, device_array, out);
          },
          "device_array"_a, "out"_a = nb::none(),
          "Copies a CuPy array on this lane's device into `out` (or a new NumPy array); returns\n"
          "once the data is on the host.")
      .def("_upload",
           [](const py_lane& l, std::uintptr_t device_dst, input_array src) {
             auto& lane = l.get();
             nb::gil_scoped_release nogil;
             lane.upload_bytes(reinterpret_cast<void*>(device_dst), src.data(), src.nbytes());
           })
      .def("_download", [](const py_lane& l, nb::ndarray<> dst, std::uintptr_t device_src) {
        auto& lane = l.get();
        nb::gil_scoped_release nogil;
        lane.download_bytes(dst.data(), reinterpret_cast<const void*>(device_src), dst.nbytes());
      });

  m.def("current_lane", []() -> std::optional<py_lane> {
    if (current_lane == nullptr) return std::nullopt;
    return py_lane(current_lane);
  });

  nb::class_<py_executor>(m, "Executor")
      .def(nb::init<int, std::optional<std::vector<int>>, std::optional<std::string>, int,
                    std::size_t, std::size_t, int>(),
           "threads_per_gpu"_a = 0, "devices"_a = nb::none(), "backend"_a = nb::none(),
           "slots_per_lane"_a = 2, "chunk_bytes"_a = std::size_t{8} << 20,
           "device_memory_budget"_a = 0, "cpu_devices"_a = 0)
      .def("submit_call", &py_executor::submit_call, "call"_a, "on_error"_a,
           "device"_a = nb::none())
      .def("map_kernel", &py_executor::map_kernel, "kernel"_a, "xs"_a, "ys"_a = nb::none())
      .def("launch_compiled", &py_executor::launch_compiled<gpupool::elementwise_kernel>,
           "kernel"_a, "args"_a)
      .def("launch_compiled", &py_executor::launch_compiled<gpupool::raw_kernel>, "kernel"_a,
           "args"_a)
      .def("map_on_device", &py_executor::map_on_device<gpupool::elementwise_kernel>, "kernel"_a,
           "ordinal"_a, "calls"_a, "outs"_a, "counts"_a, "result"_a, "keep_alive"_a)
      .def("map_on_device", &py_executor::map_on_device<gpupool::raw_kernel>, "kernel"_a,
           "ordinal"_a, "calls"_a, "outs"_a, "counts"_a, "result"_a, "keep_alive"_a)
      .def("launch_device", &py_executor::launch_device, "kernel"_a, "x"_a, "y"_a, "out"_a,
           "count"_a, "dtype"_a, "ordinal"_a, "result"_a, "keep_alive"_a)
      .def("shutdown", &py_executor::shutdown, "cancel_pending"_a = false)
      .def(
          "set_tracing", [](py_executor& e, bool on) { e.get().set_tracing(on); }, "on"_a)
      .def("clear_trace", [](py_executor& e) { e.get().clear_trace(); })
      .def(
          "trace_snapshot",
          [](py_executor& e, std::uint64_t first_task) {
            gpupool::trace t;
            {
              nb::gil_scoped_release nogil;
              t = e.get().trace(first_task);
            }
            return t;
          },
          "first_task"_a = 0)
      .def("set_trace_capacity",
           [](py_executor& e, std::size_t records) { e.get().set_trace_capacity(records); })
      .def_prop_ro("trace_capacity", [](py_executor& e) { return e.get().trace_capacity(); })
      .def_prop_ro("trace_dropped", [](py_executor& e) { return e.get().trace_dropped(); })
      .def_prop_ro("next_task_id", [](py_executor& e) { return e.get().next_task_id(); })
      .def_prop_ro(
          "backend",
          [](const py_executor& e) { return std::string(gpupool::to_string(e.get().backend())); })
      .def_prop_ro("threads_per_gpu",
                   [](const py_executor& e) { return e.get().lanes_per_device(); })
      .def_prop_ro("lane_count", [](const py_executor& e) { return e.get().lane_count(); })
      .def_prop_ro("slots_per_lane", [](const py_executor& e) { return e.get().slots_per_lane(); })
      .def_prop_ro("chunk_bytes", [](const py_executor& e) { return e.get().chunk_bytes(); })
      .def_prop_ro("queued", [](const py_executor& e) { return e.get().queued(); })
      .def_prop_ro("is_lane_thread", [](const py_executor& e) { return e.get().is_lane_thread(); })
      .def_prop_ro("devices",
                   [](const py_executor& e) {
                     nb::list out;
                     for (const auto& d : e.get().devices())
                       out.append(device_dict(d, e.get().lanes_per_device()));
                     return out;
                   })
      .def("memory_stats", [](const py_executor& e) {
        nb::list out;
        for (const auto& s : e.get().memory_stats()) {
          nb::dict d;
          d["in_use"] = s.in_use;
          d["peak"] = s.peak;
          d["budget"] = s.budget;
          out.append(d);
        }
        return out;
      });

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
  m.def(
      "join_orphaned_executors",
      []() {
        std::unique_lock lock(orphans().mutex);
        orphans().stopped.wait(lock, [] { return orphans().stopping == 0; });
      },
      nb::call_guard<nb::gil_scoped_release>(),
      "Waits until every executor dropped by one of its own tasks has stopped (called at exit).");
  m.def("pinned_bytes_in_use", &gpupool::pinned_bytes_in_use);
  m.def("kernels_compiled", &gpupool::kernels_compiled,
        "How many kernels this process compiled (rather than found in a cache).");
  m.def("kernel_cache_directory", &gpupool::kernel_cache_directory);
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
  m.def("cuda_availability", []() {
    const auto a = gpupool::cuda_availability();
    return nb::make_tuple(a.usable, a.devices, a.reason);
  });
  m.attr("__version__") = GPUPOOL_VERSION_STRING;
  m.attr("HAS_CUDA") = bool(GPUPOOL_HAS_CUDA);
}
