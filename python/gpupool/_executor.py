"""gpupool.Executor: a concurrent.futures.Executor whose workers are gpupool lanes."""

from __future__ import annotations

import atexit
import collections
import concurrent.futures as _futures
import contextlib
import functools
import itertools
import numbers
import os
import sys
import threading
import time
import weakref
from concurrent.futures._base import (CANCELLED as _CANCELLED,
                                      CANCELLED_AND_NOTIFIED as _CANCELLED_AND_NOTIFIED,
                                      FINISHED as _FINISHED, PENDING as _PENDING,
                                      RUNNING as _RUNNING)
from types import ModuleType
from typing import (Any, Callable, ContextManager, Dict, Iterable, Iterator, List, Literal,
                    NamedTuple, Optional, Sequence, Tuple, TypeVar, Union, cast, overload)

import numpy.typing as npt

from . import _device, _ext
from ._ext import BuiltinKernel, ElementwiseKernel, RawKernel
from ._pinned import empty_pinned
from ._timeline import Trace

_T = TypeVar("_T")
_R = TypeVar("_R")
#: What runs in C++ over arrays: a built-in kernel, an elementwise or a raw kernel.
AnyKernel = Union[BuiltinKernel, ElementwiseKernel, RawKernel]

_COMPILED = (ElementwiseKernel, RawKernel)
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


def _is_auto(value: object) -> bool:
    """True for ``"auto"`` and ``None``: the setting is chosen as ``tuning`` says."""
    return value is None or (isinstance(value, str) and value == "auto")


def _device_list(devices: object) -> Optional[list[int]]:
    if devices is None:
        return None
    allowed = "a list of device ordinals such as [0] or [0, 1], or None for every visible device"
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


# Python calls of a map queued by one call to the extension (see Executor._submit_calls).
_SUBMIT_BATCH = 1024

# How often a waiting result() wakes to let Python handle signals (seconds).
_WAIT_SLICE = 0.05
# Held while a future's Condition is made and while an outcome is set on a future that has none
# (see _Future._made_condition): one lock for every future, held for a few bytecodes.
_condition_making = threading.Lock()


class _Defaults:
    """The defaults of include/gpupool/options.hpp, read from the options the extension binds
    (as plain numbers: no extension object outlives the import)."""

    def __init__(self, options: _ext.ExecutorOptions) -> None:
        self.slots_per_lane = options.slots_per_lane
        self.device_memory_budget = options.device_memory_budget
        self.cpu_devices = options.cpu_devices
        self.in_flight_budget = options.in_flight_budget
        self.when_full = options.when_full


_DEFAULTS = _Defaults(_ext.ExecutorOptions())


