"""Arrays that already live on a GPU (CuPy, PyTorch, anything with the CUDA Array Interface or
DLPack): built-in kernels run on them in place on the device, with no host round trip."""

from __future__ import annotations

import sys
from concurrent.futures import Future
from typing import (Any, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple, Type, Union,
                    cast)

import numpy as np

from . import _ext
from ._ext import BuiltinKernel, ElementwiseKernel, RawKernel

#: The dtypes the C++ library computes with (its one dtype table), by NumPy's names.
SUPPORTED = tuple(_ext.dtypes())


class _CudaArray(Protocol):
    """An object speaking the CUDA Array Interface (its dict's values are of several types)."""

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...


def is_device_array(obj: object) -> bool:
    if type(obj) is np.ndarray:  # the common case, without a call into the extension
        return False
    return _ext.is_device_array(obj)


class DeviceArray:
    """What gpupool needs to know of one device array, checked at the call."""

    obj: _CudaArray
    pointer: int
    shape: Tuple[int, ...]
    dtype: np.dtype[Any]
    #: The stream the producer may still be writing on (CAI v3), or None.
    stream: Optional[int]
    count: int
    #: The ordinal of the device holding the memory (-1 for an empty array).
    device: int

    def __init__(self, obj: object, where: str) -> None:
        if not is_device_array(obj):
            raise TypeError(f"gpupool: {where} is not a device array while the first array is; "
                            "pass host arrays and device arrays in separate calls")
        # Read by the extension, as a map over device arrays reads them (one reading of the
        # CUDA Array Interface): a DLPack array becomes CuPy's view of it.
        self.pointer, self.count, name, self.device, self.shape, self.stream, read = \
            _ext.describe_device_array(obj, where)
        self.obj = cast(_CudaArray, read)
        self.dtype = np.dtype(name)

    def empty_like(self) -> object:
        """A new array of the same kind, shape and dtype on the same device."""
        module = type(self.obj).__module__.split(".")[0]
        if module == "torch":
            return sys.modules["torch"].empty_like(self.obj)
        cupy = sys.modules.get("cupy")
        if cupy is None:
            raise TypeError("gpupool: results for this kind of device array are made with "
                            "CuPy; import cupy")
        with cupy.cuda.Device(self.device if self.device >= 0 else None):
            return cupy.empty(self.shape, self.dtype)

    def wait_for_producer(self) -> None:
        """Waits for the stream the array's producer says its data is ready on (CAI v3)."""
        if self.stream is not None and self.stream != 0:
            _ext.wait_for_stream(self.stream)


def launch(core: _ext.Executor, kernel: BuiltinKernel, xs: Sequence[object],
           ys: Optional[Sequence[object]], future_type: Type[Future[Any]],
           priority: Optional[int] = None) -> List[Future[Any]]:
    """Checks every array, then runs the kernel over each (pair) on its own device's lanes.
    Returns futures (of `future_type`) whose results are new device arrays of the inputs'
    kind."""
    if ys is not None and len(ys) != len(xs):
        raise ValueError("gpupool: the two input lists differ in length")
    views: List[Tuple[DeviceArray, Optional[DeviceArray]]] = []
    for i, x in enumerate(xs):
        vx = DeviceArray(x, f"x[{i}]")
        vy = None
        if ys is not None:
            vy = DeviceArray(ys[i], f"y[{i}]")
            if vy.dtype != vx.dtype or vy.shape != vx.shape or vy.device != vx.device:
                raise ValueError(f"gpupool: x[{i}] and y[{i}] differ in dtype, shape or device")
        views.append((vx, vy))
    futures: List[Future[Any]] = []
    for vx, vy in views:
        out = vx.empty_like()
        vout = DeviceArray(out, "result")
        for v in (vx, vy, vout):
            if v is not None:
                v.wait_for_producer()
        # The extension makes the future with future_type (its stub says only "object").
        futures.append(cast("Future[Any]", core.launch_device(
            kernel, vx.pointer, vy.pointer if vy is not None else 0, vout.pointer, vx.count,
            vx.dtype.name, vout.device if vx.count else 0, out,
            (vx.obj, vy.obj if vy is not None else None), future_type, priority)))
    return futures


def _allocate_flat(kind_of: object, ordinal: int, count: int, dtype: str) -> Tuple[Any, int]:
    """One device buffer of `count` elements, of the same kind (CuPy or PyTorch) as `kind_of`,
    and its address."""
    module = type(kind_of).__module__.split(".")[0]
    if module == "torch":
        torch = sys.modules["torch"]
        tensor = torch.empty(count, dtype=getattr(torch, dtype), device=f"cuda:{ordinal}")
        return tensor, int(tensor.data_ptr())
    cupy = sys.modules.get("cupy")
    if cupy is None:
        raise TypeError("gpupool: results for this kind of device array are made with CuPy; "
                        "import cupy")
    with cupy.cuda.Device(ordinal):
        flat = cupy.empty(count, dtype)
    return flat, int(flat.data.ptr)


