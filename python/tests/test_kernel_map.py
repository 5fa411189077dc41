"""Executor.map over a built-in kernel and host arrays: every call queued at the call, results
handed straight from C++ in input order (no Future per call), and concurrent.futures' map
contract kept: a timeout, a failure, Ctrl-C or an iterator dropped early cancels every call that
has not started."""
import gc
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import run_interrupted

import gpupool


def _kernel_calls(trace, name):
    return sum(1 for r in trace.records() if r["name"] == name)


def test_many_small_arrays_of_every_dtype_come_back_in_order(executor):
    rng = np.random.default_rng(1)
    xs = []
    for i in range(2000):
        dtype = gpupool.kernels.DTYPES[i // 500]  # runs of one dtype, as mixed maps give
        xs.append((rng.random(1 + i % 37) * 100).astype(dtype))
    out = list(executor.map(gpupool.kernels.square, xs))
    assert len(out) == len(xs)
    for x, y in zip(xs, out):
        assert y.dtype == x.dtype and y.shape == x.shape
        np.testing.assert_array_equal(y, x * x)


def test_two_input_kernels_and_shapes_are_kept(executor):
    xs = [np.arange(12, dtype=np.float32).reshape(3, 4) + i for i in range(50)]
    ys = [np.full((3, 4), 2 * i, dtype=np.float32) for i in range(50)]
    for x, y, r in zip(xs, ys, executor.map(gpupool.kernels.add, xs, ys)):
        assert r.shape == (3, 4)
        np.testing.assert_array_equal(r, x + y)
    axpy = gpupool.kernels.axpy(3.0)
    for x, y, r in zip(xs, ys, executor.map(axpy, xs, ys)):
        np.testing.assert_array_equal(r, 3 * x + y)


def test_a_bad_array_is_refused_at_the_call_and_nothing_runs(executor):
    good = [np.ones(8) for _ in range(5)]
    with executor.trace() as trace:
        with pytest.raises(ValueError, match=r"x\[3\] and y\[3\] differ in length"):
            executor.map(gpupool.kernels.add, good, good[:3] + [np.ones(9), np.ones(8)])
        with pytest.raises(TypeError, match=r"x\[2\] is a list"):
            executor.map(gpupool.kernels.square, good[:2] + [[1.0, 2.0]])
    assert _kernel_calls(trace, "add") == _kernel_calls(trace, "square") == 0


def test_a_timeout_cancels_what_has_not_started(hold_every_lane):
    ex = gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1)
    try:
        with ex.trace() as trace:
            _, release = hold_every_lane(ex)
            results = ex.map(gpupool.kernels.square, [np.ones(100) for _ in range(20)],
                             timeout=0.05)
            with pytest.raises(TimeoutError, match="timeout passed before result 0"):
                next(results)
            with pytest.raises(StopIteration):  # the iteration is over, as a generator's
                next(results)
            release.set()
            ex.shutdown(wait=True)
        assert _kernel_calls(trace, "square") == 0
    finally:
        ex.shutdown()


def test_dropping_the_results_early_cancels_the_rest_and_keeps_running_calls_safe():
    # Big enough that calls are still running when the iterator goes: their arrays must stay
    # alive until they end (the extension under ASan would catch a freed one).
    ex = gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1, chunk_bytes=1 << 20)
    try:
        xs = [np.full(1 << 21, float(i)) for i in range(40)]
        with ex.trace() as trace:
            results = ex.map(gpupool.kernels.square, xs)
            first = next(results)
            del results
            gc.collect()
            del xs  # the only other reference to the inputs of calls still running
            ex.shutdown(wait=True)
        assert first[0] == 0.0 and first.shape == (1 << 21,)
        ran = {r["id"] for r in trace.records() if r["name"] == "square"}
        assert 1 <= len(ran) < 40 * 16  # pieces of the calls that had started, not all of them
    finally:
        ex.shutdown()


