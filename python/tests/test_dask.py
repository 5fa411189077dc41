"""gpupool.dask on a LocalCluster of 2 worker processes on the CPU backend: grouped and per-block
map_blocks and the cluster Executor give NumPy's results, a group moves only the blocks other
workers hold, a worker killed mid-run loses no block, each worker's pool is created once and
shut down with it, and a cluster trace comes back as one Chrome trace with a process per
worker. Without install, a worker (here in this process, so that its pool and its log line can
be seen) makes a default pool once, says so once and shuts it down when it closes."""

import concurrent.futures as cf
import inspect
import json
import logging
import os
import pathlib
import signal
import time

import numpy as np
import pytest

import gpupool

pytest.importorskip("dask.array", reason="dask[array] is not installed (pip install '.[dask]')")
pytest.importorskip("distributed", reason="distributed is not installed (pip install '.[dask]')")

import dask.array as da  # noqa: E402
from distributed import Client, LocalCluster, Worker, get_task_stream, wait  # noqa: E402

import gpupool.dask as gd  # noqa: E402

WORKER_ENV = {"GPUPOOL_BACKEND": "cpu", "GPUPOOL_QUIET": "1"}


def local_cluster(**kwargs):
    # No dashboard (bokeh is not installed either); the scheduler's small HTTP server (health,
    # metrics) takes any free loopback port, so that clusters started side by side never clash.
    options = dict(n_workers=2, processes=True, threads_per_worker=2, host="127.0.0.1",
                   dashboard_address=":0", env=WORKER_ENV)
    return LocalCluster(**dict(options, **kwargs))


@pytest.fixture(scope="module")
def client():
    with local_cluster() as cluster, Client(cluster) as c:
        gd.install(c, threads_per_gpu=2)
        yield c


# -- map_blocks ------------------------------------------------------------------------------------

def test_a_group_of_a_builtin_kernel_is_written_into_its_joined_chunk():
    """The blocks' results land in one array in pinned memory (the lanes download straight into
    it), each in its place (no join afterwards); what cannot be so (a join along another axis,
    blocks of different dtypes) is left to the join."""
    rng = np.random.default_rng(5)
    xs = [rng.random((n, 3)) for n in (4, 1, 6)]
    ys = [rng.random(x.shape) for x in xs]
    spec = gd._KernelSpec.of(gpupool.kernels.axpy(2.0))
    with gpupool.Executor(backend="cpu", threads_per_gpu=2) as pool:
        joined = gd._run_into_one(pool, spec.build(), spec, 0, [list(p) for p in zip(xs, ys)])
        assert joined.shape == (11, 3) and joined.flags.c_contiguous
        assert gpupool.is_pinned(joined)
        assert np.array_equal(joined, np.concatenate([2.0 * x + y for x, y in zip(xs, ys)]))
        assert gd._run_into_one(pool, spec.build(), spec, 1, [list(p) for p in zip(xs, ys)]) \
            is None
        mixed = [[xs[0], ys[0]], [xs[1].astype(np.float32), ys[1].astype(np.float32)]]
        assert gd._run_into_one(pool, spec.build(), spec, 0, mixed) is None


def test_a_group_without_pinned_memory_is_written_into_ordinary_memory(monkeypatch):
    """Where no pinned memory is to be had, the joined chunk is ordinary memory, still filled in
    place by the lanes."""
    def no_pinned(*args, **kwargs):
        raise MemoryError("no pinned memory")

    monkeypatch.setattr(gd._pinned, "empty_pinned", no_pinned)
    xs = [np.arange(n, dtype=np.float64) for n in (3, 5)]
    spec = gd._KernelSpec.of(gpupool.kernels.square)
    with gpupool.Executor(backend="cpu", threads_per_gpu=2) as pool:
        joined = gd._run_into_one(pool, spec.build(), spec, 0, [[x] for x in xs])
    assert joined.flags.owndata and not gpupool.is_pinned(joined)
    assert np.array_equal(joined, np.square(np.concatenate(xs)))