class _Future(_futures.Future[Any]):
    """The one concurrent.futures.Future of a task; the extension hands its outcome over (from
    the lane that ran a Python call, or in bulk once tasks end).

    cancel() succeeds only while no lane has taken the task (a task that started runs to its
    end, and cancel() returns False; a compiled kernel's map over device arrays, one future for
    many batches, is cancelled while any batch has not started, the others running to their
    end), and a cancelled future is reported finished at once
    (waiters of ``wait``/``as_completed`` wake, callbacks run), as
    ``set_running_or_notify_cancel`` does for the standard executors. A kernel's task is
    cancelled in gpupool's queue; a Python call's is skipped by the lane that takes it."""

    # A kernel's task in gpupool's queue (set by the extension): its cancel() is True if it had
    # not started and is now cancelled. None for Python calls.
    _task: Optional[_ext.QueuedTask] = None
    # The future's Condition, made at the first use of `_condition`: a future nobody waits on,
    # cancels or adds a callback to (a task whose result is taken once it is done) never makes
    # one. A Condition is eight of the eleven objects of a Future the cyclic garbage collector
    # tracks, and with many futures alive (a submit loop) and a large heap (CuPy, PyTorch
    # imported) its collections cost more than everything else a submit does.
    _made_condition: Optional[threading.Condition] = None

    def __init__(self) -> None:  # Future.__init__, without the Condition
        self._state = _PENDING
        self._result: Any = None
        self._exception: Optional[BaseException] = None
        self._waiters: List[Any] = []
        self._done_callbacks: List[Callable[[_futures.Future[Any]], object]] = []

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        condition = self._made_condition
        if condition is None:
            with _condition_making:
                condition = self._made_condition
                if condition is None:
                    condition = self._made_condition = threading.Condition()
        return condition

    def set_result(self, result: Any) -> None:
        with _condition_making:
            if self._made_condition is None and self._state in (_PENDING, _RUNNING):
                # No Condition: no waiter, no callback to tell, and whoever looks next makes it
                # (under this lock) and finds the result.
                self._result = result
                self._state = _FINISHED
                return
        super().set_result(result)

    def set_running_or_notify_cancel(self) -> bool:
        with _condition_making:
            if self._made_condition is None and self._state == _PENDING:
                self._state = _RUNNING  # not cancelled: cancel() makes the Condition
                return True
        with self._condition:
            if self._state == _CANCELLED_AND_NOTIFIED:
                return False  # notified at cancel(): the lane skips the call
            return super().set_running_or_notify_cancel()

    def cancel(self) -> bool:
        if self._state in (_RUNNING, _FINISHED):
            # Neither state ever goes back to one that can be cancelled: no Condition is made
            # to say so (map cancels every future it hands on, most of them long finished).
            return False
        with self._condition:
            if self._state in (_RUNNING, _FINISHED):
                return False
            if self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED):
                return True
            task = self._task
        if task is not None and not task.cancel():
            return self.cancelled()  # a lane has it (or another caller cancelled it just now)
        self._notify_cancelled()
        return True

    def result(self, timeout: Optional[float] = None) -> Any:
        if self._state == _FINISHED:  # the common case once a map's results are in
            if self._exception is None:  # set before the state, which never leaves FINISHED
                return self._result
            return super().result(0)
        self._wait_in_slices(timeout)
        return super().result(timeout=0)

    def done(self) -> bool:
        return self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED, _FINISHED)  # no Condition

    def cancelled(self) -> bool:
        return self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED)  # no Condition

    def running(self) -> bool:
        return self._state == _RUNNING  # no Condition

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._wait_in_slices(timeout)
        return super().exception(timeout=0)

    def _wait_in_slices(self, timeout: Optional[float]) -> None:
        # A signal (Ctrl-C) may be taken by any thread of the process, which does not wake a
        # main thread asleep on a lock: waking every slice lets Python run its handlers (and
        # raise KeyboardInterrupt) promptly.
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while self._state not in (_CANCELLED, _CANCELLED_AND_NOTIFIED, _FINISHED):
                wait = _WAIT_SLICE
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        return
                self._condition.wait(wait)

    def _notify_cancelled(self) -> bool:
        """Ends the future as cancelled and notified; False if it had already ended."""
        with self._condition:
            if self._state not in (_PENDING, _CANCELLED):
                return False
            callbacks_ran = self._state == _CANCELLED
            self._state = _CANCELLED_AND_NOTIFIED
            for waiter in self._waiters:
                waiter.add_cancelled(self)
            self._condition.notify_all()
        if not callbacks_ran:
            # Future's own (private) way to run the callbacks; typeshed leaves it out.
            self._invoke_callbacks()  # type: ignore[attr-defined, unused-ignore]
        return True


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
        devices: device ordinals to use (default: every visible device).
        backend: ``"cuda"`` or ``"cpu"`` (default: ``GPUPOOL_BACKEND``, else CUDA if usable).
        slots_per_lane: tasks one lane keeps in flight, 1 to 64.
        chunk_bytes: largest piece of an array moved through a staging slot at once, or
            ``"auto"`` (the default; ``None`` means the same): chosen as ``tuning`` says.
        device_memory_budget: bytes gpupool may hold per device (0: no limit).
        cpu_devices: devices the CPU backend stands in for.
        in_flight_budget: bytes of work in flight per device (0: the default).
        when_full: ``"block"`` or ``"raise"`` when the in-flight budget is full.
        tuning: how ``"auto"`` values are chosen: ``"auto"`` (measured on CUDA, once per
            machine and device model and then read from the cache; the fixed defaults on the CPU
            backend), ``"measured"`` (on any backend), ``"remeasure"`` (measure now and replace
            the cached result) or ``"fixed"`` (8 lanes on CUDA, host cores on the CPU backend,
            8 MiB chunks). ``GPUPOOL_TUNING`` overrides it. ``settings`` says what was chosen.
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
                 in_flight_budget: int = _DEFAULTS.in_flight_budget,
                 when_full: str = _DEFAULTS.when_full,
                 tuning: Literal["auto", "measured", "remeasure", "fixed"] = "auto",
                 quiet: bool = False) -> None:
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
        options.cpu_devices = _count("cpu_devices", cpu_devices, 0, 1024,
                                     "a whole number from 0 (GPUPOOL_CPU_DEVICES, else 1) to 1024")
        options.in_flight_budget = _count(
            "in_flight_budget", in_flight_budget, 0, 2**64 - 1,
            "a byte count per device: 0 for the default, 2**64 - 1 for no budget")
        options.when_full = _choice("when_full", when_full, ("block", "raise"))
        options.tuning = _choice("tuning", tuning, ("auto", "measured", "remeasure", "fixed"))
        if not isinstance(quiet, bool):
            raise TypeError(f"gpupool.Executor: quiet must be True or False, not {quiet!r} "
                            f"({type(quiet).__name__})")
        options.quiet = quiet
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
        if self._core.backend == "cuda":
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
    def threads_per_gpu(self) -> int:
        return self._core.threads_per_gpu

    @property
    def lane_count(self) -> int:
        return self._core.lane_count

    @property
    def _max_workers(self) -> int:
        """The lanes of every device: what ``ThreadPoolExecutor._max_workers`` says of its
        threads. Dask's local scheduler (``dask.config.set(pool=ex, scheduler="threads")``) and
        other clients that size their work to a pool read it."""
        return self._core.lane_count

    @property
    def chunk_bytes(self) -> int:
        return self._core.chunk_bytes

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
    @overload
    def submit(self, fn: AnyKernel, /, *args: Any,
               **kwargs: Any) -> _futures.Future[npt.NDArray[Any]]: ...

    @overload
    def submit(self, fn: Callable[..., _T], /, *args: Any,
               **kwargs: Any) -> _futures.Future[_T]: ...

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> _futures.Future[Any]:
        """Schedules ``fn(*args, **kwargs)`` on a lane; returns a concurrent.futures.Future.

        With a built-in kernel, ``submit(gpupool.kernels.square, x)`` runs in C++."""
        if isinstance(fn, _KERNELS):
            return self._submit_kernel(None, fn, args, kwargs)
        # The one Future of the call; the lane that runs it hands the outcome over.
        future = _Future()
        with self._lock:
            if self._closed or self._forked or _exiting:
                self._check_open()
            self._core.submit_call(fn, args, kwargs, future, None)
        return future

    def submit_to(self, device: int, fn: Callable[..., _T], /, *args: Any,
                  **kwargs: Any) -> _futures.Future[_T]:
        """Like submit, on a lane of executor device ``device`` (0..len(devices)-1)."""
        if not 0 <= device < len(self._ordinals):
            raise IndexError(f"gpupool: device {device} is not one of this executor's "
                             f"{len(self._ordinals)} devices")
        return self._submit(device, fn, args, kwargs)

    @overload
    def map(self, fn: AnyKernel, *iterables: Any, timeout: Optional[float] = None,
            chunksize: int = 1, buffersize: Optional[int] = None, progress: bool = False,
            out: Optional[Iterable[Any]] = None) -> Iterator[npt.NDArray[Any]]: ...

    @overload
    def map(self, fn: Callable[..., _T], *iterables: Iterable[Any],
            timeout: Optional[float] = None, chunksize: int = 1,
            buffersize: Optional[int] = None, progress: bool = False,
            out: Optional[Iterable[Any]] = None) -> Iterator[_T]: ...

    def map(self, fn: Any, *iterables: Any, timeout: Optional[float] = None,
            chunksize: int = 1, buffersize: Optional[int] = None, progress: bool = False,
            out: Optional[Iterable[Any]] = None) -> Iterator[Any]:
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
        holds: neither is windowed. With ``buffersize`` it runs in windows of that many calls."""
        del chunksize  # every item is its own task; kept for Executor.map compatibility
        window_calls = _buffersize(buffersize)
        lazy = buffersize is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        outputs = None if out is None else list(out)
        if outputs is not None and not isinstance(fn, _COMPILED):
            raise TypeError("gpupool: out is for compiled kernels (elementwise, raw) over device "
                            "arrays")
        label = getattr(fn, "name", None) or getattr(fn, "__name__", "map")
        if isinstance(fn, BuiltinKernel):
            if len(iterables) not in (1, 2):
                raise TypeError(
                    f"gpupool: kernel '{fn.name}' takes {fn.arity} iterable(s) of arrays")
            xs, first = _peek(iterables[0], lazy)
            ys = (_peek(iterables[1], lazy)[0] if len(iterables) == 2 else None)
            with self._lock:
                self._check_open()
                if first is _NOTHING or not _device.is_device_array(first):
                    # Host arrays: results yielded in order straight from C++ (no Future per
                    # call; TimeoutError, a failure or Ctrl-C cancels the rest, as below).
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    in_order: Iterator[Any] = self._core.map_kernel_results(
                        fn, xs, ys, left, window_calls, self.map_window_bytes, lazy)
                    if not lazy:
                        self._windowed_maps.add(in_order)
                    if progress:
                        in_order = _with_progress(in_order, _known_length(xs), fn.name)
                    return in_order
            if self.backend != "cuda":
                raise TypeError("gpupool: device arrays need the CUDA backend")
            if not lazy:
                # Device arrays: the inputs are on the GPU already and so go the results, in
                # one pass (see the docstring); buffersize windows it.
                with self._lock:
                    self._check_open()
                    pending = _device.launch(self._core, fn, cast(List[object], xs),
                                             cast(Optional[List[object]], ys), _Future)
                everything = _ordered_results(pending, deadline)
                if progress:
                    everything = _with_progress(everything, len(pending), fn.name)
                return everything
            calls: Iterable[Tuple[Any, ...]] = (zip(xs) if ys is None else _same_length(xs, ys))
            arity = 1 if ys is None else 2
            result_bytes = _array_bytes((first,))

            def submit(batch: List[Tuple[Any, ...]]) -> List[_futures.Future[Any]]:
                columns = list(zip(*batch))
                with self._lock:
                    self._check_open()
                    return _device.launch(self._core, fn, list(columns[0]),
                                          list(columns[1]) if arity == 2 else None, _Future)
        elif isinstance(fn, _COMPILED):
            if lazy:
                first_call, raw = _peek_call(_lazy_calls(iterables))
                on_device = first_call is not None and _on_device(first_call)
                calls = raw if on_device else (tuple(_elementwise_arguments(call))
                                               for call in raw)
            else:
                calls, on_device = _compiled_calls(iterables)
            if outputs is not None and not on_device:
                raise TypeError("gpupool: out is for maps over device arrays; a map over host "
                                "arrays returns new arrays in pinned memory")
            # A call's result is as long as its arrays: its largest array says how large.
            if lazy:
                result_bytes = _array_bytes(first_call or ())
            else:
                listed = cast(List[Tuple[Any, ...]], calls)
                result_bytes = _array_bytes(listed[0]) if listed else 0
            with self._lock:
                self._check_open()
                if on_device and self.backend != "cuda":
                    raise TypeError("gpupool: device arrays need the CUDA backend")
            if on_device and (outputs is not None or not lazy):
                with self._lock:
                    self._check_open()
                    written = _device.map_compiled(self._core, fn, list(calls), _Future,
                                                   out=outputs).results(deadline)
                if progress:
                    written = _with_progress(written, _known_length(calls), fn.name)
                return written

            def submit(batch: List[Tuple[Any, ...]]) -> List[_futures.Future[Any]]:
                with self._lock:
                    self._check_open()
                    if on_device:
                        return list(_device.map_compiled(self._core, fn, batch,
                                                         _Future).futures)
                    futures: List[_futures.Future[Any]] = []
                    try:
                        for args in batch:
                            # The extension makes the future with _Future (stub: "object").
                            futures.append(cast(_Future, self._core.launch_compiled(
                                fn, args, _Future)))
                    except BaseException:
                        for started in futures:
                            started.cancel()
                        raise
                    return futures
        else:
            calls = zip(*iterables)
            if not lazy:
                calls = list(calls)
            result_bytes = 0  # unknown until the first result
            with self._lock:
                self._check_open()

            def submit(batch: List[Tuple[Any, ...]]) -> List[_futures.Future[Any]]:
                return self._submit_calls(fn, iter(batch))

        # Before the first result says how large results are, a few calls per lane.
        first_batch = max(_FIRST_BATCH, 4 * self.lane_count)
        stream = _MapStream(submit, iter(calls), window_calls, self.map_window_bytes,
                            first_batch, deadline, result_bytes)
        if not lazy:
            self._windowed_maps.add(stream)
        results: Iterator[Any] = stream.results()
        if progress:
            results = _with_progress(results, _known_length(calls), label)
        return results

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
                        ys: Optional[List[object]]) -> List[_futures.Future[Any]]:
        """Host arrays go through the pinned pipeline; device arrays stay on their GPU."""
        if xs and _device.is_device_array(xs[0]):
            if self.backend != "cuda":
                raise TypeError("gpupool: device arrays need the CUDA backend")
            return _device.launch(self._core, kernel, xs, ys, _Future)
        return self._core.map_kernel(kernel, xs, ys, _Future)

    def _submit_calls(self, fn: Callable[..., Any],
                      calls: Iterator[Tuple[Any, ...]]) -> List[_futures.Future[Any]]:
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
                    self._core.submit_calls(fn, batch, futures)
        except BaseException:
            for future in pending:
                future.cancel()
            raise

    def _submit(self, device: Optional[int], fn: object, args: Tuple[Any, ...],
                kwargs: Dict[str, Any]) -> _futures.Future[Any]:
        if isinstance(fn, _KERNELS):
            return self._submit_kernel(device, fn, args, kwargs)
        future = _Future()
        with self._lock:
            self._check_open()
            self._core.submit_call(fn, args, kwargs, future, device)
        return future

    def _submit_kernel(self, device: Optional[int], kernel: AnyKernel, args: Tuple[Any, ...],
                       kwargs: Dict[str, Any]) -> _futures.Future[Any]:
        if device is not None:
            raise TypeError("gpupool: kernels over arrays are spread over every device; "
                            "use submit() rather than submit_to()")
        if kwargs:
            raise TypeError(f"gpupool: kernel '{kernel.name}' takes no keyword arguments")
        if isinstance(kernel, BuiltinKernel) and len(args) != kernel.arity:
            raise TypeError(f"gpupool: kernel '{kernel.name}' takes {kernel.arity} array(s)")
        with self._lock:
            self._check_open()
            if isinstance(kernel, _COMPILED):
                arguments = _elementwise_arguments(args)
                if any(_device.is_device_array(a) for a in arguments):
                    if self.backend != "cuda":
                        raise TypeError("gpupool: device arrays need the CUDA backend")
                    return _device.map_compiled(self._core, kernel, [arguments], _Future,
                                                single=True).futures[0]
                # The extension makes the future with _Future; its stub says only "object".
                return cast(_Future, self._core.launch_compiled(kernel, arguments, _Future))
            return self._kernel_futures(
                kernel, [args[0]], [args[1]] if kernel.arity == 2 else None)[0]


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
        lane = current_lane()  # the runner runs only on lanes
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


def _as_number(value: Any) -> Any:
    """`value` as a Python number if it is one (NumPy scalars and 0-d arrays included), else
    None."""
    kind = type(value)
    if kind is int or kind is float:
        return value
    if isinstance(value, numbers.Number):
        return value.item() if hasattr(value, "item") else value
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return None


def _elementwise_arguments(args: Iterable[object]) -> List[object]:
    """One call's arguments: numbers as Python numbers, arrays as they are."""
    return [value if (number := _as_number(value)) is None else number for value in args]


