// Exception types (created at import, under the package's name) and the translation of the
// core's C++ exceptions into them.
#include "errors.hpp"

#include <stdexcept>

#include "gpupool/gpupool.hpp"

namespace gpupool_python {
namespace {

// Exception types, created at import.
PyObject* error_type = nullptr;
PyObject* cuda_error_type = nullptr;
PyObject* out_of_memory_type = nullptr;
PyObject* backend_unavailable_type = nullptr;
PyObject* compile_error_type = nullptr;
PyObject* device_fault_type = nullptr;
PyObject* cancelled_type = nullptr;  // concurrent.futures.CancelledError

void translate_exceptions(const std::exception_ptr& p, void* /*payload*/);

}  // namespace

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

namespace {

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
  } catch (const gpupool::device_fault& e) {
    PyErr_SetString(device_fault_type, e.what());
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

void bind_errors(nb::module_& m) {
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
  device_fault_type = PyErr_NewExceptionWithDoc(
      "gpupool.DeviceFaultError",
      "A device was taken out of service after a fault: raised for work only it could run and "
      "for new work for it. A sticky CUDA error (an illegal address) ends CUDA on every device "
      "of the process: then queued work fails with this and new work is refused.",
      error_type, nullptr);
  cancelled_type =
      nb::module_::import_("concurrent.futures").attr("CancelledError").inc_ref().ptr();
  m.attr("GpupoolError") = nb::handle(error_type);
  m.attr("CudaError") = nb::handle(cuda_error_type);
  m.attr("OutOfMemoryError") = nb::handle(out_of_memory_type);
  m.attr("BackendUnavailableError") = nb::handle(backend_unavailable_type);
  m.attr("CompileError") = nb::handle(compile_error_type);
  m.attr("DeviceFaultError") = nb::handle(device_fault_type);
  nb::register_exception_translator(translate_exceptions);
}

}  // namespace gpupool_python