class _Worker:
    """What _bound_pinned_cache reads of a Dask worker."""

    def __init__(self, memory_limit):
        self.memory_manager = type("Manager", (), {"memory_limit": memory_limit})()


@pytest.fixture
def pinned_cache_limit():
    """Puts the process's pinned cache limit back after the test."""
    before = gpupool._ext.pinned_memory_stats()["cache_limit"]
    yield before
    gpupool._ext.set_pinned_cache_limit(before)


def test_a_worker_caps_the_pinned_cache_at_a_share_of_its_memory_limit(monkeypatch,
                                                                         pinned_cache_limit):
    """Freed pinned blocks stay in the cache, resident, where Dask cannot spill them: a worker's
    pool keeps at most 1/8 of the worker's memory limit there, unless the environment chose."""
    monkeypatch.delenv("GPUPOOL_PINNED_CACHE_BYTES", raising=False)
    stats = gpupool._ext.pinned_memory_stats
    gd._bound_pinned_cache(_Worker(None))  # no limit: the cache keeps its own
    gd._bound_pinned_cache(_Worker(0))
    assert stats()["cache_limit"] == pinned_cache_limit
    limit = 8 * 2**20
    assert limit // 8 < pinned_cache_limit
    gd._bound_pinned_cache(_Worker(limit))
    assert stats()["cache_limit"] == limit // 8
    gd._bound_pinned_cache(_Worker(limit * 64))  # never raised again
    assert stats()["cache_limit"] == limit // 8
    gpupool._ext.set_pinned_cache_limit(pinned_cache_limit)
    monkeypatch.setenv("GPUPOOL_PINNED_CACHE_BYTES", str(pinned_cache_limit))
    gd._bound_pinned_cache(_Worker(limit))  # the user's choice stands
    assert stats()["cache_limit"] == pinned_cache_limit
    monkeypatch.setenv("GPUPOOL_PINNED_CACHE_BYTES", "")  # empty: unset, as the core reads it
    gd._bound_pinned_cache(_Worker(limit))
    assert stats()["cache_limit"] == limit // 8


def test_a_cluster_worker_bounds_its_pinned_cache(client):
    """Installed pools cap their worker's pinned cache (the fixture's workers have a memory
    limit)."""
    def cache_and_memory_limit(dask_worker):
        return (gpupool._ext.pinned_memory_stats()["cache_limit"],
                dask_worker.memory_manager.memory_limit)

    for cache, limit in client.run(cache_and_memory_limit).values():
        assert limit and cache <= limit // 8


def test_a_grouped_task_joins_no_results_afterwards(monkeypatch):
    """_run_group of a built-in kernel over NumPy blocks along the first axis never calls
    numpy.concatenate: the pool wrote each result in its place."""
    rng = np.random.default_rng(6)
    xs = [rng.random(n) for n in (5, 7, 3)]
    spec = gd._KernelSpec.of(gpupool.kernels.square)

    def no_join(*args, **kwargs):
        raise AssertionError("the results were joined afterwards")

    with gpupool.Executor(backend="cpu", threads_per_gpu=2) as pool:
        monkeypatch.setattr(gd, "worker_executor", lambda: pool)
        monkeypatch.setattr(gd.np, "concatenate", no_join)
        joined = gd._run_group(spec, 0, xs)
    assert np.array_equal(joined, np.square(np.hstack(xs)))


