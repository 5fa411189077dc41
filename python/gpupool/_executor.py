"""gpupool.Executor: a concurrent.futures.Executor whose workers are gpupool lanes."""

from __future__ import annotations

import atexit
import concurrent.futures as _futures
import contextlib
import itertools
import math
import numbers
import os
import threading
import weakref
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Literal, Optional, Tuple,
                    TypeVar, Union, cast, overload)

import numpy as np
import numpy.typing as npt

from . import _device, _ext, _map_paths
from ._ext import BuiltinKernel, ElementwiseKernel, RawKernel
from ._future import _Future
from ._lane_streams import _FrameworkStreams
from ._map_paths import _COMPILED, _elementwise_arguments
from ._map_stream import _MAP_WINDOW_FLOOR, _SUBMIT_BATCH
from ._timeline import Trace

_T = TypeVar("_T")
#: What runs in C++ over arrays: a built-in kernel, an elementwise or a raw kernel.
AnyKernel = Union[BuiltinKernel, ElementwiseKernel, RawKernel]

_KERNELS = (BuiltinKernel, ElementwiseKernel, RawKernel)

__all__ = ["AnyKernel", "Executor", "Trace", "current_lane"]


def _count(name: str, value: object, low: int, high: Optional[int], allowed: str) -> int:
    """``value`` as an int in [low, high], or an error naming the parameter, the value given
    and what is allowed. bool, float and str are refused rather than converted."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"gpupool.Executor: {name} must be {allowed}, not "
                        f"{value!r} ({type(value).__name__})")
    number = int(value)
    if number < low or (high is not None and number > high):
        raise ValueError(f"gpupool.Executor: {name} must be {allowed}, not {number}")
    return number


def _rate(name: str, value: object, least: float, allowed: str) -> float:
    """``value`` as 0 or a finite float of at least ``least``, or an error naming the
    parameter, the value given and what is allowed. bool and str are refused rather than
    converted."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"gpupool.Executor: {name} must be {allowed}, not "
                        f"{value!r} ({type(value).__name__})")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        number = math.inf
    if number != 0 and not (math.isfinite(number) and number >= least):
        raise ValueError(f"gpupool.Executor: {name} must be {allowed}, not {value!r}")
    return number


def _choice(name: str, value: object, allowed: Tuple[str, ...], none_means: str = "") -> Any:
    """``value`` if it is one of the strings ``allowed`` (or None where ``none_means`` says what
    None means), or an error naming the parameter, the value given and what is allowed:
    TypeError for a value that is not a string, ValueError for an unknown one."""
    if value is None and none_means:
        return None
    names = [repr(a) for a in allowed] + ([f"None ({none_means})"] if none_means else [])
    words = ", ".join(names[:-1]) + " or " + names[-1]
    if not isinstance(value, str):
        raise TypeError(f"gpupool.Executor: {name} must be {words}, not {value!r} "
                        f"({type(value).__name__})")
    if value not in allowed:
        raise ValueError(f"gpupool.Executor: {name} must be {words}, not {value!r}")
    return value


def _priority(value: object, default_allowed: bool, where: str = "gpupool") -> Optional[int]:
    """``value`` as a priority (an int from _ext.LOWEST_PRIORITY to _ext.HIGHEST_PRIORITY;
    higher is more urgent), or None where ``default_allowed`` (the executor's own), or an error
    naming the range: TypeError for a value that is not a whole number, ValueError for one out
    of range. bool is refused rather than read as 0 or 1."""
    if value is None and default_allowed:
        return None
    allowed = (f"a whole number from {_ext.LOWEST_PRIORITY} to {_ext.HIGHEST_PRIORITY} "
               "(higher is more urgent)" + (", or None for the executor's default"
                                             if default_allowed else ""))
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: priority must be {allowed}, not {value!r} "
                        f"({type(value).__name__})")
    number = int(value)
    if not _ext.LOWEST_PRIORITY <= number <= _ext.HIGHEST_PRIORITY:
        raise ValueError(f"{where}: priority must be {allowed}, not {number}")
    return number


def _is_auto(value: object) -> bool:
    """True for ``"auto"`` and ``None``: the setting is chosen as ``tuning`` says."""
    return value is None or (isinstance(value, str) and value == "auto")


