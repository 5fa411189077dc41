// A compiled kernel over many calls whose arrays live on GPUs: Executor.map over CuPy or PyTorch
// arrays, every array read here (no Python loop per array) and queued as batched device maps.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// The executor's device index of GPU `ordinal`, taking turns among the executor's devices of
// that GPU (ValueError for one it does not use).
int device_of_ordinal(const gpupool::executor& ex, int ordinal);

// One map of a compiled kernel over calls whose arrays live on GPUs (_ext.DeviceMapRun), driven
// by Python (_device.map_compiled) in a loop: C++ reads the calls into plain data and queues the
// work, Python makes what only CuPy or PyTorch can make (output buffers and their views). No
// callback of the package's drives the run.
//
// Numbers are checked against their parameter, CuPy arrays (of type `cupy_ndarray`) are read
// through CuPy's attributes, any other device array through read_device_array (the CUDA Array
// Interface, or CuPy's view of a DLPack array); the streams their producers name are waited for,
// with the streams the caller names at the start (CuPy's current stream, on which CuPy work and
// the outputs' allocation are ordered), before each block is queued.
//
// Calls are taken in blocks of 64, 128, then 256 calls, so that the GPUs start on the first
// calls while the later ones are still being read. Per block:
//   read_block() reads and checks the block's calls and groups them by device: None once every
//     call is read, else the output buffers the block's new groups need, in order, as
//     (anchor array (the group's first call's first array: the buffer is of its kind), ordinal,
//     element count, dtype name); empty with `out`;
//   give_buffers([(buffer, address)]) takes them (each group's outputs are consecutive in its
//     buffer; not called with `out`);
//   queue_block() waits for the streams, then queues one batched map_on_device per group.
// Then cuts() gives (buffer, ends) for each group not cut yet: its calls' views are elements
// [previous end, end) of the buffer; finish(pieces) takes the views cut from each group's buffer
// (in the order cuts() gave them; more than its calls is fine) and returns (outputs in call
// order, reshaped to their call's shape, [one future of `future_type` for the whole map, whose
// result is the outputs, or with `single` (one call) that call's output]); `keep_alive` and the
// buffers are held until the map ends. Only the last batch to end takes the GIL to hand the
// future over, so lanes never wait for the GIL the reading thread holds.
//
// A bad call raises from read_block naming the call by its index in `calls`, as does a refusal
// of map_on_device's own check from queue_block. A step taken out of order is refused, and a
// step that fails ends the run: after any failure the caller calls abandon(),
// which cancels what was queued and has not started and waits for what started (it writes into
// the buffers); the run's destructor does the same for a run neither finished nor abandoned, so
// that no work is left running on buffers nobody holds.
//
// With `out` (a sequence of one device array per call) the calls write there instead, and the
// outputs are those arrays: nothing is allocated or cut, which leaves only the reading of the
// arrays on the host. Each must be C-contiguous, of the kernel's output type, of its call's
// length and on its call's GPU, and no call may write memory another call of the map reads or
// writes (see write_hazards). With `out_is_one_array`, `out` is one such array instead, holding
// exactly the calls' elements: call c writes the elements after call c-1's part (ValueError from
// read_block at the call that overflows it or, if it holds more, once the last block is read,
// before that block is queued). The
// outputs are then an empty list and the future's result is `out`: no object is made per call.
//
// Abstract so that one Python type serves both kinds of compiled kernel.
class device_map_run {
 public:
  device_map_run() = default;
  device_map_run(const device_map_run&) = delete;
  device_map_run& operator=(const device_map_run&) = delete;
  virtual ~device_map_run() = default;

  virtual nb::object read_block() = 0;
  virtual void give_buffers(nb::sequence buffers) = 0;
  virtual void queue_block() = 0;
  virtual nb::list cuts() = 0;
  virtual nb::tuple finish(nb::sequence pieces) = 0;
  virtual void abandon() = 0;
};

// A run of compiled kernel `k` over `calls` (each a sequence of its arguments) on `ex`; both must
// outlive it (the binding keeps their Python objects alive with it). `wait_streams` are waited
// for before every block, even 0 (the legacy default stream).
template <class K>
std::unique_ptr<device_map_run> map_device_calls(gpupool::executor& ex, const K& k,
                                                 nb::sequence calls, nb::handle cupy_ndarray,
                                                 nb::object out, bool out_is_one_array, bool single,
                                                 const gpupool::task_options& options,
                                                 nb::object keep_alive, nb::handle future_type,
                                                 std::vector<std::uintptr_t> wait_streams);

extern template std::unique_ptr<device_map_run> map_device_calls<gpupool::elementwise_kernel>(
    gpupool::executor&, const gpupool::elementwise_kernel&, nb::sequence, nb::handle, nb::object,
    bool, bool, const gpupool::task_options&, nb::object, nb::handle, std::vector<std::uintptr_t>);
extern template std::unique_ptr<device_map_run> map_device_calls<gpupool::raw_kernel>(
    gpupool::executor&, const gpupool::raw_kernel&, nb::sequence, nb::handle, nb::object, bool,
    bool, const gpupool::task_options&, nb::object, nb::handle, std::vector<std::uintptr_t>);

// Registers DeviceMapRun, and the reading of device arrays (bind_device_arrays): before the
// Executor, whose map_device_calls returns one.
void bind_device_map(nb::module_& m);

}  // namespace gpupool_python
