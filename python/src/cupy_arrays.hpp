// CuPy arrays read from CuPy's own attributes: thousands of small arrays pass through a device
// map, and a lane's download reads one per task, so no interface dict, dtype name or flags object
// is made for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// What gpupool needs of one CuPy array.
struct cupy_array_view {
  std::uintptr_t address = 0;
  std::size_t count = 0;
  gpupool::dtype type{};
  int ordinal = -1;
  std::size_t ndim = 1;
  nb::object shape;  // the array's shape tuple; read only when ndim is not 1 (invalid then)
};

// Why a CuPy array cannot be read as a cupy_array_view: nothing, a dtype gpupool does not compute
// with (its dtype object is kept for the message), or a layout that is not C-contiguous.
struct cupy_reading {
  enum class problem { none, dtype, not_contiguous };
  problem trouble = problem::none;
  cupy_array_view view;
  nb::object dtype;
};

// Reads `a`, a cupy.ndarray. Throws only what CuPy's attributes raise.
cupy_reading read_cupy(nb::handle a);

// Makes what read_cupy keeps (interned names, NumPy's dtype objects): called once when the module
// is imported. Made on first use instead, by lanes reading arrays at once, one thread could let
// the GIL go inside NumPy while making it and another wait for it holding the GIL.
void prepare_cupy_reading();

// `a` (a cupy.ndarray) as a view, or the refusal for `where()`: TypeError for a dtype gpupool
// does not compute with, ValueError for a layout that is not C-contiguous.
template <class Where>
cupy_array_view describe_cupy(nb::handle a, const Where& where) {
  cupy_reading r = read_cupy(a);
  if (r.trouble == cupy_reading::problem::dtype)
    throw nb::type_error(("gpupool: " + where() + " has unsupported dtype " +
                          nb::cast<std::string>(nb::str(r.dtype)) + "; expected " +
                          dtype_names(" or "))
                             .c_str());
  if (r.trouble == cupy_reading::problem::not_contiguous)
    throw nb::value_error(
        ("gpupool: " + where() + " is not C-contiguous; pass a C-contiguous array").c_str());
  return std::move(r.view);
}

// The type cupy.ndarray if CuPy has been imported, else an invalid handle (borrowed: CuPy's
// module holds it).
nb::handle cupy_ndarray_type();

// The shape of `view` as sizes.
std::vector<std::size_t> sizes_of(const cupy_array_view& view);

}  // namespace gpupool_python
