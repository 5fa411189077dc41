"""The motivating program beside ``gpupool demo``: ``cupy.asnumpy(cupy.array(chunk) ** 2)`` in a
``ThreadPoolExecutor(max_workers=5)`` (examples/seed.py, the original line), run on the demo's
sizes with the demo's warm-up and timed runs, its results checked against NumPy, and the ratio
of the two printed.

It needs only NumPy and CuPy (not gpupool), so that ``scripts/demo`` can run it by path with any
Python that has CuPy::

    python3 python/gpupool/_motivating.py --summary demo-summary.json

where the summary is what ``gpupool demo --summary`` wrote. Without a usable CuPy it prints one
line saying why the comparison was skipped, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence

THREADS = 5
WHAT = (f"motivating program (cupy.asnumpy(cupy.array(chunk) ** 2) in "
        f"ThreadPoolExecutor(max_workers={THREADS}), examples/seed.py)")


class Unavailable(Exception):
    """The motivating program cannot run here; the message says why."""


class WrongResult(Exception):
    """The motivating program's results differ from NumPy's."""


def load_cupy() -> ModuleType:
    """CuPy with a usable GPU, else Unavailable."""
    try:
        # Optional, and without annotations mypy can use where installed.
        import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        raise Unavailable("CuPy is not installed") from None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as error:  # installed, but no driver or no device
        first = (str(error).strip().splitlines() or [""])[0]
        raise Unavailable(f"CuPy cannot use a GPU here ({type(error).__name__}: "
                          f"{first[:100]})") from None
    if count == 0:
        raise Unavailable("CuPy sees no GPU")
    module: ModuleType = cupy
    return module


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted, non-empty values, interpolated linearly between the two
    nearest ranks: as NumPy's default, and as the C++ tool computes it."""
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def spread(times_ms: Sequence[float]) -> Dict[str, float]:
    """Median, quartiles and extremes of the timed runs, under the C++ tool's JSON names."""
    ordered = sorted(times_ms)
    return {"median_ms": quantile(ordered, 0.5), "best_ms": ordered[0],
            "q1_ms": quantile(ordered, 0.25), "q3_ms": quantile(ordered, 0.75),
            "max_ms": ordered[-1]}


def run(chunks: int, size: int, warmup: int, repeat: int, seed: int = 42) -> Dict[str, Any]:
    """Runs the motivating program as the demo runs gpupool: a cold first run, ``warmup``
    untimed runs, ``repeat`` timed ones. The first and the last run's results are checked
    against NumPy (WrongResult). Raises Unavailable where CuPy cannot run."""
    cp = load_cupy()
    import numpy as np

    rng = np.random.default_rng(seed)
    data = [rng.uniform(-10.0, 10.0, size) for _ in range(chunks)]
    want = [d * d for d in data]

    def square(chunk: Any) -> Any:
        return cp.asnumpy(cp.array(chunk) ** 2)

    def check(results: List[Any], which: str) -> None:
        if len(results) != len(want) or not all(
                np.array_equal(got, expect) for got, expect in zip(results, want)):
            raise WrongResult(f"the motivating program's {which} run differs from NumPy")

    # The CUDA context and CuPy's memory pool are made before the clock starts, as gpupool's
    # are in its executor's constructor: the cold run of each is its first piece of work.
    started = time.perf_counter()
    cp.zeros(1).sum()
    cp.cuda.Device().synchronize()
    start_ms = (time.perf_counter() - started) * 1e3
    results: List[Any] = []
    times_ms: List[float] = []
    cold_ms = 0.0
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        for index in range(1 + warmup + repeat):
            results = []  # the previous run's results are let go first, as in the demo
            t0 = time.perf_counter()
            results = list(pool.map(square, data))
            elapsed = (time.perf_counter() - t0) * 1e3
            if index == 0:
                cold_ms = elapsed
                check(results, "first")
            elif index > warmup:
                times_ms.append(elapsed)
    check(results, "last")
    input_bytes = chunks * size * 8
    figures = spread(times_ms)
    return {"threads": THREADS, "chunks": chunks, "size": size, "warmup": warmup,
            "repeat": repeat, "start_ms": start_ms, "cold_ms": cold_ms, "times_ms": times_ms,
            **figures, "input_gb_per_s": input_bytes / (figures["median_ms"] * 1e-3) / 1e9,
            "wrong": 0}


def report_lines(gpupool: Dict[str, Any], motivating: Dict[str, Any]) -> List[str]:
    """The lines printed after the demo's own: the motivating program's steady state and cold
    run, then gpupool's ratio to it in each."""
    m = motivating
    gb = m["chunks"] * m["size"] * 8 / 1e9
    steady = gpupool["median_ms"], m["median_ms"]
    cold = gpupool["cold_ms"], m["cold_ms"]
    runs = "run" if m["warmup"] == 1 else "runs"
    return [
        f"{WHAT}, same sizes, results equal NumPy's:",
        f"  steady state: {m['median_ms']:.3f} ms median of {m['repeat']} timed runs after "
        f"{m['warmup']} warm-up {runs} (min {m['best_ms']:.3f}, IQR {m['q1_ms']:.3f}-"
        f"{m['q3_ms']:.3f}, max {m['max_ms']:.3f} ms): {m['input_gb_per_s']:.2f} GB/s of input",
        f"  cold first run: {m['cold_ms']:.3f} ms ({gb / (m['cold_ms'] * 1e-3):.2f} GB/s)",
        f"gpupool vs the motivating program: {steady[1] / steady[0]:.2f}x as fast in the steady "
        f"state ({steady[0]:.3f} vs {steady[1]:.3f} ms median), {cold[1] / cold[0]:.2f}x on the "
        f"cold first run ({cold[0]:.3f} vs {cold[1]:.3f} ms)",
    ]


def skipped_line(reason: str) -> str:
    """The one line printed where the comparison cannot run."""
    return f"motivating program (CuPy in a ThreadPoolExecutor) not run beside it: {reason}"


def compare(gpupool: Dict[str, Any]) -> Dict[str, Any]:
    """Runs the motivating program on the sizes and runs of gpupool's demo summary; returns its
    figures with the two ratios (``x_steady``, ``x_cold``: how many times faster gpupool was),
    or ``{"skipped": reason}``. Raises WrongResult."""
    try:
        m = run(int(gpupool["chunks"]), int(gpupool["size"]), int(gpupool["warmup"]),
                int(gpupool["repeat"]), int(gpupool.get("seed", 42)))
    except Unavailable as why:
        return {"skipped": str(why)}
    m["x_steady"] = m["median_ms"] / gpupool["median_ms"]
    m["x_cold"] = m["cold_ms"] / gpupool["cold_ms"]
    return m


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Reads ``--summary`` (from ``gpupool demo --summary``), runs the motivating program beside
    it and prints the comparison (or why it was skipped). 1 when its results were wrong."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--summary", required=True,
                        help="the JSON file gpupool demo --summary wrote")
    args = parser.parse_args(argv)
    try:
        with open(args.summary, encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError) as error:
        print(f"cannot read the demo's summary {args.summary}: {error}", file=sys.stderr)
        return 2
    try:
        result = compare(summary)
    except WrongResult as wrong:
        print(f"gpupool demo: {wrong}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError) as error:
        print(f"the demo's summary {args.summary} lacks what it needs: {error!r}",
              file=sys.stderr)
        return 2
    if "skipped" in result:
        print(skipped_line(result["skipped"]))
    else:
        print("\n".join(report_lines(summary, result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
