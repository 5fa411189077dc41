"""Arrays that already live on a GPU (CuPy, PyTorch, anything with the CUDA Array Interface or
DLPack): built-in kernels run on them in place on the device, with no host round trip."""

from __future__ import annotations

import sys
from concurrent.futures import Future
from typing import (Any, Dict, Iterable, Iterator, List, Optional, Protocol, Sequence, Set,
                    Tuple, Type, Union, cast)

import numpy as np

from . import _ext
from ._ext import BuiltinKernel, ElementwiseKernel, RawKernel

#: The dtypes the C++ library computes with (its one dtype table), by NumPy's names.
SUPPORTED = tuple(_ext.dtypes())
_DLPACK_CUDA = 2  # kDLCUDA

# CuPy and PyTorch carry no type annotations: their modules, arrays and streams are Any here.
#: A CuPy stream to synchronize ("cupy", stream), or a stream handle a producer named ("cai", n).
_Streams = Set[Tuple[str, Any]]
#: What _describe tells of one device array: address, element count, dtype name, ordinal, shape.
_Description = Tuple[int, int, str, int, Tuple[int, ...]]


class _CudaArray(Protocol):
    """An object speaking the CUDA Array Interface (its dict's values are of several types)."""

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...


def is_device_array(obj: object) -> bool:
    if type(obj) is np.ndarray:  # the common case, without a failed attribute lookup
        return False
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    if dlpack_device is None or isinstance(obj, np.ndarray):
        return False
    try:
        device_type: object = dlpack_device()[0]
        return device_type == _DLPACK_CUDA
    except Exception:  # noqa: BLE001 - a broken protocol means "not a device array"
        return False


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


def _describe(obj: object, where: str, streams: _Streams) -> _Description:
    """(address, element count, dtype name, ordinal, shape) of one device array other than a
    CuPy array (the extension reads those itself); notes the stream its producer may still be
    writing on in `streams` (CuPy's current stream is the caller's to note, once for all
    arrays)."""
    view = DeviceArray(obj, where)
    if view.stream not in (None, 0):
        streams.add(("cai", view.stream))
    return view.pointer, view.count, view.dtype.name, view.device, view.shape


def _wait_for(streams: Iterable[Tuple[str, Any]]) -> None:
    for kind, stream in streams:
        if kind == "cupy":
            stream.synchronize()
        else:
            _ext.wait_for_stream(stream)


def _allocate_flat(kind_of: object, ordinal: int, count: int, dtype: str) -> Any:
    """One device buffer of `count` elements, of the same kind (CuPy or PyTorch) as `kind_of`."""
    module = type(kind_of).__module__.split(".")[0]
    if module == "torch":
        torch = sys.modules["torch"]
        return torch.empty(count, dtype=getattr(torch, dtype), device=f"cuda:{ordinal}")
    cupy = sys.modules.get("cupy")
    if cupy is None:
        raise TypeError("gpupool: results for this kind of device array are made with CuPy; "
                        "import cupy")
    with cupy.cuda.Device(ordinal):
        return cupy.empty(count, dtype)


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


def map_compiled(core: _ext.Executor, kernel: Union[ElementwiseKernel, RawKernel],
                 calls: Sequence[Sequence[object]], future_type: Type[Future[Any]],
                 single: bool = False, out: Optional[Sequence[object]] = None,
                 priority: Optional[int] = None) -> CompiledMap:
    """Runs a compiled kernel over calls whose arrays live on GPUs: each call's arrays on one
    device. The calls are read in blocks of 64, 128, then 256 calls each; each block's
    calls are checked, grouped by device and queued as one batched map per device before the
    next block is read, so that the GPUs start while later calls are still being looked at. A
    bad call raises before this returns, once the blocks queued before it have stopped. Outputs
    are new arrays of the first array's kind, shape and device (views into one buffer per
    device and block), or with `out` the arrays given there, one per call, written in place
    (checked first: each of its call's length, device and the kernel's output type, C-contiguous,
    and none written by one call while another reads or writes it). The per-array work is done by the extension in one call
    (core.map_device_calls); this module only lends it what needs CuPy or PyTorch. Its one
    future (of `future_type`) gives the outputs, or with `single` (one call) that call's
    output."""
    cupy = sys.modules.get("cupy")
    # CuPy work, and the outputs allocated for the calls, are ordered on CuPy's current stream.
    streams: _Streams = {("cupy", cupy.cuda.get_current_stream())} if cupy is not None else set()

    def describe_other(obj: object, where: str) -> _Description:
        if not is_device_array(obj):
            raise TypeError(f"gpupool: {where} is not a device array; a map over device arrays "
                            "takes device arrays and numbers only (host arrays go in a map of "
                            "their own)")
        address, count, name, ordinal, shape = _describe(obj, where, streams)
        return address, count, name, ordinal, shape

    def allocate_flat(anchor: object, ordinal: int, count: int, dtype: str) -> Tuple[Any, int]:
        flat = _allocate_flat(anchor, ordinal, count, dtype)
        base = flat.data.ptr if hasattr(flat, "data") and hasattr(flat.data, "ptr") \
            else flat.data_ptr()
        return flat, base

    outputs, futures = core.map_device_calls(
        kernel, calls, cupy.ndarray if cupy is not None else None, describe_other,
        allocate_flat, _split_flat, lambda: _wait_for(streams), tuple(calls), future_type,
        single, out, priority)
    return CompiledMap(futures, outputs, given=out is not None)
