# Over the usual size: every workload beside its variants, as compare runs and reports them.
"""The workloads (W1-W8 and W6c) and the variants run for each."""

from __future__ import annotations

import argparse
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

import gpupool

from . import _frameworks as fw
from . import _programs
from ._harness import (ALTERNATIVE, ANCHOR, FAILED, GPUPOOL, LIMIT, OK, Contender, Result, Skip,
                       Timing, WrongResult, best, measure, measure_interleaved, skipped)

# (chunks, elements per chunk[, dependent FMAs per element]) at full size, and for tests.
FULL = {"W1": (5, 1_000_000), "W2": (200, 1_000_000), "W4": (20_000, 1024),
        "W5": (2000, 16384, 2048), "W6c": (400, 1_000_000, 16384)}
TINY = {"W1": (5, 20_000), "W2": (12, 50_000), "W4": (300, 1024), "W5": (24, 4096, 32),
        "W6c": (8, 20_000, 32)}
WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6", "W6c", "W8")
FMA_A, FMA_B = np.float32(0.999), np.float32(0.001)

# A variant's output is whatever it makes (NumPy or CuPy arrays, lists of them): Any.
#: What a variant's setup appends to and is closed after it: pools, executors.
Closers = List[Callable[[], None]]
#: A variant's setup: given the closers, the function doing the work once.
Setup = Callable[[Closers], Callable[[], Any]]
#: A check of a variant's output (raises WrongResult).
Check = Callable[[Any], None]
Chunks = List[npt.NDArray[Any]]
#: Per workload: (chunks, elements per chunk[, dependent FMAs per element]).
Sizes = Dict[str, Tuple[int, ...]]


def sizes(tiny: bool, scale: float) -> Sizes:
    """Workload sizes; ``scale`` multiplies the chunk counts (not W1's five)."""
    chosen: Sizes = dict(TINY if tiny else FULL)
    for name, shape in chosen.items():
        if name != "W1" and scale != 1.0:
            chosen[name] = (max(2, int(round(shape[0] * scale))),) + shape[1:]
    chosen["W3"] = chosen["W2"]
    return chosen


def describe(name: str, size: Sizes) -> str:
    s = size
    return {
        "W1": f"{s['W1'][0]} x {s['W1'][1]:,} float64 squared, NumPy in and out (wall time)",
        "W2": f"{s['W2'][0]} x {s['W2'][1]:,} float64 squared, pageable in, NumPy out "
              "(GB/s of input)",
        "W3": "W2 with inputs and outputs in pinned memory (GB/s of input)",
        "W4": f"{s['W4'][0]:,} tasks of {s['W4'][1]:,} float64, square (tasks per second)",
        "W5": f"{s['W5'][0]:,} x {s['W5'][1]:,} float32 on the GPU, {s['W5'][2]:,} dependent "
              "FMAs per element (wall time)",
        "W6": "W2 on every GPU vs one (speed-up)",
        "W6c": f"{s['W6c'][0]} x {s['W6c'][1]:,} float32 from NumPy, {s['W6c'][2]:,} dependent "
               "FMAs per element, every GPU vs one (speed-up)",
        "W8": "the user's own CuPy function in gpupool, at W2 and W4 sizes",
        "W8@W2": "the user's own CuPy function at W2 size (GB/s of input)",
        "W8@W4": "the user's own CuPy function at W4 size (tasks per second)",
        "limits": "the machine's own limits, measured in this run",
    }[name]


def check_squares(data: Sequence[npt.NDArray[Any]]) -> Check:
    want = [d * d for d in data]

    def check(out: Iterable[Any]) -> None:
        out = list(out)
        if len(out) != len(want):
            raise WrongResult(f"{len(out)} results for {len(want)} inputs")
        for i, (got, expect) in enumerate(zip(out, want)):
            got = np.asarray(got)
            if got.shape != expect.shape or not np.array_equal(got, expect):
                raise WrongResult(f"result {i} differs from NumPy's")

    return check


def check_returned(inputs: Sequence[object]) -> Check:
    """The check of a no-op over `inputs`: each input back, itself, in order."""
    def check(out: Iterable[Any]) -> None:
        got = list(out)
        if len(got) != len(inputs) or any(g is not d for g, d in zip(got, inputs)):
            raise WrongResult("the no-op did not return each input, in order")
    return check


def fma_reference(x: npt.NDArray[Any], fmas: int,
                  add_input: bool = False) -> npt.NDArray[Any]:
    """The FMA chain in float64 with NumPy (the GPU fuses each step in float32; with a = 0.999
    rounding errors decay, and the two agree to about 1e-5 relative)."""
    v = x.astype(np.float64)
    a = float(FMA_A)
    addend = v.copy() if add_input else float(FMA_B)
    for _ in range(fmas):
        v = v * a + addend
    return v


def check_fma(chunks: Sequence[npt.NDArray[Any]], fmas: int, samples_per_chunk: int,
              to_host: Callable[[Any], Any] = np.asarray, add_input: bool = False) -> Check:
    """Checks sampled elements of every chunk's result against NumPy."""
    picks = [np.linspace(0, c.size - 1, min(c.size, samples_per_chunk)).astype(np.int64)
             for c in chunks]
    want = fma_reference(np.concatenate([np.asarray(to_host(c))[p] for c, p in
                                         zip(chunks, picks)]), fmas, add_input)

    def check(out: Iterable[Any]) -> None:
        out = list(out)
        if len(out) != len(chunks):
            raise WrongResult(f"{len(out)} results for {len(chunks)} inputs")
        got = np.concatenate([np.asarray(to_host(o)).reshape(-1)[p] for o, p in zip(out, picks)])
        bad = ~np.isclose(got, want, rtol=1e-4, atol=1e-5)
        if bad.any():
            i = int(np.argmax(bad))
            raise WrongResult(f"{int(bad.sum())} sampled elements differ from NumPy's "
                              f"(e.g. {got[i]!r} vs {want[i]!r})")

    return check


