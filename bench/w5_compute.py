"""W5 from Python: a compute-heavy elementwise kernel (2,048 dependent FMAs per element) over
2,000 chunks of 16,384 float32 already on the GPU, beside CuPy, in one run.

Variants, each timed as one warm-up then the median of --repeat runs (synchronised), every result
checked against CuPy's one launch before any time is reported:

  cupy one launch    cupy.ElementwiseKernel once over all the data (the limit)
  cupy per chunk     the same kernel launched per chunk from one thread (one stream)
  gpupool map        Executor.map(gpupool.elementwise(...), chunks, a, b): batched launches on
                     every lane, new CuPy arrays back (includes allocating them)

Prints one JSON object per variant and a table with ratios to the one launch.
"""

import argparse
import json
import statistics
import time

import numpy as np

import gpupool


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--size", type=int, default=16384)
    parser.add_argument("--fmas", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=8, help="gpupool lanes per GPU")
    args = parser.parse_args()
    import cupy as cp

    body = f"float v = x;\nfor (int i = 0; i < {args.fmas}; ++i) v = v * a + b;\ny = v;"
    a, b = np.float32(0.999), np.float32(0.001)
    data = cp.random.default_rng(5).uniform(-1, 1, args.chunks * args.size, dtype=cp.float32)
    chunks = [data[i * args.size:(i + 1) * args.size] for i in range(args.chunks)]
    cupy_kernel = cp.ElementwiseKernel("float32 x, float32 a, float32 b", "float32 y", body, "w5")
    reference = cupy_kernel(data, a, b)
    cp.cuda.runtime.deviceSynchronize()

    def check(outs, what):
        got = outs if isinstance(outs, cp.ndarray) else cp.concatenate(outs)
        if not bool(cp.allclose(got, reference, rtol=1e-5, atol=1e-6)):
            raise SystemExit(f"{what}: results differ from CuPy's one launch")

    def timed(what, run):
        check(run(), what)
        times = []
        for _ in range(args.repeat):
            cp.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            out = run()
            cp.cuda.runtime.deviceSynchronize()
            times.append(time.perf_counter() - t0)
        check(out, what)
        return statistics.median(times) * 1e3, min(times) * 1e3

    results = {}
    results["cupy one launch"] = timed("cupy one launch", lambda: cupy_kernel(data, a, b))
    results["cupy per chunk"] = timed("cupy per chunk",
                                      lambda: [cupy_kernel(c, a, b) for c in chunks])
    k = gpupool.elementwise("float32 x, float32 a, float32 b", "float32 y", body, "w5")
    with gpupool.Executor(threads_per_gpu=args.threads, backend="cuda") as ex:
        results["gpupool map"] = timed("gpupool map",
                                       lambda: list(ex.map(k, chunks, float(a), float(b))))
    one = results["cupy one launch"][0]
    print(f"W5: {args.chunks} x {args.size} float32, {args.fmas} dependent FMAs per element "
          f"(medians of {args.repeat}; results checked)")
    for what, (median, best) in results.items():
        print(json.dumps({"workload": "W5", "variant": what, "median_ms": round(median, 3),
                          "best_ms": round(best, 3), "x_one_launch": round(median / one, 2)}))
    for what, (median, best) in results.items():
        print(f"  {what:<18} {median:9.3f} ms (best {best:8.3f})  {median / one:5.2f}x one launch")


if __name__ == "__main__":
    main()
