"""Where W8's time goes: the user's own CuPy function in gpupool, beside the motivating program
(CuPy + ThreadPoolExecutor), at W4 size (20,000 x 1,024 float64) and W2 size (200 x 1M float64),
all in one run: each variant once to warm up, then --repeat rounds of all of them, each round
starting one variant later. Every result is checked; the best and median round are printed.

Variants (5 threads or lanes unless said):
  tpe                    ThreadPoolExecutor.map(motivating_square): the motivating program, every
                         thread on CuPy's legacy default stream
  tpe, own streams       the same, each thread on a non-blocking CuPy stream of its own
  gpupool                Executor(threads_per_gpu=5).map(motivating_square): W8 (a)
  gpupool, no runner     the same with the lanes' streams not made current for CuPy (every call
                         on the legacy default stream, as in the motivating program)
  tpe no-op, gpupool no-op   what each pool itself costs per call
  lane                   Executor().map(lane_square): W8 (b), with the default lanes and with 5
                         (or each of --lane-counts)
  gpupool, one call per hold   W8 (a) with each lane taking the GIL for one call at a time (no
                         chain of the calls queued behind it)
  gpupool, lanes never spin    W8 (a) with GPUPOOL_LANE_SPIN_US=0 (a lane with no work sleeps)
  tpe / gpupool, switch 1 ms   tpe and W8 (a) with sys.setswitchinterval(0.001) (Python's
                         default is 5 ms: how long a thread waiting for the GIL waits before
                         it asks the holder to let go)
Then, per variant, the mean time of each step of the function per call (the steps are timed
inside the calls, so the rates of the timed runs are a little lower than the untimed ones).

    python bench/w8_profile.py [--repeat 3] [--sizes W4,W2] [--only VARIANT[|VARIANT...]]
                               [--lane-counts 5,8,16]

--only runs those variants' timed rounds (interleaved) and nothing else (to profile one, say:
`--only "lane, default lanes"`; to set two side by side: `--only "tpe|gpupool"`).
"""

import argparse
import functools
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List

import numpy as np

import gpupool
from gpupool.compare import _frameworks as fw

SIZES = {"W4": (20_000, 1_024), "W2": (200, 1_000_000)}

# Step timings: (variant, step) -> seconds, appended from every thread (list.append holds the
# GIL for its whole run).
_steps: Dict[str, List[float]] = {}
_label = ""


def _add(step: str, seconds: float) -> None:
    _steps.setdefault(f"{_label}|{step}", []).append(seconds)


def _timed_steps(value: Any, steps: Any) -> Any:
    """Applies each (name, function) of `steps` in turn, timing each."""
    for name, step in steps:
        t0 = time.perf_counter()
        value = step(value)
        _add(name, time.perf_counter() - t0)
    return value


def _map_all(pool: Any, fn: Callable[[Any], Any], data: List[Any]) -> List[Any]:
    return list(pool.map(fn, data))


def timed_motivating(chunk: Any) -> Any:
    import cupy as cp  # type: ignore[import-not-found, import-untyped, unused-ignore]

    return _timed_steps(chunk, (("cp.array", cp.array), ("** 2", lambda d: d ** 2),
                                ("cp.asnumpy", cp.asnumpy)))


def lane_square(chunk: Any) -> Any:
    lane = gpupool.current_lane()
    device: Any = lane.upload(chunk)  # a CuPy array (CuPy carries no type annotations)
    return lane.download(device * device)


def timed_lane_square(chunk: Any) -> Any:
    lane = gpupool.current_lane()
    return _timed_steps(chunk, (("lane.upload", lane.upload), ("* (CuPy)", lambda d: d * d),
                                ("lane.download", lane.download)))


def noop(chunk: Any) -> Any:
    return chunk


