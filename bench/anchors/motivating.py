"""The motivating program, as widely copied: CuPy inside a ThreadPoolExecutor.

Every thread shares CuPy's default stream, copies from pageable memory and allocates per task.
This is the anchor gpupool is measured against (W1: 5 chunks; W2: 200 chunks), timed the same
way as `gpupool demo`: one warm-up map, then the median of --repeat timed maps, results checked
against NumPy before any time is reported. Prints one JSON object.
"""

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import cupy as cp
import numpy as np


def square(chunk):
    return cp.asnumpy(cp.array(chunk) ** 2)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=5)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    rng = np.random.default_rng(42)
    data = [rng.uniform(-10, 10, args.size) for _ in range(args.chunks)]
    times = []
    with ThreadPoolExecutor(max_workers=args.threads) as executor:
        for run in range(args.repeat + 1):
            t0 = time.perf_counter()
            results = list(executor.map(square, data))
            t1 = time.perf_counter()
            if run > 0:
                times.append((t1 - t0) * 1e3)
    wrong = sum(int(np.count_nonzero(r != d * d)) for r, d in zip(results, data))
    if wrong:
        raise SystemExit(f"motivating program: {wrong} wrong results")
    median = statistics.median(times)
    gb = args.chunks * args.size * 8 / 1e9
    print(json.dumps({
        "program": "cupy+ThreadPoolExecutor", "chunks": args.chunks, "size": args.size,
        "threads": args.threads, "repeat": args.repeat, "median_ms": round(median, 4),
        "best_ms": round(min(times), 4), "input_gb_per_s": round(gb / (median / 1e3), 3),
        "wrong": wrong,
    }))


if __name__ == "__main__":
    main()
