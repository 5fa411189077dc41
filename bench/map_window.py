"""Executor.map over host arrays, as a user streams them: W2 (200 x 1,000,000 float64) and W4
(20,000 x 1,024 float64) through the built-in square, and W4 through a Python callable, each
result checked against NumPy before any time counts. It judges the map's window (calls queued
only as far ahead of the consumer as results fit) against a build without one: run it under
each build with `scripts/gpu paired --python bench/map_window.py`.

    python3 bench/map_window.py [--lanes 0] [--repeat 7] [--backend cuda]

Prints one line per workload: `LABEL  MEDIAN ms`, the median of the timed runs after a warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable, List

import numpy as np

import gpupool


def timed(run: Callable[[], List[Any]], check: Callable[[List[Any]], None],
          repeat: int) -> float:
    check(run())  # warm-up, and the results checked before any time counts
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
        check(out)
        del out
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # `scripts/gpu paired --python` passes the lane count as --lanes N.
    parser.add_argument("--lanes", type=int, default=0, help="lanes per device (0: auto)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--backend", default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    w2 = [rng.random(1_000_000) for _ in range(200)]
    w4 = [rng.random(1_024) for _ in range(20_000)]
    w2_expected = [x * x for x in w2]
    w4_expected = [x * x for x in w4]

    def check(expected: List[np.ndarray]) -> Callable[[List[Any]], None]:
        def same(out: List[Any]) -> None:
            if len(out) != len(expected) or not all(
                    np.array_equal(a, b) for a, b in zip(out, expected)):
                raise SystemExit("FAIL: a result differs from NumPy's")
        return same

    threads: Any = "auto" if args.lanes == 0 else args.lanes
    with gpupool.Executor(threads_per_gpu=threads, backend=args.backend) as ex:
        square = gpupool.kernels.square
        rows = [
            ("W2 map, built-in", lambda: list(ex.map(square, w2)), check(w2_expected)),
            ("W4 map, built-in", lambda: list(ex.map(square, w4)), check(w4_expected)),
            ("W4 map, callable", lambda: list(ex.map(np.square, w4)), check(w4_expected)),
        ]
        print(f"backend {ex.backend}, {ex.lane_count} lanes, chunk {ex.chunk_bytes} bytes")
        for label, run, same in rows:
            seconds = timed(run, same, args.repeat)
            print(f"  {label:<22} {seconds * 1e3:8.2f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
