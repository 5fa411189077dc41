"""How many blocks a second gpupool.dask gets through when blocks are tiny, so that Dask's per-task
cost (the scheduler's and the worker's), not the pool, bounds the run: a LocalCluster of 1..N
worker processes on the CPU backend, each with a one-lane pool, mapping gpupool.kernels.square
over many small blocks with blocks_per_task 1, 8 and 64. docs/scaling.md says how its figures bound a cluster.

    GPUPOOL_BACKEND=cpu python bench/dask_scaling.py --workers 1,2,4,8 --blocks 4000

Prints one JSON object per line (workers, blocks_per_task, tasks, seconds, tasks_per_s,
blocks_per_s), then a table; --json writes the list.
"""

import argparse
import json
import os
import platform
import statistics
import time
import uuid

os.environ.setdefault("GPUPOOL_BACKEND", "cpu")
os.environ.setdefault("GPUPOOL_QUIET", "1")

import dask.array as da  # noqa: E402
from distributed import Client, LocalCluster, wait  # noqa: E402

import gpupool  # noqa: E402
import gpupool.dask as gd  # noqa: E402


def measure(client, x, blocks_per_task, repeat):
    times = []
    tasks = 0
    for _ in range(repeat):
        # A new name each run: results of a run not yet released would otherwise be reused.
        y = gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=blocks_per_task,
                          name=f"square-{uuid.uuid4().hex}")
        tasks = len(y.dask.layers[y.name])
        start = time.perf_counter()
        persisted = client.persist(y)
        wait(persisted)
        times.append(time.perf_counter() - start)
        del persisted
    return tasks, statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts, comma-separated")
    parser.add_argument("--blocks", type=int, default=4000, help="blocks per run")
    parser.add_argument("--block-elements", type=int, default=1000, help="float64 per block")
    parser.add_argument("--blocks-per-task", default="1,8,64")
    parser.add_argument("--repeat", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    rows = []
    for workers in [int(w) for w in args.workers.split(",")]:
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                          host="127.0.0.1", dashboard_address=":0") as cluster, \
                Client(cluster) as client:
            gd.install(client, threads_per_gpu=1)
            # The input blocks live on the workers before the clock starts.
            x = client.persist(da.random.random(args.blocks * args.block_elements,
                                                chunks=args.block_elements))
            wait(x)
            for bpt in [int(b) for b in args.blocks_per_task.split(",")]:
                measure(client, x, bpt, 1)  # warm: kernels, connections
                tasks, seconds = measure(client, x, bpt, args.repeat)
                row = {"workers": workers, "blocks_per_task": bpt, "blocks": args.blocks,
                       "block_bytes": args.block_elements * 8, "tasks": tasks,
                       "seconds": round(seconds, 4), "tasks_per_s": round(tasks / seconds),
                       "blocks_per_s": round(args.blocks / seconds)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"\n{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"gpupool {gpupool.__version__} on the CPU backend")
    print(f"{'workers':>7} {'blocks/task':>11} {'tasks':>6} {'s':>7} {'tasks/s':>8} "
          f"{'blocks/s':>9}")
    for r in rows:
        print(f"{r['workers']:>7} {r['blocks_per_task']:>11} {r['tasks']:>6} {r['seconds']:>7.3f} "
              f"{r['tasks_per_s']:>8} {r['blocks_per_s']:>9}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
