"""What ties a lane's stream to CuPy and PyTorch: the runner of Python calls on CUDA lanes
(_FrameworkStreams) and Lane.upload/download, which allocate with CuPy."""

from __future__ import annotations

import atexit
import contextlib
import functools
import sys
import threading
from types import ModuleType
from typing import Any, Callable, ContextManager, Dict, List, NamedTuple, Optional, Tuple, cast

import numpy.typing as npt

from . import _ext
from ._pinned import empty_pinned


class _FrameworkStreams:
    """Runs Python calls on CUDA lanes with the lane's stream current for CuPy and PyTorch, where
    imported (one stream object per lane and framework, made at the lane's first call after the
    framework's import).

    Both frameworks keep their current stream per thread, and a lane's thread runs only that
    lane's tasks: the stream is made current once and only checked before each later call (a call
    that left another stream current does not take the next one off the lane), which costs far
    less than entering and leaving their context managers per call. The check holds the GIL
    throughout: with many lanes running Python, every call that let the GIL go would wait for it
    again behind the other lanes. The extension makes the lane's device current before and after
    each call (a call that switched devices does not leave the lane there)."""

    def __init__(self, ordinals: List[int]) -> None:
        self._ordinals = ordinals
        # Per lane thread: _LaneStreams for the frameworks imported when it was made.
        self._local = threading.local()

    def run(self, fn: Callable[..., Any], args: Tuple[Any, ...],
            kwargs: Optional[Dict[str, Any]]) -> Any:
        modules = sys.modules
        cupy = modules.get("cupy")
        torch = modules.get("torch")
        if cupy is not None or torch is not None:
            streams: Optional[_LaneStreams] = getattr(self._local, "streams", None)
            if streams is None or streams.cupy is not cupy or streams.torch is not torch:
                streams = self._local.streams = self._make(cupy, torch)
            if streams.cupy_stream is not None and streams.cupy_current() is not \
                    streams.cupy_stream:
                streams.cupy_stream.use()
            if streams.torch_stream is not None and streams.torch_current() != streams.stream:
                streams.torch_set(streams.torch_stream)
        return fn(*args, **kwargs) if kwargs else fn(*args)

    def _make(self, cupy: Optional[ModuleType], torch: Optional[ModuleType]) -> "_LaneStreams":
        lane = _ext.current_lane()
        assert lane is not None  # the runner runs only on lanes
        ordinal = self._ordinals[lane.device]
        stream = lane.stream
        cupy_stream = cupy_current = torch_stream = torch_current = torch_set = None
        if cupy is not None:
            cupy_stream = _cupy_stream(cupy, stream, ordinal)
            cupy_current = cupy.cuda.get_current_stream
        if torch is not None and torch.cuda.is_available():
            torch_stream = torch.cuda.ExternalStream(stream, device=torch.device("cuda", ordinal))
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            torch_current = (functools.partial(raw, ordinal) if raw is not None else
                             lambda: torch.cuda.current_stream(ordinal).cuda_stream)
            torch_set = torch.cuda.set_stream
        return _LaneStreams(cupy, torch, stream, cupy_stream, cupy_current, torch_stream,
                            torch_current, torch_set)


class _LaneStreams(NamedTuple):
    """One lane's stream as CuPy's and PyTorch's stream objects, how to read their current
    stream (CuPy's stream object; PyTorch's raw handle) and how PyTorch's is set."""
    cupy: Optional[ModuleType]
    torch: Optional[ModuleType]
    stream: int
    # The stream objects, and what reads the current stream (None where not imported; the
    # frameworks carry no type annotations).
    cupy_stream: Any
    cupy_current: Any
    torch_stream: Any
    torch_current: Any
    torch_set: Any


class _StreamHandle:
    """A bare CUDA stream handle speaking the ``__cuda_stream__`` protocol."""

    def __init__(self, stream: int) -> None:
        self._stream = stream

    def __cuda_stream__(self) -> Tuple[int, int]:
        return (0, self._stream)


# CuPy and PyTorch carry no type annotations: their stream objects are Any here.
def _cupy_stream(cupy: ModuleType, stream: int, ordinal: int) -> Any:
    """A CuPy stream object for a stream gpupool owns."""
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:  # CuPy 14+: ExternalStream is deprecated
        with cupy.cuda.Device(ordinal):
            return from_external(_StreamHandle(stream))
    return cupy.cuda.ExternalStream(stream, ordinal)


def _require_cupy(lane: _ext.Lane) -> ModuleType:
    cupy = sys.modules.get("cupy")
    if lane.backend != "cuda" or cupy is None:
        raise RuntimeError("gpupool: Lane.upload/download need the CUDA backend and CuPy "
                           "(import cupy first)")
    return cupy


def _on_lane_stream(cupy: ModuleType, lane: _ext.Lane) -> ContextManager[Any]:
    """A scope in which CuPy's work is ordered on `lane`'s stream: none when it already is CuPy's
    current stream (the task's own, the usual case), else that stream made current."""
    if cupy.cuda.get_current_stream().ptr == lane.stream:
        return contextlib.nullcontext()
    return cast(ContextManager[Any], _cupy_stream(cupy, lane.stream, cupy.cuda.Device().id))


# CuPy arrays are Any: CuPy carries no type annotations.
def _lane_upload(self: _ext.Lane, array: npt.ArrayLike) -> Any:
    """Copies a host array to a new CuPy array on this lane's device, ordered on its stream
    (through the lane's pinned staging slot, or directly when ``array`` is pinned).

    Returns once ``array`` may be changed or freed: pageable data is in the staging slot by
    then; a direct copy from pinned memory is waited for (the caller may free the pinned block
    at once, and gpupool's cache would hand it out again while the copy still reads it)."""
    import numpy as np

    cupy = _require_cupy(self)
    host = np.ascontiguousarray(array)
    with _on_lane_stream(cupy, self):
        device = cupy.empty(host.shape, host.dtype)
    self._upload(device.data.ptr, host)  # waits for a copy straight from pinned memory
    return device


def _lane_download(self: _ext.Lane, device_array: Any,
                   out: Optional[npt.NDArray[Any]] = None) -> npt.NDArray[Any]:
    """Copies a CuPy array on this lane's device into ``out`` (or a new NumPy array in pinned
    memory from gpupool's cache, so the copy runs at full speed and no pageable memory is
    allocated per call), ordered on the lane's stream; returns once the data is on the host.
    The extension takes the common case itself (a C-contiguous array of one of gpupool's
    dtypes, no ``out``); this helper the rest."""
    cupy = _require_cupy(self)
    if not device_array.flags.c_contiguous:
        # A strided view is copied into a contiguous array first, on the lane's stream, as
        # CuPy's own get() does; its bytes as they lie would be other elements.
        with _on_lane_stream(cupy, self):
            device_array = cupy.ascontiguousarray(device_array)
    if out is None:
        out = empty_pinned(device_array.shape, device_array.dtype)
    if out.nbytes != device_array.nbytes or not out.flags.c_contiguous:
        raise ValueError("gpupool: out must be C-contiguous and the size of the device array")
    self._download(out, device_array.data.ptr)  # returns once the copy is done
    return out


_ext.set_lane_helpers(_lane_upload, _lane_download)
# Let go at exit, so that nothing of the package is still held by the extension when the
# interpreter finalizes.
atexit.register(_ext.set_lane_helpers, None, None)
