"""Host lanes (``Executor(host_lanes=N)``): small calls of built-in kernels over host arrays are
shared between threads computing on the host and the devices' lanes, so that both sides would
finish together by what each side's calls took so far. On the CPU backend, whose stand-in
devices can be slowed with ``cpu_copy_rate``."""

import threading
import xml.etree.ElementTree as ET

import gpupool
import numpy as np
import pytest
from gpupool import _ext
from gpupool._timeline import HOST_DEVICE, timeline_figure

PLACEMENT_KEYS = {"host_tasks", "device_tasks", "host_share", "host_bytes_per_second",
                  "device_bytes_per_second", "host_latency_seconds", "device_latency_seconds"}


def host_executor(host_lanes=2, **kwargs):
    """One stand-in device with two lanes, whatever GPUPOOL_CPU_DEVICES says."""
    kwargs.setdefault("threads_per_gpu", 2)
    return gpupool.Executor(backend="cpu", cpu_devices=1, host_lanes=host_lanes, **kwargs)


def small_arrays(n, size=1000, dtype=np.float64):
    rng = np.random.default_rng(n)
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-1000, 1000, size).astype(dtype) for _ in range(n)]
    return [rng.random(size).astype(dtype) for _ in range(n)]


def test_the_limits_are_the_cores():
    assert _ext.MOST_HOST_LANES == 256
    assert _ext.MOST_HOST_TASK_BYTES == 256 * 1024
    assert _ext.HOST_DEVICE == HOST_DEVICE == -1
    assert _ext.ExecutorOptions().host_lanes == 0


def test_without_host_lanes_nothing_is_placed():
    with gpupool.Executor(threads_per_gpu=2, backend="cpu", cpu_devices=1) as ex:
        assert ex.host_lanes == 0
        xs = small_arrays(20)
        assert all(np.array_equal(r, x * x) for r, x in zip(ex.map(gpupool.kernels.square, xs),
                                                            xs))
        placement = ex.placement()
    assert placement == {key: 0 for key in PLACEMENT_KEYS}


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_a_map_of_small_arrays_is_shared_and_right(dtype):
    xs = small_arrays(200, dtype=dtype)
    ys = small_arrays(200, dtype=dtype)
    with host_executor() as ex:
        assert ex.host_lanes == 2
        squares = list(ex.map(gpupool.kernels.square, xs))
        sums = list(ex.map(gpupool.kernels.add, xs, ys))
        placement = ex.placement()
    for x, y, square, total in zip(xs, ys, squares, sums):
        assert square.dtype == x.dtype and np.array_equal(square, x * x)
        assert total.dtype == x.dtype and np.array_equal(total, x + y)
    assert set(placement) == PLACEMENT_KEYS
    assert placement["host_tasks"] > 0
    assert placement["host_tasks"] + placement["device_tasks"] == 2 * len(xs)
    assert 0 < placement["host_share"] < 1


def test_submit_of_a_builtin_kernel_runs_on_either_side():
    xs = small_arrays(100)
    with host_executor() as ex:
        futures = [ex.submit(gpupool.kernels.scale(3.0), x) for x in xs]
        pairs = [ex.submit(gpupool.kernels.axpy(2.0), x, x) for x in xs]
        assert all(np.array_equal(f.result(), 3.0 * x) for f, x in zip(futures, xs))
        assert all(np.array_equal(f.result(), 2.0 * x + x) for f, x in zip(pairs, xs))
        placement = ex.placement()
    assert placement["host_tasks"] > 0
    assert placement["host_tasks"] + placement["device_tasks"] == 2 * len(xs)


def test_only_calls_within_the_host_task_limit_are_placed():
    # A square of float64 reads and writes 16 bytes an element.
    at_limit = _ext.MOST_HOST_TASK_BYTES // 16
    with host_executor() as ex:
        big = [np.full(at_limit + 1, 2.0) for _ in range(8)]
        assert all(np.array_equal(r, np.full(at_limit + 1, 4.0))
                   for r in ex.map(gpupool.kernels.square, big))
        assert ex.submit(gpupool.kernels.square, big[0]).result()[0] == 4.0
        assert ex.placement()["host_tasks"] == ex.placement()["device_tasks"] == 0
        # The largest call the host lanes may take is a candidate.
        edge = [np.full(at_limit, 3.0) for _ in range(8)]
        assert all(np.array_equal(r, np.full(at_limit, 9.0))
                   for r in ex.map(gpupool.kernels.square, edge))
        placement = ex.placement()
    assert placement["host_tasks"] + placement["device_tasks"] == len(edge)


