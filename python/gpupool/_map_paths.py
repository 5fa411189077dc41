"""How Executor.map runs, one strategy per kind of map: a built-in kernel over host arrays (in
C++, results yielded in order), over device arrays (one pass, or windowed with
``buffersize``), a compiled kernel over device arrays (one pass, or windowed) or over host
arrays (windowed), and Python calls (windowed). Executor.map picks the strategy by the kind of
``fn``; each reads its calls, checks them and returns the iterator of results."""

from __future__ import annotations

import concurrent.futures as _futures
import itertools
import numbers
import time
from typing import (TYPE_CHECKING, Any, Callable, Iterable, Iterator, List, Optional, Sequence,
                    Tuple, Union, cast)

from . import _device
from ._ext import BuiltinKernel, ElementwiseKernel, RawKernel
from ._future import _Future
from ._map_stream import (_FIRST_BATCH, _MapStream, _buffersize, _known_length,
                          _ordered_results, _with_progress)

if TYPE_CHECKING:
    from ._executor import Executor

_COMPILED = (ElementwiseKernel, RawKernel)
_Compiled = Union[ElementwiseKernel, RawKernel]

_Submit = Callable[[List[Tuple[Any, ...]]], List[_futures.Future[Any]]]


class MapRequest:
    """One call of Executor.map, its arguments checked: what every strategy reads."""

    __slots__ = ("executor", "fn", "iterables", "lazy", "window_calls", "deadline", "outputs",
                 "progress", "label", "priority")

    def __init__(self, executor: Executor, fn: Any, iterables: Tuple[Any, ...],
                 timeout: Optional[float], buffersize: Optional[int], progress: bool,
                 out: Optional[Iterable[Any]], priority: Optional[int] = None) -> None:
        self.executor = executor
        # Every call's (checked by the caller); None: the executor's.
        self.priority = priority
        self.fn = fn
        self.iterables = iterables
        self.window_calls = _buffersize(buffersize)
        # With buffersize the iterables are read as the window has room, else whole at once.
        self.lazy = buffersize is not None
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.outputs = None if out is None else list(out)
        if self.outputs is not None and not isinstance(fn, _COMPILED):
            raise TypeError("gpupool: out is for compiled kernels (elementwise, raw) over device "
                            "arrays")
        self.progress = progress
        self.label = getattr(fn, "name", None) or getattr(fn, "__name__", "map")

    def check_open(self) -> None:
        """Raises if the executor takes no more work (call with its lock held)."""
        self.executor._check_open()

    def require_device_arrays(self) -> None:
        if not self.executor._core.takes_cuda_arrays:
            raise TypeError("gpupool: device arrays need the CUDA backend")

    def shown(self, results: Iterator[Any], total: Optional[int]) -> Iterator[Any]:
        """``results``, with a progress bar where the map asked for one."""
        return _with_progress(results, total, self.label) if self.progress else results


def builtin_kernel(m: MapRequest) -> Iterator[Any]:
    """A built-in kernel: over host arrays in C++; over device arrays on their GPUs."""
    fn = cast(BuiltinKernel, m.fn)
    if len(m.iterables) not in (1, 2):
        raise TypeError(f"gpupool: kernel '{fn.name}' takes {fn.arity} iterable(s) of arrays")
    xs, first = _peek(m.iterables[0], m.lazy)
    ys = _peek(m.iterables[1], m.lazy)[0] if len(m.iterables) == 2 else None
    with m.executor._lock:
        m.check_open()
        if first is _NOTHING or not _device.is_device_array(first):
            return _builtin_over_host(m, fn, xs, ys)
    m.require_device_arrays()
    if not m.lazy:
        return _builtin_over_device(m, fn, cast(List[object], xs), cast(Optional[List[object]], ys))
    return _builtin_over_device_windowed(m, fn, xs, ys, first)


def _builtin_over_host(m: MapRequest, fn: BuiltinKernel, xs: Iterable[Any],
                       ys: Optional[Iterable[Any]]) -> Iterator[Any]:
    """Results yielded in order straight from C++ (no Future per call; TimeoutError, a failure
    or Ctrl-C cancels the rest). Called with the executor's lock held."""
    ex = m.executor
    left = None if m.deadline is None else max(0.0, m.deadline - time.monotonic())
    in_order: Iterator[Any] = ex._core.map_kernel_results(
        fn, xs, ys, left, m.window_calls, ex.map_window_bytes, m.lazy, m.priority)
    if not m.lazy:
        ex._windowed_maps.add(in_order)
    return m.shown(in_order, _known_length(xs))


def _builtin_over_device(m: MapRequest, fn: BuiltinKernel, xs: List[object],
                         ys: Optional[List[object]]) -> Iterator[Any]:
    """The inputs are on the GPU already and so go the results, in one pass."""
    ex = m.executor
    with ex._lock:
        m.check_open()
        pending = _device.launch(ex._core, fn, xs, ys, _Future, m.priority)
    return m.shown(_ordered_results(pending, m.deadline), len(pending))


