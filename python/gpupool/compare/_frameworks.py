"""The hand-written alternatives gpupool is compared with: the motivating program, careful CuPy
and careful PyTorch. Each ``make_*`` returns a function that does a whole workload once, or
raises Skip with the reason it cannot run here."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, Callable, Dict, Generic, Iterable, List, Optional, Tuple, TypeVar

import numpy as np
import numpy.typing as npt

from ._harness import Skip

# CuPy and PyTorch are optional here and carry no type annotations mypy can use (absent, or
# untyped): their modules are ModuleType and what they make is Any. Where one is imported by name,
# the ignore covers both "not installed" and "installed without annotations".

#: Per framework: the module (None where unusable) and why it cannot be used ("" if it can).
_gpu_cache: Dict[str, Tuple[Optional[ModuleType], str]] = {}

_State = TypeVar("_State")
_R = TypeVar("_R")
#: The chunks of a workload, and what a variant returns.
Chunks = List[npt.NDArray[Any]]


def need_cupy() -> ModuleType:
    """CuPy, with at least one usable GPU; Skip otherwise."""
    if "cupy" not in _gpu_cache:
        try:
            import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]

            count = cupy.cuda.runtime.getDeviceCount()
            _gpu_cache["cupy"] = (cupy, "" if count > 0 else "CuPy sees no GPU")
        except ImportError:
            _gpu_cache["cupy"] = (None, "CuPy is not installed")
        except Exception as error:  # installed, but no driver or no device
            _gpu_cache["cupy"] = (None, f"CuPy cannot use a GPU: {str(error)[:120]}")
    cupy, reason = _gpu_cache["cupy"]
    if reason or cupy is None:
        raise Skip(reason)
    return cupy


def need_torch() -> ModuleType:
    """PyTorch with CUDA; Skip otherwise."""
    if "torch" not in _gpu_cache:
        try:
            import torch  # type: ignore[import-not-found, import-untyped, unused-ignore]

            usable = torch.cuda.is_available()
            _gpu_cache["torch"] = (torch, "" if usable else "PyTorch sees no CUDA GPU")
        except ImportError:
            _gpu_cache["torch"] = (None, "PyTorch is not installed")
        except Exception as error:
            _gpu_cache["torch"] = (None, f"PyTorch cannot use a GPU: {str(error)[:120]}")
    torch, reason = _gpu_cache["torch"]
    if reason or torch is None:
        raise Skip(reason)
    return torch


def gpu_count() -> int:
    try:
        count: int = need_cupy().cuda.runtime.getDeviceCount()
        return count
    except Skip:
        return 0


class Pool(Generic[_State]):
    """A ThreadPoolExecutor whose threads each take one private state (stream, buffers) on first
    use, so that per-thread resources are made once and reused across runs."""

    def __init__(self, threads: int, make_state: Callable[[], _State]) -> None:
        self._states: queue.SimpleQueue[_State] = queue.SimpleQueue()
        for _ in range(threads):
            self._states.put(make_state())
        self._local = threading.local()
        self.executor = ThreadPoolExecutor(max_workers=threads)

    def state(self) -> _State:
        state: Optional[_State] = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = self._states.get_nowait()
        return state

    def map(self, fn: Callable[..., _R], *iterables: Iterable[Any]) -> List[_R]:
        return list(self.executor.map(fn, *iterables))

    def close(self) -> None:
        self.executor.shutdown(wait=True)


# -- the motivating program -------------------------------------------------------------------
def motivating_square(chunk: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The function as published."""
    import cupy as cp  # type: ignore[import-not-found, import-untyped, unused-ignore]

    squared: npt.NDArray[Any] = cp.asnumpy(cp.array(chunk) ** 2)
    return squared


def make_motivating(threads: int, data: Chunks,
                    closers: List[Callable[[], None]]) -> Callable[[], Chunks]:
    need_cupy()
    pool = ThreadPoolExecutor(max_workers=threads)
    closers.append(lambda: pool.shutdown(wait=True))
    return lambda: list(pool.map(motivating_square, data))


# -- careful CuPy -----------------------------------------------------------------------------
def careful_cupy_loop(data: Chunks) -> Chunks:
    """The simplest careful CuPy: one thread, a non-blocking stream of its own, a
    copy in, the square, a copy out per chunk: the baseline beside gpupool's Python tasks."""
    cp = need_cupy()
    out = []
    with cp.cuda.Stream(non_blocking=True):
        for chunk in data:
            d = cp.asarray(chunk)
            out.append(cp.asnumpy(d * d))
    return out