def test_a_failed_call_raises_its_error_and_cancels_the_rest(monkeypatch):
    monkeypatch.setenv("GPUPOOL_FAULTS", "launch=1,seed=3")  # every launch fails
    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1)
    monkeypatch.delenv("GPUPOOL_FAULTS")
    try:
        results = ex.map(gpupool.kernels.square, [np.ones(10) for _ in range(50)])
        with pytest.raises(gpupool.GpupoolError, match="injected fault"):
            next(results)
        assert list(results) == []
    finally:
        ex.shutdown()


def test_results_are_numpy_arrays_that_own_their_memory(executor):
    results = executor.map(gpupool.kernels.scale(2.0), [np.arange(5.0) for _ in range(3)])
    assert results.__length_hint__() == 3
    arrays = list(results)
    assert results.__length_hint__() == 0
    del results
    gc.collect()
    for a in arrays:
        assert isinstance(a, np.ndarray) and a.flags.c_contiguous and a.flags.writeable
        np.testing.assert_array_equal(a, 2 * np.arange(5.0))
        a += 1  # the caller's to change
    assert gpupool.is_pinned(arrays[0])


def test_ctrl_c_while_waiting_for_a_result_raises_and_cancels_the_rest():
    code = textwrap.dedent("""
        import os, signal, threading, time
        import gpupool, numpy as np
        signal.signal(signal.SIGINT, signal.default_int_handler)
        ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1)
        release = threading.Event()
        started = threading.Event()
        def hold():
            started.set()
            release.wait(30)
        holder = ex.submit(hold)
        started.wait(10)
        def interrupt():
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)
        with ex.trace() as trace:
            results = ex.map(gpupool.kernels.square, [np.ones(10) for _ in range(8)])
            threading.Thread(target=interrupt).start()
            began = time.monotonic()
            try:
                list(results)
                print("not interrupted")
            except KeyboardInterrupt:
                print(f"interrupted after {time.monotonic() - began:.3f}", flush=True)
            release.set()
            ex.shutdown(wait=True)
        print("ran", sum(1 for r in trace.records() if r["name"] == "square"), flush=True)
    """)
    seconds, ran = run_interrupted(code, timeout=120)
    assert seconds < 1.5 and ran == 0


def test_close_and_a_timeout_already_passed_behave_as_concurrent_futures(executor):
    results = executor.map(gpupool.kernels.square, [np.ones(10) for _ in range(3)])
    results.close()  # as a generator's close(): what has not started is cancelled
    assert list(results) == []
    results = executor.map(gpupool.kernels.square, [np.ones(10)], timeout=-1)
    try:
        assert list(results)[0][0] == 1.0  # ready at the first look: no wait, no timeout
    except TimeoutError:
        pass  # not ready at once: the timeout had passed, as the standard library's says


def test_one_map_read_from_two_threads_at_once_is_refused(hold_every_lane):
    import threading

    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1)
    try:
        _, release = hold_every_lane(ex)
        results = ex.map(gpupool.kernels.square, [np.ones(10) for _ in range(4)])
        got, refused = [], []

        def read():
            try:
                got.append(next(results))
            except ValueError as e:
                refused.append(str(e))

        readers = [threading.Thread(target=read) for _ in range(2)]
        for reader in readers:
            reader.start()
        # The lanes are held, so the first reader waits inside next() until the second is
        # refused.
        deadline = time.monotonic() + 10
        while not refused and time.monotonic() < deadline:
            time.sleep(0.01)
        assert refused and "being read by another thread" in refused[0]
        release.set()
        for reader in readers:
            reader.join(10)
        assert len(got) == 1 and got[0][0] == 1.0
        assert len(list(results)) == 3  # the others, once
    finally:
        ex.shutdown()


def test_compiled_maps_read_each_iterable_once_and_take_numbers_of_any_kind(executor):
    k = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = x * a", "kernel_map_scale")
    xs = [np.arange(5.0) + i for i in range(4)]
    # Generators: read once (a second read would find them empty).
    got = list(executor.map(k, (x for x in xs), 2.0))
    assert len(got) == 4 and all(np.array_equal(g, x * 2.0) for g, x in zip(got, xs))
    got = list(executor.map(k, (x for x in xs), (a for a in [1.0, 2.0, 3.0, 4.0])))
    assert all(np.array_equal(g, x * a) for g, x, a in zip(got, xs, [1.0, 2.0, 3.0, 4.0]))
    # A NumPy scalar or 0-d array broadcast to every call is a number.
    for number in (np.float64(3.0), np.array(3.0)):
        got = list(executor.map(k, xs, number))
        assert all(np.array_equal(g, x * 3.0) for g, x in zip(got, xs))