def test_python_calls_are_never_placed():
    # Python calls are never placed, however small their arrays.
    with host_executor() as ex:
        assert list(ex.map(np.square, small_arrays(10)))
        assert ex.submit(sum, [1, 2]).result() == 3
        assert ex.placement()["host_tasks"] == ex.placement()["device_tasks"] == 0


@pytest.mark.parametrize("bad, error, message", [
    (-1, ValueError, r"not -1$"),
    (_ext.MOST_HOST_LANES + 1, ValueError, rf"not {_ext.MOST_HOST_LANES + 1}$"),
    (1.5, TypeError, r"not 1\.5 \(float\)"),
    ("2", TypeError, r"not '2' \(str\)"),
    (True, TypeError, r"not True \(bool\)"),
    (None, TypeError, r"not None \(NoneType\)"),
])
def test_bad_host_lanes_name_the_parameter_and_what_is_allowed(bad, error, message):
    allowed = rf"host_lanes must be a whole number from 0 \(none\) to {_ext.MOST_HOST_LANES}, "
    with pytest.raises(error, match=allowed + message):
        gpupool.Executor(backend="cpu", host_lanes=bad)


def test_the_limit_of_host_lanes_is_allowed_and_the_core_checks_it_too():
    with host_executor(host_lanes=_ext.MOST_HOST_LANES, threads_per_gpu=1) as ex:
        assert ex.host_lanes == _ext.MOST_HOST_LANES
        assert ex.lane_count == 1  # the host lanes are not the devices'
        assert ex.submit(gpupool.kernels.square, np.arange(4.0)).result().tolist() == [0, 1, 4, 9]
    options = _ext.ExecutorOptions()
    options.backend = "cpu"
    options.host_lanes = _ext.MOST_HOST_LANES + 1
    with pytest.raises(ValueError, match=f"host_lanes must be from 0 to {_ext.MOST_HOST_LANES}"):
        _ext.Executor(options)


def test_the_default_is_the_cpp_default():
    import inspect

    parameters = inspect.signature(gpupool.Executor).parameters
    assert parameters["host_lanes"].default == _ext.ExecutorOptions().host_lanes == 0


def test_a_slow_device_leaves_the_small_calls_to_the_host_lanes():
    # Each stand-in copy of a 4 KiB array lasts milliseconds at this rate; a host lane computes
    # it in microseconds. Placement learns the two rates from each map and moves the calls.
    xs = small_arrays(32, size=512)
    with host_executor(cpu_copy_rate=1_000_000) as ex:
        for _ in range(4):
            assert all(np.array_equal(r, x * x)
                       for r, x in zip(ex.map(gpupool.kernels.square, xs), xs))
        placement = ex.placement()
    assert placement["host_bytes_per_second"] > placement["device_bytes_per_second"] > 0
    assert placement["host_share"] > 0.5
    assert placement["host_tasks"] > placement["device_tasks"]


def test_cancelling_at_shutdown_leaves_no_future_hanging(hold_every_lane):
    ex = host_executor(threads_per_gpu=1)
    _, release = hold_every_lane(ex)
    xs = small_arrays(400, size=256)
    # The device's lane is held: what placement gives the device waits in its queue, what it
    # gives the host lanes runs.
    futures = [ex.submit(gpupool.kernels.square, x) for x in xs]
    threading.Timer(0.2, release.set).start()
    ex.shutdown(wait=True, cancel_futures=True)
    assert all(f.done() for f in futures)
    cancelled = [f for f in futures if f.cancelled()]
    ran = [(f, x) for f, x in zip(futures, xs) if not f.cancelled()]
    assert cancelled and ran
    assert all(np.array_equal(f.result(timeout=0), x * x) for f, x in ran)
    assert ex.placement()["host_tasks"] > 0


