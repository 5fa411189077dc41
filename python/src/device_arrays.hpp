// Device arrays, and a device map's calls, read in C++ into plain data. Device arrays other than
// CuPy's (which cupy_arrays.hpp reads) are anything speaking the CUDA Array Interface (PyTorch
// tensors, Numba arrays, ...), read through its dict, and arrays offering only DLPack, read
// through CuPy's view of them: one reading for every caller, a device map's arguments and outputs
// and _device.DeviceArray (a built-in kernel over device arrays, through describe_device_array).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.hpp"
#include "gpupool/gpupool.hpp"
#include "write_hazards.hpp"

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
  // The CUDA Array Interface's read-only flag: the producer lets nobody write the memory.
  bool read_only = false;
  // What was read: the array itself, or CuPy's view of an array offering only DLPack (the view
  // must live as long as its memory is used: it holds the DLPack capsule).
  nb::object read;
};

// Whether `a` is an array on a GPU: it has a __cuda_array_interface__, or its __dlpack_device__
// names a CUDA device (a protocol that fails says it is not; an error other than an Exception
// propagates, as does one raised looking the attributes up other than AttributeError).
bool is_device_array(nb::handle a);

// Reads `a` for `where()` (which names it in refusals, and is made only for them). Nothing if `a`
// is not a device array: neither a CUDA Array Interface nor a CUDA device behind __dlpack_device__
// (callers word that refusal their way). Refuses (TypeError) a DLPack array while CuPy is not
// imported, a dtype gpupool does not compute with, and memory that is not a GPU's; (ValueError) a
// layout that is not C-contiguous. Whatever reading the interface itself raises comes as it is.
std::optional<device_array_reading> read_device_array(nb::handle a,
                                                      const std::function<std::string()>& where);

// `failure` again, of the same kind (TypeError, ValueError, OverflowError, ...), with
// `message_for(its message)` as its message; a failure of any other kind as it came.
[[noreturn]] void rethrow_reworded(
    const std::exception_ptr& failure,
    const std::function<std::string(const std::string&)>& message_for);

// One call of a device map as read: the work queued for it, and what its output is made from.
struct described_call {
  gpupool::device_call work;
  nb::object anchor;  // the call's first array
  int ordinal = -1;
  nb::object shape;   // invalid where the reading does not say: one dimension
  nb::object output;  // the array given for it in `out`
};

// What reading a map's arrays leaves to do: the streams to wait for before queueing (the
// caller's, then those the producers name, each once), and CuPy's views of DLPack arrays, held
// with the map (they hold the capsules).
struct reading_notes {
  std::vector<std::uintptr_t> streams;
  nb::list views;
};

// Reads a map's calls one at a time into described_calls, checking each against the kernel
// (named `kernel_name`, taking `inputs` and writing `output`, all outliving the reader), against
// the first call's pattern of arrays and numbers and, with `out`, against what the other calls
// read and write. CuPy arrays (of type `cupy_ndarray`, invalid or None where CuPy is not
// imported), the common case, are read through CuPy's own attributes, any other device array by
// read_device_array, noting in `notes` what it leaves to do.
//
// `out` is either a sequence of one device array per call or, with `out_is_one_array`, one
// device array that takes every call's output end to end, in call order: it is read once, here
// (TypeError: not a device array, or not of the kernel's output type; ValueError: not
// C-contiguous), and each call's part of it is found by counting, with no object per call.
class call_reader {
 public:
  call_reader(const std::string& kernel_name, const std::vector<gpupool::kernel_parameter>& inputs,
              const gpupool::kernel_parameter& output, nb::sequence calls, nb::handle cupy_ndarray,
              nb::object out, bool out_is_one_array, reading_notes& notes);

  // Reads call `c` into `d`. Its refusals all name the call (some say only which argument was
  // wrong): by the time a later block is read, earlier ones run, so the number is what tells.
  // Calls are read in order, from 0.
  void read(std::size_t c, described_call& d);

  // Once every call is read: with one array as `out`, refuses (ValueError) one that holds more
  // elements than the calls write (one that holds fewer is refused at the call that overflows).
  void check_every_call_read() const;

 private:
  // One device array as read: address, element count, type, ordinal, shape (invalid where the
  // reading does not say: one dimension).
  using array_reading = std::tuple<std::uintptr_t, std::size_t, gpupool::dtype, int, nb::object>;

  bool is_cupy(nb::handle a) const {
    return cupy_ndarray_.is_valid() && a.type().is(cupy_ndarray_);
  }
  // A device array other than a CuPy array, noting what it leaves to do; `written`: one the map
  // writes, which must not be read-only (ValueError).
  array_reading read_other(nb::handle a, const std::function<std::string()>& where,
                           bool written = false);
  // An array the map writes (one of `out`, or the one array): its address, element count and
  // ordinal. Refused if it is not of the kernel's output type (TypeError), read-only or not
  // C-contiguous (ValueError).
  std::tuple<std::uintptr_t, std::size_t, int> read_written(
      nb::handle o, const std::function<std::string()>& where);
  // Call `c`'s array in `out` (or its part of the one array), checked against the call (whose
  // inputs `d` holds) and against what the map's other calls read and write.
  void read_output(std::size_t c, described_call& d);
  // Argument `i` of call `c`: a number (pushed to `d`'s inputs; nothing returned) or a device
  // array (its reading).
  std::optional<array_reading> read_argument(std::size_t c, std::size_t i, nb::handle a,
                                             described_call& d);
  void describe(std::size_t c, described_call& d);

  const std::string& name_;
  const std::vector<gpupool::kernel_parameter>& inputs_;
  const gpupool::kernel_parameter& output_;
  nb::sequence calls_;
  // Held: a run reads blocks after the call that made it returned. Invalid where CuPy is not
  // imported.
  nb::object cupy_ndarray_;
  nb::object out_;
  reading_notes& notes_;
  bool given_outputs_;
  // With one array as `out`: where it is, and how many of its elements the calls read so far
  // take.
  struct one_output {
    std::uintptr_t address = 0;
    std::size_t count = 0;
    int ordinal = -1;
    std::size_t taken = 0;
  };
  std::optional<one_output> one_out_;
  write_hazards hazards_;  // with `out`: what the calls read and write so far
  std::vector<nb::object> last_number_;
  std::vector<std::optional<gpupool::kernel_argument>> last_number_argument_;
  std::vector<bool> first_pattern_;  // which of call 0's arguments are arrays
};

// Registers describe_device_array (the reading for Python) and its test switch.
void bind_device_arrays(nb::module_& m);

}  // namespace gpupool_python
