"""gpupool.Executor as a concurrent.futures.Executor: ordering, futures, cancellation,
shutdown, exceptions, threads."""

import concurrent.futures as cf
import gc
import threading
import time
import traceback
import weakref

import gpupool
import numpy as np
import pytest


def test_is_a_concurrent_futures_executor(executor, backend):
    assert isinstance(executor, cf.Executor)
    assert executor.backend == backend
    assert executor.threads_per_gpu == 4
    assert executor.lane_count == 4 * len(executor.devices)
    future = executor.submit(pow, 3, 4)
    assert isinstance(future, cf.Future)
    assert future.result(timeout=10) == 81


def test_map_keeps_input_order(executor):
    def slow_square(i):
        time.sleep(0.001 * (i % 3))
        return i * i

    assert list(executor.map(slow_square, range(200))) == [i * i for i in range(200)]


@pytest.mark.parametrize("fails_after", [2, 1500])  # within the first batch of calls; after it
def test_a_map_whose_iterable_fails_runs_none_of_its_calls(backend, hold_every_lane, fails_after):
    # With every lane held, no call of the map can start before the iterable fails: the calls
    # already queued (a whole batch, for the second case) must be cancelled, not run later.
    ex = gpupool.Executor(threads_per_gpu=1, backend=backend)
    try:
        _, release = hold_every_lane(ex)
        ran = []

        def items():
            yield from range(fails_after)
            raise RuntimeError("the caller's iterable failed")

        with pytest.raises(RuntimeError, match="iterable failed"):
            ex.map(ran.append, items())
        release.set()
    finally:
        ex.shutdown(wait=True)
    assert ran == []


def test_a_finalizer_that_submits_while_map_queues_does_not_deadlock(backend):
    # The cyclic collector may run a finalizer in any Python code of map's thread, and one that
    # submits to the same executor must not find map holding the executor's lock.
    ex = gpupool.Executor(threads_per_gpu=2, backend=backend)
    submitted = []

    class Submits:
        def __init__(self):
            self.me = self  # a cycle: freed by the collector, at any allocation after this

        def __del__(self):
            submitted.append(ex.submit(int, 1))

    def items():
        for i in range(5000):
            Submits()
            yield i

    done = []
    mapper = threading.Thread(target=lambda: done.append(list(ex.map(abs, items()))),
                              daemon=True)
    mapper.start()
    mapper.join(60)
    assert not mapper.is_alive(), "map deadlocked on a finalizer's submit"
    assert done == [list(range(5000))]
    gc.collect()
    assert submitted and all(f.result(timeout=30) == 1 for f in submitted)
    ex.shutdown()


def test_map_over_many_batches_of_calls_keeps_order(executor):
    n = 2 * 1024 + 77
    assert list(executor.map(lambda i: -i, range(n))) == [-i for i in range(n)]


def test_map_hands_each_result_on_without_waiting_for_later_calls(executor):
    # Call i waits until the consumer has taken result i - 1: a map that held a result back
    # until later calls had ended would stall here (each call gives up after 10 s).
    taken = [threading.Event() for _ in range(60)]
    taken[0].set()

    def call(i):
        return taken[i].wait(timeout=10)

    started = time.monotonic()
    results = []
    for i, result in enumerate(executor.map(call, range(60))):
        results.append(result)
        if i + 1 < len(taken):
            taken[i + 1].set()
    assert results == [True] * 60
    assert time.monotonic() - started < 8


def test_cancelling_an_ended_future_makes_no_condition(executor):
    future = executor.submit(lambda: 5)
    deadline = time.monotonic() + 30
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert future.done()
    assert future.cancel() is False and not future.cancelled()
    assert future.result() == 5
    # Nobody waited on it: no Condition was ever made (map cancels every future it hands on).
    assert future._made_condition is None


def test_as_completed_wait_and_callbacks_work_unchanged(executor):
    futures = [executor.submit(lambda i=i: i + 1) for i in range(50)]
    assert sorted(f.result() for f in cf.as_completed(futures, timeout=30)) == list(range(1, 51))
    done, not_done = cf.wait(futures, timeout=30)
    assert len(done) == 50 and not not_done
    seen = []
    event = threading.Event()
    f = executor.submit(lambda: "x")
    f.add_done_callback(lambda fut: (seen.append(fut.result()), event.set()))
    assert event.wait(10) and seen == ["x"]