@pytest.mark.parametrize("blocks_per_task", [1, 7, 500])
def test_grouped_map_blocks_equals_numpy(client, blocks_per_task):
    # 10,007 elements in 101 blocks, the last one short: groups of 7 leave a short group too.
    x = da.random.random(10_007, chunks=100)
    y = gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=blocks_per_task)
    groups = -(-x.numblocks[0] // blocks_per_task)
    assert y.numblocks == (groups,)
    assert len(y.dask.layers[y.name]) == groups  # one Dask task per group, nothing else added
    assert sum(y.chunks[0]) == x.shape[0]
    values, squares = client.compute([x, y], sync=True)  # one graph: the same random blocks
    np.testing.assert_array_equal(squares, values * values)


def _blocks_fetched(dask_worker):
    return sum(len(transfer["keys"]) for transfer in dask_worker.transfer_incoming_log)


def _forget_fetched(dask_worker):
    dask_worker.transfer_incoming_log.clear()


def test_a_group_fetches_only_the_blocks_other_workers_hold(client):
    """As docs/scaling.md says: blocks made one per chunk are spread over the workers, so a
    group gathers most of its blocks to one worker first; blocks made a group to a chunk and
    split sit together, and their groups move nothing."""
    moved = {}
    for made_together in (False, True):
        x = da.random.random(64 * 100, chunks=800 if made_together else 100).rechunk(100)
        x = client.persist(x)
        wait(x)
        client.run(_forget_fetched)
        y = client.persist(gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=8))
        wait(y)
        moved[made_together] = sum(client.run(_blocks_fetched).values())
        values, squares = client.compute([x, y], sync=True)  # gathers: counted before
        np.testing.assert_array_equal(squares, values * values)
        del x, y
    assert moved[True] == 0, moved
    assert moved[False] > 0, moved


def test_grouped_map_blocks_two_arrays_and_other_axis(client):
    x = da.random.random((60, 90), chunks=(20, 10)).astype(np.float32)
    y = da.random.random((60, 90), chunks=(30, 45)).astype(np.float32)  # rechunked to x's
    z = gd.map_blocks(gpupool.kernels.axpy(2.0), x, y, blocks_per_task=4, axis=1)
    assert z.chunks == ((20, 20, 20), (40, 40, 10))
    xs, ys, zs = client.compute([x, y, z], sync=True)
    assert zs.dtype == np.float32
    np.testing.assert_allclose(zs, 2.0 * xs + ys, rtol=1e-6)


def test_built_ins_with_an_int_alpha_over_int_arrays(client):
    # Each built-in is rebuilt on the workers from the table; an int alpha must stay an int
    # there (a float alpha is refused for int arrays), and two-array built-ins take two.
    x = da.arange(1_000, chunks=100, dtype=np.int32)
    y = da.arange(1_000, chunks=100, dtype=np.int32)
    z = gd.map_blocks(gpupool.kernels.axpy(3), x, y, blocks_per_task=3)
    s = x.map_blocks(gd.kernel(gpupool.kernels.scale(-2)))
    zs, ss = client.compute([z, s], sync=True)
    assert zs.dtype == np.int32 and ss.dtype == np.int32
    np.testing.assert_array_equal(zs, 4 * np.arange(1_000, dtype=np.int32))
    np.testing.assert_array_equal(ss, -2 * np.arange(1_000, dtype=np.int32))
    assert gd._KernelSpec.of(gpupool.kernels.add).arity == 2
    assert gd._KernelSpec.of(gpupool.kernels.scale(1)).arity == 1


def test_grouped_map_blocks_compiled_kernel_with_number(client):
    k = gpupool.elementwise("int64 x, int64 a", "int64 y", "y = a * x + 1", name="affine")
    x = da.arange(5_000, chunks=64, dtype=np.int64)
    y = gd.map_blocks(k, x, 3, blocks_per_task=16)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y.compute(), 3 * np.arange(5_000) + 1)


def test_kernel_in_dask_map_blocks(client):
    x = da.random.random(4_000, chunks=250)
    values, squares = client.compute([x, x.map_blocks(gd.kernel(gpupool.kernels.square))],
                                     sync=True)
    np.testing.assert_array_equal(squares, values * values)
    k = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = a * x * x")
    values, scaled = client.compute([x, x.map_blocks(gd.kernel(k), 2.5)], sync=True)
    np.testing.assert_allclose(scaled, 2.5 * values * values)


