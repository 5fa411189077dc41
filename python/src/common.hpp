// What every part of gpupool._ext shares: the interpreter's state, references to Python objects
// that lane threads may release, and raising a Python exception with a message.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
// Every type caster the binding uses, in every file: a caster missing where a signature needs it
// does not fail to compile, it makes the call refuse its arguments at run time.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <string>

namespace gpupool_python {

namespace nb = nanobind;

inline bool interpreter_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// Gives this thread, if Python did not start it (a lane), a Python thread state kept until the
// thread ends: each later acquisition of the GIL there reuses it, rather than making one and
// destroying it again, which costs more than most Python tasks. Call without the GIL.
void keep_python_thread_state();

[[noreturn]] inline void throw_python(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

// A host array as nanobind takes it from Python (Py_buffer or DLPack), read-only.
using input_array = nb::ndarray<nb::ro>;

// One per concept, each in its own file; NB_MODULE (module.cpp) calls them in this order, which
// is the order the classes must exist in (a later binding names an earlier class).
void bind_errors(nb::module_& m);
void bind_kernels(nb::module_& m);
void bind_arrays(nb::module_& m);
void bind_trace(nb::module_& m);
void bind_lane(nb::module_& m);
void bind_futures(nb::module_& m);
void bind_kernel_map(nb::module_& m);
void bind_executor(nb::module_& m);

}  // namespace gpupool_python