def _elementwise_columns(iterables: Sequence[Any]) -> List[Iterable[object]]:
    """The arguments of a map over an elementwise kernel by parameter, one value per call each:
    a number (a Python number, NumPy scalar or 0-d array) is broadcast to every call as a Python
    number, anything else is an iterable, read once, with one value (an array, or a number) per
    call."""
    numbers = [_as_number(it) for it in iterables]
    columns = [None if n is not None else list(it) for it, n in zip(iterables, numbers)]
    lengths = {len(c) for c in columns if c is not None}
    if not lengths:
        raise TypeError("gpupool: give at least one iterable of arrays")
    if len(lengths) > 1:
        raise ValueError("gpupool: the iterables differ in length")
    count = lengths.pop()
    return [itertools.repeat(n, count) if c is None else c for n, c in zip(numbers, columns)]


def _same_length(*iterables: Iterable[Any]) -> Iterator[Tuple[Any, ...]]:
    """zip() that raises ValueError, when it is read that far, if the iterables differ in
    length (Python 3.9's zip has no ``strict``)."""
    end = object()
    for items in itertools.zip_longest(*iterables, fillvalue=end):
        if any(item is end for item in items):
            raise ValueError("gpupool: the iterables differ in length")
        yield items


def _lazy_calls(iterables: Sequence[Any]) -> Iterator[Tuple[Any, ...]]:
    """The calls of a map over a compiled kernel, read as they are needed: as
    _elementwise_columns, with each number broadcast to every call."""
    numbers = [_as_number(it) for it in iterables]
    if all(n is not None for n in numbers):
        raise TypeError("gpupool: give at least one iterable of arrays")
    columns = [iter(it) for it, n in zip(iterables, numbers) if n is None]
    for values in _same_length(*columns):
        given = iter(values)
        yield tuple(next(given) if n is None else n for n in numbers)