def test_a_future_nobody_waits_on_makes_no_condition(executor):
    """A submit loop's futures make no Condition (most of what the cyclic collector would track
    per future) unless something waits on, cancels or watches them; those still work."""
    x = np.arange(8, dtype=np.float64)
    futures = [executor.submit(gpupool.kernels.square, x) for _ in range(20)]
    futures += [executor.submit(lambda i=i: i) for i in range(20)]
    deadline = time.monotonic() + 30
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert all(f.done() for f in futures)
    for f in futures[:20]:
        assert np.array_equal(f.result(), x * x)
    assert [f.result() for f in futures[20:]] == list(range(20))
    assert all(f._made_condition is None for f in futures)
    # Nor the lists of waiters and callbacks, two more tracked objects per future.
    assert all(f._made_waiters is None and f._made_callbacks is None for f in futures)
    # A waiter makes one, and is woken by an outcome set after it began to wait.
    gate = threading.Event()
    slow = executor.submit(gate.wait, 10)
    waiting = threading.Thread(target=lambda: cf.wait([slow], timeout=10))
    waiting.start()
    deadline = time.monotonic() + 10  # until the waiter has begun to wait (a loaded machine)
    while slow._made_condition is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert slow._made_condition is not None
    called = []
    slow.add_done_callback(lambda f: called.append(f.result()))
    gate.set()
    waiting.join(10)
    assert not waiting.is_alive() and slow.result(timeout=10) is True and called == [True]
    # The waiter's list was made for it (and left empty when it was done), the callback's holds it.
    assert slow._made_waiters == [] and len(slow._made_callbacks or []) == 1


def test_exception_comes_back_with_its_traceback(executor):
    def fails_deep_inside():
        raise KeyError("missing key 17")

    future = executor.submit(fails_deep_inside)
    with pytest.raises(KeyError, match="missing key 17") as info:
        future.result(timeout=10)
    frames = "".join(traceback.format_tb(info.value.__traceback__))
    assert "fails_deep_inside" in frames
    # The executor carries on.
    assert executor.submit(lambda: 5).result(timeout=10) == 5


def blocked_executor(backend, hold_every_lane):
    """An executor with one lane per device, every lane held by a task until the returned event
    is set. Returns the executor, the first holder's future and the event."""
    ex = gpupool.Executor(threads_per_gpu=1, backend=backend)
    holders, release = hold_every_lane(ex)
    return ex, holders[0], release


def test_cancel_a_queued_task(backend, hold_every_lane):
    ex, blocker, release = blocked_executor(backend, hold_every_lane)
    ran = []
    queued = ex.submit(ran.append, 1)
    assert not blocker.cancel()
    assert queued.cancel()
    release.set()
    ex.shutdown()
    assert queued.cancelled() and ran == []
    with pytest.raises(cf.CancelledError):
        queued.result()


def test_shutdown_cancel_futures_resolves_everything_pending(backend, hold_every_lane):
    ex, blocker, release = blocked_executor(backend, hold_every_lane)
    pending = [ex.submit(time.sleep, 0) for _ in range(2000)]
    kernels = [ex.submit(gpupool.kernels.square, np.ones(100)) for _ in range(20)]
    threading.Timer(0.2, release.set).start()
    ex.shutdown(wait=True, cancel_futures=True)
    assert blocker.done()
    assert all(f.cancelled() for f in pending)
    assert all(f.done() for f in kernels)
    with pytest.raises(RuntimeError):
        ex.submit(time.sleep, 0)


def test_shutdown_waits_for_pending_work(backend):
    ex = gpupool.Executor(threads_per_gpu=2, backend=backend)
    counter = []
    lock = threading.Lock()

    def add():
        with lock:
            counter.append(1)

    futures = [ex.submit(add) for _ in range(3000)]
    ex.shutdown(wait=True)
    assert len(counter) == 3000 and all(f.done() for f in futures)


