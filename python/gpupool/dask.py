# Over the usual size: one public module, its parts sharing the plugin and the dask imports.
"""gpupool on Dask: one long-lived gpupool pool per Dask worker, Dask arrays mapped through it,
a concurrent.futures Executor over the cluster and one trace for the whole cluster.

    from dask.distributed import Client
    import dask.array as da, gpupool.dask

    client = Client()                                   # or Client("scheduler:8786")
    gpupool.dask.install(client, threads_per_gpu=8)     # a pool per worker, over its GPUs
    x = da.random.random(50_000_000, chunks=500_000)
    y = gpupool.dask.map_blocks(gpupool.kernels.square, x, blocks_per_task=8)
    z = x.map_blocks(gpupool.dask.kernel(gpupool.kernels.square))   # one Dask task per block

Each worker's pool covers the GPUs that worker sees (its ``CUDA_VISIBLE_DEVICES``), so one
worker per GPU (dask-cuda's layout) and one worker per machine both work; with no usable GPU
the pool runs on the CPU backend, so the same code runs on a laptop and in CI.

Code that runs on a worker gets the pool with :func:`worker_executor`. On a worker where
:func:`install` was not called, the first use makes that worker a pool with default settings,
says so once in a warning on the ``gpupool.dask`` logger (naming the pool and how to choose its
settings) and shuts it down when the worker closes, as an installed pool is; ``install`` later
replaces it. Outside any Dask worker - Dask's local threaded scheduler, ``compute()`` with no
Client - it returns one process-wide pool with default settings, created on first use and shut
down at exit.

Needs the ``dask`` extra: ``pip install "gpupool[dask]"`` (dask[array] and distributed).
"""

from __future__ import annotations

import atexit
import concurrent.futures as _futures
import contextlib
import functools
import inspect
import itertools
import json
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np


def _extra_missing(error: ImportError) -> str:
    """Why gpupool.dask cannot import: what of the extra is installed, in which versions (a
    distributed older than its dask fails inside its own import), and how to install it."""
    from importlib import metadata
    found = []
    for name in ("dask", "distributed"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"no {name}")
    return (f"gpupool.dask needs dask[array] and distributed of one release (here: "
            f"{', '.join(found)}): pip install \"gpupool[dask]\" ({error})")


try:
    import dask
    import dask.array as da
    import distributed
    import distributed.utils
    from dask.highlevelgraph import HighLevelGraph
    from distributed.worker import WORKER_ANY_RUNNING
except ImportError as _missing:
    raise ImportError(_extra_missing(_missing)) from _missing

from . import _executor, _ext, _map_paths, _map_stream, _pinned
from ._ext import BuiltinKernel, ElementwiseKernel, RawKernel, builtin_kernels
from ._timeline import write_by_suffix

__all__ = [
    "ClusterTrace",
    "Executor",
    "PLUGIN_NAME",
    "PoolPlugin",
    "install",
    "kernel",
    "map_blocks",
    "pool_info",
    "trace",
    "worker_executor",
]

#: The name the plugin is registered under on every worker (``worker.plugins[PLUGIN_NAME]``).
PLUGIN_NAME = "gpupool"

#: The keyword arguments gpupool.Executor takes (read from its signature, so that a new option
#: reaches the workers too); the plugin refuses others at once, on the client, rather than on
#: every worker.
_EXECUTOR_OPTIONS = tuple(name for name in inspect.signature(_executor.Executor).parameters)

#: What a plugin holds on its worker alone (never pickled).
_WORKER_STATE = ("executor", "clock_offset_us", "_tracing", "_lock")

#: Where a worker's pool made on first use is announced (see :func:`worker_executor`).
_log = logging.getLogger("gpupool.dask")

#: How many pools this process's plugin has created and shut down (a worker process normally
#: has one of each over its life; ``pool_info`` reports them).
_pools_created = 0
_pools_closed = 0


# -- the worker plugin ----------------------------------------------------------------------------

def _untyped(obj: Any) -> Any:
    """``obj`` for calls into parts of Dask that carry no type annotations (which mypy --strict
    refuses to call from annotated code)."""
    return obj


class PoolPlugin(distributed.WorkerPlugin):
    """Gives a Dask worker one gpupool.Executor for its whole life.

    The pool is created in ``setup`` (when the plugin is registered, and on every worker that
    joins later) with the keyword arguments given here, over the GPUs the worker process sees,
    and shut down in ``teardown`` (when the worker closes or the plugin is replaced)."""

    name = PLUGIN_NAME

    #: True for a pool the worker made itself on first use, without :func:`install`.
    made_on_first_use = False

    def __init__(self, **executor_kwargs: Any) -> None:
        unknown = sorted(set(executor_kwargs) - set(_EXECUTOR_OPTIONS))
        if unknown:
            raise TypeError(f"gpupool.dask: unknown Executor option(s) {', '.join(unknown)}; "
                            f"allowed: {', '.join(_EXECUTOR_OPTIONS)}")
        self.executor_kwargs: Dict[str, Any] = dict(executor_kwargs)
        self._reset()

    def _reset(self) -> None:
        self.executor: Optional[_executor.Executor] = None
        #: Microseconds to add to the pool's trace times (since the pool started) to get
        #: microseconds since the Unix epoch on this worker's clock.
        self.clock_offset_us = 0.0
        self._tracing: Optional[Tuple[Any, Any]] = None
        self._lock = threading.Lock()

    def __getstate__(self) -> Dict[str, Any]:
        # The settings (and a subclass's own attributes) travel to the workers; each worker
        # builds its own pool.
        return {k: v for k, v in self.__dict__.items() if k not in _WORKER_STATE}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def setup(self, worker: Any) -> None:
        global _pools_created
        with self._lock:
            if self.executor is not None:
                return
            _bound_pinned_cache(worker)
            pool = _executor.Executor(**self.executor_kwargs)
            try:
                self.clock_offset_us = _clock_offset_us(pool)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            self.executor = pool
            _pools_created += 1

    def teardown(self, worker: Any) -> None:
        global _pools_closed
        with self._lock:
            pool, self.executor = self.executor, None
            tracing, self._tracing = self._tracing, None
        if pool is None:
            return
        if tracing is not None:
            with contextlib.suppress(BaseException):
                tracing[0].__exit__(None, None, None)
        pool.shutdown(wait=True, cancel_futures=True)
        _pools_closed += 1


