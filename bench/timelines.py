"""W2 (200 x 1,000,000 float64 squared, NumPy in and out) through Executor.map with tracing:

- the cost of tracing: W2 timed with tracing off and on, alternating, medians compared;
- timelines of W2 with 1 lane and with 4 lanes, as PNG pictures (and the 4-lane Chrome trace).

Usage: python bench/timelines.py OUT_DIR [--repeat N]
"""

import argparse
import os
import statistics
import time

import numpy as np

import gpupool


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--chunks", type=int, default=200)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    rng = np.random.default_rng(5)
    data = [rng.uniform(-10, 10, 1_000_000) for _ in range(args.chunks)]
    want = [d * d for d in data]
    gigabytes = sum(d.nbytes for d in data) / 1e9

    def check(out):
        if not all(np.array_equal(o, w) for o, w in zip(out, want)):
            raise SystemExit("wrong results")

    def run(ex):
        """Maps W2 and returns (results, seconds); the check is left to the caller."""
        t0 = time.perf_counter()
        out = list(ex.map(gpupool.kernels.square, data))
        return out, time.perf_counter() - t0

    with gpupool.Executor() as ex:
        check(run(ex)[0])
        off, on = [], []
        for _ in range(args.repeat):
            out, seconds = run(ex)
            off.append(seconds)
            with ex.trace():
                traced, seconds = run(ex)
            on.append(seconds)
            check(out)
            check(traced)
            del out, traced
        m_off, m_on = statistics.median(off), statistics.median(on)
        print(f"W2 tracing off: {gigabytes / m_off:.2f} GB/s; on: {gigabytes / m_on:.2f} GB/s; "
              f"cost {100 * (m_on / m_off - 1):+.1f}% ({args.repeat} runs each, alternating)")

    for lanes in (1, 4):
        with gpupool.Executor(threads_per_gpu=lanes) as ex:
            check(run(ex)[0])
            with ex.trace() as t:
                out, seconds = run(ex)
            check(out)
            name = f"timeline_{lanes}lane{'s' if lanes > 1 else ''}"
            t.write(os.path.join(args.out, name + ".png"))
            if lanes == 4:
                t.write(os.path.join(args.out, "w2_trace.json"))
            print(f"W2 with {lanes} lane(s): {gigabytes / seconds:.2f} GB/s; {name}.png")
            print(t.stats_table())


if __name__ == "__main__":
    main()