def _device_list(devices: object) -> Optional[list[int]]:
    if devices is None:
        return None
    allowed = ("a list of device ordinals such as [0], [0, 1] or [0, 0] (GPU 0 as two devices), "
               "or None for GPUPOOL_DEVICES, else every visible device")
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Iterable):
        raise TypeError(f"gpupool.Executor: devices must be {allowed}, not {devices!r} "
                        f"({type(devices).__name__})")
    ordinals = [_count("devices[]", d, 0, None, "an ordinal (a whole number from 0)")
                for d in devices]
    if not ordinals:
        raise ValueError(f"gpupool.Executor: devices=[] names no device; give {allowed}")
    return ordinals


def current_lane() -> _ext.Lane:
    """The lane running the calling task: its device, its stream (``lane.stream``, and the
    ``__cuda_stream__`` protocol), and helpers to move data on it.

    Raises RuntimeError outside a task submitted to a gpupool Executor."""
    lane = _ext.current_lane()
    if lane is None:
        raise RuntimeError("gpupool.current_lane() called outside a task running on a lane")
    return lane


class _Defaults:
    """The defaults of include/gpupool/options.hpp, read from the options the extension binds
    (as plain numbers: no extension object outlives the import)."""

    def __init__(self, options: _ext.ExecutorOptions) -> None:
        self.slots_per_lane = options.slots_per_lane
        self.device_memory_budget = options.device_memory_budget
        self.cpu_devices = options.cpu_devices
        self.cpu_copy_rate = options.cpu_copy_rate
        self.in_flight_budget = options.in_flight_budget
        self.when_full = options.when_full
        self.priority = options.priority
        self.host_lanes = options.host_lanes


_DEFAULTS = _Defaults(_ext.ExecutorOptions())


# Every executor not yet shut down. At exit they are shut down (intake stopped, queued work run,
# lanes joined) while the interpreter is still whole, as concurrent.futures does for its pools:
# a lane must never reach for Python once the interpreter is finalizing.
_live_executors: weakref.WeakSet[Executor] = weakref.WeakSet()
_live_lock = threading.Lock()
_exiting = False


def _shut_down_at_exit() -> None:
    global _exiting
    with _live_lock:
        _exiting = True
        executors = list(_live_executors)
    for executor in executors:
        with contextlib.suppress(Exception):
            executor.shutdown(wait=True)
    # Executors dropped by one of their own tasks stop on a thread of their own: wait for those
    # too, so that no lane releases a Python object while the interpreter finalizes.
    _ext.join_orphaned_executors()


if hasattr(threading, "_register_atexit"):
    # Runs when the main thread ends, before atexit callbacks and finalization (Python 3.9+).
    threading._register_atexit(_shut_down_at_exit)
else:  # pragma: no cover
    atexit.register(_shut_down_at_exit)


