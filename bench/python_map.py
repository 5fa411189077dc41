"""Executor.map over a Python function with many small tasks, before and after its calls were
queued in batches by one call to the extension each: W8 (a) (the motivating function
unchanged, 5 lanes), W8 (b) (the same math through Lane.upload/download, the default lanes) and a
no-op, at W4 size (20,000 x 1,024 float64), beside the motivating program (ThreadPoolExecutor,
5 threads) and careful CuPy on one thread in the same run. Rounds interleave the variants; every
result is checked before its rate counts.

Variants of gpupool's map:
  before      a submit() per call, then each result in order, each future's Condition made (what
              map did: its cancel() of every future it handed on made one)
  now         map as it is

    python3 bench/python_map.py [--count 20000] [--size 1024] [--rounds 5] [--holds 0,50,200,1000]
        [--long 20000,100000] [--long-count 2000]

`--holds`: for W8 (b), how long a task polls its stream after a small copy holding the GIL (0:
let it go at once). The long-kernel rows run W8 (b) with a kernel of that many dependent adds
between the copies (tens to hundreds of microseconds), where holding the GIL through the wait
would keep the other lanes from starting theirs. Without CuPy only the no-op rows run.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List

import numpy as np

import gpupool
from gpupool import _ext
from gpupool.compare import _frameworks as fw
from gpupool.compare._workloads import lane_square  # W8 (b) as a user writes it


_LONG_KERNELS: Dict[int, Any] = {}


def long_kernel(iterations: int) -> Any:
    """A kernel that adds 1 to each element `iterations` times, one dependent add after another
    (exact on integers): GPU time that a small copy does not have."""
    if iterations not in _LONG_KERNELS:
        import cupy as cp  # type: ignore[import-not-found, import-untyped, unused-ignore]

        _LONG_KERNELS[iterations] = cp.ElementwiseKernel(
            "float64 x", "float64 y",
            f"double v = x; for (int i = 0; i < {iterations}; ++i) v = v + 1.0; y = v;",
            f"gpupool_bench_long_{iterations}")
    return _LONG_KERNELS[iterations]


def lane_long(iterations: int, chunk: Any) -> Any:
    """W8 (b) with a long kernel between the copies."""
    lane = gpupool.current_lane()
    device: Any = lane.upload(chunk)
    return lane.download(long_kernel(iterations)(device))


def no_op(chunk: Any) -> Any:
    return chunk


def map_before(ex: Any, fn: Callable[[Any], Any], data: List[Any]) -> List[Any]:
    pending = [ex.submit(fn, chunk) for chunk in data]
    out = []
    for future in pending:
        out.append(future.result())
        future._condition  # what map's cancel() of a finished future made before
    return out


def map_now(ex: Any, fn: Callable[[Any], Any], data: List[Any]) -> List[Any]:
    return list(ex.map(fn, data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1_024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--holds", default="0,50,200,1000")
    parser.add_argument("--long", default="20000,100000",
                        help="iterations of the long kernel's rows (none: leave them out)")
    parser.add_argument("--long-count", type=int, default=2_000)
    args = parser.parse_args()
    try:
        # Imported before the executors: their lanes bind its streams.
        import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]  # noqa: F401
        gpu = fw.gpu_count() > 0
    except ImportError:
        gpu = False
    default_hold = _ext._lane_gil_hold_us()
    holds = [int(h) for h in args.holds.split(",")]
    rng = np.random.default_rng(11)
    # Whole numbers, so that the long kernel's adds are exact; squares are exact too.
    data = [rng.integers(-1000, 1000, args.size).astype(np.float64) for _ in range(args.count)]
    squares = [np.square(d) for d in data]

    def checker(expected: List[Any], label: str) -> Callable[[List[Any]], None]:
        def check(results: List[Any]) -> None:
            if len(results) != len(expected) or not all(
                    np.array_equal(np.asarray(r), e) for r, e in zip(results, expected)):
                raise SystemExit(f"FAIL: {label}: a result differs")
        return check

    check_square = checker(squares, "square")
    check_same = checker(data, "no-op")
    default_lanes = gpupool.Executor()
    five_lanes = gpupool.Executor(threads_per_gpu=5)
    tpe = ThreadPoolExecutor(5)
    # label -> (GIL hold or -1 to leave it, run, check)
    runs: Dict[str, Any] = {}

    def variants(prefix: str, ex: Any, fn: Callable[[Any], Any], check: Any, hold: int,
                 before: bool = True) -> None:
        if before:
            runs[f"{prefix}, before"] = (hold, functools.partial(map_before, ex, fn, data), check)
        runs[f"{prefix}, now"] = (hold, functools.partial(map_now, ex, fn, data), check)

    runs["no-op, ThreadPoolExecutor 5 threads"] = (-1, functools.partial(
        lambda d: list(tpe.map(no_op, d)), data), check_same)
    variants(f"no-op, gpupool {default_lanes.threads_per_gpu} lanes", default_lanes, no_op,
             check_same, -1)
    reference = ""
    if gpu:
        reference = "motivating program (ThreadPoolExecutor, 5 threads)"
        runs[reference] = (-1, functools.partial(
            lambda d: list(tpe.map(fw.motivating_square, d)), data), check_square)
        runs["careful CuPy, 1 thread"] = (-1, functools.partial(fw.careful_cupy_loop, data),
                                          check_square)
        variants("W8 (a), gpupool 5 lanes", five_lanes, fw.motivating_square, check_square, -1)
        for hold in holds:
            variants(f"W8 (b), gpupool {default_lanes.threads_per_gpu} lanes, hold {hold} us",
                     default_lanes, lane_square, check_square, hold,
                     before=hold in (0, max(holds)))
        few = data[:args.long_count]
        for iterations in [int(n) for n in args.long.split(",") if n and n != "none"]:
            long_check = checker([d + iterations for d in few], f"long kernel {iterations}")
            for hold in holds:
                label = (f"long kernel ({iterations:,} adds), {args.long_count:,} tasks, hold "
                         f"{hold} us")
                long_run = functools.partial(lane_long, iterations)
                runs[label] = (hold, functools.partial(map_now, default_lanes, long_run, few),
                               long_check)
            # Compiled before the rounds, not in the first one.
            map_now(default_lanes, functools.partial(lane_long, iterations), few[:8])
    else:
        print("no GPU or no CuPy: the no-op rows only", file=sys.stderr)
    times: Dict[str, List[float]] = {k: [] for k in runs}
    print(f"== {args.count} x {args.size} float64, {args.rounds} rounds", flush=True)
    try:
        for _ in range(args.rounds):
            for label, (hold, run, check) in runs.items():
                _ext._lane_gil_hold_us(hold if hold >= 0 else default_hold)
                t0 = time.perf_counter()
                results = run()
                times[label].append(time.perf_counter() - t0)
                check(results)
                del results
    finally:
        _ext._lane_gil_hold_us(default_hold)
    base = statistics.median(times[reference]) if reference else None
    for label, seconds in times.items():
        median = statistics.median(seconds)
        count = args.long_count if label.startswith("long") else args.count
        versus = (f"  {base / median:5.2f}x the motivating program"
                  if base and count == args.count else "")
        print(f"  {label:58s} {count / median:>9,.0f} tasks/s{versus}; rounds: "
              f"{' '.join(f'{count / t:,.0f}' for t in seconds)}", flush=True)
    tpe.shutdown()
    default_lanes.shutdown()
    five_lanes.shutdown()


if __name__ == "__main__":
    main()