#: The share of a worker's memory limit that gpupool's pinned cache may keep (see
#: _bound_pinned_cache).
_PINNED_CACHE_SHARE = 8


def _bound_pinned_cache(worker: Any) -> None:
    """Caps gpupool's pinned cache in this worker's process at 1/_PINNED_CACHE_SHARE of the
    worker's memory limit, unless GPUPOOL_PINNED_CACHE_BYTES chose the cap. Freed pinned blocks
    stay resident in the cache, which Dask counts as the worker's memory but cannot spill: by
    default the cache may keep a quarter of the host's memory, more than the whole limit of a
    worker that shares its host with three others. The pool's results (and a group's chunk) are
    pinned, so the cache fills as Dask drops them."""
    if os.environ.get("GPUPOOL_PINNED_CACHE_BYTES"):  # empty is unset, as gpupool reads it
        return
    manager = getattr(worker, "memory_manager", None)
    limit = getattr(manager, "memory_limit", None)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return  # no limit (None or 0): Dask does not bound the worker's memory
    bound = limit // _PINNED_CACHE_SHARE
    if _ext.pinned_memory_stats()["cache_limit"] > bound:
        _ext.set_pinned_cache_limit(bound)


def _clock_offset_us(pool: _executor.Executor, tries: int = 8) -> float:
    """Lines the pool's trace clock (microseconds since it started) up with the epoch, once, as
    the pool is made. A traced no-op task's ``submitted`` time is stamped inside ``submit``, so
    it lies between readings of the wall clock just before and just after that call (not the
    task's whole round trip, which a lane's wake-up or a busy lane stretches); of a few such
    windows, the narrowest places it best. Each window is matched to its record by the task's
    id, so that other tasks traced meanwhile are no matter."""
    core = _untyped(pool)._core
    windows = {}
    with pool.trace() as recording:
        for _ in range(tries):
            task_id = core.next_task_id
            before = time.time_ns()
            future = pool.submit(int)
            after = time.time_ns()
            if core.next_task_id == task_id + 1:  # no other task took an id in between
                windows[task_id] = (before, after)
            future.result()
    stamped = [(after - before, (before + after) / 2e3 - r["submitted"])
               for r in recording.records() if r["id"] in windows
               for before, after in [windows[r["id"]]]]
    if not stamped:
        _log.warning("gpupool.dask: could not line the pool's trace clock up with the wall "
                     "clock; a cluster trace's times may be off by this pool's uptime")
        return 0.0
    return float(min(stamped)[1])


def install(client: "distributed.Client", **executor_kwargs: Any) -> Dict[str, Any]:
    """Registers :class:`PoolPlugin` on every worker of ``client``'s cluster, now and as they
    join: each gets one gpupool.Executor(**executor_kwargs) over the GPUs it sees. Installing
    again replaces every worker's pool (the old one is shut down first). Returns each worker's
    reply; a worker whose pool could not be created (``backend="cuda"`` without a GPU, a bad
    option) raises here, and leaves no pool (nor the plugin) on any worker."""
    plugin = PoolPlugin(**executor_kwargs)
    try:
        replies = client.register_plugin(plugin, name=PLUGIN_NAME)
    except BaseException:
        # Left registered, the plugin would fail again on every worker that joins.
        _uninstall(client)
        raise
    failed = {w: r for w, r in (replies or {}).items()
              if isinstance(r, dict) and r.get("status") not in (None, "OK")}
    if failed:
        _uninstall(client)
        address, reply = next(iter(failed.items()))
        raise RuntimeError(f"gpupool.dask: the pool could not be created on {len(failed)} "
                           f"worker(s), e.g. {address}: {reply.get('exception', reply)}")
    return dict(replies or {})


def _uninstall(client: "distributed.Client") -> None:
    with contextlib.suppress(Exception):
        _untyped(client).unregister_worker_plugin(PLUGIN_NAME)


def _installed(client: "distributed.Client") -> bool:
    return bool(_untyped(client).run_on_scheduler(_scheduler_has_plugin))


def _scheduler_has_plugin(dask_scheduler: Any) -> bool:
    return PLUGIN_NAME in getattr(dask_scheduler, "worker_plugins", {})