def _switching_every(interval: float, run: Callable[..., Any], *args: Any) -> Any:
    """run(*args) with Python's GIL switch interval set to `interval` seconds meanwhile."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        return run(*args)
    finally:
        sys.setswitchinterval(before)


def main() -> None:
    global _label
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="W4,W2")
    parser.add_argument("--only", default=None,
                        help="run these variants ('|'-separated) alone, without the steps")
    parser.add_argument("--lane-counts", default="5",
                        help="comma-separated lane counts of the 'lane, N lanes' variants")
    args = parser.parse_args()
    import cupy as cp

    rng = np.random.default_rng(7)
    for size in args.sizes.split(","):
        count, length = SIZES[size]
        data = [rng.standard_normal(length) for _ in range(count)]
        expected = [np.square(d) for d in data]
        nbytes = sum(d.nbytes for d in data)

        def check(results: List[Any], same: bool = False) -> None:
            assert len(results) == count
            for r, d, e in zip(results, data, expected):
                if same:
                    assert r is d
                elif not np.array_equal(np.asarray(r), e):
                    raise SystemExit("FAIL: a result differs from numpy.square")

        def rate(seconds: float) -> str:
            if size == "W2":
                return f"{nbytes / seconds / 1e9:7.2f} GB/s"
            return f"{count / seconds:9,.0f} tasks/s"

        def own_stream() -> None:
            cp.cuda.Stream(non_blocking=True).use()

        runs: Dict[str, Callable[[], Any]] = {}
        pools: List[Any] = []

        def pool(kind: str, threads: int, **kw: Any) -> Any:
            p = ThreadPoolExecutor(threads, **kw) if kind == "tpe" else gpupool.Executor(
                threads_per_gpu=threads)
            pools.append(p)
            return p

        tpe = pool("tpe", 5)
        tpe_streams = pool("tpe", 5, initializer=own_stream)
        gp5 = pool("gpupool", 5)
        gp5_bare = pool("gpupool", 5)
        gp5_bare._core.set_runner(None)  # CuPy stays on the legacy default stream on the lanes
        gp5_single = pool("gpupool", 5)
        gp5_single._core._set_chaining(False)
        spin = os.environ.get("GPUPOOL_LANE_SPIN_US")
        os.environ["GPUPOOL_LANE_SPIN_US"] = "0"  # read when the executor is made
        try:
            gp5_asleep = pool("gpupool", 5)
        finally:
            if spin is None:
                del os.environ["GPUPOOL_LANE_SPIN_US"]
            else:
                os.environ["GPUPOOL_LANE_SPIN_US"] = spin
        gp = gpupool.Executor()
        pools.append(gp)
        print(f"== {size}: {count} x {length} float64 ({nbytes / 1e9:.2f} GB); gpupool default "
              f"lanes {gp.threads_per_gpu}, chunk {gp.chunk_bytes}; {args.repeat} rounds after "
              f"a warm-up")
        for name, p in (("tpe", tpe), ("tpe, own streams", tpe_streams), ("gpupool", gp5),
                        ("gpupool, no runner", gp5_bare),
                        ("gpupool, one call per hold", gp5_single),
                        ("gpupool, lanes never spin", gp5_asleep)):
            runs[name] = functools.partial(_map_all, p, fw.motivating_square, data)
        for name, p in (("tpe, switch 1 ms", tpe), ("gpupool, switch 1 ms", gp5)):
            runs[name] = functools.partial(_switching_every, 0.001, _map_all, p,
                                           fw.motivating_square, data)
        runs["tpe no-op"] = lambda: list(tpe.map(noop, data))
        runs["gpupool no-op"] = lambda: list(gp5.map(noop, data))
        runs["lane, default lanes"] = lambda: list(gp.map(lane_square, data))
        lane_pools = {n: gp5 if n == 5 else pool("gpupool", n) for n in
                      (int(x) for x in args.lane_counts.split(","))}
        for n, p in lane_pools.items():
            runs[f"lane, {n} lanes"] = functools.partial(_map_all, p, lane_square, data)
        runs["kernels.square (for scale)"] = lambda: list(gp.map(gpupool.kernels.square, data))
        if args.only is not None:
            chosen = args.only.split("|")
            unknown = [name for name in chosen if name not in runs]
            if unknown:
                raise SystemExit(f"--only: no variant {unknown[0]!r}; the variants: "
                                 + ", ".join(runs))
            runs = {name: runs[name] for name in chosen}
        times: Dict[str, List[float]] = {name: [] for name in runs}
        names = list(runs)
        for name in names:  # a warm-up of each (first use: pools, caches, compiled kernels)
            check(runs[name](), same=name.endswith("no-op"))
        # Rounds interleave the variants, each round starting one variant later, so that each
        # goes first in turn.
        for round_number in range(args.repeat):
            for k in range(len(names)):
                name = names[(round_number + k) % len(names)]
                t0 = time.perf_counter()
                results = runs[name]()
                seconds = time.perf_counter() - t0
                check(results, same=name.endswith("no-op"))
                del results
                times[name].append(seconds)
        print(f"  {'variant':32s} {'best':>15s}  {'median':>15s}  (us per call, best)")
        for name, rounds in times.items():
            print(f"  {name:32s} {rate(min(rounds))}  {rate(statistics.median(rounds))}  "
                  f"({1e6 * min(rounds) / count:8.1f})")
        print("  every round of each variant, in order (s):")
        for name, rounds in times.items():
            print(f"    {name:30s} " + " ".join(f"{t:.3f}" for t in rounds))

        if args.only is not None:
            for p in pools:
                p.shutdown(wait=True)
            continue
        # Steps of the function, timed inside each call (one round each).
        steps = (("tpe", tpe, timed_motivating), ("tpe, own streams", tpe_streams,
                                                   timed_motivating),
                 ("gpupool", gp5, timed_motivating), ("gpupool, no runner", gp5_bare,
                                                      timed_motivating),
                 ("lane, default lanes", gp, timed_lane_square)) + tuple(
                     (f"lane, {n} lanes", p, timed_lane_square) for n, p in lane_pools.items())
        _steps.clear()
        for name, p, fn in steps:
            _label = name
            t0 = time.perf_counter()
            results = list(p.map(fn, data))
            seconds = time.perf_counter() - t0
            check(results)
            del results
            _add("whole map / count", seconds / count)
        print("  mean us per call of each step (timed inside the calls):")
        for key, values in _steps.items():
            variant, step = key.split("|")
            print(f"    {variant:22s} {step:18s} {1e6 * statistics.fmean(values):9.1f}"
                  f"  (median {1e6 * statistics.median(values):8.1f})")
        for p in pools:
            p.shutdown(wait=True)


if __name__ == "__main__":
    main()
