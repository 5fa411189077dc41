// Device arrays read in C++ into plain data. Device arrays other than CuPy's (which
// cupy_arrays.hpp reads) are anything speaking the CUDA Array Interface (PyTorch tensors, Numba
// arrays, ...), read through its dict, and arrays offering only DLPack, read through CuPy's view
// of them: one reading for every caller, a device map's arguments and outputs and
// _device.DeviceArray (a built-in kernel over device arrays, through describe_device_array).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// What gpupool needs of one device array.
struct device_array_reading {
  std::uintptr_t address = 0;
  std::size_t count = 0;
  gpupool::dtype type{};
  int ordinal = -1;  // -1 for an empty array, whose memory says nothing
  nb::object shape;  // a tuple of ints
  // The stream its producer may still be writing on (CUDA Array Interface v3), to be waited for
  // before a kernel reads it; none where the producer names none (or 0, which v3 disallows).
  std::optional<std::uintptr_t> stream;
  // What was read: the array itself, or CuPy's view of an array offering only DLPack (the view
  // must live as long as its memory is used: it holds the DLPack capsule).
  nb::object read;
};

// Reads `a` for `where()` (which names it in refusals, and is made only for them). Nothing if `a`
// is not a device array: neither a CUDA Array Interface nor a CUDA device behind __dlpack_device__
// (callers word that refusal their way). Refuses (TypeError) a DLPack array while CuPy is not
// imported, a dtype gpupool does not compute with, and memory that is not a GPU's; (ValueError) a
// layout that is not C-contiguous. Whatever reading the interface itself raises comes as it is.
std::optional<device_array_reading> read_device_array(nb::handle a,
                                                      const std::function<std::string()>& where);

// Registers describe_device_array (the reading for Python) and its test switch.
void bind_device_arrays(nb::module_& m);

}  // namespace gpupool_python