def _worker_plugin(worker: Any) -> PoolPlugin:
    """The plugin holding ``worker``'s pool; a worker with none gets one with default settings
    (:func:`_first_use_plugin`)."""
    plugin = worker.plugins.get(PLUGIN_NAME)
    if plugin is None:
        plugin = _first_use_plugin(worker)
    if not isinstance(plugin, PoolPlugin):
        raise RuntimeError(
            f"gpupool.dask: Dask worker {worker.address} has a plugin named {PLUGIN_NAME!r} that "
            "is not gpupool's: register gpupool.dask.PoolPlugin under that name, or call "
            "gpupool.dask.install(client)")
    if plugin.executor is None:
        # install's plugin may be making its pool on the worker's loop right now (setup holds
        # the lock while it does): wait for it rather than fail the task.
        with plugin._lock:
            pass
    if plugin.executor is None:
        # Its setup failed (install raised on the client), or the worker is closing.
        raise RuntimeError(
            f"gpupool.dask: no gpupool pool on Dask worker {worker.address}: its plugin's pool "
            "could not be created or was shut down with the worker")
    return plugin


#: Held while a task thread makes its worker's pool, so that the worker's other task threads
#: wait for that pool rather than make their own.
_first_use_lock = threading.Lock()


def _first_use_plugin(worker: Any) -> Any:
    """Makes ``worker`` a pool with default settings and adds its plugin to the worker, as if
    installed there alone: the worker tears it down when it closes, and ``install`` replaces
    it. Returns the plugin the worker holds afterwards (another one, if one came first)."""
    if _untyped(distributed.utils).in_async_call(worker.loop):
        # On the worker's event loop (client.run): nothing else changes worker.plugins while
        # this runs. The lock is not taken: a task thread holding it waits for this loop.
        return _adopt(worker, _default_plugin(worker))
    with _first_use_lock:
        plugin = worker.plugins.get(PLUGIN_NAME)
        if plugin is not None:
            return plugin
        # The pool is made here, off the event loop; only adding it to worker.plugins, which
        # the worker iterates on its loop when it closes, happens there.
        made = _default_plugin(worker)
        try:
            return distributed.utils.sync(worker.loop, _adopt_on_loop, worker, made)
        except BaseException:
            made.teardown(worker)
            raise


def _default_plugin(worker: Any) -> PoolPlugin:
    plugin = PoolPlugin()
    plugin.made_on_first_use = True
    plugin.setup(worker)
    return plugin


async def _adopt_on_loop(worker: Any, made: PoolPlugin) -> Any:
    return _adopt(worker, made)


def _adopt(worker: Any, made: PoolPlugin) -> Any:
    """On the worker's event loop: ``made`` becomes the worker's plugin unless the worker has
    one already (then ``made``'s pool is shut down) or is closing (then this raises, as a pool
    added now would outlive the worker's teardown of its plugins)."""
    current = worker.plugins.get(PLUGIN_NAME)
    if current is not None or worker.status not in WORKER_ANY_RUNNING:
        made.teardown(worker)
        if current is None:
            raise RuntimeError(f"gpupool.dask: Dask worker {worker.address} is closing "
                               f"({worker.status.name}); no pool is made for it")
        return current
    worker.plugins[PLUGIN_NAME] = made
    pool = made.executor
    assert pool is not None
    _log.warning(
        "gpupool.dask: made a gpupool pool with default settings on Dask worker %s (backend "
        "%s, devices %s, %d lanes), because gpupool.dask.install(client) was not called; it is "
        "shut down when the worker closes. To choose its settings, call "
        "gpupool.dask.install(client, threads_per_gpu=..., ...) on the client before the work "
        "(it replaces this pool).",
        worker.address, pool.backend, [d["ordinal"] for d in pool.devices], pool.lane_count)
    return made


_local_lock = threading.Lock()
_local_pool: Optional[_executor.Executor] = None


def _local_executor() -> _executor.Executor:
    global _local_pool
    with _local_lock:
        if _local_pool is None:
            _local_pool = _executor.Executor()
            atexit.register(_local_pool.shutdown)
        return _local_pool


def worker_executor() -> _executor.Executor:
    """The gpupool.Executor of the Dask worker running the calling task.

    On a Dask worker without the plugin (see :func:`install`), the first call makes the worker
    a pool with default settings, logs one warning on the ``gpupool.dask`` logger naming it, and
    adds it to the worker as a plugin of its own: it is shut down when the worker closes, and
    ``install`` replaces it. Raises RuntimeError on a worker that is closing, or whose plugin
    has no pool (its setup failed). Outside any Dask worker (the local threaded scheduler)
    returns one process-wide pool with default settings, created on first use and shut down at
    exit."""
    try:
        worker = distributed.get_worker()
    except ValueError:
        return _local_executor()
    pool = _worker_plugin(worker).executor
    if pool is None:  # torn down since it was looked at: the worker is closing
        raise RuntimeError(f"gpupool.dask: the pool of Dask worker {worker.address} was shut "
                           "down with the worker")
    return pool


def pool_info(client: "distributed.Client") -> Dict[str, Dict[str, Any]]:
    """Per worker address: whether it has a pool (``installed``) and whether the worker made it
    on first use without :func:`install` (``made_on_first_use``), the pool's backend, devices,
    lanes, ``CUDA_VISIBLE_DEVICES``, and how many pools the worker process has created and shut
    down."""
    info: Dict[str, Dict[str, Any]] = client.run(_worker_pool_info)
    return info


