"""One GPU as two devices against one: W2 and W4 from Python through `Executor.map` on
`devices=[0]` and on `devices=[0, 0]`, interleaved round after round, results checked.

    python bench/shared_devices.py                      # on a GPU
    GPUPOOL_BACKEND=cpu python bench/shared_devices.py --w2-elements 100000 --w4-tasks 2000

Three executors over GPU 0: as one device with L lanes (the defaults: L as tuned), as two
devices with L lanes each (twice the lanes), and as two with L/2 each (as many lanes as one
device has, for even L). Each round times
every workload on each of them in turn; the medians over --rounds rounds and their ratios to
one device are printed as a table and JSON (--json). A ratio near 1 means the second device's
own queue, lanes and budget cost nothing over one device's (issue target: at least 0.95).
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("GPUPOOL_QUIET", "1")

import numpy as np  # noqa: E402

import gpupool  # noqa: E402


def workloads(args):
    rng = np.random.default_rng(7)
    w2 = [rng.random(args.w2_elements) for _ in range(args.w2_arrays)]
    w4 = [rng.random(args.w4_elements) for _ in range(args.w4_tasks)]
    return {"W2": (w2, sum(x.nbytes for x in w2), "GB/s"),
            "W4": (w4, len(w4), "tasks/s")}


def timed_map(ex, arrays):
    start = time.perf_counter()
    results = list(ex.map(gpupool.kernels.square, arrays))
    seconds = time.perf_counter() - start
    for x, r in zip(arrays[:: max(1, len(arrays) // 50)], results[:: max(1, len(arrays) // 50)]):
        if not np.array_equal(r, x * x):
            raise SystemExit("a wrong result")
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--w2-arrays", type=int, default=200)
    parser.add_argument("--w2-elements", type=int, default=1_000_000)
    parser.add_argument("--w4-tasks", type=int, default=20_000)
    parser.add_argument("--w4-elements", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    work = workloads(args)

    one = gpupool.Executor(devices=[0])
    lanes = one.settings["threads_per_gpu"]
    chunk = one.settings["chunk_bytes"]
    setups = {
        f"1 device x {lanes} lanes": one,
        f"2 devices x {lanes} lanes": gpupool.Executor(lanes, devices=[0, 0], chunk_bytes=chunk),
        f"2 devices x {max(1, lanes // 2)} lanes": gpupool.Executor(
            max(1, lanes // 2), devices=[0, 0], chunk_bytes=chunk),
    }
    for ex in setups.values():  # warm: lanes, pinned blocks, kernels
        for arrays, _, _ in work.values():
            timed_map(ex, arrays[:64])
    seconds = {(name, w): [] for name in setups for w in work}
    for _ in range(args.rounds):
        for w, (arrays, _, _) in work.items():
            for name, ex in setups.items():
                seconds[(name, w)].append(timed_map(ex, arrays))
    for ex in setups.values():
        ex.shutdown()

    rows = []
    baseline = next(iter(setups))
    for w, (_, amount, unit) in work.items():
        base = amount / statistics.median(seconds[(baseline, w)])
        for name in setups:
            rate = amount / statistics.median(seconds[(name, w)])
            rows.append({"workload": w, "setup": name, "unit": unit,
                         "rate": rate / 1e9 if unit == "GB/s" else rate,
                         "over_one_device": rate / base})
    print(f"{one.backend}, {args.rounds} rounds, medians; chunk {chunk} bytes")
    for r in rows:
        print(f"{r['workload']:>3} {r['setup']:<22} {r['rate']:>12,.2f} {r['unit']:<8} "
              f"{r['over_one_device']:.3f}x")
    print(json.dumps(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