# The small results of calls queued together share pinned slabs (at most 64 results, 1 MiB),
# each result a view whose base keeps its slab alive.
SLAB_CALLS = 64


def test_small_results_are_views_of_shared_slabs_yet_independent(executor):
    xs = [np.full(100, float(i)) for i in range(3 * SLAB_CALLS)]
    out = list(executor.map(gpupool.kernels.square, xs))
    bases = {id(r.base) for r in out}
    assert all(r.base is not None for r in out)
    assert len(bases) < len(out)  # shared: far fewer slabs than results
    for r in out:
        assert r.flags.c_contiguous and r.flags.writeable and r.shape == (100,)
    out[1][:] = -1.0  # writing one result changes none of its neighbours
    out[2] += 1
    np.testing.assert_array_equal(out[0], np.full(100, 0.0))
    np.testing.assert_array_equal(out[1], np.full(100, -1.0))
    np.testing.assert_array_equal(out[2], np.full(100, 5.0))
    np.testing.assert_array_equal(out[3], np.full(100, 9.0))
    assert gpupool.is_pinned(out[5])


def test_slab_results_outlive_the_map_and_the_executor_and_go_in_any_order():
    gc.collect()
    before = gpupool._ext.pinned_bytes_in_use()  # the executor's staging is pinned too
    ex = gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1)
    xs = [np.arange(50, dtype=np.float32) + i for i in range(5 * SLAB_CALLS)]
    expected = [x * x for x in xs]
    results = ex.map(gpupool.kernels.square, xs)
    out = list(results)
    del results
    ex.shutdown(wait=True)
    del ex, xs
    gc.collect()
    assert gpupool._ext.pinned_bytes_in_use() > before
    rng = np.random.default_rng(7)
    alive = dict(enumerate(out))
    del out
    for i in rng.permutation(len(alive)):
        del alive[int(i)]
        if len(alive) % 37 == 0:
            gc.collect()
            for j, r in alive.items():
                np.testing.assert_array_equal(r, expected[j])
        if len(alive) == 1:
            # A result kept alone keeps its slab (at most 1 MiB), not the others.
            (kept,) = alive.values()
            assert 0 < gpupool._ext.pinned_bytes_in_use() - before <= 1 << 20
            np.testing.assert_array_equal(kept, expected[next(iter(alive))])
            del kept
    r = None  # the loop's last reference
    gc.collect()
    assert gpupool._ext.pinned_bytes_in_use() == before