def _compiled_calls(iterables: Sequence[Any]) -> Tuple[List[Tuple[object, ...]], bool]:
    """The calls of a map over an elementwise kernel, and whether they go to the device path:
    the first call has an array on a GPU (then the extension checks every value itself, with no
    Python work per array). Host calls have their numbers as Python numbers."""
    calls = list(zip(*_elementwise_columns(iterables)))
    on_device = bool(calls) and _on_device(calls[0])
    if on_device:
        return calls, True
    return [tuple(_elementwise_arguments(call)) for call in calls], False


def _with_progress(results: Iterable[_R], total: Optional[int], label: object) -> Iterator[_R]:
    # tqdm ships no type annotations (unused-ignore: where its stubs, types-tqdm, are installed).
    from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

    with tqdm(total=total, desc=f"gpupool {label}", unit="task", disable=None) as bar:
        for result in results:
            bar.update(1)
            yield result


_NOTHING = object()
# No limit on a map's calls in flight (the window's bytes still bound it).
_NO_LIMIT = 2**64 - 1
# The least window of a map, in bytes (see Executor.map_window_bytes).
_MAP_WINDOW_FLOOR = 1 << 30
# The least number of calls a map queues before its first result says how large results are.
_FIRST_BATCH = 64


def _buffersize(buffersize: object) -> int:
    """The calls a map may run ahead of its consumer, as Python 3.14's ``buffersize``."""
    if buffersize is None:
        return _NO_LIMIT
    if not isinstance(buffersize, int) or isinstance(buffersize, bool):
        raise TypeError(f"buffersize must be an integer or None, not {buffersize!r}")
    if buffersize < 1:
        raise ValueError("buffersize must be None or > 0")
    return buffersize