def _after_fork_in_child() -> None:
    # The lanes did not survive fork(): the child's copies take no work (the core refuses it with
    # a clear error) and must not wait for lanes at exit.
    with _live_lock:
        executors = list(_live_executors)
        _live_executors.clear()
    for executor in executors:
        executor._forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Executor(_futures.Executor):
    """Runs tasks on many lanes (threads) per GPU, on every GPU.

    Python callables run on a lane thread with the lane's device current and, when CuPy or
    PyTorch is imported, the lane's own stream made their current stream, so CuPy code runs
    unchanged on per-lane streams. Built-in kernels (``gpupool.kernels``) run entirely in C++
    with the GIL released.

    Args:
        threads_per_gpu: lanes per device, 1 to 256, or ``"auto"`` (the default; ``None`` means
            the same): chosen as ``tuning`` says.
        devices: device ordinals to use, in the order the executor numbers them (default:
            ``GPUPOOL_DEVICES``, else every visible device). An ordinal listed n times makes n
            devices of that GPU, each with its own lanes, budgets, statistics and quarantine,
            sharing its memory and copy engines (``[0, 0]``: GPU 0 as two devices).
        backend: ``"cuda"`` or ``"cpu"`` (default: ``GPUPOOL_BACKEND``, else CUDA if usable).
        slots_per_lane: tasks one lane keeps in flight, 1 to 64.
        chunk_bytes: largest piece of an array moved through a staging slot at once, or
            ``"auto"`` (the default; ``None`` means the same): chosen as ``tuning`` says.
        device_memory_budget: bytes gpupool may hold per device (0: no limit).
        cpu_devices: devices the CPU backend stands in for.
        cpu_copy_rate: bytes per second each way of each CPU stand-in device's copies, shared
            by its lanes as a GPU's copy engines are, so that the CPU backend can model a GPU's
            pace (0, the default: no limit; ignored on CUDA).
        in_flight_budget: bytes of work in flight per device (0: the default).
        when_full: ``"block"`` or ``"raise"`` when the in-flight budget is full.
        priority: the priority of work submitted without one, a whole number from -3 to 3
            (default 0); higher is more urgent. ``submit`` and ``map`` take their own
            ``priority=``. The next free lane takes queued work of the highest priority first,
            first come first served within a priority; aging keeps lower priorities moving.
            Priorities order what lanes take, not copies already running. On CUDA a priority
            p above 0 also puts this executor's lanes on streams p levels above the GPU's
            default stream priority (ValueError on a GPU without that many levels).
        tuning: how ``"auto"`` values are chosen: ``"auto"`` (measured on CUDA, once per
            machine and device model and then read from the cache; the fixed defaults on the CPU
            backend), ``"measured"`` (on any backend), ``"remeasure"`` (measure now and replace
            the cached result) or ``"fixed"`` (8 lanes on CUDA, host cores on the CPU backend,
            8 MiB chunks). ``GPUPOOL_TUNING`` overrides it. ``settings`` says what was chosen.
        host_lanes: threads beside the devices' lanes, 0 to 256 (default 0: none), that run
            small calls of built-in kernels over host arrays (``map`` and ``submit``, each call
            at most 256 KiB in and out together) on the host itself, without staging or copies.
            Such calls are shared between the host lanes and the devices so that both would
            finish together, by a model of each side's latency and pace fitted from earlier
            calls; ``placement()`` reports it. Everything else runs on the devices.
        quiet: no messages on standard error: the notice of falling back to the CPU backend, a
            device taken out of service, a tuning sweep that failed (errors are still raised).

    Raises:
        BackendUnavailableError: ``backend="cuda"`` without a usable GPU.
        TypeError: an option of the wrong type, ValueError: one out of range or unknown (each
            naming the parameter, the value given and what is allowed).
    """

    def __init__(self, threads_per_gpu: Union[int, Literal["auto"], None] = "auto",
                 devices: Optional[Iterable[int]] = None, *, backend: Optional[str] = None,
                 slots_per_lane: int = _DEFAULTS.slots_per_lane,
                 chunk_bytes: Union[int, Literal["auto"], None] = "auto",
                 device_memory_budget: int = _DEFAULTS.device_memory_budget,
                 cpu_devices: int = _DEFAULTS.cpu_devices,
                 cpu_copy_rate: float = _DEFAULTS.cpu_copy_rate,
                 in_flight_budget: int = _DEFAULTS.in_flight_budget,
                 when_full: str = _DEFAULTS.when_full,
                 tuning: Literal["auto", "measured", "remeasure", "fixed"] = "auto",
                 quiet: bool = False, priority: int = _DEFAULTS.priority,
                 host_lanes: int = _DEFAULTS.host_lanes) -> None:
        lanes = 0 if _is_auto(threads_per_gpu) else _count(
            "threads_per_gpu", threads_per_gpu, 1, _ext.MOST_LANES_PER_DEVICE,
            f"a whole number from 1 to {_ext.MOST_LANES_PER_DEVICE}, or 'auto'")
        options = _ext.ExecutorOptions()
        options.backend = _choice("backend", backend, _ext.BACKENDS,
                                  "the GPUPOOL_BACKEND variable, else CUDA when usable")
        options.devices = _device_list(devices) or []
        options.lanes_per_device = lanes
        options.slots_per_lane = _count(
            "slots_per_lane", slots_per_lane, 1, _ext.MOST_SLOTS_PER_LANE,
            f"a whole number from 1 to {_ext.MOST_SLOTS_PER_LANE}")
        options.chunk_bytes = 0 if _is_auto(chunk_bytes) else _count(
            "chunk_bytes", chunk_bytes, 1, None, "a byte count of at least 1, or 'auto'")
        options.device_memory_budget = _count("device_memory_budget", device_memory_budget, 0,
                                              None, "a byte count, or 0 for no limit")
        options.cpu_devices = _count(
            "cpu_devices", cpu_devices, 0, _ext.MOST_CPU_DEVICES,
            f"a whole number from 0 (GPUPOOL_CPU_DEVICES, else 1) to {_ext.MOST_CPU_DEVICES}")
        options.cpu_copy_rate = _rate(
            "cpu_copy_rate", cpu_copy_rate, _ext.LEAST_CPU_COPY_RATE,
            f"bytes per second: 0 (no limit) or a finite number of at least "
            f"{_ext.LEAST_CPU_COPY_RATE:g}")
        options.in_flight_budget = _count(
            "in_flight_budget", in_flight_budget, 0, 2**64 - 1,
            "a byte count per device: 0 for the default, 2**64 - 1 for no budget")
        options.when_full = _choice("when_full", when_full, _ext.WHEN_FULL_MODES)
        options.tuning = _choice("tuning", tuning, _ext.TUNING_MODES)
        if not isinstance(quiet, bool):
            raise TypeError(f"gpupool.Executor: quiet must be True or False, not {quiet!r} "
                            f"({type(quiet).__name__})")
        options.quiet = quiet
        options.priority = cast(int, _priority(priority, False, "gpupool.Executor"))
        options.host_lanes = _count(
            "host_lanes", host_lanes, 0, _ext.MOST_HOST_LANES,
            f"a whole number from 0 (none) to {_ext.MOST_HOST_LANES}")
        self._core = _ext.Executor(options)
        self._ordinals = [d["ordinal"] for d in self._core.devices]
        self._lock = threading.Lock()
        self._closed = False
        self._forked = False
        # Maps whose inputs were read whole at the call: shutdown queues what their windows
        # have not (see _queue_unread_maps). Weak: a map dropped early goes with its iterator.
        self._windowed_maps: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._queueing_unread = False
        self._trace_depth = 0
        if self._core.takes_cuda_arrays:
            # CUDA lanes run Python calls through it, with CuPy's and PyTorch's current stream
            # the lane's. It holds no reference to this Executor.
            self._core.set_runner(_FrameworkStreams(self._ordinals).run)
        with _live_lock:
            _live_executors.add(self)

    # -- information ----------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """``"cuda"`` or ``"cpu"``."""
        return self._core.backend

    @property
    def devices(self) -> list[dict[str, Any]]:
        """One dict per device: id, ordinal, name, backend, total_memory, lanes, ..."""
        return self._core.devices

    @property
    def priority(self) -> int:
        """The priority of work submitted without one (the ``priority`` option)."""
        return self._core.priority

    @property
    def threads_per_gpu(self) -> int:
        return self._core.threads_per_gpu

    @property
    def lane_count(self) -> int:
        return self._core.lane_count

    @property
    def host_lanes(self) -> int:
        """Host lanes beside the devices' lanes (the ``host_lanes`` option; not counted in
        ``lane_count``)."""
        return self._core.host_lanes

    @property
    def _max_workers(self) -> int:
        """The lanes of every device: what ``ThreadPoolExecutor._max_workers`` says of its
        threads. Dask's local scheduler (``dask.config.set(pool=ex, scheduler="threads")``) and
        other clients that size their work to a pool read it."""
        return self._core.lane_count

    @property
    def takes_cuda_arrays(self) -> bool:
        """Whether this executor's devices are GPUs that take CUDA device arrays (CuPy, PyTorch,
        the CUDA Array Interface) in place: true on the CUDA backend."""
        return bool(self._core.takes_cuda_arrays)

    @property
    def slots_per_lane(self) -> int:
        """Tasks one lane keeps in flight (the ``slots_per_lane`` option)."""
        return self._core.slots_per_lane

    @property
    def chunk_bytes(self) -> int:
        return self._core.chunk_bytes

    @property
    def queued(self) -> int:
        """Work queued and not yet taken by a lane, now: each task, piece of a map or batch of
        small tasks coalesced together counts once (Python calls as one task each)."""
        return self._core.queued

    @property
    def settings(self) -> dict[str, Any]:
        """``threads_per_gpu`` and ``chunk_bytes`` this executor runs with, where each came from
        (``*_from``: ``"given"``, ``"fixed"``, ``"measured"`` or ``"cached"``), the sweep behind
        measured values (``samples``: threads_per_gpu, chunk_bytes, bytes_per_second of input),
        the ``cache_file`` read or written, and a ``note`` if measuring or caching failed."""
        return self._core.settings

    def memory_stats(self) -> list[dict[str, Any]]:
        """Per device: bytes gpupool holds now (``in_use``), its ``peak`` and the ``budget``."""
        return self._core.memory_stats()

    def placement(self) -> dict[str, Any]:
        """Where small calls of built-in kernels over host arrays (at most
        ``gpupool._ext.MOST_HOST_TASK_BYTES`` in and out together) ran since the executor
        started, with host lanes: ``host_tasks`` (queued for the host lanes) and
        ``device_tasks`` (small enough for them, queued for the devices); ``host_share``, the
        host lanes' share of a push large against both sides' latencies; and each
        side's model behind it: ``host_bytes_per_second`` and ``device_bytes_per_second`` (bytes
        in and out per second once its calls run) and ``host_latency_seconds`` and
        ``device_latency_seconds`` (from queueing to the end of a call on a side with nothing
        pending, apart from the time per byte); 0 until measured. All 0 without
        host lanes."""
        return self._core.placement()

    # -- tracing --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def trace(self, path: Union[str, os.PathLike[str], None] = None, *,
              capacity: Optional[int] = None) -> Iterator[Trace]:
        """Records every task's journey inside the ``with`` block.

            with ex.trace("w2.json") as t:
                list(ex.map(gpupool.kernels.square, chunks))
            print(t.stats_table())

        Yields a Trace, filled when the block ends: ``records()``, ``stats()``,
        ``chrome_json()``, ``svg()``, ``stats_table()``, ``write(path)``, and ``dropped``. With
        ``path``, the trace is also written there (see Trace.write).

        Records are kept in a ring of ``capacity`` records (default: as set before, initially
        262,144, about 200-300 bytes each); once it is full the oldest are dropped and counted
        in ``Trace.dropped``. The records are released when the outermost block ends. Blocks may
        nest: an inner block's trace holds the tasks submitted inside it, and the outer block
        keeps its own."""
        recording = Trace()
        with self._lock:
            if capacity is not None:
                if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
                    raise ValueError("gpupool: trace(capacity=...) must be a whole number of "
                                     f"records, at least 1, not {capacity!r}")
                self._core.set_trace_capacity(capacity)
            if self._trace_depth == 0:
                self._core.clear_trace()
                self._core.set_tracing(True)
            self._trace_depth += 1
            first_task = self._core.next_task_id
        try:
            yield recording
        finally:
            # Outside the lock: a Python call still running may submit (and take the lock). Not
            # on a lane: the tasks waited for may be queued behind this very call.
            if not self._core.is_lane_thread:
                self._core.wait_for_surplus_tasks()
            with self._lock:
                self._trace_depth -= 1
                outermost = self._trace_depth == 0
                if outermost:
                    self._core.set_tracing(False)
                recording._snapshot = self._core.trace_snapshot(first_task)
                recording.dropped = self._core.trace_dropped
                if outermost:
                    self._core.clear_trace()
        if path is not None:
            recording.write(path)

    # -- work -----------------------------------------------------------------------------------
    # `priority` is a keyword of submit's own (not passed to fn), which the base class's
    # signature, all of whose keywords go to fn, cannot express.
    @overload  # type: ignore[override]
    def submit(self, fn: AnyKernel, /, *args: Any, priority: Optional[int] = None,
               **kwargs: Any) -> _futures.Future[npt.NDArray[Any]]: ...

    @overload
    def submit(self, fn: Callable[..., _T], /, *args: Any, priority: Optional[int] = None,
               **kwargs: Any) -> _futures.Future[_T]: ...

    def submit(self, fn: Any, /, *args: Any, priority: Optional[int] = None,
               **kwargs: Any) -> _futures.Future[Any]:
        """Schedules ``fn(*args, **kwargs)`` on a lane; returns a concurrent.futures.Future.

        With a built-in kernel, ``submit(gpupool.kernels.square, x)`` runs in C++; its result
        is a new NumPy array, or with ``out=`` (a writable C-contiguous NumPy array of the
        input's dtype and shape: the input itself, or memory apart from the inputs) that array,
        written by the call. Until the future is done, ``out`` may hold anything.

        ``priority`` (keyword only, -3 to 3, higher is more urgent; None: the executor's) orders
        the call among queued work; it is not passed to ``fn`` (give a function's own
        ``priority`` argument through ``functools.partial``)."""
        level = _priority(priority, True)
        if (type(fn) is BuiltinKernel and not kwargs and 1 <= len(args) <= 2
                and type(args[0]) is np.ndarray):
            # The common case, a built-in kernel over NumPy arrays, in one call to the extension
            # (which checks the arity and the arrays as _submit_kernel's path does): a submit
            # loop's cost per task is mostly Python's.
            with self._lock:
                if self._closed or self._forked or _exiting:
                    self._check_open()
                # The extension makes the future with _Future; its stub says only "object".
                return cast(_Future, self._core.submit_kernel(
                    fn, args[0], args[1] if len(args) == 2 else None, _Future, level))
        if isinstance(fn, _KERNELS):
            return self._submit_kernel(None, fn, args, kwargs, level)
        # The one Future of the call; the lane that runs it hands the outcome over.
        future = _Future()
        with self._lock:
            if self._closed or self._forked or _exiting:
                self._check_open()
            self._core.submit_call(fn, args, kwargs, future, None, level)
        return future

    def submit_to(self, device: int, fn: Callable[..., _T], /, *args: Any,
                  priority: Optional[int] = None, **kwargs: Any) -> _futures.Future[_T]:
        """Like submit, on a lane of executor device ``device`` (0..len(devices)-1)."""
        if not 0 <= device < len(self._ordinals):
            raise IndexError(f"gpupool: device {device} is not one of this executor's "
                             f"{len(self._ordinals)} devices")
        return self._submit(device, fn, args, kwargs, _priority(priority, True))

    @overload
    def map(self, fn: AnyKernel, *iterables: Any, timeout: Optional[float] = None,
            chunksize: int = 1, buffersize: Optional[int] = None, progress: bool = False,
            out: Optional[Iterable[Any]] = None,
            priority: Optional[int] = None) -> Iterator[npt.NDArray[Any]]: ...

    @overload
    def map(self, fn: Callable[..., _T], *iterables: Iterable[Any],
            timeout: Optional[float] = None, chunksize: int = 1,
            buffersize: Optional[int] = None, progress: bool = False,
            out: Optional[Iterable[Any]] = None,
            priority: Optional[int] = None) -> Iterator[_T]: ...

    def map(self, fn: Any, *iterables: Any, timeout: Optional[float] = None,
            chunksize: int = 1, buffersize: Optional[int] = None, progress: bool = False,
            out: Optional[Iterable[Any]] = None,
            priority: Optional[int] = None) -> Iterator[Any]:
        """Returns an iterator of ``fn(*items)`` in input order, like Executor.map.

        The map runs ahead of its consumer only as far as its window: calls whose results have
        not been taken yet, together at most ``map_window_bytes`` of results (and, for built-in
        kernels over host arrays, of inputs) and at most ``buffersize`` calls. More calls are
        queued as results are taken, so a map of any length runs in bounded memory; a map
        whose iterator is never read runs only its first window. With ``buffersize`` (as in
        Python 3.14's ``Executor.map``: a whole number of at least 1) the iterables are read
        lazily too, as the window has room; without it they are read whole at the call, as
        ``concurrent.futures`` does (and a bad array is refused before anything runs).

        With a built-in kernel, every array is checked (TypeError/ValueError) before it is
        queued and the work runs in C++ with the GIL released; the results are NumPy arrays.
        For two-input kernels the two iterables must have the same length.

        With ``progress=True`` a progress bar (tqdm) with rate and ETA advances as results come
        back; it stays silent when standard error is not a terminal.

        ``out`` (a compiled kernel over device arrays only): one device array per call that the
        call writes instead of a new one; the results are those arrays. Each must be C-contiguous,
        of the kernel's output dtype, of its call's length and on its call's GPU, and may be one
        of its own call's inputs (in place), but no memory another call of the map reads or
        writes (ValueError or TypeError naming the call; calls before it, in blocks already
        queued, may have run). The arrays hold their results once the iterator gives them (it
        waits for the whole map); after a TimeoutError or Ctrl-C, batches that had started have
        ended before the error reaches the caller. It saves making a new array per call, which
        with thousands of small arrays costs the host as much as reading them.

        A map over device arrays (CuPy, PyTorch) holds its inputs on the GPU already; without
        ``buffersize`` it queues every call at once and makes its results there in one pass
        (a few launches for thousands of arrays), and with ``out`` it writes arrays the caller
        holds: neither is windowed. With ``buffersize`` it runs in windows of that many calls.

        ``priority`` (-3 to 3, higher is more urgent; None: the executor's) is every call's,
        every piece of every array included, whenever the window queues it."""
        del chunksize  # every item is its own task; kept for Executor.map compatibility
        request = _map_paths.MapRequest(self, fn, iterables, timeout, buffersize, progress, out,
                                        _priority(priority, True))
        if isinstance(fn, BuiltinKernel):
            return _map_paths.builtin_kernel(request)
        if isinstance(fn, _COMPILED):
            return _map_paths.compiled_kernel(request)
        return _map_paths.python_calls(request)

    def map_into(self, fn: Union[ElementwiseKernel, RawKernel], *iterables: Any, out: _T,
                 timeout: Optional[float] = None, priority: Optional[int] = None) -> _T:
        """Runs a compiled kernel over device arrays, as ``map`` does, writing every call's
        result into one device array ``out``, end to end in call order: call 0's elements
        first, then call 1's, and so on. Returns ``out`` once every call has written its part.

        No object is made per call (``map`` makes an output array, or with its ``out`` reads one,
        per call), which with thousands of small arrays is most of the host's work. ``out`` must
        be C-contiguous, of the kernel's output dtype, on the calls' GPU, and hold exactly as many
        elements as the calls together (any shape: a 2-D array of one row per call of equal
        length will do); it may hold the calls' inputs only where each call reads its own part
        (in place). Refusals are ``map``'s with ``out`` (TypeError, ValueError naming the call);
        one of the size comes at the call that overflows ``out``, or after the last call where
        it holds more; as with any refused call, calls before it may have run. After a
        TimeoutError past ``timeout`` (or Ctrl-C), what had not started is cancelled and what had
        started has ended before the error reaches the caller.

        ``priority`` (-3 to 3, higher is more urgent; None: the executor's) is every call's."""
        request = _map_paths.MapRequest(self, fn, iterables, timeout, None, False, None,
                                        _priority(priority, True))
        return cast(_T, _map_paths.compiled_into(request, out))

    @property
    def map_window_bytes(self) -> int:
        """Bytes of results (with inputs, where the map holds them) that ``map`` keeps queued
        ahead of its consumer: eight pieces per lane, and at least 1 GiB."""
        return max(_MAP_WINDOW_FLOOR, 8 * self.lane_count * self.chunk_bytes)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stops taking work. With ``cancel_futures``, work no lane has taken yet is cancelled
        (its futures end cancelled, waiters notified); work already running finishes normally.
        With ``wait``, returns once every lane has stopped (every future is then done)."""
        if self._core.is_lane_thread:
            raise ValueError("gpupool: an executor cannot be shut down by its own tasks")
        if not cancel_futures and not self._forked:
            self._queue_unread_maps()
        with self._lock:
            self._closed = True
        if self._forked:
            return  # the lanes are the parent's; there is nothing here to stop
        if wait:
            self._core.shutdown(cancel_futures)
        else:
            threading.Thread(target=self._core.shutdown, args=(cancel_futures,),
                             name="gpupool-shutdown").start()

    # -- internals ------------------------------------------------------------------------------
    def _queue_unread_maps(self) -> None:
        """concurrent.futures runs every call of a map before shutdown returns, whether its
        results were read or not: the calls that maps' windows have not queued yet are queued
        now (maps given ``buffersize``, as Python 3.14's, stop where they are)."""
        if self._closed:
            return
        self._queueing_unread = True
        try:
            for windowed in list(self._windowed_maps):
                with contextlib.suppress(Exception):  # each map's own error is raised to its reader
                    windowed.queue_rest()
        finally:
            self._queueing_unread = False

    def _check_open(self) -> None:
        if self._forked:
            raise RuntimeError("gpupool: this Executor was created in the parent process; its "
                               "lanes did not survive fork(). Create a new Executor in the child")
        if self._queueing_unread:
            return  # shutdown queueing the rest of maps' calls, at exit too
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if _exiting:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    def _kernel_futures(self, kernel: BuiltinKernel, xs: List[object],
                        ys: Optional[List[object]], priority: Optional[int] = None,
                        outs: Optional[List[object]] = None) -> List[_futures.Future[Any]]:
        """Host arrays go through the pinned pipeline (into ``outs`` where given); device arrays
        stay on their GPU."""
        if xs and _device.is_device_array(xs[0]):
            if outs is not None:
                raise TypeError("gpupool: out= of a built-in kernel takes host arrays (NumPy); "
                                "over device arrays, give a compiled kernel's map out=")
            if not self._core.takes_cuda_arrays:
                raise TypeError("gpupool: device arrays need the CUDA backend")
            return _device.launch(self._core, kernel, xs, ys, _Future, priority)
        return self._core.map_kernel(kernel, xs, ys, _Future, priority, outs)

    def _submit_calls(self, fn: Callable[..., Any], calls: Iterator[Tuple[Any, ...]],
                      priority: Optional[int] = None) -> List[_futures.Future[Any]]:
        """map's Python calls: queued _SUBMIT_BATCH at a time, each batch in one call to the
        extension rather than a submit() per call (with many lanes running Python, a thread
        queueing calls one by one waits for the GIL behind them while they run out of work).
        Work starts once the first batch is read. If reading the iterables or queueing fails,
        the calls queued so far are cancelled (those a lane had started run to their end) and
        the error raised."""
        pending: List[_futures.Future[Any]] = []
        try:
            while True:
                batch = list(itertools.islice(calls, _SUBMIT_BATCH))
                if not batch:
                    return pending
                # Made before the lock: making them runs Python code, where a finalizer or
                # signal handler of this thread may submit to this executor.
                futures: List[_futures.Future[Any]] = [_Future() for _ in batch]
                pending.extend(futures)
                with self._lock:
                    self._check_open()
                    self._core.submit_calls(fn, batch, futures, priority)
        except BaseException:
            for future in pending:
                future.cancel()
            raise

    def _submit(self, device: Optional[int], fn: object, args: Tuple[Any, ...],
                kwargs: Dict[str, Any], priority: Optional[int] = None) -> _futures.Future[Any]:
        if isinstance(fn, _KERNELS):
            return self._submit_kernel(device, fn, args, kwargs, priority)
        future = _Future()
        with self._lock:
            self._check_open()
            self._core.submit_call(fn, args, kwargs, future, device, priority)
        return future

    def _submit_kernel(self, device: Optional[int], kernel: AnyKernel, args: Tuple[Any, ...],
                       kwargs: Dict[str, Any],
                       priority: Optional[int] = None) -> _futures.Future[Any]:
        if device is not None:
            raise TypeError("gpupool: kernels over arrays are spread over every device; "
                            "use submit() rather than submit_to()")
        out = kwargs.pop("out", None) if isinstance(kernel, BuiltinKernel) else None
        if kwargs:
            allowed = " other than out" if isinstance(kernel, BuiltinKernel) else ""
            raise TypeError(f"gpupool: kernel '{kernel.name}' takes no keyword arguments"
                            f"{allowed}")
        if isinstance(kernel, BuiltinKernel) and len(args) != kernel.arity:
            raise TypeError(f"gpupool: kernel '{kernel.name}' takes {kernel.arity} array(s)")
        with self._lock:
            self._check_open()
            if isinstance(kernel, _COMPILED):
                arguments = _elementwise_arguments(args)
                if any(_device.is_device_array(a) for a in arguments):
                    if not self._core.takes_cuda_arrays:
                        raise TypeError("gpupool: device arrays need the CUDA backend")
                    return _device.map_compiled(self._core, kernel, [arguments], _Future,
                                                single=True, priority=priority).futures[0]
                # The extension makes the future with _Future; its stub says only "object".
                return cast(_Future, self._core.launch_compiled(kernel, arguments, _Future,
                                                                priority))
            return self._kernel_futures(
                kernel, [args[0]], [args[1]] if kernel.arity == 2 else None, priority,
                None if out is None else [out])[0]
