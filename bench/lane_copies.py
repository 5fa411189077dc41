"""How a Python task's `Lane.upload`/`Lane.download` cost with many lanes: W8 (b), the
motivating function's math through the lane helpers, at W4 size (20,000 x 1,024 float64), by
lanes, by how long a task waits for its copies holding the GIL before it lets the GIL go, and by
which download runs (the CuPy array read and its pinned result made in C++, or the Python
helper), beside the motivating program (ThreadPoolExecutor, 5 threads) and careful CuPy on one
thread in the same run. Rounds interleave the variants; every result is checked against
numpy.square before its rate counts.

    python3 bench/lane_copies.py [--count 20000] [--size 1024] [--rounds 3]
        [--lanes 1,2,4,0] [--holds 0,200,1000] [--w2]

`--lanes 0` is the executor's default. `--w2` adds W2's size (200 x 1M float64), GB/s. Each row
gives the median over rounds and every round's figure.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

import gpupool
from gpupool import _ext
from gpupool._executor import _lane_download  # the Python helper, for the side-by-side rows
from gpupool.compare import _frameworks as fw
from gpupool.compare._workloads import lane_square  # W8 (b) as a user writes it


def lane_square_python_download(chunk: Any) -> Any:
    """The same through the Python download helper (what Lane.download ran before)."""
    lane = gpupool.current_lane()
    device: Any = lane.upload(chunk)
    return _lane_download(lane, device * device)


def mapped(ex: Any, fn: Callable[[Any], Any], data: List[Any]) -> List[Any]:
    return list(ex.map(fn, data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1_024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lanes", default="1,2,4,0")
    parser.add_argument("--holds", default="0,200,1000")
    parser.add_argument("--w2", action="store_true")
    args = parser.parse_args()
    # Imported before the executors: their lanes bind its streams.
    import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]  # noqa: F401

    shapes: List[Tuple[str, int, int]] = [("W4", args.count, args.size)]
    if args.w2:
        shapes.append(("W2", 200, 1_000_000))
    lane_counts = [int(n) for n in args.lanes.split(",")]
    default_hold = _ext._lane_gil_hold_us()
    holds = [int(h) for h in args.holds.split(",")]
    rng = np.random.default_rng(11)
    for name, count, length in shapes:
        data = [rng.standard_normal(length) for _ in range(count)]
        expected = [np.square(d) for d in data]
        nbytes = sum(d.nbytes for d in data)

        def check(results: List[Any]) -> None:
            if len(results) != count or not all(
                    np.array_equal(np.asarray(r), e) for r, e in zip(results, expected)):
                raise SystemExit(f"FAIL: {name}: a result differs from numpy.square")

        pools: Dict[int, Any] = {n: gpupool.Executor(threads_per_gpu=n or None)
                                 for n in lane_counts}
        tpe = ThreadPoolExecutor(5)
        runs: Dict[str, Tuple[int, Callable[[], List[Any]]]] = {
            "motivating program (ThreadPoolExecutor, 5 threads)":
                (-1, lambda: list(tpe.map(fw.motivating_square, data))),
            "careful CuPy, 1 thread": (-1, lambda: fw.careful_cupy_loop(data)),
        }
        for n, ex in pools.items():
            lanes = f"{ex.threads_per_gpu} lanes" + (" (default)" if n == 0 else "")
            for hold in holds:
                runs[f"Lane helpers, {lanes}, hold {hold} us"] = (
                    hold, functools.partial(mapped, ex, lane_square, data))
            if n == 0:
                for hold in holds:
                    runs[f"Python download, {lanes}, hold {hold} us"] = (
                        hold, functools.partial(mapped, ex, lane_square_python_download, data))
        times: Dict[str, List[float]] = {k: [] for k in runs}
        print(f"== {name}: {count} x {length} float64, {args.rounds} rounds", flush=True)
        for _ in range(args.rounds):
            for label, (hold, run) in runs.items():
                if hold >= 0:
                    _ext._lane_gil_hold_us(hold)
                t0 = time.perf_counter()
                results = run()
                times[label].append(time.perf_counter() - t0)
                check(results)
                del results
        _ext._lane_gil_hold_us(default_hold)
        reference = statistics.median(times["motivating program (ThreadPoolExecutor, 5 threads)"])
        def rate(seconds: float) -> str:
            return (f"{nbytes / seconds / 1e9:.2f}" if name == "W2" else f"{count / seconds:,.0f}")

        unit = "GB/s" if name == "W2" else "tasks/s"
        for label, seconds in times.items():
            median = statistics.median(seconds)
            print(f"  {label:52s} {rate(median):>9s} {unit}  {reference / median:5.2f}x the "
                  f"motivating program; rounds: {' '.join(rate(t) for t in seconds)}",
                  flush=True)
        tpe.shutdown()
        for ex in pools.values():
            ex.shutdown()


if __name__ == "__main__":
    main()