def test_cancelling_calls_queued_for_the_host_lanes_leaves_no_future_hanging():
    # More calls than one host lane gets through before shutdown: those still queued for it are
    # cancelled, the rest run, whichever way each race goes.
    ex = host_executor(host_lanes=1, threads_per_gpu=1)
    xs = small_arrays(2000, size=64)
    futures = [ex.submit(gpupool.kernels.square, x) for x in xs]
    ex.shutdown(wait=True, cancel_futures=True)
    assert all(f.done() for f in futures)
    for f, x in zip(futures, xs):
        if not f.cancelled():
            assert np.array_equal(f.result(timeout=0), x * x)


def test_a_trace_shows_the_host_lanes_as_their_own_rows(tmp_path):
    xs = small_arrays(64)
    with host_executor() as ex:
        lanes = ex.lane_count
        with ex.trace() as t:
            results = list(ex.map(gpupool.kernels.square, xs))
        placement = ex.placement()
    assert all(np.array_equal(r, x * x) for r, x in zip(results, xs))
    assert placement["host_tasks"] > 0
    records = t.records()
    host = [r for r in records if r["device"] == _ext.HOST_DEVICE]
    assert len(host) == placement["host_tasks"]
    for r in host:
        # The host lanes' numbers follow the devices' lanes.
        assert lanes <= r["lane"] < lanes + 2
        assert r["kernel"] is not None and r["upload"] is None and r["download"] is None
        assert not r["on_stream"]
        assert r["submitted"] <= r["started"] <= r["kernel"][0] <= r["kernel"][1] <= r["done"]
    assert sum(r["bytes_in"] for r in records) == sum(x.nbytes for x in xs)

    stats = t.stats()
    host_total = [s for s in stats if s["device"] == _ext.HOST_DEVICE and s["lane"] is None]
    assert len(host_total) == 1 and host_total[0]["tasks"] == len(host)
    assert sum(s["tasks"] for s in stats if s["lane"] is not None) == len(records)
    assert any(line.startswith("host ") for line in t.stats_table().splitlines())

    figure = timeline_figure(records, "cpu")
    labels = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    host_rows = [label for label in labels if label.startswith("host")]
    assert host_rows and all(label.startswith("host, lane ") for label in host_rows)
    assert not any("-1" in label for label in labels)
    # After the device's lanes and engines.
    assert labels.index(host_rows[0]) > max(i for i, label in enumerate(labels)
                                            if label.startswith("device"))
    ET.fromstring(t.svg())
    t.write(tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    t.write(tmp_path / "trace.json")
    assert '"host lanes"' in (tmp_path / "trace.json").read_text()


def test_a_trace_of_host_lanes_only_draws_aggregated_too():
    # Many records draw per pixel column; host rows have no stream and no engine rows.
    records = [{"id": i, "device": -1, "lane": 2 + i % 2, "started": float(i),
                "done": i + 0.5, "submitted": float(i), "kernel": (float(i), i + 0.5),
                "bytes_in": 8, "on_stream": False} for i in range(30_000)]
    figure = timeline_figure(records, "cpu")
    labels = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert labels == ["host, lane 2", "host, lane 3"]


def test_host_lanes_beside_each_backends_devices(backend):
    """On CUDA the devices' share goes through the GPU and the host's does not: every result is
    the kernel's either way, from map and from submit."""
    xs = small_arrays(500, size=1024)
    with gpupool.Executor(backend=backend, host_lanes=2) as ex:
        for _ in range(3):
            squares = list(ex.map(gpupool.kernels.square, xs))
            assert all(np.array_equal(r, x * x) for r, x in zip(squares, xs))
        futures = [ex.submit(gpupool.kernels.scale(3.0), x) for x in xs[:50]]
        assert all(np.array_equal(f.result(), 3.0 * x) for f, x in zip(futures, xs))
        placement = ex.placement()
    assert placement["host_tasks"] + placement["device_tasks"] == 3 * len(xs) + 50
    assert placement["host_tasks"] > 0
