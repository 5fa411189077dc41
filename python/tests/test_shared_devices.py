"""One GPU as several devices (``devices=[0, 0]``, or GPUPOOL_DEVICES) and the CPU stand-ins'
copy rate (``cpu_copy_rate``), from Python: on the CPU backend, and the executor's own paths on
CUDA where a GPU is usable (tests/test_shared_devices.cpp has the C++ side on both)."""
import threading
import time

import gpupool
import numpy as np
import pytest

from test_device_map import SCALE, FakeCupyArray, run


def test_one_ordinal_twice_is_two_devices_with_their_own_lanes(backend):
    with gpupool.Executor(threads_per_gpu=2, backend=backend, devices=[0, 0]) as ex:
        assert [(d["id"], d["ordinal"]) for d in ex.devices] == [(0, 0), (1, 0)]
        assert [d["lanes"] for d in ex.devices] == [2, 2]
        assert {ex.submit_to(1, lambda: gpupool.current_lane().device).result()
                for _ in range(10)} == {1}

        # Four calls that each wait for all four to run: only every lane of both devices at
        # once can run them.
        everyone = threading.Barrier(4, timeout=30)

        def meet():
            everyone.wait()
            return gpupool.current_lane().device

        assert sorted(f.result(timeout=60) for f in [ex.submit(meet) for _ in range(4)]) == \
            [0, 0, 1, 1]
        xs = [np.full(20_000, float(i)) for i in range(64)]
        for x, r in zip(xs, ex.map(gpupool.kernels.square, xs)):
            np.testing.assert_array_equal(r, x * x)


def test_a_map_over_device_arrays_of_a_shared_gpu_takes_turns_on_its_devices():
    with gpupool.Executor(threads_per_gpu=1, backend="cpu", devices=[0, 0]) as ex:
        xs = [np.arange(100, dtype=np.float64) + i for i in range(400)]
        with ex.trace() as trace:
            outputs, _, _, _ = run(ex._core, [[FakeCupyArray(x, 0), 2.0] for x in xs],
                                   cupy_type=FakeCupyArray)
        for x, out in zip(xs, outputs):
            np.testing.assert_array_equal(out, x * 2.0)
        assert {r["device"] for r in trace.records()} == {0, 1}


def test_the_devices_variable_names_them_where_the_executor_names_none(monkeypatch):
    monkeypatch.setenv("GPUPOOL_DEVICES", "0,0,0")
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        assert [d["ordinal"] for d in ex.devices] == [0, 0, 0]
    with gpupool.Executor(threads_per_gpu=1, backend="cpu", devices=[0]) as ex:
        assert len(ex.devices) == 1  # the argument wins
    monkeypatch.setenv("GPUPOOL_DEVICES", "0;1")
    with pytest.raises(ValueError, match=r"GPUPOOL_DEVICES must be device ordinals.*'0;1'"):
        gpupool.Executor(threads_per_gpu=1, backend="cpu")


def test_stand_in_copies_take_their_bytes_at_the_copy_rate():
    rate = 64 * 2**20
    xs = [np.full(2**18, 3.0, np.float32) for _ in range(16)]  # 16 MiB each way
    with gpupool.Executor(threads_per_gpu=4, backend="cpu", cpu_copy_rate=rate,
                          chunk_bytes=2**20) as ex:
        start = time.perf_counter()
        results = list(ex.map(gpupool.kernels.square, xs))
        seconds = time.perf_counter() - start
    assert all(np.array_equal(r, x * x) for x, r in zip(xs, results))
    assert seconds >= 16 * 2**20 / rate


@pytest.mark.parametrize("bad, error", [
    (-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
    (41.3, ValueError), (10**400, ValueError), (5e-324, ValueError),
    ("fast", TypeError), (True, TypeError), (None, TypeError)])
def test_a_bad_copy_rate_names_the_parameter(bad, error):
    with pytest.raises(error, match=r"cpu_copy_rate must be bytes per second: 0 \(no limit\) "
                                    r"or a finite number of at least 1024"):
        gpupool.Executor(backend="cpu", cpu_copy_rate=bad)
