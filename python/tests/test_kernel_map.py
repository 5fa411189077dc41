"""Executor.map over a built-in kernel and host arrays: every call queued at the call, results
handed straight from C++ in input order (no Future per call), and concurrent.futures' map
contract kept: a timeout, a failure, Ctrl-C or an iterator dropped early cancels every call that
has not started."""
import gc
import textwrap
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
