"""The concurrent.futures.Future of one gpupool task (see _Future)."""

from __future__ import annotations

import concurrent.futures as _futures
import threading
import time
from concurrent.futures._base import (CANCELLED as _CANCELLED,
                                      CANCELLED_AND_NOTIFIED as _CANCELLED_AND_NOTIFIED,
                                      FINISHED as _FINISHED, PENDING as _PENDING,
                                      RUNNING as _RUNNING)
from typing import Any, Callable, List, Optional

from . import _ext

# How often a waiting result() wakes to let Python handle signals (seconds).
_WAIT_SLICE = 0.05
# Held while a future's Condition is made and while an outcome is set on a future that has none
# (see _Future._made_condition): one lock for every future, held for a few bytecodes.
_condition_making = threading.Lock()


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
    # Its waiters (of `wait`/`as_completed`) and callbacks, made at first use as the Condition
    # is, for the same reason: two lists the collector would track for every future. Future's
    # own code reaches them only with the Condition held, or (callbacks run after an outcome is
    # set) once they can no longer grow.
    _made_waiters: Optional[List[Any]] = None
    _made_callbacks: Optional[List[Callable[[_futures.Future[Any]], object]]] = None

    def __init__(self) -> None:  # Future.__init__, without the Condition and the lists
        self._state = _PENDING
        self._result: Any = None
        self._exception: Optional[BaseException] = None

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        condition = self._made_condition
        if condition is None:
            with _condition_making:
                condition = self._made_condition
                if condition is None:
                    condition = self._made_condition = threading.Condition()
        return condition

    @property
    def _waiters(self) -> List[Any]:  # type: ignore[override]
        waiters = self._made_waiters
        if waiters is None:
            waiters = self._made_waiters = []
        return waiters

    @property
    def _done_callbacks(self) -> List[Callable[[_futures.Future[Any]], object]]:
        callbacks = self._made_callbacks
        if callbacks is None:
            callbacks = self._made_callbacks = []
        return callbacks

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