def make_careful_cupy(threads: int, data: Chunks, closers: List[Callable[[], None]],
                      make_outputs: Optional[Callable[[], Chunks]] = None
                      ) -> Callable[[], Chunks]:
    """A non-blocking stream per thread, pinned staging, device buffers made once. With
    ``make_outputs`` (it makes pinned arrays, one per input), inputs are pinned already and
    results go straight into those; otherwise inputs are staged through pinned memory and each
    result is a new NumPy array."""
    cp = need_cupy()
    import cupyx  # type: ignore[import-not-found, import-untyped, unused-ignore]

    outputs = make_outputs() if make_outputs else None
    largest = max(c.size for c in data)
    dtype = data[0].dtype

    def make_state() -> Tuple[Any, Any, Any, Any, Any]:
        return (cp.cuda.Stream(non_blocking=True), cupyx.empty_pinned(largest, dtype),
                cupyx.empty_pinned(largest, dtype), cp.empty(largest, dtype),
                cp.empty(largest, dtype))

    pool = Pool(threads, make_state)
    closers.append(pool.close)

    def work(index: int) -> npt.NDArray[Any]:
        chunk = data[index]
        stream, pin_in, pin_out, d_in, d_out = pool.state()
        n = chunk.size
        target: npt.NDArray[Any]  # pinned NumPy memory (cupyx.empty_pinned), or an output
        with stream:
            if outputs is None:
                np.copyto(pin_in[:n], chunk)
                source, target = pin_in[:n], pin_out[:n]
            else:
                source, target = chunk, outputs[index]
            d_in[:n].set(source, stream=stream)
            cp.multiply(d_in[:n], d_in[:n], out=d_out[:n])
            d_out[:n].get(stream=stream, out=target)  # blocks until the copy is done
        return target if outputs is not None else target.copy()

    indices = range(len(data))
    return lambda: pool.map(work, indices)


# -- careful PyTorch --------------------------------------------------------------------------
def make_careful_torch(threads: int, data: Chunks, closers: List[Callable[[], None]],
                       make_outputs: Optional[Callable[[], Chunks]] = None
                       ) -> Callable[[], Chunks]:
    """A stream per thread, pinned staging, device tensors made once, non_blocking copies."""
    torch = need_torch()
    outputs = make_outputs() if make_outputs else None
    largest = max(c.size for c in data)
    dtype = {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32}[
        data[0].dtype]

    def make_state() -> Tuple[Any, Any, Any, Any, Any]:
        return (torch.cuda.Stream(), torch.empty(largest, dtype=dtype, pin_memory=True),
                torch.empty(largest, dtype=dtype, pin_memory=True),
                torch.empty(largest, dtype=dtype, device="cuda"),
                torch.empty(largest, dtype=dtype, device="cuda"))

    pool = Pool(threads, make_state)
    closers.append(pool.close)

    def work(index: int) -> npt.NDArray[Any]:
        chunk = data[index]
        stream, pin_in, pin_out, d_in, d_out = pool.state()
        n = chunk.size
        with torch.cuda.stream(stream):
            if outputs is None:
                np.copyto(pin_in[:n].numpy(), chunk)
                source, target = pin_in[:n], pin_out[:n]
            else:
                source, target = torch.from_numpy(chunk), torch.from_numpy(outputs[index])
            d_in[:n].copy_(source, non_blocking=True)
            torch.mul(d_in[:n], d_in[:n], out=d_out[:n])
            target.copy_(d_out[:n], non_blocking=True)
            stream.synchronize()
        return outputs[index] if outputs is not None else target.numpy().copy()

    indices = range(len(data))
    return lambda: pool.map(work, indices)


# -- W5: a compiled kernel over chunks already on the GPU -------------------------------------
def fma_body(fmas: int, addend: str = "b") -> str:
    """``fmas`` dependent FMAs per element: ``v = v * a + b`` (W5), or ``v = v * a + x`` (W6c,
    whose result then depends on the input however long the chain: about 1000 x)."""
    return f"float v = x;\nfor (int i = 0; i < {fmas}; ++i) v = v * a + {addend};\ny = v;"


def cupy_fma_kernel(fmas: int) -> Any:
    cp = need_cupy()
    return cp.ElementwiseKernel("float32 x, float32 a, float32 b", "float32 y", fma_body(fmas),
                                f"compare_fma_{fmas}")