def _builtin_over_device_windowed(m: MapRequest, fn: BuiltinKernel, xs: Iterable[Any],
                                  ys: Optional[Iterable[Any]], first: Any) -> Iterator[Any]:
    ex = m.executor
    calls: Iterable[Tuple[Any, ...]] = zip(xs) if ys is None else _same_length(xs, ys)
    arity = 1 if ys is None else 2

    def submit(batch: List[Tuple[Any, ...]]) -> List[_futures.Future[Any]]:
        columns = list(zip(*batch))
        with ex._lock:
            m.check_open()
            return _device.launch(ex._core, fn, list(columns[0]),
                                  list(columns[1]) if arity == 2 else None, _Future, m.priority)

    return _windowed(m, calls, submit, _array_bytes((first,)))


def compiled_kernel(m: MapRequest) -> Iterator[Any]:
    """An elementwise or raw kernel: over device arrays in one pass (or windowed with
    ``buffersize``), over host arrays windowed."""
    ex = m.executor
    calls: Iterable[Tuple[Any, ...]]
    if m.lazy:
        first_call, raw = _peek_call(_lazy_calls(m.iterables))
        on_device = first_call is not None and _on_device(first_call)
        calls = raw if on_device else (tuple(_elementwise_arguments(call)) for call in raw)
        # A call's result is as long as its arrays: its largest array says how large.
        result_bytes = _array_bytes(first_call or ())
    else:
        listed, on_device = _compiled_calls(m.iterables)
        calls = listed
        result_bytes = _array_bytes(listed[0]) if listed else 0
    if m.outputs is not None and not on_device:
        raise TypeError("gpupool: out is for maps over device arrays; a map over host "
                        "arrays returns new arrays in pinned memory")
    with ex._lock:
        m.check_open()
        if on_device:
            m.require_device_arrays()
    if on_device and (m.outputs is not None or not m.lazy):
        return _compiled_over_device(m, list(calls))
    submit = _compiled_device_batches(m) if on_device else _compiled_host_batches(m)
    return _windowed(m, calls, submit, result_bytes)


def compiled_into(m: MapRequest, out: object) -> object:
    """Executor.map_into: every call at once, each writing its part of ``out``; returns
    ``out`` once all have."""
    if not isinstance(m.fn, _COMPILED):
        raise TypeError("gpupool: map_into takes a compiled kernel (elementwise, raw) over device "
                        "arrays")
    calls, on_device = _compiled_calls(m.iterables)
    if calls and not on_device:
        raise TypeError("gpupool: map_into is for maps over device arrays; a map over host "
                        "arrays returns new arrays in pinned memory (Executor.map)")
    ex = m.executor
    with ex._lock:
        m.check_open()
        m.require_device_arrays()
        written = _device.map_compiled(ex._core, m.fn, calls, _Future, out=out,
                                       priority=m.priority, one_out=True)
    for _ in written.results(m.deadline):
        pass
    return out


def _compiled_over_device(m: MapRequest, calls: List[Tuple[Any, ...]]) -> Iterator[Any]:
    """Every call at once, as one map on the GPUs (with ``out``: into the arrays given)."""
    ex = m.executor
    with ex._lock:
        m.check_open()
        written = _device.map_compiled(ex._core, cast(_Compiled, m.fn), calls, _Future,
                                       out=m.outputs, priority=m.priority).results(m.deadline)
    return m.shown(written, len(calls))


def _compiled_device_batches(m: MapRequest) -> _Submit:
    ex = m.executor

    def submit(batch: List[Tuple[Any, ...]]) -> List[_futures.Future[Any]]:
        with ex._lock:
            m.check_open()
            return list(_device.map_compiled(ex._core, cast(_Compiled, m.fn), batch,
                                             _Future, priority=m.priority).futures)

    return submit


def _compiled_host_batches(m: MapRequest) -> _Submit:
    ex = m.executor

    def submit(batch: List[Tuple[Any, ...]]) -> List[_futures.Future[Any]]:
        futures: List[_futures.Future[Any]] = []
        with ex._lock:
            m.check_open()
            try:
                for args in batch:
                    # The extension makes the future with _Future (stub: "object").
                    futures.append(cast(_Future, ex._core.launch_compiled(m.fn, args, _Future,
                                                                          m.priority)))
            except BaseException:
                for started in futures:
                    started.cancel()
                raise
            return futures

    return submit


def python_calls(m: MapRequest) -> Iterator[Any]:
    """Python callables: queued in batches as the window has room."""
    ex = m.executor
    calls: Iterable[Tuple[Any, ...]] = zip(*m.iterables)
    if not m.lazy:
        calls = list(calls)
    with ex._lock:
        m.check_open()

    def submit(batch: List[Tuple[Any, ...]]) -> List[_futures.Future[Any]]:
        return ex._submit_calls(m.fn, iter(batch), m.priority)

    return _windowed(m, calls, submit, 0)  # results' size unknown until the first


def _windowed(m: MapRequest, calls: Iterable[Tuple[Any, ...]], submit: _Submit,
              result_bytes: int) -> Iterator[Any]:
    """The calls queued through ``submit`` as the map's window has room (see _MapStream)."""
    ex = m.executor
    # Before the first result says how large results are, a few calls per lane.
    first_batch = max(_FIRST_BATCH, 4 * ex.lane_count)
    stream = _MapStream(submit, iter(calls), m.window_calls, ex.map_window_bytes, first_batch,
                        m.deadline, result_bytes)
    if not m.lazy:
        ex._windowed_maps.add(stream)
    return m.shown(stream.results(), _known_length(calls))


# -- reading a map's calls ---------------------------------------------------------------------
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



_NOTHING = object()


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