def test_map_blocks_refuses_bad_arguments():
    x = da.ones(10, chunks=5)
    with pytest.raises(ValueError, match="blocks_per_task"):
        gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=0)
    with pytest.raises(TypeError, match="takes 2 array"):
        gd.map_blocks(gpupool.kernels.add, x)
    with pytest.raises(ValueError, match="differ in shape"):
        gd.map_blocks(gpupool.kernels.add, x, da.ones(11, chunks=5))
    with pytest.raises(TypeError, match="from_array"):
        gd.map_blocks(gpupool.kernels.add, x, np.ones(10))
    with pytest.raises(TypeError, match="gpupool kernel"):
        gd.map_blocks(np.square, x)


def test_off_a_worker_the_local_scheduler_uses_one_process_pool():
    x = da.arange(1_000, chunks=100, dtype=np.float64)
    y = gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=3)
    np.testing.assert_array_equal(y.compute(scheduler="threads"), np.arange(1_000.0) ** 2)
    assert gd.worker_executor() is gd.worker_executor()


# -- the Executor ---------------------------------------------------------------------------------

def test_executor_futures_work_with_the_standard_library(client):
    chunks = [np.random.rand(1_000 + i) for i in range(12)]
    with gd.Executor(client) as ex:
        futures = {ex.submit(gpupool.kernels.square, c): i for i, c in enumerate(chunks)}
        assert all(isinstance(f, cf.Future) for f in futures)
        seen = set()
        for f in cf.as_completed(futures, timeout=60):
            i = futures[f]
            np.testing.assert_array_equal(f.result(), chunks[i] ** 2)
            seen.add(i)
        assert seen == set(range(len(chunks)))
        done, not_done = cf.wait([ex.submit(pow, 2, 10)], timeout=60)
        assert not not_done and done.pop().result() == 1024
        for got, want in zip(ex.map(gpupool.kernels.square, chunks, chunksize=5), chunks):
            np.testing.assert_array_equal(got, want ** 2)
        assert list(ex.map(divmod, range(7), [3] * 7)) == [divmod(i, 3) for i in range(7)]
        assert list(ex.map(divmod, range(7), [3] * 7, chunksize=3)) == \
            [divmod(i, 3) for i in range(7)]


def test_executor_runs_callables_on_a_lane_and_returns_their_errors(client):
    def lane_backend():
        return gpupool.current_lane().backend

    def fail():
        raise KeyError("from the worker")

    with gd.Executor(client) as ex:
        assert ex.submit(lane_backend).result(timeout=60) == "cpu"
        with pytest.raises(KeyError, match="from the worker"):
            ex.submit(fail).result(timeout=60)


def test_executor_hands_every_keyword_to_the_function(client):
    # Including `priority`, which gpupool's own submit keeps for itself: this Executor's
    # submit(fn, *args, **kwargs) runs fn(*args, **kwargs), as concurrent.futures says.
    def ranked(name, priority="none"):
        return f"{name}:{priority}"

    with gd.Executor(client) as ex:
        assert ex.submit(ranked, "a", priority="high").result(timeout=60) == "a:high"
        assert ex.submit(ranked, "b").result(timeout=60) == "b:none"


def test_executor_shutdown_semantics(client):
    ex = gd.Executor(client)
    slow = ex.submit(time.sleep, 0.5)
    ex.shutdown(wait=True)
    assert slow.done() and slow.exception() is None
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(pow, 2, 2)

    ex = gd.Executor(client)
    queued = [ex.submit(time.sleep, 1) for _ in range(12)]  # 4 threads: most must wait
    ex.shutdown(wait=True, cancel_futures=True)
    assert all(f.done() for f in queued)
    assert any(f.cancelled() for f in queued)


# -- the cluster trace ----------------------------------------------------------------------------

