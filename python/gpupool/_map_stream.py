"""A map's calls queued as far ahead of its consumer as its window allows, and its results
handed on in order (see _MapStream)."""

from __future__ import annotations

import collections
import concurrent.futures as _futures
import itertools
import sys
import time
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple, TypeVar

_R = TypeVar("_R")

# Python calls of a map queued by one call to the extension (see Executor._submit_calls).
_SUBMIT_BATCH = 1024
# No limit on a map's calls in flight (the window's bytes still bound it).
_NO_LIMIT = 2**64 - 1
# The least window of a map, in bytes (see Executor.map_window_bytes).
_MAP_WINDOW_FLOOR = 1 << 30
# The least number of calls a map queues before its first result says how large results are.
_FIRST_BATCH = 64


def _with_progress(results: Iterable[_R], total: Optional[int], label: object) -> Iterator[_R]:
    # tqdm ships no type annotations (unused-ignore: where its stubs, types-tqdm, are installed).
    from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

    with tqdm(total=total, desc=f"gpupool {label}", unit="task", disable=None) as bar:
        for result in results:
            bar.update(1)
            yield result



def _buffersize(buffersize: object) -> int:
    """The calls a map may run ahead of its consumer, as Python 3.14's ``buffersize``."""
    if buffersize is None:
        return _NO_LIMIT
    if not isinstance(buffersize, int) or isinstance(buffersize, bool):
        raise TypeError(f"buffersize must be an integer or None, not {buffersize!r}")
    if buffersize < 1:
        raise ValueError("buffersize must be None or > 0")
    return buffersize



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
    caller knows it) fit in ``window_bytes``; before the first result says, ``first_batch``.
    Calls go ``_SUBMIT_BATCH`` at a time to ``submit``, which returns their futures. The first
    batch is queued here, at the map's call, as concurrent.futures queues its calls; the rest as
    results are taken. Leaving the iteration early (the consumer stops, a failure, the timeout,
    Ctrl-C) cancels what is queued and queues nothing more."""

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

