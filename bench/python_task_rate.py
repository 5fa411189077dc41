"""Per-task cost of gpupool from Python, beside the standard library's ThreadPoolExecutor in the
same run (same process, same machine state). Every result is checked.

    python bench/python_task_rate.py                      # the backend gpupool picks
    python bench/python_task_rate.py --backend cpu        # the CPU backend (no GPU needed)
    python bench/python_task_rate.py --backend cuda --cupy  # also W5 (2,000 x 16,384 float32
                                                            # CuPy chunks; needs a GPU)

Rows (tasks per second, median of --repeat runs):
  submit_noop_batch   [ex.submit(noop, i) for i in range(n)], then every .result()
  submit_noop_each    ex.submit(noop, i).result() in a loop (one task in flight)
  submit_square_each  ex.submit(gpupool.kernels.square, x).result() in a loop (W4, submit)
  map_square          list(ex.map(gpupool.kernels.square, arrays)) (W4, map)
  map_noop            list(ex.map(noop, range(n)))
ThreadPoolExecutor (threads = gpupool's lane count) runs the same Python function for the noop
rows and numpy.square for the square rows. With --cupy, W5: gpupool's Executor.map of an
elementwise kernel over --cupy-arrays CuPy chunks, against one CuPy launch over all of the data
(target: at most 1.3x).
Prints one JSON object per row, then a table; --json FILE writes the list.
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import time

import numpy as np

import gpupool


def noop(value):
    return value


def timed(run, repeat):
    """Median seconds of `run()` over `repeat` runs (after one warm-up run)."""
    run()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def check(condition, what):
    if not condition:
        sys.exit(f"python_task_rate: wrong result: {what}")


def submit_batch(ex, n):
    def run():
        futures = [ex.submit(noop, i) for i in range(n)]
        check([f.result() for f in futures] == list(range(n)), "submit_noop_batch")
    return run


def submit_each(ex, n):
    def run():
        for i in range(n):
            check(ex.submit(noop, i).result() == i, "submit_noop_each")
    return run


def submit_square_each(ex, square, arrays):
    def run():
        for x in arrays:
            out = ex.submit(square, x).result()
            check(out[-1] == x[-1] * x[-1], "submit_square_each")
    return run


def map_square(ex, square, arrays):
    def run():
        results = list(ex.map(square, arrays))
        check(len(results) == len(arrays) and all(r[-1] == x[-1] * x[-1] for r, x in
                                                   zip(results[::997], arrays[::997])),
              "map_square")
    return run


def map_noop(ex, n):
    def run():
        check(list(ex.map(noop, range(n))) == list(range(n)), "map_noop")
    return run


def w5_rows(ex, args):
    """W5 as the comparison harness defines it: --cupy-arrays float32 chunks of --cupy-size on
    the GPU, --fmas dependent FMAs per element, against one CuPy launch over all of the data."""
    import cupy

    body = (f"float v = x; for (int i = 0; i < {args.fmas}; ++i) v = v * a + b; y = v;")
    kernel = gpupool.elementwise("float32 x, float32 a, float32 b", "float32 y", body, "w5")
    one = cupy.ElementwiseKernel("float32 x, float32 a, float32 b", "float32 y", body, "w5_one")
    flat = cupy.random.default_rng(5).random(args.cupy_arrays * args.cupy_size,
                                             dtype=cupy.float32)
    arrays = [flat[i * args.cupy_size:(i + 1) * args.cupy_size]
              for i in range(args.cupy_arrays)]
    expected = one(flat, 0.999, 0.001)
    cupy.cuda.Device().synchronize()

    def gpupool_map():
        out = list(ex.map(kernel, arrays, 0.999, 0.001))
        cupy.cuda.Device().synchronize()
        check(len(out) == len(arrays) and bool(cupy.allclose(out[-1], expected[-args.cupy_size:]))
              and bool(cupy.allclose(out[0], expected[:args.cupy_size])), "w5 map")

    def one_launch():
        one(flat, 0.999, 0.001)
        cupy.cuda.Device().synchronize()

    mine = timed(gpupool_map, args.repeat)
    reference = timed(one_launch, args.repeat)
    return [{"row": "w5_map_cupy", "tasks": args.cupy_arrays, "gpupool_s": mine,
             "one_launch_s": reference, "ratio_to_one_launch": mine / reference}]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--tasks", type=int, default=20000, help="tasks per run (noop rows)")
    parser.add_argument("--arrays", type=int, default=20000, help="arrays (square rows)")
    parser.add_argument("--size", type=int, default=1024, help="float64 elements per array")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="lanes per device")
    parser.add_argument("--cupy", action="store_true", help="also W5 over CuPy arrays")
    parser.add_argument("--cupy-arrays", type=int, default=2000, help="W5 chunks")
    parser.add_argument("--cupy-size", type=int, default=16384, help="W5 float32 per chunk")
    parser.add_argument("--fmas", type=int, default=2048, help="W5 dependent FMAs per element")
    parser.add_argument("--json", help="write the rows there")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    arrays = [rng.random(args.size) for _ in range(args.arrays)]
    each = max(1, args.tasks // 4)  # one task in flight at a time: fewer, as each is slower
    rows = []
    with gpupool.Executor(args.threads, backend=args.backend) as ex, \
            concurrent.futures.ThreadPoolExecutor(ex.lane_count) as pool:
        cases = [
            ("submit_noop_batch", args.tasks, submit_batch(ex, args.tasks),
             submit_batch(pool, args.tasks)),
            ("submit_noop_each", each, submit_each(ex, each), submit_each(pool, each)),
            ("submit_square_each", each, submit_square_each(ex, gpupool.kernels.square,
                                                            arrays[:each]),
             submit_square_each(pool, np.square, arrays[:each])),
            ("map_square", args.arrays, map_square(ex, gpupool.kernels.square, arrays),
             map_square(pool, np.square, arrays)),
            ("map_noop", args.tasks, map_noop(ex, args.tasks), map_noop(pool, args.tasks)),
        ]
        for name, tasks, mine, theirs in cases:
            # Alternated, so that both see the same machine state.
            ours = timed(mine, args.repeat)
            stdlib = timed(theirs, args.repeat)
            row = {"row": name, "tasks": tasks, "gpupool_per_s": tasks / ours,
                   "threadpool_per_s": tasks / stdlib, "ratio": stdlib / ours,
                   "backend": ex.backend, "lanes": ex.lane_count, "cores": os.cpu_count()}
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.cupy:
            for row in w5_rows(ex, args):
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'row':<20} {'gpupool/s':>12} {'ThreadPool/s':>13} {'ratio':>7}")
    for row in rows:
        if "gpupool_per_s" in row:
            print(f"{row['row']:<20} {row['gpupool_per_s']:>12,.0f} "
                  f"{row['threadpool_per_s']:>13,.0f} {row['ratio']:>7.2f}")
        else:
            print(f"{row['row']:<20} {row['gpupool_s'] * 1e3:>9.2f} ms vs one launch "
                  f"{row['one_launch_s'] * 1e3:.2f} ms: {row['ratio_to_one_launch']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