def _peek(iterable: Iterable[Any], lazy: bool) -> Tuple[Iterable[Any], Any]:
    """The iterable (a list unless ``lazy``) and its first item (_NOTHING if empty); a lazy
    iterable's first item is read and put back in front."""
    if not lazy:
        items = list(iterable)
        return items, (items[0] if items else _NOTHING)
    iterator = iter(iterable)
    first = next(iterator, _NOTHING)
    if first is _NOTHING:
        return iterator, first
    return itertools.chain((first,), iterator), first


def _peek_call(calls: Iterator[Tuple[Any, ...]]) -> Tuple[Optional[Tuple[Any, ...]],
                                                          Iterator[Tuple[Any, ...]]]:
    first = next(calls, None)
    if first is None:
        return None, calls
    return first, itertools.chain((first,), calls)


def _on_device(call: Sequence[Any]) -> bool:
    return any(_device.is_device_array(a) and _as_number(a) is None for a in call)


def _array_bytes(arguments: Iterable[Any]) -> int:
    """The bytes of the largest array among a call's arguments (0 if none says)."""
    sizes = [getattr(a, "nbytes", 0) for a in arguments]
    return max([n for n in sizes if isinstance(n, int)], default=0)


def _known_length(items: object) -> Optional[int]:
    return len(items) if isinstance(items, (list, tuple)) else None


