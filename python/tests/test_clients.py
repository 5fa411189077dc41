"""gpupool.Executor handed to other libraries that take a concurrent.futures.Executor: Dask's
local threaded scheduler (``dask.config.set(pool=ex)``), asyncio's ``run_in_executor``,
tornado's ``run_on_executor`` and a dask.distributed worker's ``executor=``. Each runs its work
on the pool's lanes and gives the right results; where a client accepts only a
ThreadPoolExecutor (asyncio's default executor), it refuses the pool, as docs/python.md says."""

import asyncio
import concurrent.futures as cf
import threading

import numpy as np
import pytest

import gpupool

# The dask extra brings tornado (distributed needs it).
_TORNADO_MISSING = "tornado is not installed (pip install '.[dask]')"


def _lane_index(value):
    """``value`` and the index of the lane the call ran on (RuntimeError off a lane)."""
    return value, gpupool.current_lane().index


# -- Dask's local threaded scheduler --------------------------------------------------------------

def test_dask_threads_scheduler_runs_arrays_and_delayed_on_the_pool(executor):
    dask = pytest.importorskip("dask", reason="dask is not installed (pip install '.[dask]')")
    da = pytest.importorskip("dask.array", reason="dask is not installed (pip install '.[dask]')")
    assert executor._max_workers == executor.lane_count
    with dask.config.set(pool=executor, scheduler="threads"):
        x = da.arange(1_000_000, chunks=50_000, dtype=np.float64)
        assert (x ** 2).sum().compute() == np.sum(np.arange(1_000_000, dtype=np.float64) ** 2)
        ones = da.ones((600, 700), chunks=(100, 70))
        assert (ones ** 2).sum().compute() == 600 * 700

        calls = [dask.delayed(_lane_index)(i) for i in range(40)]
        total = dask.delayed(lambda pairs: (sum(v * v for v, _ in pairs), {i for _, i in pairs}))
        squares, lanes = total(calls).compute()
        bag = pytest.importorskip(
            "dask.bag", reason="dask is not installed (pip install '.[dask]')"
        ).from_sequence(range(30), npartitions=6)
        bag_pairs = bag.map(_lane_index).compute()
    assert squares == sum(i * i for i in range(40))
    assert [v for v, _ in bag_pairs] == list(range(30))
    # Every call ran on a lane of this pool (current_lane raises anywhere else).
    lanes |= {i for _, i in bag_pairs}
    assert lanes <= set(range(executor.lane_count))


def test_dask_threads_scheduler_raises_a_task_error_from_the_pool(executor):
    dask = pytest.importorskip("dask", reason="dask is not installed (pip install '.[dask]')")

    def fail(i):
        raise KeyError(f"task {i}")

    with dask.config.set(pool=executor, scheduler="threads"):
        with pytest.raises(KeyError, match="task 3"):
            dask.delayed(fail)(3).compute()
        # The pool is still usable for the next graph.
        assert dask.delayed(pow)(2, 10).compute() == 1024


# -- asyncio ---------------------------------------------------------------------------------------

def test_asyncio_run_in_executor_awaits_results_and_errors_from_lanes(executor):
    async def main():
        loop = asyncio.get_running_loop()
        pairs = await asyncio.gather(*[loop.run_in_executor(executor, _lane_index, i)
                                       for i in range(50)])
        chunk = np.arange(10_000, dtype=np.float64)
        squared = await loop.run_in_executor(executor, gpupool.kernels.square, chunk)
        with pytest.raises(ZeroDivisionError):
            await loop.run_in_executor(executor, divmod, 1, 0)
        return pairs, chunk, squared

    pairs, chunk, squared = asyncio.run(main())
    assert [v for v, _ in pairs] == list(range(50))
    assert {i for _, i in pairs} <= set(range(executor.lane_count))
    np.testing.assert_array_equal(squared, chunk * chunk)


def test_asyncio_cancelling_an_await_cancels_the_queued_call(hold_every_lane):
    with gpupool.Executor(threads_per_gpu=2, backend="cpu") as ex:
        ran = threading.Event()
        holders, release = hold_every_lane(ex)

        async def main():
            loop = asyncio.get_running_loop()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(loop.run_in_executor(ex, ran.set), 0.2)

        asyncio.run(main())
        release.set()
        cf.wait(holders, timeout=30)
        ex.shutdown(wait=True)
        # Every lane was busy, so the call was still queued when asyncio cancelled it.
        assert not ran.is_set()


def test_asyncio_refuses_the_pool_as_its_default_executor():
    # asyncio's default executor also runs the loop's own blocking calls (getaddrinfo,
    # asyncio.to_thread) and accepts only ThreadPoolExecutor instances; docs/python.md says to
    # pass the pool to run_in_executor instead.
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        loop = asyncio.new_event_loop()
        try:
            with pytest.raises(TypeError, match="ThreadPoolExecutor"):
                loop.set_default_executor(ex)
        finally:
            loop.close()


# -- tornado ---------------------------------------------------------------------------------------

def test_tornado_runs_methods_and_calls_on_lanes(executor):
    tornado_concurrent = pytest.importorskip("tornado.concurrent", reason=_TORNADO_MISSING)
    tornado_ioloop = pytest.importorskip("tornado.ioloop", reason=_TORNADO_MISSING)

    class Handler:
        def __init__(self, pool):
            self.executor = pool

        @tornado_concurrent.run_on_executor
        def lane_of(self, value):
            return _lane_index(value)

    async def main():
        handler = Handler(executor)
        pairs = await asyncio.gather(*[handler.lane_of(i) for i in range(20)])
        loop = tornado_ioloop.IOLoop.current()
        pairs.append(await loop.run_in_executor(executor, _lane_index, 20))
        # On asyncio, tornado's default executor is asyncio's, which refuses the pool.
        with pytest.raises(TypeError, match="ThreadPoolExecutor"):
            loop.set_default_executor(executor)
        return pairs

    pairs = asyncio.run(main())
    assert [v for v, _ in pairs] == list(range(21))
    assert {i for _, i in pairs} <= set(range(executor.lane_count))


# -- a dask.distributed worker's executor ---------------------------------------------------------

def _where():
    import distributed

    lane = gpupool.current_lane().index
    try:
        worker = distributed.get_worker().address
    except ValueError:
        worker = None
    return lane, worker


def test_a_distributed_worker_runs_its_tasks_on_the_pool_and_shuts_it_down():
    pytest.importorskip("dask.array", reason="dask is not installed (pip install '.[dask]')")
    distributed = pytest.importorskip(
        "distributed", reason="distributed is not installed (pip install '.[dask]')")
    import dask.array as da

    ex = gpupool.Executor(threads_per_gpu=2, backend="cpu")
    with distributed.LocalCluster(n_workers=1, processes=False, threads_per_worker=ex.lane_count,
                                  dashboard_address=":0", executor=ex) as cluster, \
            distributed.Client(cluster) as client:
        lane, worker = client.submit(_where, pure=False).result(timeout=60)
        assert lane in range(ex.lane_count)
        # distributed hands a task's context (get_worker, worker_client) only to
        # ThreadPoolExecutors; docs/python.md says so.
        assert worker is None
        x = da.arange(100_000, chunks=10_000, dtype=np.float64)
        assert client.compute((x ** 2).sum()).result(timeout=60) == \
            np.sum(np.arange(100_000, dtype=np.float64) ** 2)
    # The worker owns its executor: closing the worker shut the pool down.
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(int)