def test_cluster_trace_is_one_chrome_trace_with_a_process_per_worker(client, tmp_path):
    x = da.random.random(20_000, chunks=500)
    y = gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=4)
    path = tmp_path / "cluster.json"
    with gd.trace(client, path) as t:
        y.compute()
    workers = sorted(client.scheduler_info()["workers"])
    assert t.workers == workers
    # Every block once, whichever worker ran it (tasks left running by earlier tests may add
    # records of their own).
    assert sum(r["name"] == "square" for r in t.records()) == 40
    chrome = json.loads(path.read_text())
    names = {e["pid"]: e["args"]["name"] for e in chrome["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert len(names) == 2  # one CPU stand-in device per worker
    assert {n.split(" (")[1].split(")")[0] for n in names.values()} == set(workers)
    spans = [e for e in chrome["traceEvents"] if e.get("ph") == "X"]
    assert {e["pid"] for e in spans} == set(names)
    assert min(e["ts"] for e in spans) >= 0
    # The workers ran at the same time: their busy spans, on the common clock, overlap.
    ends = {pid: (min(e["ts"] for e in spans if e["pid"] == pid),
                  max(e["ts"] + e["dur"] for e in spans if e["pid"] == pid)) for pid in names}
    (a0, a1), (b0, b1) = ends.values()
    assert a0 < b1 and b0 < a1
    records = t.records()
    assert {r["worker"] for r in records} == set(workers)
    assert "lane" in t.stats_table()


def test_a_pools_clock_is_lined_up_by_its_submit_alone_not_by_the_tasks_wait():
    with gpupool.Executor(backend="cpu", cpu_devices=1, threads_per_gpu=1) as pool:
        busy = pool.submit(time.sleep, 0.2)  # the first no-op task waits behind it
        offset = gd._clock_offset_us(pool, tries=1)
        assert busy.done()
        windows = []
        with pool.trace() as recording:
            for _ in range(10):
                before = time.time_ns() / 1e3
                future = pool.submit(int)
                windows.append((before, time.time_ns() / 1e3))
                future.result()
        stamps = [r["submitted"] + offset for r in recording.records()]
    assert len(stamps) == len(windows)
    # A wait in the queue (here 0.2 s) is not the clock's error: the stamp, made inside submit,
    # lands within each call's window up to the narrowest window the estimate had.
    slack_us = 1000
    for (before, after), stamp in zip(windows, stamps):
        assert before - slack_us <= stamp <= after + slack_us, (before, stamp, after)


def _assert_squares_ran_inside_their_tasks(trace, stream, tasks, blocks):
    """Each traced square block was queued and ran inside one of the Dask tasks that computed
    squares: the trace and Dask's task stream are both on the scheduler's clock, the pool's
    lined up with its worker's by submit calls and moved by the estimate Dask moves the task
    times by (which a heartbeat may change by milliseconds meanwhile; a wrong origin or a move
    left out is off by far more)."""
    computes = [(s["start"], s["stop"]) for task in stream.data for s in task["startstops"]
                if s["action"] == "compute" and "square" in str(task["key"])]
    squares = [r for r in trace.records() if r["name"] == "square"]
    assert len(computes) == tasks and len(squares) == blocks
    slack = 0.05
    for r in squares:
        submitted = trace.origin + r["submitted"] / 1e6
        done = trace.origin + r["done"] / 1e6
        assert any(begin - slack <= submitted and done <= end + slack
                   for begin, end in computes), (submitted, done, computes)


class _LateClockWorker(Worker):
    """A worker whose estimate of the scheduler's clock's lead over its own stays at 5 s: Dask
    moves the times of its tasks by that much, and so must the cluster trace."""

    @property
    def scheduler_delay(self):
        return 5.0

    @scheduler_delay.setter
    def scheduler_delay(self, value):
        pass


def test_cluster_trace_moves_each_workers_times_as_dask_moves_its_tasks():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      worker_class=_LateClockWorker, dashboard_address=":0") as cluster, \
            Client(cluster) as late_client:
        gd.install(late_client, backend="cpu", threads_per_gpu=2)
        x = da.random.random(8_000, chunks=1_000).persist()
        wait(x)
        y = gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=2)
        with gd.trace(late_client) as t, get_task_stream(late_client) as stream:
            y.compute()
        (address,) = late_client.scheduler_info()["workers"]
        assert t.scheduler_delays == {address: 5.0}
        # Left on the worker's own clock, or moved the wrong way, they would be 5 or 10 s off.
        _assert_squares_ran_inside_their_tasks(t, stream, tasks=4, blocks=8)
        gd._uninstall(late_client)