def _worker_pool_info(dask_worker: Any) -> Dict[str, Any]:
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    pool = getattr(plugin, "executor", None)
    return {
        "installed": pool is not None,
        "made_on_first_use": pool is not None and bool(getattr(plugin, "made_on_first_use", False)),
        "backend": None if pool is None else pool.backend,
        "devices": [] if pool is None else [d["ordinal"] for d in pool.devices],
        "lanes": 0 if pool is None else pool.lane_count,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
        "pools_created": _pools_created,
        "pools_closed": _pools_closed,
    }


# -- kernels that travel --------------------------------------------------------------------------

AnyKernel = Union[BuiltinKernel, ElementwiseKernel, RawKernel]


class _KernelSpec:
    """A gpupool kernel as plain data, so that it pickles to the workers (the compiled kernel
    objects do not); each process rebuilds the kernel once (compiled kernels also hit the disk
    cache, so a worker compiles a body at most once)."""

    __slots__ = ("description", "_kernel")

    def __init__(self, description: Tuple[Any, ...]) -> None:
        self.description = description
        self._kernel: Optional[AnyKernel] = None

    @classmethod
    def of(cls, kernel: Any) -> "_KernelSpec":
        if isinstance(kernel, _KernelSpec):
            return kernel
        if isinstance(kernel, BuiltinKernel):
            # alpha as the caller gave it (an int stays an int, as int arrays need): the
            # kernel's own float64 copy would be refused for them at the call.
            return cls(("builtin", kernel.name, getattr(kernel, "_alpha_value", kernel.alpha)))
        if isinstance(kernel, ElementwiseKernel):
            inputs = ", ".join(f"{t} {n}" for t, n in kernel.inputs)
            out_type, out_name = kernel.output
            return cls(("elementwise", inputs, f"{out_type} {out_name}", kernel.body,
                        kernel.name))
        if isinstance(kernel, RawKernel):
            inputs = ", ".join(f"{t}{'*' if is_array else ''} {n}"
                               for t, n, is_array in kernel.inputs)
            out_type, out_name = kernel.output
            return cls(("raw", kernel.source, kernel.name, inputs, f"{out_type}* {out_name}",
                        int(kernel.shape.block), int(kernel.shape.grid)))
        raise TypeError(f"gpupool.dask: expected a gpupool kernel (gpupool.kernels.*, "
                        f"gpupool.elementwise, gpupool.raw_kernel), not {type(kernel).__name__}")

    def __getstate__(self) -> Tuple[Any, ...]:
        return self.description

    def __setstate__(self, description: Tuple[Any, ...]) -> None:
        self.description = description
        self._kernel = None

    def __dask_tokenize__(self) -> Tuple[Any, ...]:
        return self.description

    def __repr__(self) -> str:
        return f"<gpupool kernel {self.name}>"

    @property
    def name(self) -> str:
        kind = self.description[0]
        return str(self.description[{"builtin": 1, "elementwise": 4, "raw": 2}[kind]])

    @property
    def arity(self) -> Optional[int]:
        """Arrays a built-in kernel takes; None for compiled kernels (declared inputs)."""
        if self.description[0] != "builtin":
            return None
        kernel = self.build()
        return kernel.arity if isinstance(kernel, BuiltinKernel) else None

    def output_dtype(self, first: np.dtype) -> np.dtype:
        if self.description[0] == "builtin":
            return first
        declared = str(self.description[2]).split()[0].rstrip("*")
        return np.dtype(declared)

    def build(self) -> AnyKernel:
        if self._kernel is None:
            kind, *rest = self.description
            if kind == "builtin":
                name, alpha = rest
                make = getattr(BuiltinKernel, name)  # a factory per entry of the table
                takes_alpha = any(k["name"] == name and k["takes_alpha"]
                                  for k in builtin_kernels())
                built: BuiltinKernel = make(alpha) if takes_alpha else make()
                self._kernel = built
            elif kind == "elementwise":
                inputs, output, body, name = rest
                self._kernel = ElementwiseKernel(inputs, output, body, name)
            else:
                source, entry, inputs, output, block, grid = rest
                self._kernel = RawKernel(source, entry, inputs, output, block, grid)
        assert self._kernel is not None
        return self._kernel


def _is_array(value: Any) -> bool:
    return hasattr(value, "__array_interface__") or hasattr(value, "__cuda_array_interface__")


def _host_block(value: Any) -> Any:
    # Dask hands out slices and broadcasts: gpupool reads C-contiguous arrays only.
    if isinstance(value, np.ndarray) and not value.flags.c_contiguous:
        return np.ascontiguousarray(value)
    return value


def _empty_result(spec: _KernelSpec, arrays: List[Any]) -> np.ndarray:
    """A zero-size block's result, and Dask's metadata probes: no pool is needed for them."""
    shape = np.broadcast_shapes(*(np.shape(a) for a in arrays))
    return np.empty(shape, spec.output_dtype(np.asarray(arrays[0]).dtype))