@pytest.mark.parametrize("shapes", ["same", "mixed", "zero_d", "empty", "all_empty"])
def test_slab_results_keep_every_shape_and_dtype(executor, shapes):
    rng = np.random.default_rng(3)
    xs = []
    for i in range(4 * SLAB_CALLS):
        dtype = gpupool.kernels.DTYPES[(i // 40) % 4]  # dtype changes inside slabs' runs
        shape = {"same": (3, 5), "mixed": ((2, 3), (7,), (1, 4, 2), (6, 1))[i % 4],
                 "zero_d": (), "empty": ((0,), (3, 0), (5,))[i % 3], "all_empty": (0,)}[shapes]
        xs.append((rng.random(shape) * 10).astype(dtype))
    out = list(executor.map(gpupool.kernels.square, xs))
    assert len(out) == len(xs)
    for x, r in zip(xs, out):
        assert isinstance(r, np.ndarray) and r.dtype == x.dtype and r.shape == x.shape
        assert r.flags.c_contiguous and r.flags.writeable
        np.testing.assert_array_equal(r, x * x)
    ys = [x + 1 for x in xs]
    for x, y, r in zip(xs, ys, executor.map(gpupool.kernels.add, xs, ys)):
        assert r.shape == x.shape
        np.testing.assert_array_equal(r, x + y)


def test_a_failure_inside_a_slab_hands_on_the_results_before_it(monkeypatch):
    # Launches of one call each (32 KiB arrays, 32 KiB slots); seed 2 fails the 14th launch,
    # inside the first slab (32 results of 32 KiB): the 13 before it come back, then the error.
    monkeypatch.setenv("GPUPOOL_FAULTS", "launch=0.05,seed=2")
    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1, chunk_bytes=1 << 15)
    monkeypatch.delenv("GPUPOOL_FAULTS")
    try:
        xs = [np.full(4096, float(i)) for i in range(200)]
        results = ex.map(gpupool.kernels.square, xs)
        got = []
        with pytest.raises(gpupool.GpupoolError, match="injected fault"):
            for r in results:
                got.append(r)
        assert 0 < len(got) % 32 and len(got) < 200
        assert list(results) == []
        ex.shutdown(wait=True)
        gc.collect()
        for i, r in enumerate(got):  # their slab is still theirs
            np.testing.assert_array_equal(r, np.full(4096, float(i) ** 2))
    finally:
        ex.shutdown()


def test_a_map_cancelled_inside_a_slab_keeps_what_it_handed_on(hold_every_lane):
    gc.collect()
    before = gpupool._ext.pinned_bytes_in_use()  # the executor's staging is pinned too
    ex = gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1)
    try:
        xs = [np.full(16, float(i)) for i in range(3 * SLAB_CALLS)]
        results = ex.map(gpupool.kernels.square, xs)
        first = [next(results) for _ in range(10)]  # inside the first slab
        results.close()
        assert list(results) == []
        # Queued behind held lanes and closed: no call of it runs, and once it is dropped every
        # slab it had is given back, while the lanes are still held.
        holders, release = hold_every_lane(ex)
        gc.collect()
        level = gpupool._ext.pinned_bytes_in_use()
        held = ex.map(gpupool.kernels.square, xs)
        assert gpupool._ext.pinned_bytes_in_use() > level  # its slabs
        held.close()
        assert list(held) == []
        del held
        gc.collect()
        assert gpupool._ext.pinned_bytes_in_use() == level
        release.set()
        for h in holders:
            h.result(timeout=10)
        ex.shutdown(wait=True)
        del results
        gc.collect()
        for i, r in enumerate(first):
            np.testing.assert_array_equal(r, np.full(16, float(i) ** 2))
        del first, r
        gc.collect()
        assert gpupool._ext.pinned_bytes_in_use() == before
    finally:
        ex.shutdown()


def test_a_map_of_small_arrays_dropped_early_keeps_running_calls_safe():
    # Slabs that lanes still write into when the iterator goes: their memory must stay until the
    # calls end (the extension under ASan would catch a freed one).
    gc.collect()
    before = gpupool._ext.pinned_bytes_in_use()  # the executor's staging is pinned too
    ex = gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1)
    try:
        xs = [np.full(2048, float(i)) for i in range(4000)]
        results = ex.map(gpupool.kernels.square, xs)
        first = next(results)
        del results
        gc.collect()
        del xs
        ex.shutdown(wait=True)
        np.testing.assert_array_equal(first, np.zeros(2048))
        del first
        gc.collect()
        assert gpupool._ext.pinned_bytes_in_use() == before
    finally:
        ex.shutdown()


@pytest.mark.parametrize("lazy", [False, True])
def test_slabs_stay_within_the_window(lazy):
    ex = gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1)
    try:
        xs = [np.full(512, float(i)) for i in range(500)]  # 4 KiB each
        window_calls, window_bytes = 100, 40 * xs[0].nbytes * (2 if lazy else 1)
        inputs = iter(xs) if lazy else xs
        results = ex._core.map_kernel_results(gpupool.kernels.square, inputs, None, None,
                                              window_calls, window_bytes, lazy)
        per_call = xs[0].nbytes * (2 if lazy else 1)
        for i in range(len(xs)):
            assert results.queued_calls <= 40
            assert results.queued_bytes == results.queued_calls * per_call <= window_bytes
            np.testing.assert_array_equal(next(results), np.full(512, float(i) ** 2))
        assert results.queued_calls == 0
        with pytest.raises(StopIteration):
            next(results)
    finally:
        ex.shutdown()