def _split_flat(flat: Any, ends: List[int]) -> Sequence[Any]:
    """Views of a 1-D buffer from _allocate_flat: elements [0, ends[0]), [ends[0], ends[1]) and
    so on, one per end (and the rest of the buffer last). One call for all of them: a CuPy slice
    through __getitem__ costs microseconds per view, CuPy's array_split and PyTorch's
    tensor_split a fraction of that."""
    if type(flat).__module__.split(".")[0] == "torch":
        return cast(Sequence[Any], flat.tensor_split(ends))
    return cast(Sequence[Any], sys.modules["cupy"].array_split(flat, ends))


class CompiledMap:
    """The outputs of a compiled kernel over device-array calls, and the one future that ends
    when every batch filling them has ended. `given`: the outputs are the caller's own arrays
    (out=)."""

    def __init__(self, futures: List[Future[Any]], outputs: List[object],
                 given: bool = False) -> None:
        self.futures = futures
        self.outputs = outputs
        self.given = given

    def results(self, deadline: Optional[float]) -> Iterator[object]:
        import time

        try:
            for future in self.futures:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                future.result(remaining)
        except TimeoutError as exc:
            import concurrent.futures

            raise concurrent.futures.TimeoutError() from exc
        finally:
            for future in self.futures:
                if not future.done():
                    future.cancel()
                    # Batches that had started still write into the caller's own arrays: the
                    # map does not raise (TimeoutError, Ctrl-C) before they have ended.
                    task = getattr(future, "_task", None)
                    if self.given and task is not None:
                        task.wait()
        yield from self.outputs


def _cut(run: _ext.DeviceMapRun) -> List[Sequence[Any]]:
    """The views of each of the run's buffers not cut yet."""
    return [_split_flat(flat, ends) for flat, ends in run.cuts()]


def map_compiled(core: _ext.Executor, kernel: Union[ElementwiseKernel, RawKernel],
                 calls: Sequence[Sequence[object]], future_type: Type[Future[Any]],
                 single: bool = False, out: Optional[object] = None,
                 priority: Optional[int] = None, one_out: bool = False) -> CompiledMap:
    """Runs a compiled kernel over calls whose arrays live on GPUs: each call's arrays on one
    device. The calls are read in blocks of 64, 128, then 256 calls each; each block's
    calls are checked, grouped by device and queued as one batched map per device before the
    next block is read, so that the GPUs start while later calls are still being looked at. A
    bad call raises before this returns, once the blocks queued before it have stopped. Outputs
    are new arrays of the first array's kind, shape and device (views into one buffer per
    device and block), or with `out` the arrays given there, one per call, written in place
    (checked first: each of its call's length, device and the kernel's output type,
    C-contiguous, and none written by one call while another reads or writes it); with
    `one_out`, `out` is one device array instead, holding exactly the calls' elements, each call
    writing its part after the one before (Executor.map_into): no object is made per call, and
    the future's result is `out`.

    The extension reads every call and array into plain data and queues the work (an
    _ext.DeviceMapRun, see python/src/device_map.hpp); this function drives it block by block
    and makes what only CuPy or PyTorch can make: each block's output buffers and, once
    everything is queued, their views. Its one future (of `future_type`) gives the outputs, or
    with `single` (one call) that call's output."""
    cupy = sys.modules.get("cupy")
    # CuPy work, and the outputs allocated for the calls, are ordered on CuPy's current stream:
    # the extension waits for it before each block (its handle is 0 for the legacy default
    # stream, which is waited for too), with the streams the arrays' producers name.
    wait_streams = [int(cupy.cuda.get_current_stream().ptr)] if cupy is not None else []
    run = core.map_device_calls(kernel, calls, cupy.ndarray if cupy is not None else None, out,
                                one_out, single, priority, tuple(calls), future_type,
                                wait_streams)
    try:
        pieces: List[Sequence[Any]] = []
        while True:
            needed = run.read_block()
            if needed is None:
                break
            if out is None:
                run.give_buffers([_allocate_flat(anchor, ordinal, count, dtype)
                                  for anchor, ordinal, count, dtype in needed])
            if single:
                # One call leaves nothing to read while the GPU runs it, so its view is made
                # first: a failure to make it then stops the call before anything runs.
                pieces += _cut(run)
            run.queue_block()
        # Everything is queued before the views are made (CuPy takes microseconds for each), so
        # that the GPUs compute meanwhile.
        pieces += _cut(run)
        outputs, futures = run.finish(pieces)
    except BaseException:
        # Nothing of this map runs on once it has raised: what was queued and has not started
        # is cancelled, and what started is waited for (it writes into the buffers).
        run.abandon()
        raise
    # The extension makes the future with future_type (its stub says only "object").
    return CompiledMap(cast(List[Future[Any]], futures), outputs, given=out is not None)
