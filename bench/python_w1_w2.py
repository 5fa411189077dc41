"""W1 and W2 from Python: gpupool beside the motivating program, in one run.

Variants, each timed as one warm-up map then the median of --repeat maps, results checked
against NumPy before any time is reported:

  motivating     CuPy `cp.asnumpy(cp.array(x) ** 2)` in a concurrent.futures.ThreadPoolExecutor
  seed           the same CuPy function in gpupool.Executor (the one-line change)
  kernel         gpupool.Executor.map(gpupool.kernels.square, ...): C++, GIL released

Prints one JSON object per measurement and a table at the end.
"""

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import gpupool


def timed(run, check, repeat):
    check(run())  # warm-up, and the first check
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t0)
    check(out)
    return statistics.median(times), min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--workloads", default="W1,W2")
    args = parser.parse_args()

    import cupy as cp

    def square(chunk):
        return cp.asnumpy(cp.array(chunk) ** 2)

    rng = np.random.default_rng(3)
    rows = []
    for workload in args.workloads.split(","):
        chunks = 5 if workload == "W1" else 200
        data = [rng.uniform(-10, 10, 1_000_000) for _ in range(chunks)]
        want = [d * d for d in data]
        gigabytes = chunks * 1_000_000 * 8 / 1e9

        def check(results):
            if len(results) != len(want) or not all(
                    np.array_equal(r, w) for r, w in zip(results, want)):
                raise SystemExit(f"{workload}: wrong results")

        variants = []
        for threads in (5, 16):
            variants.append((f"motivating, {threads} threads",
                             lambda t=threads: ThreadPoolExecutor(max_workers=t), square))
        for threads in (5, 8):
            variants.append((f"seed (CuPy fn in gpupool), {threads} lanes",
                             lambda t=threads: gpupool.Executor(threads_per_gpu=t), square))
        for threads, chunk in ((8, 8 << 20), (16, 8 << 20), (16, 2 << 20), (16, 1 << 20)):
            variants.append((f"kernel, {threads} lanes, {chunk >> 10} KiB pieces",
                             lambda t=threads, c=chunk: gpupool.Executor(threads_per_gpu=t,
                                                                         chunk_bytes=c),
                             gpupool.kernels.square))
        for name, make, fn in variants:
            with make() as ex:
                median, best = timed(lambda: list(ex.map(fn, data)), check, args.repeat)
            row = {"workload": workload, "variant": name, "median_ms": round(median * 1e3, 3),
                   "best_ms": round(best * 1e3, 3),
                   "input_gb_per_s": round(gigabytes / median, 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)

    print()
    for workload in args.workloads.split(","):
        base = next(r for r in rows if r["workload"] == workload
                    and r["variant"].startswith("motivating, 5"))
        print(f"{workload}: median ms (best) | GB/s | vs motivating program (5 threads)")
        for r in rows:
            if r["workload"] == workload:
                print(f"  {r['variant']:<40} {r['median_ms']:>9.2f} ({r['best_ms']:.2f})"
                      f" | {r['input_gb_per_s']:>6.2f} | {base['median_ms'] / r['median_ms']:.2f}x")


if __name__ == "__main__":
    main()
