"""Where W8's time goes: the user's own CuPy function in gpupool, beside the motivating program
(CuPy + ThreadPoolExecutor), at W4 size (20,000 x 1,024 float64) and W2 size (200 x 1M float64),
all in one run. Every variant's results are checked before its rate is printed.

Variants (5 threads or lanes unless said):
  tpe                    ThreadPoolExecutor.map(motivating_square): the motivating program, every
                         thread on CuPy's legacy default stream
  tpe, own streams       the same, each thread on a non-blocking CuPy stream of its own
  gpupool                Executor(threads_per_gpu=5).map(motivating_square): W8 (a)
  gpupool, no runner     the same with the lanes' streams not made current for CuPy (every call
                         on the legacy default stream, as in the motivating program)
  tpe no-op, gpupool no-op   what each pool itself costs per call
  lane                   Executor().map(lane_square): W8 (b), with the default lanes and with 5
Then, per variant, the mean time of each step of the function per call (the steps are timed
inside the calls, so the rates of the timed runs are a little lower than the untimed ones).

    python bench/w8_profile.py [--repeat 3] [--sizes W4,W2] [--only VARIANT]

--only runs that one variant's timed rounds and nothing else (to profile it, say:
`--only "lane, default lanes"`).
"""

import argparse
import functools
import statistics
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


def main() -> None:
    global _label
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="W4,W2")
    parser.add_argument("--only", default=None, help="run this variant alone, without the steps")
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
        gp = gpupool.Executor()
        pools.append(gp)
        print(f"== {size}: {count} x {length} float64 ({nbytes / 1e9:.2f} GB); gpupool default "
              f"lanes {gp.threads_per_gpu}, chunk {gp.chunk_bytes}; best of {args.repeat}")
        for name, p in (("tpe", tpe), ("tpe, own streams", tpe_streams), ("gpupool", gp5),
                        ("gpupool, no runner", gp5_bare)):
            runs[name] = functools.partial(_map_all, p, fw.motivating_square, data)
        runs["tpe no-op"] = lambda: list(tpe.map(noop, data))
        runs["gpupool no-op"] = lambda: list(gp5.map(noop, data))
        runs["lane, default lanes"] = lambda: list(gp.map(lane_square, data))
        runs["lane, 5 lanes"] = lambda: list(gp5.map(lane_square, data))
        runs["kernels.square (for scale)"] = lambda: list(gp.map(gpupool.kernels.square, data))
        if args.only is not None:
            if args.only not in runs:
                raise SystemExit(f"--only: no variant {args.only!r}; the variants: "
                                 + ", ".join(runs))
            runs = {args.only: runs[args.only]}
        best: Dict[str, float] = {name: float("inf") for name in runs}
        for _ in range(args.repeat):  # rounds interleave the variants
            for name, run in runs.items():
                t0 = time.perf_counter()
                results = run()
                seconds = time.perf_counter() - t0
                check(results, same=name.endswith("no-op"))
                del results
                best[name] = min(best[name], seconds)
        for name, seconds in best.items():
            print(f"  {name:32s} {rate(seconds)}  ({1e6 * seconds / count:8.1f} us per call)")

        if args.only is not None:
            for p in pools:
                p.shutdown(wait=True)
            continue
        # Steps of the function, timed inside each call (one round each).
        steps = (("tpe", tpe, timed_motivating), ("tpe, own streams", tpe_streams,
                                                   timed_motivating),
                 ("gpupool", gp5, timed_motivating), ("gpupool, no runner", gp5_bare,
                                                      timed_motivating),
                 ("lane, default lanes", gp, timed_lane_square),
                 ("lane, 5 lanes", gp5, timed_lane_square))
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