def test_map_timeout(backend, hold_every_lane):
    ex, blocker, release = blocked_executor(backend, hold_every_lane)
    try:
        results = ex.map(gpupool.kernels.square, [np.ones(10)], timeout=0.05)
        with pytest.raises(cf.TimeoutError):
            next(results)
        with pytest.raises(cf.TimeoutError):
            list(ex.map(abs, [-1, -2], timeout=0.05))
    finally:
        release.set()
        ex.shutdown()


def test_many_threads_submitting_at_once(executor):
    def submitter(t):
        fs = [executor.submit(lambda i=i: t * 1000 + i) for i in range(300)]
        arrays = [np.full(64, t + i, dtype=np.int64) for i in range(50)]
        squares = list(executor.map(gpupool.kernels.square, arrays))
        assert all(s[0] == (t + i) ** 2 for i, s in enumerate(squares))
        return sum(f.result() for f in fs)

    with cf.ThreadPoolExecutor(8) as callers:
        sums = list(callers.map(submitter, range(8)))
    assert sums == [t * 1000 * 300 + 300 * 299 // 2 for t in range(8)]


def test_current_lane_only_inside_a_task(executor):
    with pytest.raises(RuntimeError, match="outside a task"):
        gpupool.current_lane()

    def describe():
        lane = gpupool.current_lane()
        return lane.device, lane.index, lane.__cuda_stream__()

    device, index, (version, stream) = executor.submit(describe).result(timeout=10)
    assert 0 <= device < len(executor.devices) and 0 <= index < executor.lane_count
    assert version == 0
    if executor.backend == "cuda":
        assert stream != 0
    kept = executor.submit(gpupool.current_lane).result(timeout=10)
    with pytest.raises(RuntimeError, match="only inside the task"):
        kept.device


def test_submit_to_pins_a_device():
    with gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=3) as ex:
        devices = {ex.submit_to(2, lambda: gpupool.current_lane().device).result()
                   for _ in range(30)}
        assert devices == {2}
        with pytest.raises(IndexError):
            ex.submit_to(3, abs, 1)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(threads_per_gpu=-1), ValueError,
     r"threads_per_gpu must be a whole number from 1 to 256.*not -1"),
    (dict(threads_per_gpu=2.5), TypeError, r"threads_per_gpu must be .*not 2\.5 \(float\)"),
    (dict(threads_per_gpu="4"), TypeError, r"threads_per_gpu must be .*not '4' \(str\)"),
    (dict(threads_per_gpu=True), TypeError, r"threads_per_gpu .*not True \(bool\)"),
    (dict(chunk_bytes=-1), ValueError,
     r"chunk_bytes must be a byte count of at least 1, or 'auto', not -1"),
    (dict(slots_per_lane=0), ValueError, r"slots_per_lane must be a whole number from 1 to 64"),
    (dict(devices=0), TypeError, r"devices must be a list of device ordinals.*not 0 \(int\)"),
    (dict(devices=[]), ValueError, r"devices=\[\] names no device"),
    (dict(devices=[0.5]), TypeError, r"devices\[\] must be an ordinal.*not 0\.5"),
    (dict(backend="tpu"), ValueError, r"backend must be 'cpu', 'cuda' or None.*not 'tpu'"),
    (dict(cpu_devices=-3), ValueError, r"cpu_devices must be .*not -3"),
    (dict(backend=5), TypeError, r"backend must be 'cpu', 'cuda' or None.*not 5 \(int\)"),
    (dict(when_full=True), TypeError, r"when_full must be 'block' or 'raise', not True \(bool\)"),
    (dict(when_full="sometimes"), ValueError, r"when_full must be 'block' or 'raise', not "
                                              r"'sometimes'"),
    (dict(tuning=5), TypeError, r"tuning must be 'auto', 'measured', 'remeasure' or 'fixed', "
                                r"not 5 \(int\)"),
    (dict(quiet=1), TypeError, r"quiet must be True or False, not 1 \(int\)"),
])
def test_bad_options_name_the_parameter_the_value_and_what_is_allowed(kwargs, error, message):
    with pytest.raises(error, match=message):
        gpupool.Executor(**{"backend": "cpu", **kwargs})


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError):
        gpupool.Executor(backend="tpu")
    with pytest.raises(ValueError):
        gpupool.Executor(threads_per_gpu=-2, backend="cpu")
    with pytest.raises(ValueError):
        gpupool.Executor(backend="cpu", devices=[5])
    if not gpupool.cuda_available()[0]:
        with pytest.raises(gpupool.BackendUnavailableError, match="CUDA"):
            gpupool.Executor(backend="cuda")