def _result_bytes(result: object) -> int:
    """What a result holds, as far as it says: an array's ``nbytes``, the sum of those of a
    tuple's, list's or dict's items (one level down), else the object's own size."""
    nbytes = getattr(result, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(result, dict):
        result = list(result.values())
    if isinstance(result, (tuple, list)):
        return sys.getsizeof(result, 64) + sum(
            n if isinstance(n := getattr(item, "nbytes", None), int) else sys.getsizeof(item, 64)
            for item in result)
    return sys.getsizeof(result, 64)


class _MapStream:
    """A map's calls queued as far ahead of its consumer as its window allows.

    The window holds at most ``window_calls`` calls whose results have not been taken, and as
    many as results of the largest size seen so far (at first ``result_bytes``, where the
    caller knows it) fit in ``window_bytes``; before the first result says, ``first_batch``. Calls go ``_SUBMIT_BATCH`` at a time to ``submit``,
    which returns their futures. The first batch is queued here, at the map's call, as concurrent.futures queues
    its calls; the rest as results are taken. Leaving the iteration early (the consumer stops,
    a failure, the timeout, Ctrl-C) cancels what is queued and queues nothing more."""

    def __init__(self, submit: Callable[[List[Tuple[Any, ...]]], List[_futures.Future[Any]]],
                 calls: Iterator[Tuple[Any, ...]], window_calls: int, window_bytes: int,
                 first_batch: int, deadline: Optional[float], result_bytes: int = 0) -> None:
        self._submit = submit
        self._calls = calls
        self._window_calls = window_calls
        self._window_bytes = window_bytes
        self._first_batch = first_batch
        self._deadline = deadline
        self._pending: collections.deque[_futures.Future[Any]] = collections.deque()
        # The largest result taken so far, in bytes (or the size the caller expects); 0 before
        # the first when nothing is expected.
        self._largest = result_bytes
        self._calls_left = True
        self._top_up()

    def _room(self) -> int:
        queued = len(self._pending)
        room = self._window_calls - queued
        if self._largest:
            room = min(room, self._window_bytes // self._largest - queued)
        else:  # nothing known of the results' size yet: the first batch alone
            room = min(room, self._first_batch - queued)
        return max(room, 1 if not queued else 0)

    def _top_up(self) -> None:
        while self._calls_left:
            room = self._room()
            if room <= 0:
                return
            batch = list(itertools.islice(self._calls, min(room, _SUBMIT_BATCH)))
            if not batch:
                self._calls_left = False
                return
            try:
                self._pending.extend(self._submit(batch))
            except BaseException:
                self._cancel()
                raise

    def queue_rest(self) -> None:
        """Queues every call the window has not (the executor is shutting down)."""
        self._window_calls = self._window_bytes = self._first_batch = _NO_LIMIT
        self._largest = max(self._largest, 1)
        self._top_up()

    def _cancel(self) -> None:
        self._calls_left = False
        for future in self._pending:
            future.cancel()
        self._pending.clear()

    def results(self) -> Iterator[Any]:
        try:
            while self._pending:
                future = self._pending.popleft()
                if self._deadline is None:
                    result = _result_or_cancel(future)
                else:
                    result = _result_or_cancel(future,
                                               max(0.0, self._deadline - time.monotonic()))
                del future
                if self._calls_left:  # more to queue: the result says how much fits
                    self._largest = max(self._largest, _result_bytes(result), 1)
                    self._top_up()
                # Handed on without a reference kept here, as concurrent.futures does.
                taken = [result]
                del result
                yield taken.pop()
        finally:
            self._cancel()


def _result_or_cancel(future: _futures.Future[_R], timeout: Optional[float] = None) -> _R:
    # Cancels a future left waiting (timeout, Ctrl-C) and keeps no reference to it or its result
    # once its result is handed on, as concurrent.futures does.
    try:
        try:
            return future.result(timeout)
        finally:
            future.cancel()
    finally:
        del future


def _ordered_results(pending: list[_futures.Future[Any]],
                     deadline: Optional[float]) -> Iterator[Any]:
    """Yields results in order, holding none once handed on; cancels what is left if the
    consumer stops early, a result times out or the wait is interrupted (Ctrl-C)."""
    try:
        pending.reverse()
        while pending:
            if deadline is None:
                yield _result_or_cancel(pending.pop())
            else:
                yield _result_or_cancel(pending.pop(), max(0.0, deadline - time.monotonic()))
    finally:
        for future in pending:
            future.cancel()


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