class Comparison:
    """One comparison run: every workload's variants, the limits, the sweeps."""

    #: Per C++ program: (its path, None) or (None, why it is not there); set by all().
    cpp: Dict[str, Tuple[Optional[str], Optional[str]]]
    #: W2's and W4's inputs, kept for W3, W6 and W8 (set by w2 and w4, where they run).
    w2_data: Chunks
    w4_data: Chunks

    def __init__(self, args: argparse.Namespace,
                 progress: Callable[[str], None] = print) -> None:
        self.args = args
        self.size = sizes(args.tiny, args.scale)
        self.timing = Timing(args.repeat, min(args.min_repeat, args.repeat), args.seconds)
        self.sweep_timing = Timing(max(1, min(3, args.repeat)), 1, args.seconds / 4)
        self.results: List[Result] = []
        self.sweeps: Dict[str, List[Dict[str, Any]]] = {}
        self.limits: Dict[str, float] = {}
        self.best_settings: Dict[str, Dict[str, Any]] = {}
        self.progress = progress
        self.rng = np.random.default_rng(2026)
        self.backend: str = args.backend
        with gpupool.Executor(backend=args.backend) as probe:
            self.backend = probe.backend
            self.on_gpus = probe.takes_cuda_arrays
            self.gpus = len(probe.devices) if self.on_gpus else 0
            self.default_lanes, self.default_chunk = probe.threads_per_gpu, probe.chunk_bytes
            # "measured" or "cached" on CUDA (docs/configuration.md, "Tuning"), else "fixed".
            self.default_source = probe.settings["threads_per_gpu_from"]
        self.lanes_list = _ints(args.lanes_list) or ([1, 2, 4] if args.tiny else [4, 8, 16])
        self.host_lanes_list = _ints(args.host_lanes_list)
        self.chunk_list = _sizes(args.chunk_list) or (
            [64 << 10, 1 << 20] if args.tiny else [1 << 20, 2 << 20, 8 << 20])

    # -- bookkeeping ------------------------------------------------------------------------
    def add(self, result: Result) -> Result:
        self.results.append(result)
        if result.status == OK:
            shown = f"{result.figure:,.4g} {result.unit} ({len(result.repeats_s)} runs)" \
                if not result.extra.get("direct") else f"{result.figure:,.4g} {result.unit}"
        else:
            shown = f"{result.status.upper() if result.status != FAILED else FAILED}: " \
                    f"{result.reason}"
        self.progress(f"  [{result.workload}] {result.variant}: {shown}")
        return result

    def run(self, workload: str, variant: str, kind: str, unit: str, amount: float, setup: Setup,
            check: Check, settings: Optional[Dict[str, Any]] = None,
            timing: Optional[Timing] = None, add: bool = True) -> Result:
        """Measures one variant; ``setup(closers)`` returns the function doing the work once and
        appends to ``closers`` what must be closed afterwards (pools, executors)."""
        closers: Closers = []
        close = functools.partial(_close_all, closers)

        result = measure(workload, variant, kind, unit, amount, lambda: setup(closers), check,
                         timing or self.timing, settings, close)
        return self.add(result) if add else result

    def run_interleaved(self, variants: Sequence[Tuple[str, str, str, str, float, Setup, Check,
                                                        Dict[str, Any]]]) -> List[Result]:
        """Measures variants (each: workload, variant, kind, unit, amount, setup, check,
        settings, as for run) in turn, round after round (see measure_interleaved): for figures
        judged against each other, so that the host's drift within a run moves them alike."""
        closers: Closers = []
        close = functools.partial(_close_all, closers)

        contenders = [Contender(workload, variant, kind, unit, amount,
                                functools.partial(setup, closers), check, settings)
                      for workload, variant, kind, unit, amount, setup, check, settings in variants]
        return [self.add(r) for r in measure_interleaved(contenders, self.timing, close)]

    def executor(self, closers: Closers, lanes: Optional[int] = None, chunk: Optional[int] = None,
                 devices: Optional[List[int]] = None, host_lanes: int = 0) -> gpupool.Executor:
        options: Dict[str, Any] = {"backend": self.backend}
        if lanes:
            options["threads_per_gpu"] = lanes
        if chunk:
            options["chunk_bytes"] = chunk
        if devices is not None:
            options["devices"] = devices
        if host_lanes:
            options["host_lanes"] = host_lanes
        ex = gpupool.Executor(**options)
        closers.append(ex.shutdown)
        return ex

    def settings_label(self, lanes: Optional[int], chunk: Optional[int]) -> str:
        if not lanes and not chunk:
            return (f"defaults ({self.default_source}: {self.default_lanes} lanes x "
                    f"{_bytes(self.default_chunk)})")
        return f"{lanes or self.default_lanes} lanes x {_bytes(chunk or self.default_chunk)}"

    # -- data -------------------------------------------------------------------------------
    def float64_chunks(self, chunks: int, size: int) -> Chunks:
        return [self.rng.uniform(-10, 10, size) for _ in range(chunks)]

    # -- the runs ---------------------------------------------------------------------------
    def all(self, workloads: Sequence[str], bench_dir: Optional[str] = None) -> None:
        started = time.perf_counter()
        self.cpp = {}
        for name in (_programs.GPUPOOL_CPP, _programs.BASELINE):
            self.cpp[name] = _programs.find_program(name, bench_dir)
        steps: List[Tuple[str, Callable[[], None]]] = [("limits", self.limits_run)] + [
            (w, getattr(self, w.lower())) for w in workloads]
        for name, step in steps:
            self.progress(f"== {name}: {describe(name, self.size) if name in DESCRIBED else ''}"
                          f"  [{time.perf_counter() - started:.0f} s]")
            step()
        self.progress(f"== done in {time.perf_counter() - started:.0f} s")

    # limits -------------------------------------------------------------------------------
    def limits_run(self) -> None:
        total = (8 << 20) if self.args.tiny else (512 << 20)
        source = self.rng.integers(0, 255, total, dtype=np.uint8)
        counts = sorted({1, 2, 4, 8, 16, 32, 64} & set(range(1, (_cpu_count() or 1) + 1)))
        for threads in counts:
            target = np.empty_like(source)
            parts_in = np.array_split(source, threads)
            parts_out = np.array_split(target, threads)
            pool = ThreadPoolExecutor(max_workers=threads)

            def setup(closers: Closers, pool: ThreadPoolExecutor = pool,
                      parts_in: Chunks = parts_in, parts_out: Chunks = parts_out,
                      target: npt.NDArray[Any] = target) -> Callable[[], npt.NDArray[Any]]:
                closers.append(lambda: pool.shutdown(wait=True))
                return lambda: (list(pool.map(np.copyto, parts_out, parts_in)), target)[1]

            def check(out: Any, source: npt.NDArray[Any] = source) -> None:
                if not np.array_equal(out, source):
                    raise WrongResult("the copy differs from its source")

            r = self.run("limits", f"host memcpy (NumPy copyto), {_threads(threads)}", LIMIT,
                         "GB/s", total / 1e9, setup, check, {"threads": threads})
            if r.status == OK and r.figure is not None:  # measured: it has a figure
                self.limits["host_memcpy_gb_s"] = max(self.limits.get("host_memcpy_gb_s", 0),
                                                      r.figure)
        self.baseline_rows("limits", "limits")

    # W1, W2, W3 ---------------------------------------------------------------------------
    def w1(self) -> None:
        chunks, size = self.size["W1"]
        self.square_workload("W1", self.float64_chunks(chunks, size), "ms",
                             motivating=(5, 16), careful=(1, 5), numpy_threads=(5,))

    def w2(self) -> None:
        chunks, size = self.size["W2"]
        self.w2_data = self.float64_chunks(chunks, size)
        self.square_workload("W2", self.w2_data, "GB/s", motivating=(5, 16),
                             careful=(4, 8, 16), numpy_threads=(16,))

    def w3(self) -> None:
        data = getattr(self, "w2_data", None)
        if data is None:
            chunks, size = self.size["W3"]
            data = self.float64_chunks(chunks, size)
        pinned = [gpupool.pinned_array(d) for d in data]
        self.square_workload("W3", pinned, "GB/s", motivating=(5,), careful=(1, 4, 8),
                             numpy_threads=(), pinned_outputs=True)

    def square_workload(self, name: str, data: Chunks, unit: str, motivating: Tuple[int, ...],
                        careful: Tuple[int, ...], numpy_threads: Tuple[int, ...],
                        pinned_outputs: bool = False) -> None:
        gigabytes = sum(d.nbytes for d in data) / 1e9
        amount = gigabytes if unit == "GB/s" else float(len(data))
        check = check_squares(data)

        def outputs() -> Chunks:
            outs = [gpupool.empty_pinned(d.shape, d.dtype) for d in data]
            for o in outs:
                o.fill(np.nan)  # a variant that writes nothing cannot pass the check
            return outs

        for threads in motivating:
            self.run(name, f"motivating program, {_threads(threads)}", ANCHOR, unit, amount,
                     functools.partial(fw.make_motivating, threads, data), check)
        for threads in careful:
            self.run(name, f"careful CuPy, {_threads(threads)}", ALTERNATIVE, unit, amount,
                     functools.partial(fw.make_careful_cupy, threads, data,
                                       make_outputs=outputs if pinned_outputs else None), check,
                     {"threads": threads})
        for threads in careful:
            self.run(name, f"careful PyTorch, {_threads(threads)}", ALTERNATIVE, unit, amount,
                     functools.partial(fw.make_careful_torch, threads, data,
                                       make_outputs=outputs if pinned_outputs else None), check,
                     {"threads": threads})
        self.run(name, "NumPy on the CPU, 1 thread", ALTERNATIVE, unit, amount,
                 lambda c: (lambda: [np.square(d) for d in data]), check)
        for threads in numpy_threads:
            def numpy_pool(closers: Closers, t: int = threads) -> Callable[[], Chunks]:
                pool = ThreadPoolExecutor(max_workers=t)
                closers.append(lambda: pool.shutdown(wait=True))
                return lambda: list(pool.map(np.square, data))

            self.run(name, f"NumPy on the CPU, {_threads(threads)}", ALTERNATIVE, unit, amount,
                     numpy_pool, check, {"threads": threads})
        self.gpupool_python(name, unit, amount, check,
                            lambda ex: list(ex.map(gpupool.kernels.square, data)),
                            sweep_chunks=True)
        self.cpp_rows(name)

    def gpupool_python(self, name: str, unit: str, amount: float, check: Check,
                       work: Callable[[gpupool.Executor], Any], sweep_chunks: bool,
                       label: str = "map", devices: Optional[List[int]] = None) -> None:
        """gpupool from Python with the defaults, then a lanes x chunk_bytes sweep (lanes only
        where pieces never split) and the best point of it measured like every variant."""
        what = f"gpupool (Python) {label}"

        def setup(closers: Closers, lanes: Optional[int] = None,
                  chunk: Optional[int] = None) -> Callable[[], Any]:
            ex = self.executor(closers, lanes, chunk, devices)
            return lambda: work(ex)

        self.run(name, f"{what}, {self.settings_label(None, None)}", GPUPOOL, unit, amount,
                 setup, check, {"lanes": None, "chunk_bytes": None})
        if label == "map" and devices is None:
            for host in self.host_lanes_list:
                def with_host_lanes(closers: Closers, h: int = host) -> Callable[[], Any]:
                    ex = self.executor(closers, host_lanes=h)
                    return lambda: work(ex)

                self.run(name, f"{what}, {self.settings_label(None, None)} + {host} host lanes",
                         GPUPOOL, unit, amount, with_host_lanes, check,
                         {"lanes": None, "chunk_bytes": None, "host_lanes": host})
        points: List[Result] = []
        for lanes in self.lanes_list:
            for chunk in (self.chunk_list if sweep_chunks else [None]):
                r = self.run(name, f"{what}, {self.settings_label(lanes, chunk)}", GPUPOOL, unit,
                             amount, functools.partial(setup, lanes=lanes, chunk=chunk), check,
                             {"lanes": lanes, "chunk_bytes": chunk}, self.sweep_timing,
                             add=False)
                points.append(r)
        self.sweeps[f"{name} {what}"] = [p.as_json() for p in points]
        top = best(points, (GPUPOOL,))
        if top is None:
            failed = [p for p in points if p.status != OK]
            if failed:
                self.add(Result(name, f"{what}, sweep", GPUPOOL, failed[0].status, unit,
                                reason=failed[0].reason))
            return
        lanes, chunk = top.settings["lanes"], top.settings["chunk_bytes"]
        self.best_settings[name] = {"lanes": lanes, "chunk_bytes": chunk}
        self.progress(f"  [{name}] sweep of {len(points)} settings: best {lanes} lanes x "
                      f"{_bytes(chunk) if chunk else 'default pieces'}")
        self.run(name, f"{what}, best of sweep: {self.settings_label(lanes, chunk)}", GPUPOOL,
                 unit, amount, lambda c: setup(c, lanes, chunk), check,
                 {"lanes": lanes, "chunk_bytes": chunk, "chosen_by": "sweep"})

    # W4 -----------------------------------------------------------------------------------
    def w4(self) -> None:
        tasks, size = self.size["W4"]
        self.w4_data = data = self.float64_chunks(tasks, size)
        check = check_squares(data)
        amount = float(tasks)
        unit = "tasks/s"
        for threads in (5, 16):
            self.run("W4", f"motivating program, {_threads(threads)}", ANCHOR, unit, amount,
                     functools.partial(fw.make_motivating, threads, data), check)

        def noop(x: object) -> object:
            return x

        for threads in (1, 8):
            def floor(closers: Closers, t: int = threads) -> Callable[[], List[object]]:
                pool = ThreadPoolExecutor(max_workers=t)
                closers.append(lambda: pool.shutdown(wait=True))
                return lambda: list(pool.map(noop, data))

            # It returns its inputs, so it passes no check: it is the floor, not the work.
            self.run("W4", f"ThreadPoolExecutor running a no-op, {_threads(threads)} (floor)",
                     LIMIT, unit, amount, floor, lambda out: None, {"threads": threads})
        for threads in (1, 8):
            self.run("W4", f"careful CuPy, {_threads(threads)}", ALTERNATIVE, unit, amount,
                     functools.partial(fw.make_careful_cupy, threads, data), check,
                     {"threads": threads})
        for threads in (1, 8):
            self.run("W4", f"careful PyTorch, {_threads(threads)}", ALTERNATIVE, unit, amount,
                     functools.partial(fw.make_careful_torch, threads, data), check,
                     {"threads": threads})
        self.run("W4", "NumPy on the CPU, 1 thread", ALTERNATIVE, unit, amount,
                 lambda c: (lambda: [np.square(d) for d in data]), check)
        self.gpupool_python("W4", unit, amount, check,
                            lambda ex: list(ex.map(gpupool.kernels.square, data)),
                            sweep_chunks=False)

        def submit_loop(closers: Closers) -> Callable[[], Chunks]:
            ex = self.executor(closers)

            def run() -> Chunks:
                futures = [ex.submit(gpupool.kernels.square, d) for d in data]
                return [f.result() for f in futures]

            return run

        self.run("W4", f"gpupool (Python) submit loop, {self.settings_label(None, None)}",
                 GPUPOOL, unit, amount, submit_loop, check)
        self.w4_one_at_a_time(data, noop)
        self.cpp_rows("W4")

    def w4_one_at_a_time(self, data: Chunks, noop: Callable[[object], object]) -> None:
        """The per-task cost of a Python API, one task in flight: ``submit(f, x).result()`` in a
        loop, gpupool beside the standard library's pool doing the same (a quarter of W4's
        tasks: each waits for the one before); and no-op tasks through ``map`` beside the
        ThreadPoolExecutor floor above."""
        each = data[:max(1, len(data) // 4)]
        check = check_squares(each)
        unit = "tasks/s"

        def gpupool_each(closers: Closers) -> Callable[[], Chunks]:
            ex = self.executor(closers)
            return lambda: [ex.submit(gpupool.kernels.square, d).result() for d in each]

        def threadpool_each(closers: Closers) -> Callable[[], Chunks]:
            pool = ThreadPoolExecutor(max_workers=8)
            closers.append(lambda: pool.shutdown(wait=True))
            return lambda: [pool.submit(np.square, d).result() for d in each]

        # The same loop over a no-op: what one Python task costs, with nothing to do, beside the
        # standard library's pool (floors: no ratio to the rows that square).
        def noop_each(closers: Closers, stdlib: bool) -> Callable[[], List[object]]:
            if stdlib:
                pool = ThreadPoolExecutor(max_workers=8)
                closers.append(lambda: pool.shutdown(wait=True))
                return lambda: [pool.submit(noop, d).result() for d in each]
            ex = self.executor(closers)
            return lambda: [ex.submit(noop, d).result() for d in each]

        # In turn, round after round: a task's round trip moves with the host more than these
        # rows differ.
        tasks = float(len(each))
        self.run_interleaved([
            ("W4", "ThreadPoolExecutor, numpy.square, one at a time, 8 threads", ALTERNATIVE,
             unit, tasks, threadpool_each, check, {"threads": 8}),
            ("W4", "gpupool (Python) one at a time (submit, result)", GPUPOOL, unit, tasks,
             gpupool_each, check, {}),
            ("W4", "ThreadPoolExecutor, no-op, one at a time, 8 threads (floor)", LIMIT, unit,
             tasks, functools.partial(noop_each, stdlib=True), check_returned(each),
             {"threads": 8}),
            ("W4", "gpupool (Python) no-op, one at a time (floor)", LIMIT, unit, tasks,
             functools.partial(noop_each, stdlib=False), check_returned(each), {})])

        def gpupool_noop(closers: Closers) -> Callable[[], List[object]]:
            ex = self.executor(closers)
            return lambda: list(ex.map(noop, data))

        # gpupool's own floor: no work, so no ratio to the rows that square (a LIMIT row, shown
        # beside the standard library's).
        self.run("W4", "gpupool (Python) map of a no-op (floor)", LIMIT, unit, float(len(data)),
                 gpupool_noop, check_returned(data))

    # W5 -----------------------------------------------------------------------------------
    def w5(self) -> None:
        chunks, size, fmas = self.size["W5"]
        host = self.rng.uniform(-1, 1, chunks * size).astype(np.float32)
        host_chunks = [host[i * size:(i + 1) * size] for i in range(chunks)]
        unit = "ms"
        kernel = gpupool.elementwise("float32 x, float32 a, float32 b", "float32 y",
                                     fw.fma_body(fmas), f"compare_w5_{fmas}")
        cp: Optional[ModuleType] = None
        if self.on_gpus:
            try:
                cp = fw.need_cupy()
            except Skip:
                pass
        if cp is not None:
            self.w5_cupy(cp, host, host_chunks, size, fmas, kernel)
        else:
            check = check_fma(host_chunks, fmas, 8)
            self.add(skipped("W5", "CuPy one launch, per-chunk loops, careful CuPy", ALTERNATIVE,
                             "W5's data lives in CuPy arrays on the GPU: needs CuPy and gpupool's "
                             "CUDA backend", unit))
            self.gpupool_python("W5", unit, float(chunks), check,
                                lambda ex: list(ex.map(kernel, host_chunks, float(FMA_A),
                                                       float(FMA_B))),
                                sweep_chunks=False, label="map of a compiled kernel, host arrays")
        if size * chunks * fmas <= 2e8:
            check = check_fma(host_chunks, fmas, 8)
            self.run("W5", "NumPy on the CPU (float32 FMA chain)", ALTERNATIVE, unit,
                     float(chunks), lambda c: (lambda: [_numpy_fma(x, fmas) for x in host_chunks]),
                     check)
        else:
            self.add(skipped("W5", "NumPy on the CPU", ALTERNATIVE,
                             f"{chunks * size * fmas / 1e9:.0f} G FMAs would take minutes in "
                             "NumPy (it runs with --tiny)", unit))
        self.add(skipped("W5", "careful PyTorch", ALTERNATIVE,
                         "PyTorch cannot compile an elementwise loop without an extension; "
                         f"{fmas} separate ops per chunk would time launches, not the kernel",
                         unit))
        self.cpp_rows("W5")

    # CuPy carries no type annotations: its arrays, streams and kernels are Any here.
    def w5_cupy(self, cp: ModuleType, host: npt.NDArray[Any], host_chunks: Chunks, size: int,
                fmas: int, kernel: gpupool.ElementwiseKernel) -> None:
        chunks = len(host_chunks)
        data = cp.asarray(host)
        device_chunks = [data[i * size:(i + 1) * size] for i in range(chunks)]
        out = cp.empty_like(data)
        out_chunks = [out[i * size:(i + 1) * size] for i in range(chunks)]
        ck = fw.cupy_fma_kernel(fmas)
        a, b = FMA_A, FMA_B
        check = check_fma(host_chunks, fmas, 8, to_host=lambda x: x.get() if hasattr(x, "get")
                          else x)
        sync = cp.cuda.runtime.deviceSynchronize
        unit, amount = "ms", float(chunks)

        def one_launch(closers: Closers) -> Callable[[], List[Any]]:
            def run() -> List[Any]:
                ck(data, a, b, out)
                sync()
                return [o for o in out_chunks]
            return run

        self.run("W5", "CuPy one launch over all the data (limit)", LIMIT, unit, amount,
                 one_launch, check)
        for threads in (5, 16):
            def motivating(closers: Closers, t: int = threads) -> Callable[[], List[Any]]:
                pool = ThreadPoolExecutor(max_workers=t)
                closers.append(lambda: pool.shutdown(wait=True))

                def run() -> List[Any]:
                    results = list(pool.map(lambda x: ck(x, a, b), device_chunks))
                    sync()
                    return results
                return run

            self.run("W5", f"CuPy kernel per chunk in ThreadPoolExecutor, {_threads(threads)}",
                     ANCHOR, unit, amount, motivating, check)

        def loop(closers: Closers) -> Callable[[], List[Any]]:
            def run() -> List[Any]:
                for x, o in zip(device_chunks, out_chunks):
                    ck(x, a, b, o)
                sync()
                return out_chunks
            return run

        self.run("W5", "CuPy's own per-chunk loop, one stream", ALTERNATIVE, unit, amount, loop,
                 check)

        def careful(closers: Closers, threads: int = 4) -> Callable[[], List[Any]]:
            pool = fw.Pool(threads, lambda: cp.cuda.Stream(non_blocking=True))
            closers.append(pool.close)

            def work(i: int) -> None:
                stream = pool.state()
                with stream:
                    ck(device_chunks[i], a, b, out_chunks[i])
                stream.synchronize()

            def run() -> List[Any]:
                pool.map(work, range(chunks))
                return out_chunks
            return run

        self.run("W5", "careful CuPy, 4 threads (a stream each)", ALTERNATIVE, unit, amount,
                 careful, check, {"threads": 4})
        self.gpupool_python("W5", unit, amount, check,
                            lambda ex: list(ex.map(kernel, device_chunks, float(a), float(b))),
                            sweep_chunks=False, label="map of a compiled kernel over CuPy arrays")
        # The same map writing into arrays the caller made beforehand, as CuPy's own loop above
        # does (NaN until written, so that a call left unwritten fails the check).
        given = cp.full_like(data, float("nan"))
        given_chunks = [given[i * size:(i + 1) * size] for i in range(chunks)]

        def into_given(closers: Closers) -> Callable[[], List[Any]]:
            ex = self.executor(closers, None, None, None)
            return lambda: list(ex.map(kernel, device_chunks, float(a), float(b),
                                       out=given_chunks))

        self.run("W5", "gpupool (Python) map of a compiled kernel over CuPy arrays into given "
                 f"outputs (out=), {self.settings_label(None, None)}", GPUPOOL, unit, amount,
                 into_given, check, {"lanes": None, "chunk_bytes": None})
        # Into one array end to end (map_into): no object per call at all. Its views, made
        # here once, are only for the check.
        one = cp.full_like(data, float("nan"))
        one_chunks = [one[i * size:(i + 1) * size] for i in range(chunks)]

        def into_one(closers: Closers) -> Callable[[], List[Any]]:
            ex = self.executor(closers, None, None, None)

            def run() -> List[Any]:
                ex.map_into(kernel, device_chunks, float(a), float(b), out=one)
                return one_chunks
            return run

        self.run("W5", "gpupool (Python) map_into one array of a compiled kernel over CuPy "
                 f"arrays, {self.settings_label(None, None)}", GPUPOOL, unit, amount, into_one,
                 check, {"lanes": None, "chunk_bytes": None})

    # W6, W6c ------------------------------------------------------------------------------
    def many_gpus(self, name: str) -> bool:
        if self.gpus >= 2:
            return True
        self.add(skipped(name, "every variant", GPUPOOL,
                         f"needs two or more GPUs; this run has {self.gpus}", "x"))
        return False

    def speedup(self, name: str, variant: str, kind: str, amount: float,
                make: Callable[[Closers, Optional[List[int]]], Callable[[], Any]], check: Check,
                settings: Dict[str, Any]) -> Result:
        """Measures the same work on every GPU and on the first, as one speed-up row."""
        every = self.run(name, variant, kind, "GB/s", amount, lambda c: make(c, None), check,
                         settings, add=False)
        one = self.run(name, variant, kind, "GB/s", amount, lambda c: make(c, [0]), check,
                       settings, add=False)
        result = Result(name, variant, kind, every.status if every.status != OK else one.status,
                        "x", settings=settings)
        if result.status != OK:
            result.reason = every.reason or one.reason
        else:
            assert every.figure is not None and one.figure is not None  # measured: both are set
            result.figure = every.figure / one.figure
            result.repeats_s = every.repeats_s
            result.extra = {"gb_per_s_every_gpu": every.figure, "gb_per_s_one_gpu": one.figure,
                            "repeats_s_one_gpu": one.repeats_s, "devices": self.gpus}
        return self.add(result)

    def w6(self) -> None:
        if not self.many_gpus("W6"):
            return
        data = getattr(self, "w2_data", None) or self.float64_chunks(*self.size["W2"])
        check = check_squares(data)
        amount = sum(d.nbytes for d in data) / 1e9
        chosen = self.best_settings.get("W2", {})
        for lanes, chunk in ((None, None), (chosen.get("lanes"), chosen.get("chunk_bytes"))):
            def make(closers: Closers, devices: Optional[List[int]], l: Optional[int] = lanes,
                     c: Optional[int] = chunk) -> Callable[[], Chunks]:
                ex = self.executor(closers, l, c, devices)
                return lambda: list(ex.map(gpupool.kernels.square, data))

            self.speedup("W6", f"gpupool (Python) map, {self.settings_label(lanes, chunk)}",
                         GPUPOOL, amount, make, check, {"lanes": lanes, "chunk_bytes": chunk})
            if not chosen:
                break
        self.cpp_rows("W6")

    def w6c(self) -> None:
        if not self.many_gpus("W6c"):
            return
        chunks, size, fmas = self.size["W6c"]
        data = [self.rng.uniform(-1, 1, size).astype(np.float32) for _ in range(chunks)]
        check = check_fma(data, fmas, 16, add_input=True)
        kernel = gpupool.elementwise("float32 x, float32 a", "float32 y",
                                     fw.fma_body(fmas, addend="x"), f"compare_w6c_{fmas}")
        amount = sum(d.nbytes for d in data) / 1e9

        def make(closers: Closers, devices: Optional[List[int]]) -> Callable[[], Chunks]:
            ex = self.executor(closers, None, None, devices)
            return lambda: list(ex.map(kernel, data, float(FMA_A)))

        self.speedup("W6c", f"gpupool (Python) map of a compiled kernel, "
                     f"{self.settings_label(None, None)}", GPUPOOL, amount, make, check, {})
        self.cpp_rows("W6c")

    # W8 -----------------------------------------------------------------------------------
    def w8(self) -> None:
        for size_of, data_name in (("W2", "w2_data"), ("W4", "w4_data")):
            name = f"W8@{size_of}"
            unit = "GB/s" if size_of == "W2" else "tasks/s"
            if not self.on_gpus:
                self.add(skipped(name, "every variant", GPUPOOL,
                                 "the user's CuPy function needs CuPy and the CUDA backend", unit))
                continue
            # W2's or W4's own data where that workload ran in this run, else the same sizes.
            data = getattr(self, data_name, None)
            if data is None:
                data = self.float64_chunks(*self.size[size_of])
            amount = sum(d.nbytes for d in data) / 1e9 if unit == "GB/s" else float(len(data))
            check = check_squares(data)
            def unchanged(closers: Closers, lanes: int) -> Callable[[], Chunks]:
                fw.need_cupy()
                ex = self.executor(closers, lanes)
                return lambda: list(ex.map(fw.motivating_square, data))

            def through_lane(closers: Closers) -> Callable[[], List[object]]:
                fw.need_cupy()
                ex = self.executor(closers)
                return lambda: list(ex.map(lane_square, data))

            # The reference measured again, in turn with gpupool's rows, round after round (the
            # first reference row is what they are compared with): the one measured in W2 or W4
            # ran minutes earlier, and the host's speed drifts within a run by more than the
            # margins W8 (a) is judged by. threads_per_gpu=5 in (a): the one changed line of the
            # README's diff.
            self.run_interleaved([
                (name, "motivating program, 5 threads (measured in turn with gpupool's rows)",
                 ANCHOR, unit, amount, functools.partial(fw.make_motivating, 5, data), check,
                 {"threads": 5}),
                (name, "(a) the motivating function unchanged in gpupool.Executor, "
                 f"{self.settings_label(5, None)}", GPUPOOL, unit, amount,
                 lambda c: unchanged(c, 5), check, {"lanes": 5}),
                (name, "(b) the same math through current_lane().upload/download, "
                 f"{self.settings_label(None, None)}", GPUPOOL, unit, amount, through_lane, check,
                 {})])
            for r in list(self.results):
                if r.workload == size_of and r.kind == ANCHOR and r.status == OK:
                    copy = Result(**{**r.as_json(), "workload": name,
                                     "variant": r.variant + f" (measured in {size_of})"})
                    self.results.append(copy)

    # C++ programs -------------------------------------------------------------------------
    def cpp_rows(self, workload: str) -> None:
        self.gpupool_cpp_rows(workload)
        self.baseline_rows(workload, workload)

    def _program(self, name: str) -> Tuple[Optional[str], str]:
        """(path, "") of a C++ program, or (None, why it is not there)."""
        path, why = self.cpp[name]
        return path, why or ""

    def gpupool_cpp_rows(self, workload: str) -> None:
        if workload not in ("W1", "W2", "W3", "W4", "W5", "W6", "W6c"):
            return
        path, why = self._program(_programs.GPUPOOL_CPP)
        label = "gpupool (C++)"
        if path is None:
            self.add(skipped(workload, label, GPUPOOL, why))
            return
        arguments = self.program_arguments(workload) + [
            "--backend", self.backend,
            "--lanes-list", ",".join(str(x) for x in self.lanes_list),
            "--chunk-list", ",".join(str(x) for x in self.chunk_list)]
        if self.host_lanes_list:
            arguments += ["--host-lanes-list", ",".join(str(x) for x in self.host_lanes_list)]
        self.program_rows(workload, path, arguments, label + " ")

    def baseline_rows(self, workload: str, table: str) -> None:
        path, why = self._program(_programs.BASELINE)
        label = "hand-written C++ pipeline" if workload != "limits" else "copy limits and launch"
        if path is None:
            self.add(skipped(table, label, ALTERNATIVE if workload != "limits" else LIMIT, why))
            if workload == "limits":
                self.cupy_limits()
            return
        if self.gpus == 0:
            self.add(skipped(table, label, ALTERNATIVE if workload != "limits" else LIMIT,
                             "runs only beside gpupool's CUDA backend (a GPU)"))
            return
        rows = self.program_rows(workload, path, self.program_arguments(workload), "")
        if workload == "limits":
            for r in rows:
                key = r.settings.get("limit")
                if r.status == OK and key and r.figure is not None:  # measured: it has one
                    self.limits[key] = r.figure

    def program_arguments(self, workload: str) -> List[str]:
        arguments = ["--workload", workload, "--repeat", str(self.timing.repeat),
                     "--min-repeat", str(self.timing.min_repeat),
                     "--seconds", str(self.timing.seconds)]
        if workload in self.size:
            shape = self.size[workload]
            arguments += ["--chunks", str(shape[0]), "--size", str(shape[1])]
            if len(shape) > 2:
                arguments += ["--fmas", str(shape[2])]
        elif workload == "W6":
            arguments += ["--chunks", str(self.size["W2"][0]), "--size", str(self.size["W2"][1])]
        elif workload == "limits":
            arguments += ["--size", str((8 << 20) if self.args.tiny else (256 << 20))]
        return arguments

    def program_rows(self, workload: str, path: str, arguments: List[str],
                     prefix: str) -> List[Result]:
        rows, error = _programs.run_program(path, arguments, self.args.program_timeout)
        results: List[Result] = []
        sweep: List[Result] = []
        for row in rows:
            r = _programs.to_result(row, prefix)
            if r is None:
                continue
            if row.get("sweep"):
                sweep.append(r)
                continue
            results.append(self.add(r))
        if sweep:
            self.sweeps[f"{workload} {prefix.strip()}"] = [p.as_json() for p in sweep]
            top = best(sweep, (GPUPOOL, ALTERNATIVE))
            if top is not None:
                top.variant += " (best of sweep)"
                results.append(self.add(top))
        if error:
            results.append(self.add(Result(workload, f"{prefix}{_program_name(path)}", GPUPOOL,
                                           FAILED, reason=error)))
        return results

    def cupy_limits(self) -> None:
        """Copy limits of the first GPU through CuPy, when the C++ baseline is not built."""
        try:
            cp = fw.need_cupy()
        except Skip as why:
            self.add(skipped("limits", "copy limits through CuPy", LIMIT, str(why), "GB/s"))
            return
        import cupyx  # type: ignore[import-not-found, import-untyped, unused-ignore]  # untyped

        nbytes = (8 << 20) if self.args.tiny else (256 << 20)
        host_in = cupyx.empty_pinned(nbytes, np.uint8)
        host_in[:] = 7
        host_out = cupyx.empty_pinned(nbytes, np.uint8)
        dev_in, dev_out = cp.empty(nbytes, np.uint8), cp.empty(nbytes, np.uint8)
        up, down = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
        rounds = 5

        def timed(copy_in: bool, copy_out: bool) -> float:
            copy_in and dev_in.set(host_in, stream=up)
            copy_out and dev_out.get(stream=down, out=host_out, blocking=False)
            up.synchronize(), down.synchronize()
            t0 = time.perf_counter()
            for _ in range(rounds):
                copy_in and dev_in.set(host_in, stream=up)
                copy_out and dev_out.get(stream=down, out=host_out, blocking=False)
            up.synchronize(), down.synchronize()
            return time.perf_counter() - t0

        moved = nbytes * rounds / 1e9
        for key, label, args in (("h2d_gb_s", "pinned host to device", (True, False)),
                                 ("d2h_gb_s", "device to pinned host", (False, True)),
                                 ("both_gb_s", "each way, both at once", (True, True))):
            self.limits[key] = moved / timed(*args)
            self.add(Result("limits", f"copy limit through CuPy, GPU 0: {label}", LIMIT, OK,
                            "GB/s", self.limits[key], extra={"direct": True}))


def _close_all(closers: Closers) -> None:
    """Runs every closer, last first (each shuts down one variant's executor or pool), whatever
    an earlier one raised."""
    while closers:
        try:
            closers.pop()()
        except Exception:
            pass


def lane_square(chunk: npt.NDArray[Any]) -> object:
    """W8 (b): the motivating function's math on the lane's stream, through its pinned slot."""
    lane = gpupool.current_lane()
    device: Any = lane.upload(chunk)  # a CuPy array (CuPy carries no type annotations)
    return lane.download(device * device)


def _numpy_fma(x: npt.NDArray[Any], fmas: int) -> npt.NDArray[Any]:
    v = x.copy()
    for _ in range(fmas):
        v *= FMA_A
        v += FMA_B
    return v


def _program_name(path: str) -> str:
    from pathlib import Path

    return Path(path).name


def _threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def _cpu_count() -> Optional[int]:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def _ints(text: Optional[str]) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def _sizes(text: Optional[str]) -> List[int]:
    out: List[int] = []
    for part in (text or "").split(","):
        part = part.strip().upper()
        if not part:
            continue
        factor = 1
        for suffix, f in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
            if part.endswith(suffix):
                part, factor = part[:-1], f
        out.append(int(float(part) * factor))
    return out


def _bytes(n: Optional[int]) -> str:
    if not n:
        return "default pieces"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


DESCRIBED = set(WORKLOADS) | {"limits", "W8@W2", "W8@W4"}
