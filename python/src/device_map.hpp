// A compiled kernel over many calls whose arrays live on GPUs: Executor.map over CuPy or PyTorch
// arrays, every array read here (no Python loop per array) and queued as batched device maps.
#pragma once

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// The executor's device index of GPU `ordinal`, taking turns among the executor's devices of
// that GPU (ValueError for one it does not use).
int device_of_ordinal(const gpupool::executor& ex, int ordinal);

// Runs compiled kernel `k` over `calls` (each a sequence of its arguments) on `ex`: numbers are
// checked against their parameter, CuPy arrays (of type `cupy_ndarray`) are read directly, any
// other device array through `describe_other(array, where)` -> (address, count, dtype name,
// ordinal, shape).
//
// Calls are taken in blocks of 64, 128, then 256 calls, so that the GPUs start on the first
// calls while the later ones are still being read: a block's calls are checked, grouped by
// device, given their outputs and queued (one batched map_on_device per device) before the next
// block is read. Each group's outputs are views into one buffer that `allocate_flat(anchor
// array, ordinal, count, dtype name)` -> (buffer, address) makes and `split_flat(buffer, ends)`
// cuts into one 1-D view per call (elements [previous end, end)); `before_launch()` runs before
// each block is queued (it waits for the streams the inputs' producers use). A bad call stops
// the map with its error, naming the call by its index in `calls`, once the blocks queued before
// it have stopped: those not started are cancelled, the others waited for. Returns (outputs in
// call order, [one future of `future_type` for the whole map, whose result is the outputs, or
// with `single` (one call) that call's output]); `keep_alive` is held until it ends. Only the
// last batch to end takes the GIL to hand the future over, so lanes never wait for the GIL this
// call holds while it reads later blocks.
//
// With `out` (a sequence of one device array per call) the calls write there instead, and the
// outputs are those arrays: nothing is allocated or cut, which leaves only the reading of the
// arrays on the host. Each must be C-contiguous, of the kernel's output type, of its call's
// length and on its call's GPU, and no call may write memory another call of the map reads or
// writes (see write_hazards).
template <class K>
nb::tuple map_device_calls(gpupool::executor& ex, const K& k, nb::sequence calls,
                           nb::handle cupy_ndarray, nb::callable describe_other,
                           nb::callable allocate_flat, nb::callable split_flat,
                           nb::callable before_launch, nb::object keep_alive,
                           nb::handle future_type, bool single, nb::object out,
                           const gpupool::task_options& options);

extern template nb::tuple map_device_calls<gpupool::elementwise_kernel>(
    gpupool::executor&, const gpupool::elementwise_kernel&, nb::sequence, nb::handle, nb::callable,
    nb::callable, nb::callable, nb::callable, nb::object, nb::handle, bool, nb::object,
    const gpupool::task_options&);
extern template nb::tuple map_device_calls<gpupool::raw_kernel>(
    gpupool::executor&, const gpupool::raw_kernel&, nb::sequence, nb::handle, nb::callable,
    nb::callable, nb::callable, nb::callable, nb::object, nb::handle, bool, nb::object,
    const gpupool::task_options&);

}  // namespace gpupool_python
