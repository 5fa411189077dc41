"""W2 (200 x 1,000,000 float64 squared, NumPy in and out) through Executor.map with tracing:

- the cost of tracing: W2 timed in pairs, tracing off and on (which goes first alternates), the
  median of the pairs' time ratios with a bootstrap 90% confidence interval - pairing cancels the
  machine's drift, which is larger than the cost being measured (`--control` times pairs of
  untraced runs the same way, to show what the method reads when there is nothing to find);
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
    parser.add_argument("--repeat", type=int, default=40, help="pairs of runs for the cost")
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--lanes", type=int, default=None,
                        help="lanes per GPU for the cost measurement (default: the Executor's)")
    parser.add_argument("--cost-only", action="store_true", help="skip the timelines")
    parser.add_argument("--control", action="store_true",
                        help="trace neither run of a pair: the method's own reading of no cost")
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

    with gpupool.Executor(threads_per_gpu=args.lanes) as ex:
        check(run(ex)[0])
        ratios, off = [], []
        for i in range(args.repeat):
            seconds = {}
            for traced in ((False, True) if i % 2 == 0 else (True, False)):
                if traced and not args.control:
                    with ex.trace():
                        out, seconds[traced] = run(ex)
                else:
                    out, seconds[traced] = run(ex)
                if i < 2:  # the results are checked; not every time, to keep the run short
                    check(out)
                del out
            ratios.append(seconds[True] / seconds[False])
            off.append(seconds[False])
        median = statistics.median(ratios)
        resampled = np.median(rng.choice(ratios, (4000, len(ratios))), axis=1)
        low, high = np.percentile(resampled, [5, 95])
        what = "control (neither run traced)" if args.control else "tracing cost"
        print(f"W2 {what}: {100 * (median - 1):+.2f}% of the run time (median of "
              f"{len(ratios)} paired runs; 90% CI {100 * (low - 1):+.2f}% .. "
              f"{100 * (high - 1):+.2f}%; untraced W2 {gigabytes / statistics.median(off):.2f} "
              f"GB/s; {ex.threads_per_gpu} lanes)")
    if args.cost_only:
        return

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