def test_arrays_read_otherwise_than_as_plain_numpy_arrays_give_the_same_results(executor):
    class Sub(np.ndarray):
        pass

    readonly = np.arange(6.0)
    readonly.flags.writeable = False
    xs = [readonly, np.arange(6.0).view(Sub), memoryview(np.arange(6.0)),
          np.arange(12.0)[::2].copy(), np.arange(6, dtype=np.int64), np.arange(6, dtype=np.intc)]
    for x, r in zip(xs, executor.map(gpupool.kernels.square, xs)):
        np.testing.assert_array_equal(r, np.asarray(x) ** 2)
        assert r.dtype == np.asarray(x).dtype
    for bad, error, message in [(np.arange(12.0)[::2], ValueError, "not C-contiguous"),
                                (np.arange(6.0).astype(">f8"), TypeError, r"x\[0\]"),
                                (np.arange(6, dtype=np.uint8), TypeError, "unsupported dtype")]:
        with pytest.raises(error, match=message):
            executor.map(gpupool.kernels.square, [bad])


def _window_of_four(ex, xs):
    # A map whose window holds four calls, read whole at the call (as Executor.map makes it with
    # a window of four calls and no byte bound).
    return ex._core.map_kernel_results(gpupool.kernels.square, xs, None, None, 4, 1 << 40, False)


@pytest.mark.parametrize("then", ["read", "close"])
def test_queueing_the_rest_beside_a_reader(hold_every_lane, then):
    # Executor.shutdown queues what a map's window has not (queue_rest) while another thread may
    # read the map: that queueing waits for room in the in-flight budget with the GIL let go.
    # Meanwhile the reader takes the results queued before it, and waits for the others.
    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", cpu_devices=1,
                          in_flight_budget=1 << 16)
    try:
        xs = [np.full(1024, float(i)) for i in range(100)]
        m = _window_of_four(ex, xs)
        assert m.queued_calls == 4
        holders, release = hold_every_lane(ex)
        queueing = threading.Thread(target=m.queue_rest)
        queueing.start()
        deadline = time.monotonic() + 10
        while m.queued_calls < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert m.queued_calls == 100  # pushed, and waiting for the budget (the lane is held)
        first = [next(m) for _ in range(4)]
        for x, r in zip(xs, first):
            np.testing.assert_array_equal(r, x * x)
        if then == "close":
            m.close()
        release.set()
        queueing.join(timeout=10)
        assert not queueing.is_alive()
        rest = list(m)
        if then == "close":
            assert rest == []
        else:
            assert len(rest) == 96
            for x, r in zip(xs[4:], rest):
                np.testing.assert_array_equal(r, x * x)
        for h in holders:
            h.result(timeout=10)
    finally:
        ex.shutdown()


@pytest.mark.parametrize("buffersize", [None, 64, 4])
def test_results_refilled_as_the_consumer_takes_them_still_share_slabs(buffersize):
    # A full window is topped up once a slab's worth of calls (or half a smaller window) is
    # free, not at every result: a long map of small arrays, past its first window, still hands
    # on views of shared slabs rather than an array of its own per result.
    with gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1) as ex:
        xs = [np.full(100, float(i)) for i in range(1000)]
        kwargs = {} if buffersize is None else {"buffersize": buffersize}
        results = list(ex.map(gpupool.kernels.square, xs, **kwargs))
        for x, r in zip(xs, results):
            np.testing.assert_array_equal(r, x * x)
        slabs = {id(r.base) for r in results}
        per_slab = min(SLAB_CALLS, max(1, (buffersize or SLAB_CALLS) // 2))
        assert len(slabs) <= 2 * len(xs) // per_slab + 2