class kernel:  # noqa: N801 - used like a function: x.map_blocks(gpupool.dask.kernel(k))
    """Wraps a gpupool kernel for ``dask.array.map_blocks``: each block runs through the pool
    of the worker that computes it (one Dask task per block)::

        y = x.map_blocks(gpupool.dask.kernel(gpupool.kernels.square))
        z = x.map_blocks(gpupool.dask.kernel(k), 2.5, dtype=np.float64)   # compiled, a number

    For many small blocks, :func:`map_blocks` with ``blocks_per_task`` runs several blocks per
    Dask task."""

    def __init__(self, kernel: Any) -> None:
        self.spec = _KernelSpec.of(kernel)

    def __dask_tokenize__(self) -> Tuple[Any, ...]:
        return ("gpupool.dask.kernel",) + self.spec.description

    def __repr__(self) -> str:
        return f"gpupool.dask.kernel({self.spec.name})"

    def __call__(self, *args: Any) -> Any:
        arrays = [a for a in args if _is_array(a)]
        if not arrays:
            raise TypeError(f"gpupool.dask.kernel({self.spec.name}): give at least one array")
        if any(np.size(a) == 0 for a in arrays):
            return _empty_result(self.spec, arrays)
        pool = worker_executor()
        return pool.submit(self.spec.build(), *(_host_block(a) for a in args)).result()


def _run_group(spec: _KernelSpec, axis: int, *columns: Any) -> np.ndarray:
    """One Dask task: every block of the group through the pool at once, then the results
    joined along ``axis``. A column is a list of blocks (one per group member) or a number
    that every call shares."""
    count = max(len(c) for c in columns if isinstance(c, list))
    rows = [[c[i] if isinstance(c, list) else c for c in columns] for i in range(count)]
    results: List[Any] = [None] * count
    work = []
    for i, row in enumerate(rows):
        arrays = [a for a in row if _is_array(a)]
        if any(np.size(a) == 0 for a in arrays):
            results[i] = _empty_result(spec, arrays)
        else:
            work.append(i)
    if work:
        pool = worker_executor()
        built = spec.build()
        calls = [[_host_block(v) for v in rows[i]] for i in work]
        if count > 1 and len(work) == count and spec.arity is not None:
            joined = _run_into_one(pool, built, spec, axis, calls)
            if joined is not None:
                return joined
        if spec.arity is not None:
            outputs = pool.map(built, *zip(*calls))
        else:
            # Compiled kernels: each call's numbers are passed as one-element columns so that
            # map sees the same argument lists as each block's own call would.
            outputs = pool.map(built, *[list(column) for column in zip(*calls)])
        for i, out in zip(work, outputs):
            results[i] = out
    return results[0] if count == 1 else np.concatenate(results, axis=axis)


def _run_into_one(pool: Any, built: Any, spec: _KernelSpec, axis: int,
                  calls: List[List[Any]]) -> Optional[np.ndarray]:
    """A group's built-in kernel calls, each writing its result straight into its place in the
    joined array (``submit(..., out=)``), in pinned memory: the lanes fill it, with no copy
    afterwards. None where that cannot be: blocks that are not NumPy arrays of one dtype and one
    shape beyond the first axis, or a join along another axis (its places would not be
    contiguous)."""
    firsts = [call[0] for call in calls]
    if not all(type(a) is np.ndarray for call in calls for a in call):
        return None
    dtype = spec.output_dtype(firsts[0].dtype)
    rest = firsts[0].shape[1:]
    if axis != 0 or any(a.dtype != dtype or a.shape[1:] != rest for a in firsts):
        return None
    shape = (sum(a.shape[0] for a in firsts),) + rest
    try:
        # From gpupool's pinned cache, as the pool's own results are: the lanes download
        # straight into it, where fresh pageable memory would cost each lane a staging copy
        # and the first touch of every page.
        joined = _pinned.empty_pinned(shape, dtype)
    except MemoryError:
        joined = np.empty(shape, dtype)
    futures: List[Any] = []
    start = 0
    try:
        for call in calls:
            stop = start + call[0].shape[0]
            futures.append(pool.submit(built, *call, out=joined[start:stop]))
            start = stop
    finally:
        # Every call that was queued ends before the array is handed on or dropped.
        _futures.wait(futures)
    for f in futures:
        f.result()
    return joined


