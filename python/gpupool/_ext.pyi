"""gpupool's C++ core (internal; use the gpupool package)"""

from collections.abc import Callable, Sequence
from typing import overload

import numpy
from numpy.typing import NDArray

from gpupool import (
    BackendUnavailableError as BackendUnavailableError,
    CompileError as CompileError,
    CudaError as CudaError,
    GpupoolError as GpupoolError,
    OutOfMemoryError as OutOfMemoryError
)


class Kernel:
    """A built-in elementwise kernel."""

    @staticmethod
    def square() -> Kernel:
        """out = x * x"""

    @staticmethod
    def scale(alpha: float) -> Kernel:
        """out = alpha * x"""

    @staticmethod
    def add() -> Kernel:
        """out = x + y"""

    @staticmethod
    def axpy(alpha: float) -> Kernel:
        """out = alpha * x + y"""

    @property
    def name(self) -> str: ...

    @property
    def arity(self) -> int: ...

    @property
    def alpha(self) -> float: ...

    def __repr__(self) -> str: ...

class ElementwiseKernel:
    """
    An elementwise kernel compiled at run time from typed parameters and a C++ body.
    """

    def __init__(self, inputs: str, output: str, body: str, name: str = 'elementwise') -> None: ...

    @property
    def name(self) -> str: ...

    @property
    def body(self) -> str: ...

    @property
    def inputs(self) -> list: ...

    @property
    def output(self) -> tuple: ...

    def __repr__(self) -> str: ...

class LaunchShape:
    """How a raw kernel is launched."""

    @property
    def block(self) -> int: ...

    @property
    def grid(self) -> int: ...

class RawKernel:
    """A kernel from CUDA source with a named entry point."""

    def __init__(self, source: str, entry: str, inputs: str, output: str, block: int = 256, grid: int = 0) -> None: ...

    @property
    def name(self) -> str: ...

    @property
    def source(self) -> str: ...

    @property
    def shape(self) -> LaunchShape: ...

    @property
    def inputs(self) -> list: ...

    @property
    def output(self) -> tuple: ...

    def __repr__(self) -> str: ...

class ArrayFuture:
    """The result of a built-in kernel over one array."""

    def result(self, timeout: float | None = None) -> object: ...

    def done(self) -> bool: ...

    def cancel(self) -> bool: ...

    def cancelled(self) -> bool: ...

    def add_done_callback(self, callback: Callable) -> None: ...

class Trace:
    """A snapshot of an executor's per-task trace."""

    @property
    def backend(self) -> str: ...

    def records(self) -> list:
        """
        One dict per task (per piece for map/transform), in submission order; times in
        microseconds since the executor started, stages as (begin, end) or None.
        """

    def stats(self) -> list:
        """
        Per lane, then per device (lane None): tasks, bytes, busy time, queue wait, GB/s.
        """

    def chrome_json(self) -> str:
        """The trace in Chrome trace format (Perfetto, chrome://tracing)."""

    def svg(self) -> str:
        """A picture of the timeline."""

    def stats_table(self) -> str:
        """The stats as an aligned text table."""

    def __len__(self) -> int: ...

class Lane:
    """The lane a task runs on; valid only inside that task."""

    @property
    def device(self) -> int: ...

    @property
    def index(self) -> int: ...

    @property
    def index_on_device(self) -> int: ...

    @property
    def backend(self) -> str: ...

    @property
    def stream(self) -> int: ...

    def __cuda_stream__(self) -> tuple: ...

    def synchronize(self) -> None: ...

    def upload(self, array: object) -> object:
        """
        Copies a host array to a new CuPy array on this lane's device, ordered on the lane's
        stream (through the lane's pinned staging slot, or directly when the array is pinned).
        """

    def download(self, device_array: object, out: object | None = None) -> object:
        """
        Copies a CuPy array on this lane's device into `out` (or a new NumPy array); returns
        once the data is on the host.
        """

def current_lane() -> Lane | None: ...

class Executor:
    def __init__(self, threads_per_gpu: int = 0, devices: Sequence[int] | None = None, backend: str | None = None, slots_per_lane: int = 2, chunk_bytes: int = 8388608, device_memory_budget: int = 0, cpu_devices: int = 0) -> None: ...

    def submit_call(self, call: Callable, on_error: Callable, device: int | None = None) -> Callable[[], bool]: ...

    def map_kernel(self, kernel: Kernel, xs: Sequence, ys: Sequence | None = None) -> list[ArrayFuture]: ...

    @overload
    def launch_compiled(self, kernel: ElementwiseKernel, args: Sequence) -> ArrayFuture: ...

    @overload
    def launch_compiled(self, kernel: RawKernel, args: Sequence) -> ArrayFuture: ...

    @overload
    def map_on_device(self, kernel: ElementwiseKernel, ordinal: int, calls: list, outs: Sequence[int], counts: Sequence[int], result: object, keep_alive: object) -> ArrayFuture: ...

    @overload
    def map_on_device(self, kernel: RawKernel, ordinal: int, calls: list, outs: Sequence[int], counts: Sequence[int], result: object, keep_alive: object) -> ArrayFuture: ...

    def launch_device(self, kernel: Kernel, x: int, y: int, out: int, count: int, dtype: str, ordinal: int, result: object, keep_alive: object) -> ArrayFuture: ...

    def shutdown(self, cancel_pending: bool = False) -> None: ...

    def set_tracing(self, on: bool) -> None: ...

    def clear_trace(self) -> None: ...

    def trace_snapshot(self, first_task: int = 0) -> Trace: ...

    def set_trace_capacity(self, arg: int, /) -> None: ...

    @property
    def trace_capacity(self) -> int: ...

    @property
    def trace_dropped(self) -> int: ...

    @property
    def next_task_id(self) -> int: ...

    @property
    def backend(self) -> str: ...

    @property
    def threads_per_gpu(self) -> int: ...

    @property
    def lane_count(self) -> int: ...

    @property
    def slots_per_lane(self) -> int: ...

    @property
    def chunk_bytes(self) -> int: ...

    @property
    def queued(self) -> int: ...

    @property
    def is_lane_thread(self) -> bool: ...

    @property
    def devices(self) -> list: ...

    def memory_stats(self) -> list: ...

def allocate_pinned(nbytes: int) -> NDArray[numpy.uint8]: ...

def is_pinned(address: int) -> bool: ...

def describe_pointer(address: int) -> tuple: ...

def wait_for_stream(stream: int) -> None: ...

def pinned_bytes_in_use() -> int: ...

def kernels_compiled() -> int:
    """How many kernels this process compiled (rather than found in a cache)."""

def kernel_cache_directory() -> str: ...

def pinned_memory_stats() -> dict: ...

def set_pinned_cache_limit(nbytes: int) -> None: ...

def trim_pinned_cache() -> None: ...

def cuda_availability() -> tuple: ...

HAS_CUDA: bool = True
