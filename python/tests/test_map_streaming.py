"""Executor.map runs in bounded memory however long it is: calls are queued as far ahead of the
consumer as the map's window allows, and results not yet taken count against it."""

import os
import subprocess
import sys
import textwrap
import threading

import gpupool
import numpy as np
import pytest
from conftest import UNDER_ASAN

# A child that maps a built-in kernel, a compiled kernel or a Python callable over the same few
# 64 MiB arrays listed many times, dropping each result as the loop moves on (as a user streams
# data through), then prints the peak resident size before the map (its inputs made, a first
# map run) and after. With `limit`, the child's data segment is capped first: a map that kept
# its results would fail with MemoryError.
_CHILD = textwrap.dedent("""
    import resource, sys
    kind, backend, count, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if limit:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    import numpy as np
    import gpupool

    arrays = [np.full(8 << 20, float(i)) for i in range(4)]   # 64 MiB each
    inputs = [arrays[i % 4] for i in range(count)]
    twice = gpupool.elementwise("float64 x", "float64 y", "y = x * x", "stream_square")
    fn = {"builtin": gpupool.kernels.square, "compiled": twice, "callable": np.square}[kind]
    with gpupool.Executor(backend=backend, quiet=True) as ex:
        list(ex.map(fn, inputs[:4]))  # warm: the libraries loaded, a kernel compiled
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        seen = 0
        for i, result in enumerate(ex.map(fn, inputs)):
            assert result.shape == (8 << 20,) and result[0] == float(i % 4) ** 2, i
            assert result[-1] == float(i % 4) ** 2, i
            seen += 1
        window = ex.map_window_bytes
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(seen, before, peak, window)
""")


def _stream_in_child(kind, backend, count, limit=0):
    proc = subprocess.run([sys.executable, "-c", _CHILD, kind, backend, str(count), str(limit)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "GPUPOOL_QUIET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen, before, peak, window = (int(v) for v in proc.stdout.split())
    return seen, peak - before, window


@pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer's shadow memory needs an unlimited "
                    "data segment")
@pytest.mark.parametrize("kind", ["builtin", "compiled", "callable"])
def test_a_map_streams_results_many_times_its_memory_limit_on_the_cpu(kind):
    # 96 results of 64 MiB (6 GiB) through a process whose data segment may hold 3 GiB: the
    # inputs (256 MiB), the window (1 GiB of results) and the libraries fit; the results
    # together do not, twice over (a map that kept them would fail with MemoryError).
    limit = 3 << 30
    seen, growth, window = _stream_in_child(kind, "cpu", 96, limit)
    assert seen == 96
    assert window == 1 << 30
    assert 96 * (64 << 20) >= 2 * limit
    # The map holds at most its window of results, and staging: nothing that grows with it.
    assert growth < window + (768 << 20), growth


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["builtin", "compiled", "callable"])
def test_a_map_streams_results_larger_than_host_memory_on_the_gpu(kind):
    # 2,400 results of 64 MiB (150 GiB, more than the GPU machine's host memory) whose peak
    # resident size grows by no more than the window and the staging and pinned caches.
    count = 2400 if kind != "callable" else 240
    seen, growth, window = _stream_in_child(kind, "cuda", count)
    assert seen == count
    assert growth < window + (2 << 30), growth


@pytest.fixture
def cpu_executor():
    with gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1) as ex:
        yield ex


def test_buffersize_reads_the_inputs_lazily_and_bounds_the_calls_ahead(cpu_executor):
    read = []

    def inputs():
        for i in range(100):
            read.append(i)
            yield np.full(16, float(i))

    results = cpu_executor.map(gpupool.kernels.square, inputs(), buffersize=5)
    assert len(read) == 5  # queued at the call, as Python 3.14's buffersize does
    taken = []
    for r in results:
        taken.append(r[0])
        assert len(read) <= len(taken) + 5
    assert taken == [float(i) ** 2 for i in range(100)]


def test_buffersize_bounds_a_python_callable_map(cpu_executor):
    started = []
    lock = threading.Lock()

    def work(i):
        with lock:
            started.append(i)
        return i * 2

    results = cpu_executor.map(work, range(50), buffersize=3)
    out = []
    for value in results:
        out.append(value)
        with lock:
            assert len(started) <= len(out) + 3
    assert out == [2 * i for i in range(50)]


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                        (True, TypeError), ("4", TypeError)])
def test_buffersize_is_checked_as_python_3_14_checks_it(cpu_executor, bad, error):
    with pytest.raises(error, match="buffersize"):
        cpu_executor.map(gpupool.kernels.square, [np.ones(4)], buffersize=bad)
    with pytest.raises(error, match="buffersize"):
        cpu_executor.map(abs, [1], buffersize=bad)


def test_a_kernel_map_window_holds_only_so_many_bytes(cpu_executor):
    # 64 inputs of 32 MiB: the default window (1 GiB of results) holds 32 of them.
    x = np.ones(4 << 20)
    results = cpu_executor._core.map_kernel_results(gpupool.kernels.square, [x] * 64, None,
                                                    None, 2**64 - 1, cpu_executor.map_window_bytes,
                                                    False)
    assert results.queued_calls == 32
    assert results.queued_bytes == 32 * x.nbytes
    n = 0
    for r in results:
        n += 1
        assert results.queued_bytes <= 1 << 30
        assert r[0] == 1.0
    assert n == 64 and results.queued_calls == 0