def test_cluster_trace_origin_lines_records_up_with_dasks_task_stream(client):
    x = da.random.random(20_000, chunks=500).persist()
    wait(x)
    y = gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=4)
    with gd.trace(client) as t, get_task_stream(client) as stream:
        y.compute()
    assert t.origin > 0
    _assert_squares_ran_inside_their_tasks(t, stream, tasks=10, blocks=40)


# -- a worker killed mid-run; the plugin's life ----------------------------------------------------

def _kill_once(block, marker, block_info=None):
    """Kills its own worker process (SIGKILL: no cleanup) the first time it sees block 5."""
    if block_info[0]["chunk-location"][0] == 5:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return block
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
    return block


def test_a_worker_killed_mid_run_loses_no_block(tmp_path):
    marker = str(tmp_path / "killed")
    with local_cluster() as cluster, Client(cluster) as c:
        gd.install(c, threads_per_gpu=2)
        before = {info["pid"] for info in gd.pool_info(c).values()}
        x = da.arange(48 * 2_000, chunks=2_000, dtype=np.float64)
        y = gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=2)  # 24 tasks
        z = y.map_blocks(_kill_once, marker, dtype=np.float64)
        result = z.compute()
        assert os.path.exists(marker)  # a worker did die
        for block in range(48):  # every block, each checked
            part = slice(block * 2_000, (block + 1) * 2_000)
            np.testing.assert_array_equal(result[part], np.arange(48 * 2_000.0)[part] ** 2)
        # The nanny started a new worker process, and the plugin gave it a pool of its own.
        deadline = time.monotonic() + 30
        while len(c.scheduler_info()["workers"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        after = gd.pool_info(c)
        assert len(after) == 2 and all(i["installed"] for i in after.values())
        assert len({i["pid"] for i in after.values()} - before) == 1
        assert all(i["pools_created"] == 1 for i in after.values())


def test_pool_is_created_once_per_worker_and_shut_down_with_it(tmp_path):
    log = tmp_path / "pools.log"

    class LoggingPlugin(gd.PoolPlugin):
        def __init__(self, path, **kwargs):
            super().__init__(**kwargs)
            self.path = path

        def setup(self, worker):
            super().setup(worker)
            with open(self.path, "a") as out:
                out.write(f"setup {os.getpid()} {self.executor.lane_count}\n")

        def teardown(self, worker):
            pool = self.executor
            super().teardown(worker)
            try:
                pool.submit(int)
                state = "open"
            except RuntimeError:
                state = "closed"
            with open(self.path, "a") as out:
                out.write(f"teardown {os.getpid()} {state}\n")

    with local_cluster() as cluster, Client(cluster) as c:
        if not gpupool.cuda_available()[0]:
            # A pool that cannot be made fails the install, and leaves no plugin behind.
            with pytest.raises(gpupool.BackendUnavailableError):
                gd.install(c, backend="cuda")
            assert not gd._installed(c)
        c.register_plugin(LoggingPlugin(str(log), threads_per_gpu=3), name=gd.PLUGIN_NAME)
        x = da.arange(4_000, chunks=100, dtype=np.float64)
        for blocks_per_task in (1, 4, 40):
            y = gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=blocks_per_task)
            np.testing.assert_array_equal(y.compute(), np.arange(4_000.0) ** 2)
        info = gd.pool_info(c)
        assert [i["lanes"] for i in info.values()] == [3, 3]
        assert not any(i["made_on_first_use"] for i in info.values())
        assert [i["pools_created"] for i in info.values()] == [1, 1]
        assert [i["pools_closed"] for i in info.values()] == [0, 0]
        pids = {i["pid"] for i in info.values()}
    lines = pathlib.Path(log).read_text().splitlines()
    assert sorted(lines) == sorted([f"setup {pid} 3" for pid in pids] +
                                   [f"teardown {pid} closed" for pid in pids])


def test_install_refuses_unknown_options():
    with pytest.raises(TypeError, match="threads_per_gpu"):
        gd.PoolPlugin(threads=4)


def test_install_takes_every_option_the_executor_takes():
    # Each of gpupool.Executor's parameters, with its default, reaches the workers' pools.
    parameters = inspect.signature(gpupool.Executor).parameters
    options = {name: p.default for name, p in parameters.items()
               if p.default is not inspect.Parameter.empty}
    assert {"priority", "cpu_copy_rate", "quiet", "devices"} <= set(options)
    gd.PoolPlugin(**options)


# -- without install: a default pool per worker, made on first use --------------------------------

def in_process_cluster(n_workers):
    # Workers in this process (their pools, plugins and log records are visible here), several
    # task threads each so that first uses race.
    return LocalCluster(n_workers=n_workers, processes=False, threads_per_worker=4,
                        dashboard_address=":0")


def first_use_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "gpupool.dask" and r.levelno == logging.WARNING]