def test_an_executor_freed_by_its_own_task_stops_cleanly():
    box = {"ex": gpupool.Executor(threads_per_gpu=1, backend="cpu")}
    gone = weakref.ref(box["ex"])

    def drop_the_last_reference():
        del box["ex"]  # the task itself now keeps the executor alive, on its own lane
        return "ok"

    future = box["ex"].submit(drop_the_last_reference)
    assert future.result(timeout=10) == "ok"
    deadline = time.monotonic() + 10
    while gone() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gone() is None


def test_a_task_cannot_shut_down_its_own_executor():
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        future = ex.submit(lambda: ex.shutdown())
        with pytest.raises(ValueError, match="own tasks"):
            future.result(timeout=10)
        assert ex.submit(abs, -3).result(timeout=10) == 3


# -- the per-task path: one Future, outcomes handed over in bulk --------------------------------

def test_each_task_is_one_concurrent_futures_future_whose_outcome_comes_from_its_lane():
    import sys

    with gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1) as ex:
        for fn, args, expected in ((abs, (-3,), 3), (gpupool.kernels.square, (np.full(4, 3.0),), 9)):
            future = ex.submit(fn, *args)
            assert isinstance(future, cf.Future)
            # The future itself is what the extension completes: nothing else holds a callback
            # on it, and no second future stands behind it.
            assert not future._made_callbacks
            for value in vars(future).values():
                behind = getattr(value, "__self__", value)
                assert not isinstance(behind, cf.Future)
                assert type(behind).__name__ != "ArrayFuture"
            assert np.all(future.result(timeout=10) == expected)
            deadline = time.monotonic() + 10
            while sys.getrefcount(future) > 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # the task's own reference goes once it has ended
            assert sys.getrefcount(future) == 2  # only this frame's reference: no chain


@pytest.mark.parametrize("devices", [1, 2])
def test_python_calls_queued_behind_each_other_each_keep_their_own_outcome(devices):
    # A lane runs the Python calls queued behind the one it took in the same hold of the GIL
    # (chained); each still has its own result, exception or cancellation, in any order of
    # lanes, for submit and for submit_to alike.
    release = threading.Event()
    started = threading.Barrier(devices + 1, timeout=10)

    def block():
        started.wait()
        return release.wait(10)

    with gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=devices) as ex:
        blockers = [ex.submit_to(d, block) for d in range(devices)]
        started.wait()  # every lane is inside a call

        def call(i):
            if i % 7 == 3:
                raise KeyError(i)
            return i * i

        futures = [ex.submit(call, i) if i % 2 else ex.submit_to(i % devices, call, i)
                   for i in range(300)]
        cancelled = futures[50::41]
        assert all(f.cancel() for f in cancelled)  # nothing has started: every lane is held
        release.set()
        assert all(b.result(timeout=10) for b in blockers)
        for i, f in enumerate(futures):
            if f in cancelled:
                assert f.cancelled()
            elif i % 7 == 3:
                with pytest.raises(KeyError):
                    f.result(timeout=10)
            else:
                assert f.result(timeout=10) == i * i