def map_blocks(kernel: Any, *args: Any, blocks_per_task: int = 1, axis: int = 0,
               name: Optional[str] = None) -> "da.Array":
    """Maps a gpupool kernel over Dask arrays' blocks, ``blocks_per_task`` neighbouring blocks
    along ``axis`` per Dask task: each task hands its blocks to the worker's pool at once (the
    pool pipelines them over its lanes and GPUs) and joins the results.

    A Dask task costs about a millisecond of scheduling, more than a GPU spends on a small
    block; grouping divides that cost by ``blocks_per_task`` without a rechunk (no extra
    tasks, no copies before the kernel). The result has the inputs' shape and chunks, except
    that along ``axis`` each group's chunks are one chunk (``blocks_per_task=1``: the inputs'
    chunks exactly). A built-in kernel over NumPy blocks joined along the first axis writes each
    block's result into its place in the group's chunk, in pinned memory; other groups are
    joined with one host copy.

    A task runs on one worker, so a group's blocks held by other workers are fetched to it first
    (over the network, on a cluster). Blocks made one per chunk are spread over the workers:
    group blocks that already sit together, or make the array in chunks of the group's size
    and keep ``blocks_per_task=1`` (the pool cuts each chunk into pieces itself).

    ``args``: Dask arrays of one shape (arrays after the first are rechunked to its chunks if
    they differ) and, for compiled kernels, numbers passed to every call. Built-in kernels take
    one array (``square``, ``scale``) or two (``add``, ``axpy``)."""
    spec = _KernelSpec.of(kernel)
    if isinstance(blocks_per_task, bool) or not isinstance(blocks_per_task, int) \
            or blocks_per_task < 1:
        raise ValueError(f"gpupool.dask.map_blocks: blocks_per_task must be a whole number of at "
                         f"least 1, not {blocks_per_task!r}")
    arrays = [a for a in args if isinstance(a, da.Array)]
    if not arrays:
        raise TypeError("gpupool.dask.map_blocks: give at least one dask array")
    for a in args:
        if not isinstance(a, da.Array) and _map_paths._as_number(a) is None:
            raise TypeError(f"gpupool.dask.map_blocks: arguments are dask arrays or numbers, "
                            f"not {type(a).__name__} (wrap NumPy arrays with "
                            "dask.array.from_array)")
    if spec.arity is not None and (len(arrays) != spec.arity or len(args) != spec.arity):
        raise TypeError(f"gpupool.dask.map_blocks: kernel '{spec.name}' takes {spec.arity} "
                        f"array(s)")
    first = arrays[0]
    for a in arrays[1:]:
        if a.shape != first.shape:
            raise ValueError(f"gpupool.dask.map_blocks: arrays differ in shape: {first.shape} "
                             f"and {a.shape}")
    if first.ndim == 0:
        raise ValueError("gpupool.dask.map_blocks: 0-d arrays have no blocks to group")
    if not -first.ndim <= axis < first.ndim:
        raise ValueError(f"gpupool.dask.map_blocks: axis {axis} is out of range for "
                         f"{first.ndim}-d arrays")
    axis %= first.ndim
    aligned: List[Any] = [a if a.chunks == first.chunks else _untyped(a).rechunk(first.chunks)
                          for a in args if isinstance(a, da.Array)]
    it = iter(aligned)
    inputs = [next(it) if isinstance(a, da.Array) else _map_paths._as_number(a) for a in args]

    blocks_along = first.numblocks[axis]
    groups = [range(start, min(start + blocks_per_task, blocks_along))
              for start in range(0, blocks_along, blocks_per_task)]
    sizes = first.chunks[axis]
    out_chunks = list(first.chunks)
    out_chunks[axis] = tuple(sum(sizes[i] for i in g) for g in groups)
    token = dask.base.tokenize(spec, [a.name if isinstance(a, da.Array) else a for a in inputs],
                               blocks_per_task, axis)
    out_name = name or f"gpupool-{spec.name}-{token}"

    other_axes = [range(n) for i, n in enumerate(first.numblocks) if i != axis]
    layer: Dict[Any, Any] = {}
    for g, members in enumerate(groups):
        for rest in itertools.product(*other_axes):
            def index(i: int) -> Tuple[int, ...]:
                return rest[:axis] + (i,) + rest[axis:]

            columns = [[(a.name,) + index(i) for i in members] if isinstance(a, da.Array) else a
                       for a in inputs]
            layer[(out_name,) + index(g)] = (_run_group, spec, axis, *columns)
    graph = HighLevelGraph.from_collections(out_name, layer, dependencies=aligned)
    meta = np.empty((0,) * first.ndim, spec.output_dtype(first.dtype))
    result: da.Array = _untyped(da).Array(graph, out_name, tuple(out_chunks), meta=meta)
    return result


# -- a concurrent.futures Executor over the cluster -----------------------------------------------