def test_kernel_before_install_makes_one_default_pool_and_says_so_once(caplog):
    caplog.set_level(logging.WARNING, logger="gpupool.dask")
    created, closed = gd._pools_created, gd._pools_closed
    with in_process_cluster(1) as cluster, Client(cluster) as c:
        (worker,) = cluster.workers.values()
        x = da.random.random(20_000, chunks=250)  # 80 blocks over 4 task threads
        values, squares = c.compute([x, x.map_blocks(gd.kernel(gpupool.kernels.square))],
                                    sync=True)
        np.testing.assert_array_equal(squares, values * values)
        k = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = a * x")
        grouped = gd.map_blocks(k, x, 3.0, blocks_per_task=8)
        values, tripled = c.compute([x, grouped], sync=True)
        np.testing.assert_allclose(tripled, 3.0 * values)

        assert gd._pools_created == created + 1  # one pool, however many threads raced
        (info,) = gd.pool_info(c).values()
        assert info["installed"] and info["made_on_first_use"]
        (message,) = first_use_warnings(caplog)  # said once
        assert worker.address in message and "default settings" in message
        assert f"{info['lanes']} lanes" in message
        assert "gpupool.dask.install(client" in message  # how to choose the settings

        pool = worker.plugins[gd.PLUGIN_NAME].executor
        assert pool.submit(pow, 2, 5).result(timeout=30) == 32
    # Shut down with the worker, as an installed pool is.
    assert gd._pools_closed == closed + 1
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(int)


def test_install_replaces_a_default_pool_and_trace_makes_one_on_each_worker(caplog):
    caplog.set_level(logging.WARNING, logger="gpupool.dask")
    with in_process_cluster(2) as cluster, Client(cluster) as c:
        x = da.random.random(8_000, chunks=200)
        # The trace starts on each worker's event loop (client.run): that path makes the pools.
        with gd.trace(c) as t:
            values, squares = c.compute([x, x.map_blocks(gd.kernel(gpupool.kernels.square))],
                                        sync=True)
        np.testing.assert_array_equal(squares, values * values)
        assert sum(r["name"] == "square" for r in t.records()) == 40
        assert t.workers == sorted(cluster.scheduler_info["workers"])
        messages = first_use_warnings(caplog)
        assert sorted(next(a for a in t.workers if a in m) for m in messages) == t.workers

        defaults = [w.plugins[gd.PLUGIN_NAME].executor for w in cluster.workers.values()]
        gd.install(c, threads_per_gpu=3)
        for pool in defaults:
            with pytest.raises(RuntimeError, match="after shutdown"):
                pool.submit(int)
        info = gd.pool_info(c)
        assert [(i["lanes"], i["made_on_first_use"]) for i in info.values()] == [(3, False)] * 2
        y = x.map_blocks(gd.kernel(gpupool.kernels.square))
        np.testing.assert_array_equal(y.compute(), x.compute() ** 2)
        assert len(first_use_warnings(caplog)) == 2  # nothing more said after install