def test_python_calls_left_queued_at_shutdown_are_cancelled_each_once():
    release = threading.Event()
    started = threading.Barrier(3, timeout=10)
    ran = []

    def block():
        started.wait()
        return release.wait(10)

    ex = gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1)
    blockers = [ex.submit(block) for _ in range(2)]
    started.wait()  # both lanes are inside a call
    futures = [ex.submit(ran.append, i) for i in range(200)]
    stopping = threading.Thread(target=ex.shutdown, kwargs={"cancel_futures": True})
    stopping.start()
    deadline = time.monotonic() + 10
    while not all(f.cancelled() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    stopping.join(timeout=10)
    assert all(b.result(timeout=10) for b in blockers)
    assert all(f.cancelled() for f in futures) and ran == []
    assert all(f.done() for f in futures)


def test_a_shutdown_that_cancels_while_another_drains_never_runs_a_call_after_a_cancelled_one():
    # shutdown(wait=False) drains the queue; a shutdown(cancel_futures=True) behind it cancels
    # what is still queued. Calls end in order: some run, then the rest cancelled, none of them
    # run after one that was cancelled.
    hold = threading.Event()
    started = threading.Event()

    def hold_the_lane():
        started.set()
        return hold.wait(10)

    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1)
    blocker = ex.submit(hold_the_lane)
    # Running before anything is cancelled (on a busy machine the lane may not have taken it yet,
    # and the cancelling shutdown would cancel it too).
    assert started.wait(10)
    futures = [ex.submit(time.sleep, 0.001) for _ in range(100)]
    ex.shutdown(wait=False)
    cancelling = threading.Thread(target=ex.shutdown, kwargs={"cancel_futures": True})
    cancelling.start()
    time.sleep(0.05)
    hold.set()
    cancelling.join(timeout=10)
    assert blocker.result(timeout=10)
    ends = "".join("C" if f.cancelled() else "R" for f in futures)
    assert all(f.done() for f in futures)
    assert "CR" not in ends, ends


def test_a_trace_ends_while_a_running_call_submits_more_work():
    # The block's end waits for the tasks of the calls that ran, without holding the executor's
    # lock: a call still running may submit.
    submitted = threading.Event()
    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1)
    try:
        hold = threading.Event()

        def submits_later():
            hold.wait(10)
            time.sleep(0.2)  # the block is ending by now
            ex.submit(abs, -1)
            submitted.set()
            return 1

        with ex.trace() as trace:
            first = ex.submit(hold.wait, 10)
            quick = ex.submit(abs, -2)
            late = ex.submit(submits_later)
            hold.set()
            assert quick.result(timeout=10) == 2 and first.result(timeout=10)
        assert late.result(timeout=10) == 1 and submitted.is_set()
        assert len(trace) >= 2
    finally:
        ex.shutdown()


def test_a_trace_block_stops_a_chain_that_began_before_it():
    # A lane running the calls queued behind one it took stops going on once a trace starts:
    # the calls submitted inside the block each get their own task (and record), and the
    # block's end does not wait for the call the old chain is still in.
    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1)
    try:
        first, last = threading.Event(), threading.Event()
        started = threading.Event()

        def held():
            started.set()
            return last.wait(10)

        chain = [ex.submit(first.wait, 10), ex.submit(abs, -1), ex.submit(held)]
        first.set()
        assert started.wait(10)  # the lane is in the third call of its chain
        began = time.monotonic()
        with ex.trace() as trace:
            inside = [ex.submit(abs, -i) for i in range(5)]
            last.set()
            assert [f.result(timeout=10) for f in inside] == list(range(5))
        assert time.monotonic() - began < 5
        assert all(f.result(timeout=10) for f in (chain[0], chain[2]))
        assert len(trace) == 5
    finally:
        ex.shutdown()


def test_a_trace_block_inside_a_call_of_a_chain_ends():
    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1)
    try:
        go = threading.Event()

        def traced():
            with ex.trace():
                pass
            return "ok"

        futures = [ex.submit(go.wait, 10), ex.submit(abs, -1), ex.submit(traced)]
        go.set()
        assert futures[2].result(timeout=10) == "ok"
    finally:
        ex.shutdown()


def test_outcomes_that_complete_together_are_handed_over_under_one_hold_of_the_gil():
    import sys

    # While this thread keeps the GIL, tasks end on both lanes; their futures are then completed
    # in one go by one thread (the one that queued for the GIL first), not by each lane taking
    # the GIL for its own futures.
    slow = gpupool.elementwise(
        "float64 x, int64 n", "float64 y",
        "double a = x; for (long k = 0; k < n; ++k) a = a * 0.9999999 + 1e-9; y = a;", "slow")
    with gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1) as ex:
        ex.submit(slow, np.ones(1), 1).result()  # compiled before the clock starts
        began = time.perf_counter()
        ex.submit(slow, np.ones(64), 200_000).result()
        busy = time.perf_counter() - began  # about what a lane is busy with below
        # Both lanes busy (in C++, without the GIL) while the tasks are queued behind them.
        # (Ten times that, so that a loaded machine still queues the tasks below before they end.)
        blockers = [ex.submit(slow, np.ones(64), 2_000_000) for _ in range(2)]
        futures = [ex.submit(gpupool.kernels.square, np.full(1000, float(i))) for i in range(64)]
        completed_on = []
        for f in futures:
            f.add_done_callback(lambda _: completed_on.append(threading.get_ident()))
        assert not completed_on, "the lanes were not busy long enough for this test"
        interval = sys.getswitchinterval()
        sys.setswitchinterval(60.0)  # no forced switch while the loop below runs
        try:
            end = time.perf_counter() + 30 * busy + 1.0
            while time.perf_counter() < end:  # holds the GIL; the lanes finish the work
                pass
        finally:
            sys.setswitchinterval(interval)
        assert [f.result(timeout=10)[0] for f in futures] == [float(i * i) for i in range(64)]
        for b in blockers:
            b.result(timeout=60)
        assert len(completed_on) == 64
        assert len(set(completed_on)) == 1 and completed_on[0] != threading.get_ident()


