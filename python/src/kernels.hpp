// The kernel objects: built-in kernels and the kernels compiled at run time.
#pragma once

#include <string>

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// Refuses, before any work starts, a scale/axpy whose alpha arrays of `type` cannot take by
// NumPy's same_kind rule (0.5 for int32 would make zeros), or whose value `type` cannot hold.
void check_alpha(nb::handle kernel_object, const gpupool::builtin_kernel& k, gpupool::dtype type,
                 const std::string& arrays);

}  // namespace gpupool_python