def test_a_lazy_map_refuses_a_bad_array_when_it_reads_it(cpu_executor):
    def inputs():
        yield np.ones(4)
        yield np.ones(4)
        yield "not an array"

    results = cpu_executor.map(gpupool.kernels.square, inputs(), buffersize=1)
    assert next(results)[0] == 1.0
    with pytest.raises(TypeError):
        list(results)


def test_a_lazy_two_input_map_refuses_inputs_of_different_lengths(cpu_executor):
    ones = [np.ones(4)] * 3
    with pytest.raises(ValueError, match="differ in length"):  # read at the call: room for 8
        cpu_executor.map(gpupool.kernels.add, iter(ones), iter(ones[:2]), buffersize=8)
    results = cpu_executor.map(gpupool.kernels.add, iter(ones), iter(ones[:2]), buffersize=1)
    assert next(results)[0] == 2.0
    with pytest.raises(ValueError, match="differ in length"):
        list(results)


def test_an_early_stop_cancels_what_the_window_queued(cpu_executor):
    started = []

    def record(i):
        started.append(i)
        return i

    results = cpu_executor.map(record, range(1000), buffersize=4)
    assert next(results) == 0
    results.close()  # the calls queued and not started are cancelled, the rest never queued
    cpu_executor.shutdown(wait=True)
    assert 1 <= len(started) <= 5


def test_a_kernel_map_left_early_cancels_what_its_window_queued(cpu_executor, hold_every_lane):
    holders, release = hold_every_lane(cpu_executor)
    results = cpu_executor.map(gpupool.kernels.square, [np.ones(4)] * 100)
    assert results.queued_calls == 100
    results.close()
    release.set()
    for h in holders:
        h.result(timeout=10)
    assert list(results) == []


def test_an_unread_map_runs_its_first_calls_as_concurrent_futures_does(cpu_executor):
    done = []
    cpu_executor.map(done.append, range(10))
    cpu_executor.shutdown(wait=True)
    assert sorted(done) == list(range(10))


def test_a_map_read_after_shutdown_has_run_every_call(cpu_executor):
    # More calls than the window queues at the call: shutdown queues the rest, as the standard
    # library runs every call of a map before shutdown returns.
    x = np.full(4 << 20, 3.0)  # 32 MiB: the window (1 GiB of results) holds 32
    kernel_results = cpu_executor.map(gpupool.kernels.square, [x] * 40)
    assert kernel_results.queued_calls == 32
    ran = []
    callable_results = cpu_executor.map(ran.append, range(1000))
    cpu_executor.shutdown(wait=True)
    assert len(ran) == 1000
    assert [r[0] for r in kernel_results] == [9.0] * 40
    assert list(callable_results) == [None] * 1000


def test_shutdown_cancelling_futures_cancels_what_the_window_held_back(cpu_executor,
                                                                       hold_every_lane):
    holders, release = hold_every_lane(cpu_executor)
    ran = []
    results = cpu_executor.map(ran.append, range(1000))
    threading.Timer(0.2, release.set).start()  # after shutdown has cancelled what is queued
    cpu_executor.shutdown(wait=True, cancel_futures=True)
    for h in holders:
        h.result(timeout=10)
    with pytest.raises(Exception):
        list(results)
    assert ran == []


def test_a_lazy_map_stops_where_it_is_at_shutdown(cpu_executor):
    results = cpu_executor.map(gpupool.kernels.square, (np.ones(4) for _ in range(100)),
                               buffersize=3)
    cpu_executor.shutdown(wait=True)
    taken = 0
    with pytest.raises(RuntimeError, match="shut"):
        for _ in results:
            taken += 1
    assert taken <= 3


def test_the_window_s_next_call_is_queued_before_a_result_is_handed_on(cpu_executor):
    # buffersize=1: while the consumer works on result k, call k + 1 is already queued.
    results = cpu_executor.map(gpupool.kernels.square, [np.ones(4)] * 10, buffersize=1)
    for i in range(9):
        next(results)
        assert results.queued_calls == 1, i
    next(results)
    assert results.queued_calls == 0


def test_a_lazy_compiled_map_reads_its_inputs_as_the_window_has_room(cpu_executor):
    read = []

    def inputs():
        for i in range(30):
            read.append(i)
            yield np.full(8, float(i))

    twice = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = x * a", "lazy_twice")
    results = cpu_executor.map(twice, inputs(), 2.0, buffersize=2)
    out = []
    for r in results:
        out.append(r[0])
        assert len(read) <= len(out) + 3  # the window, and the one read ahead to peek
    assert out == [2.0 * i for i in range(30)]
    with pytest.raises(ValueError, match="differ in length"):
        list(cpu_executor.map(twice, iter([np.ones(2)] * 3), iter([np.ones(2)] * 2),
                              buffersize=2))


def test_a_callable_s_result_counts_the_arrays_it_holds():
    from gpupool._map_stream import _result_bytes

    a = np.ones(1 << 20)  # 8 MiB
    assert _result_bytes(a) == a.nbytes
    assert _result_bytes((a, a)) >= 2 * a.nbytes
    assert _result_bytes([a, 1]) >= a.nbytes
    assert _result_bytes({"x": a, "y": a}) >= 2 * a.nbytes
    assert _result_bytes(None) < 100