def test_a_done_callback_may_wait_for_another_task_of_the_same_executor():
    # The thread handing outcomes over runs callbacks; one that waits for a later task must not
    # hold up that task's own handover.
    with gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1) as ex:
        seen = []
        first = ex.submit(gpupool.kernels.square, np.full(4, 2.0))
        first.add_done_callback(
            lambda f: seen.append(ex.submit(gpupool.kernels.square, np.full(4, 3.0)).result(10)))
        first.result(timeout=10)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen and seen[0][0] == 9.0


def test_a_task_is_in_the_trace_once_its_future_is_done():
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        for _ in range(20):
            with ex.trace() as t:
                ex.submit(int).result()
            assert len(t) == 1


def test_executor_defaults_are_the_cpp_options_defaults():
    import inspect

    from gpupool import _ext

    defaults = _ext.ExecutorOptions()
    parameters = inspect.signature(gpupool.Executor).parameters
    for name in ("slots_per_lane", "device_memory_budget", "cpu_devices", "in_flight_budget",
                 "when_full", "tuning"):
        assert parameters[name].default == getattr(defaults, name)
    # Lanes and chunk size default to "auto", which the C++ options spell 0.
    assert parameters["threads_per_gpu"].default == "auto" and defaults.lanes_per_device == 0
    assert parameters["chunk_bytes"].default == "auto" and defaults.chunk_bytes == 0


def test_the_in_flight_budget_refuses_work_past_it_in_raise_mode():
    # One stand-in device (the budget is per device), whatever GPUPOOL_CPU_DEVICES says.
    with gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1,
                          in_flight_budget=1 << 20, when_full="raise") as ex:
        gate = threading.Event()
        blocker = ex.submit(gate.wait, 30)
        x = np.ones(40_000)  # 320 KB in and 320 KB out: 640 KB of the 1 MiB budget
        first = ex.submit(gpupool.kernels.square, x)
        with pytest.raises(gpupool.OutOfMemoryError, match="in-flight budget"):
            ex.submit(gpupool.kernels.square, x)
        gate.set()
        assert blocker.result(30)
        assert first.result(30)[0] == 1.0
        # Its bytes came back: the same work fits again.
        assert ex.submit(gpupool.kernels.square, x).result(30)[0] == 1.0


def test_the_in_flight_budget_makes_a_submitter_wait_for_room():
    with gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1,
                          in_flight_budget=1 << 20) as ex:
        gate = threading.Event()
        ex.submit(gate.wait, 30)
        x = np.ones(40_000)
        first = ex.submit(gpupool.kernels.square, x)
        admitted = threading.Event()

        def second():
            future = ex.submit(gpupool.kernels.square, x)  # waits: no room until `first` ends
            admitted.set()
            return future.result(30)

        waiter = threading.Thread(target=lambda: second())
        waiter.start()
        assert not admitted.wait(0.3)
        gate.set()
        assert admitted.wait(30)
        waiter.join(30)
        assert first.result(30)[0] == 1.0


def test_in_flight_options_are_checked():
    with pytest.raises(ValueError, match="when_full"):
        gpupool.Executor(backend="cpu", when_full="sometimes")
    with pytest.raises(ValueError, match="in_flight_budget"):
        gpupool.Executor(backend="cpu", in_flight_budget=-1)
