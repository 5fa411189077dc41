// gpupool's exception types in Python, and the translation of C++ failures into them.
#pragma once

#include <exception>

#include "common.hpp"

namespace gpupool_python {

// The Python exception object a C++ exception becomes (with the GIL held).
nb::object python_exception(const std::exception_ptr& failure);

}  // namespace gpupool_python