def _run_call(fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    pool = worker_executor()
    if isinstance(fn, _KernelSpec):
        return pool.submit(fn.build(), *(_host_block(a) for a in args)).result()
    # Every argument is fn's (gpupool's own submit keeps `priority` for itself).
    return pool.submit(functools.partial(fn, *args, **kwargs)).result()


def _run_batch(fn: Any, calls: List[Tuple[Any, ...]]) -> List[Any]:
    """One Dask task for ``chunksize`` calls of Executor.map: all go to the pool at once."""
    pool = worker_executor()
    if isinstance(fn, _KernelSpec):
        built = fn.build()
        columns = [list(c) for c in zip(*[[_host_block(a) for a in call] for call in calls])]
        return list(pool.map(built, *columns))
    return [f.result() for f in [pool.submit(fn, *call) for call in calls]]


class Executor(_futures.Executor):
    """A ``concurrent.futures.Executor`` over a Dask cluster's gpupool pools.

        with gpupool.dask.Executor(client) as ex:
            futures = [ex.submit(gpupool.kernels.square, x) for x in chunks]
            for f in concurrent.futures.as_completed(futures):
                ...
            squares = list(ex.map(gpupool.kernels.square, chunks, chunksize=16))

    ``submit(fn, *args, **kwargs)`` runs ``fn`` - a Python callable, or a gpupool kernel over
    arrays - on one worker's pool as one Dask task (callables run on a lane, as with
    gpupool.Executor). Its futures are ``concurrent.futures.Future`` objects, so the standard
    library's ``wait``, ``as_completed`` and ``add_done_callback`` work on them. ``map`` takes
    ``chunksize`` as ProcessPoolExecutor does: that many calls per Dask task, handed to the
    pool together.

    ``executor_kwargs`` (gpupool.Executor's options) install the plugin with those settings
    (see :func:`install`); without them it is installed with defaults if it is not there yet.
    ``shutdown`` stops taking work and, with ``wait``, waits for this executor's futures; with
    ``cancel_futures`` every future not yet done is cancelled with its Dask task (a call
    already running on a worker still runs to its end there; its result is dropped). It never
    closes the client.

    A future can be cancelled until its result is back (its Dask task is cancelled too). A
    worker lost mid-task is Dask's business: the task is run again elsewhere."""

    def __init__(self, client: "distributed.Client", **executor_kwargs: Any) -> None:
        self._client = client
        if executor_kwargs or not _installed(client):
            install(client, **executor_kwargs)
        self._lock = threading.Lock()
        self._pending: Dict[_futures.Future[Any], Any] = {}
        self._closed = False

    @property
    def client(self) -> "distributed.Client":
        return self._client

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> _futures.Future[Any]:
        if isinstance(fn, (BuiltinKernel, ElementwiseKernel, RawKernel)):
            if kwargs:
                raise TypeError(f"gpupool: kernel '{fn.name}' takes no keyword arguments")
            fn = _KernelSpec.of(fn)
        return self._launch(_run_call, fn, args, kwargs)

    def map(self, fn: Any, *iterables: Iterable[Any], timeout: Optional[float] = None,
            chunksize: int = 1) -> Iterator[Any]:
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError(f"chunksize must be a whole number of at least 1, not {chunksize!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        calls = list(zip(*iterables))
        if isinstance(fn, (BuiltinKernel, ElementwiseKernel, RawKernel)):
            fn = _KernelSpec.of(fn)
        if chunksize == 1 and not isinstance(fn, _KernelSpec):
            futures = [self.submit(fn, *call) for call in calls]
            return _map_stream._ordered_results(futures, deadline)
        batches = [calls[i:i + chunksize] for i in range(0, len(calls), chunksize)]
        futures = [self._launch(_run_batch, fn, batch) for batch in batches]
        return itertools.chain.from_iterable(_map_stream._ordered_results(futures, deadline))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            pending = list(self._pending)
        if cancel_futures:
            for future in pending:
                future.cancel()
        if wait:
            _futures.wait(pending)

    def _launch(self, function: Callable[..., Any], *args: Any) -> _futures.Future[Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            remote: Any = self._client.submit(function, *args, pure=False)
            future: _futures.Future[Any] = _futures.Future()
            # The Dask future must stay referenced until the outcome is back: Dask forgets a
            # task whose last future is released.
            self._pending[future] = remote
        pending, lock = self._pending, self._lock

        def forget(done: _futures.Future[Any]) -> None:
            with lock:
                remote_future = pending.pop(done, None)
            if done.cancelled() and remote_future is not None:
                remote_future.cancel()

        def hand_over(finished: Any) -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                if finished.status == "finished":
                    future.set_result(finished.result())
                elif finished.status == "cancelled":
                    future.set_exception(_futures.CancelledError(
                        f"the Dask task {finished.key} was cancelled"))
                else:
                    future.set_exception(finished.exception())
            except BaseException as exc:  # noqa: B902 - handed to the caller
                with contextlib.suppress(_futures.InvalidStateError):
                    future.set_exception(exc)

        future.add_done_callback(forget)
        remote.add_done_callback(hand_over)
        return future


# -- one trace for the whole cluster --------------------------------------------------------------

def _trace_begin(dask_worker: Any) -> bool:
    plugin = _worker_plugin(dask_worker)
    with plugin._lock:
        if plugin._tracing is not None:
            raise RuntimeError("gpupool.dask: this worker's pool is already being traced")
        recording = plugin.executor.trace()  # type: ignore[union-attr]
        plugin._tracing = (recording, recording.__enter__())
    return True


def _trace_end(dask_worker: Any) -> Optional[Dict[str, Any]]:
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, PoolPlugin):
        return None
    with plugin._lock:
        tracing, plugin._tracing = plugin._tracing, None
    if tracing is None:  # joined, or restarted, while the trace was taken
        return None
    recording, snapshot = tracing
    recording.__exit__(None, None, None)
    delay = _scheduler_delay_s(dask_worker)
    return {
        "name": str(dask_worker.name),
        "address": dask_worker.address,
        "backend": snapshot.backend,
        # Onto the scheduler's clock, as the worker moves the times of Dask's task stream (its
        # wall clock plus its estimate of the scheduler's lead over it, which each heartbeat
        # measures again), so that the two line up on each worker while that estimate holds:
        # the one at the trace's end is used and kept.
        "clock_offset_us": plugin.clock_offset_us + 1e6 * delay,
        "scheduler_delay_s": delay,
        "chrome": json.loads(snapshot.chrome_json()),
        "records": snapshot.records(),
        "stats_table": snapshot.stats_table(),
    }


def _scheduler_delay_s(dask_worker: Any) -> float:
    """The scheduler's clock's lead over the worker's, as the worker estimates it (seconds)."""
    delay = getattr(dask_worker, "scheduler_delay", 0.0)
    return float(delay) if isinstance(delay, (int, float)) and math.isfinite(delay) else 0.0


class ClusterTrace:
    """The traces of every worker's pool, taken together (see :func:`trace`). Times are
    microseconds since the earliest worker's first traced event, on the scheduler's clock: each
    worker's pool clock lined up with the worker's wall clock, then moved as the worker moves
    the times of Dask's own task stream (by its estimate of the scheduler's clock's lead)."""

    def __init__(self) -> None:
        self._parts: Optional[Dict[str, Dict[str, Any]]] = None

    def _data(self) -> Dict[str, Dict[str, Any]]:
        if self._parts is None:
            raise RuntimeError("gpupool.dask: the trace is filled when its `with` block ends")
        return self._parts

    @property
    def workers(self) -> List[str]:
        """The addresses of the workers traced, in order."""
        return sorted(self._data())

    def __len__(self) -> int:
        return sum(len(p["records"]) for p in self._data().values())

    def _zero(self) -> float:
        starts = [p["clock_offset_us"] + min(r["submitted"] for r in p["records"])
                  for p in self._data().values() if p["records"]]
        return min(starts) if starts else 0.0

    @property
    def scheduler_delays(self) -> Dict[str, float]:
        """Per worker address, the lead of the scheduler's clock over the worker's (seconds) that
        its times were moved by: the worker's estimate at the trace's end. Taking it off again
        puts a worker's records back on its own wall clock."""
        return {a: float(p.get("scheduler_delay_s", 0.0)) for a, p in self._data().items()}

    @property
    def origin(self) -> float:
        """The time, in seconds since the epoch on the scheduler's clock, that time 0 of
        :meth:`records` and :meth:`chrome_trace` stands for (0.0 for a trace with no records): a
        record's ``origin + started / 1e6`` is on the clock of Dask's own task stream
        (``distributed.get_task_stream``), so the two line up; on the scheduler's host it is
        ``time.time()`` give or take Dask's estimate of each worker's clock."""
        return self._zero() / 1e6

    def records(self) -> List[Dict[str, Any]]:
        """Every worker's records (see gpupool.Trace.records), each with ``worker`` (its
        address), times moved onto the common clock."""
        zero = self._zero()
        out = []
        for address in self.workers:
            part = self._data()[address]
            shift = part["clock_offset_us"] - zero
            for record in part["records"]:
                moved = dict(record, worker=address)
                for key, value in record.items():
                    if key in ("submitted", "started", "done") and value is not None:
                        moved[key] = value + shift
                    elif isinstance(value, (tuple, list)) and len(value) == 2 and \
                            key not in ("name",):
                        moved[key] = (value[0] + shift, value[1] + shift)
                out.append(moved)
        return out

    def chrome_trace(self) -> Dict[str, Any]:
        """The Chrome trace (a dict): a process per worker and device ("worker NAME (ADDRESS)"
        first in its name; with one GPU per worker, one process per worker), each with the
        lane and engine tracks of gpupool.Trace.chrome_json."""
        zero = self._zero()
        events: List[Dict[str, Any]] = []
        pids: Dict[Tuple[int, Any], int] = {}
        for w, address in enumerate(self.workers):
            part = self._data()[address]
            shift = part["clock_offset_us"] - zero
            label = f"worker {part['name']} ({address})"
            named = set()
            for event in part["chrome"].get("traceEvents", []):
                moved = dict(event)
                pid = pids.setdefault((w, event.get("pid")), len(pids))
                moved["pid"] = pid
                if "ts" in moved:
                    moved["ts"] = moved["ts"] + shift
                if "id" in moved:  # async ids are per worker: keep them apart
                    moved["id"] = f"{w}.{moved['id']}"
                if moved.get("ph") == "M" and moved.get("name") == "process_name":
                    moved["args"] = {"name": f"{label}: {event.get('args', {}).get('name', '')}"}
                    named.add(pid)
                events.append(moved)
            for (worker_index, _), pid in pids.items():
                if worker_index == w and pid not in named:
                    events.append({"ph": "M", "name": "process_name", "pid": pid,
                                   "args": {"name": label}})
                if worker_index == w:
                    events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                                   "args": {"sort_index": pid}})
        return {"displayTimeUnit": "ms", "traceEvents": events,
                "otherData": {"workers": self.workers, "source": "gpupool.dask"}}

    def chrome_json(self) -> str:
        """:meth:`chrome_trace` as JSON text, for Perfetto or chrome://tracing."""
        return json.dumps(self.chrome_trace())

    def stats_table(self) -> str:
        """Each worker's pool stats (gpupool.Trace.stats_table), under its address."""
        return "\n".join(f"worker {self._data()[a]['name']} ({a})\n{self._data()[a]['stats_table']}"
                         for a in self.workers)

    def write(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes ``.json`` (the Chrome trace) or ``.txt`` (the stats tables)."""
        write_by_suffix(path, "gpupool.dask",
                        {".json": self.chrome_json, ".txt": self.stats_table})

    def __repr__(self) -> str:
        if self._parts is None:
            return "<gpupool.dask.ClusterTrace (recording)>"
        return (f"<gpupool.dask.ClusterTrace: {len(self)} records from {len(self._parts)} "
                "workers>")


@contextlib.contextmanager
def trace(client: "distributed.Client",
          path: Union[str, "os.PathLike[str]", None] = None) -> Iterator[ClusterTrace]:
    """Traces every worker's pool inside the ``with`` block::

        with gpupool.dask.trace(client, "cluster.json") as t:
            y.compute()
        print(t.stats_table())

    Yields a :class:`ClusterTrace`, filled when the block ends: one Chrome trace with a process
    per worker (and device). A worker that joins, or is restarted, during the block is left
    out; one that is lost takes its records with it."""
    recording = ClusterTrace()
    try:
        client.run(_trace_begin)
    except BaseException:
        client.run(_trace_end, on_error="return")  # those that did start stop again
        raise
    try:
        yield recording
    finally:
        parts = client.run(_trace_end, on_error="return")
        recording._parts = {address: part for address, part in parts.items()
                            if isinstance(part, dict)}
    if path is not None:
        recording.write(path)
