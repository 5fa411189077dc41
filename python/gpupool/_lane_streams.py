"""What ties a lane's stream to CuPy and PyTorch: the runner of Python calls on CUDA lanes
(_FrameworkStreams). Lane.upload/download are the extension's own (python/src/lane.cpp)."""

from __future__ import annotations

import functools
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from . import _ext


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
