"""The cluster model of docs/scaling.md checked against a simulated cluster: Dask workers whose
"GPUs" are CPU stand-in devices paced like a GPU, so that many workers fit on one machine
without each taking a host core while its device works.

    python bench/dask_cluster_model.py --workers 1,2,4,8,16,32,64

Two models of the cluster rate (blocks/s) for N workers (one thread each, as dask-cuda lays them
out), each device taking g blocks/s alone, a scheduler doing S tasks/s, B blocks per task:

- the bound model of docs/scaling.md: min(N g, S B), which stops scaling at N* = S B / g;
- with the worker's own costs: t_w per task (its one thread takes a task, runs it and reports
  it, one task at a time, so that cost adds to the task's time on the device rather than
  overlapping it) and t_b per block inside a task (the device's 1 / g and what the task adds
  per block): min(N B / (t_w + B t_b), S B);
- on one machine, where the scheduler, the client and every worker share the host's C cores,
  also C / c_B, c_B being the CPU seconds all of them spend per block with one worker at B
  blocks per task (the host model).

Each worker's pool runs on the CPU backend with `cpu_copy_rate` set so that one block's copy
takes as long as a real block takes a GPU (--block-seconds: by default an 8 MiB block at
41.3 GB/s, W2's rate on one H200 in bench/results), both directions paced, its lanes sharing
that pace as a GPU's lanes share its copy engines. Blocks are small (--block-elements float64),
made on the workers and persisted before the clock starts; results stay there.

Where a task's blocks are matters. --placement grouped (the default) makes them B to a chunk and
splits each chunk into blocks, so that every task finds its B blocks on one worker and nothing
moves: the models' terms alone. --placement interleaved makes every block its own chunk, which
Dask spreads over the workers one at a time, so that a task of B blocks fetches most of them
from other workers first (the model's ingest term, which on a cluster crosses the network).
Each point reports the share of its blocks that moved between workers.

1. g: one pool alone (no Dask) over --blocks-alone blocks, in this process: blocks/s.
2. For each N and B: the measured rate of gpupool.dask.map_blocks(square, x, blocks_per_task=B)
   persisted (results checked once per point).
   Beside each point, with --pools-at-once: the same work without Dask, N processes at once,
   each a pool of its own running its share of the tasks one after another (a map of B blocks,
   waited for, then the next) as a worker's one thread does, all started together: what this
   machine's cores and the stand-ins' pacing allow N pools without any scheduler. Dask's rate
   over it is what Dask itself costs at that N; the pools' over N g is what the simulation
   itself loses as N grows.
3. t_w and t_b from one worker's points with the fewest and the most blocks per task (1 / rate
   = t_w / B + t_b for each); S as the highest rate of one block per task over every N (where
   adding workers stops helping, the scheduler is the bound). Every point is then compared with
   both models' predictions from g, t_w, t_b and S alone: the rows of more than one worker are
   predictions the parameters were not fitted to.

--from-json FILE prints the table of a saved run again (with the models as this file has them).

Each run maps a few hundred to a thousand tasks (--tasks); its input is made on the workers
and persisted first. Prints one JSON object per point and a table; --json writes everything,
and after each point what is measured so far ("complete": false), so that a run cut short (a
time limit, Ctrl-C) keeps its points.
The scheduler, the client and every worker share this machine's cores, which a cluster would
not: where their per-task and per-block costs together fill the cores, the measurement falls
below the model; the table shows where (docs/scaling.md).
"""

import argparse
import json
import multiprocessing
import os
import platform
import queue
import statistics
import time
import uuid

os.environ.setdefault("GPUPOOL_BACKEND", "cpu")
os.environ.setdefault("GPUPOOL_QUIET", "1")
# Blocks moved between workers are counted from each worker's log of incoming transfers, which
# keeps this many entries (a few per task).
os.environ.setdefault("DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH", "1000000")

import dask  # noqa: E402
import dask.array as da  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # type: ignore[import-untyped]  # noqa: E402  (distributed's dependency)
from distributed import Client, LocalCluster, wait  # noqa: E402

import gpupool  # noqa: E402
import gpupool.dask as gd  # noqa: E402


def pool_options(args):
    block_bytes = args.block_elements * 8
    return dict(backend="cpu", threads_per_gpu=args.lanes, cpu_copy_rate=block_bytes /
                args.block_seconds)


def pool_alone(args):
    """g: blocks/s of one stand-in pool without Dask, results checked."""
    rng = np.random.default_rng(1)
    blocks = [rng.random(args.block_elements) for _ in range(args.blocks_alone)]
    times = []
    with gpupool.Executor(**pool_options(args)) as ex:
        list(ex.map(gpupool.kernels.square, blocks[:64]))  # warm
        for _ in range(args.repeat):
            start = time.perf_counter()
            results = list(ex.map(gpupool.kernels.square, blocks))
            times.append(time.perf_counter() - start)
            for b, r in zip(blocks, results):
                if not np.array_equal(r, b * b):
                    raise SystemExit("pool alone: a wrong result")
    return args.blocks_alone / statistics.median(times)


def _pool_at_once(args, blocks, blocks_per_task, seed, ready, results):
    """One process of pools_at_once: its own pool and blocks; after `ready` (every process
    made its pool and warmed it up), each run's start and end, then whether every task's last
    result was right. On any error it breaks `ready`, so that the others stop waiting, and
    sends the error instead."""
    try:
        rng = np.random.default_rng(seed)
        data = [rng.random(args.block_elements) for _ in range(blocks)]
        spans = []
        right = True
        with gpupool.Executor(**pool_options(args)) as ex:
            list(ex.map(gpupool.kernels.square, data[:blocks_per_task]))  # warm
            for _ in range(args.repeat):
                ready.wait()
                start = time.perf_counter()
                for i in range(0, blocks, blocks_per_task):
                    task = data[i:i + blocks_per_task]
                    got = list(ex.map(gpupool.kernels.square, task))
                    right = right and np.array_equal(got[-1], task[-1] * task[-1])
                spans.append((start, time.perf_counter()))
        results.put((spans, right))
    except BaseException as e:  # noqa: B036  (the parent must hear of any end)
        ready.abort()
        results.put((None, f"{type(e).__name__}: {e}"))
        raise


def pools_at_once(args, processes, blocks, blocks_per_task):
    """Blocks/s of `processes` pools without Dask, started together, each with its share of
    `blocks` in tasks of blocks_per_task (the median over --repeat runs of all blocks over the
    time from the first start to the last end). perf_counter is the system's monotonic clock,
    which every process reads alike. Every process gets a task or more (blocks are at least
    `processes` tasks wherever main calls it)."""
    context = multiprocessing.get_context("spawn")  # a fork would copy this process's pool
    tasks = -(-blocks // blocks_per_task)
    if tasks < processes:
        raise SystemExit(f"pools at once: {tasks} tasks cannot keep {processes} pools busy")
    shares = [(tasks // processes + (p < tasks % processes)) * blocks_per_task
              for p in range(processes)]
    ready = context.Barrier(processes)
    results = context.Queue()
    workers = [context.Process(target=_pool_at_once,
                               args=(args, share, blocks_per_task, p, ready, results))
               for p, share in enumerate(shares)]
    for w in workers:
        w.start()
    ended = []
    try:
        while len(ended) < len(workers):
            try:
                ended.append(results.get(timeout=1))
            except queue.Empty:
                # A process that died without a word (killed, out of memory) sends nothing.
                if any(w.exitcode not in (None, 0) for w in workers):
                    ready.abort()
                    raise SystemExit("pools at once: a process ended with exit status "
                                     f"{[w.exitcode for w in workers]}") from None
            if ended and ended[-1][0] is None:
                raise SystemExit(f"pools at once: a process failed: {ended[-1][1]}")
    finally:
        for w in workers:
            w.join(timeout=60)
            if w.is_alive():
                w.kill()
    if not all(right for _, right in ended):
        raise SystemExit("pools at once: a wrong result")
    rates = []
    for run in range(args.repeat):
        first = min(spans[run][0] for spans, _ in ended)
        last = max(spans[run][1] for spans, _ in ended)
        rates.append(sum(shares) / (last - first))
    return statistics.median(rates)


def cpu_seconds():
    """CPU time so far of this process (the client and the scheduler) and its children (the
    workers and their nannies)."""
    me = psutil.Process()
    total = 0.0
    for p in [me] + me.children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass  # a process that ended meanwhile
    return total


def blocks_fetched(dask_worker):
    """Blocks this worker fetched from others since its log was last cleared (run on it)."""
    return sum(len(transfer["keys"]) for transfer in dask_worker.transfer_incoming_log)


def clear_fetched(dask_worker):
    dask_worker.transfer_incoming_log.clear()


def cluster_rate(client, args, blocks, blocks_per_task):
    """Median blocks/s of map_blocks(square) persisted over `blocks` blocks, the CPU seconds per
    block and the share of blocks moved between workers of the timed runs (--repeat of them);
    the first run warms up. Each run maps input of its own (input_blocks), made and persisted
    before its clock starts: a block that one run fetched from another worker stays there as a
    copy until Dask's memory manager drops it, so a second run over the same blocks would move
    fewer than a map of new data does. Every run's first and last blocks are checked against
    NumPy's squares of the same blocks, after its clock stops."""
    times = []
    cpu = 0.0
    moved = 0
    for run in range(args.repeat + 1):
        x = client.persist(input_blocks(args, blocks, blocks_per_task))
        wait(x)
        n = x.chunks[0][0]
        want = [w * w for w in dask.compute(x[:n], x[-n:])]
        y = gd.map_blocks(gpupool.kernels.square, x, blocks_per_task=blocks_per_task,
                          name=f"square-{uuid.uuid4().hex}")
        client.run(clear_fetched)
        cpu_start = cpu_seconds()
        start = time.perf_counter()
        persisted = client.persist(y)
        wait(persisted)
        seconds = time.perf_counter() - start
        if run:
            cpu += cpu_seconds() - cpu_start
            times.append(seconds)
            moved += sum(client.run(blocks_fetched).values())
        got = dask.compute(persisted[:n], persisted[-n:])
        if not all(np.array_equal(g, w) for g, w in zip(got, want)):
            raise SystemExit("cluster: a wrong result")
        del persisted, x
    timed = args.repeat * blocks
    return blocks / statistics.median(times), cpu / timed, moved / timed


def input_blocks(args, blocks, blocks_per_task):
    """The input: `blocks` random blocks made on the workers, each task's B of them on one
    worker (grouped) or every block placed on its own (interleaved)."""
    made = args.block_elements * (blocks_per_task if args.placement == "grouped" else 1)
    x = da.random.random(blocks * args.block_elements, chunks=made)
    return x.rechunk(args.block_elements) if made != args.block_elements else x


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8,16,32,64", help="worker counts")
    parser.add_argument("--blocks-per-task", default="1,8,64")
    parser.add_argument("--block-elements", type=int, default=1000, help="float64 per block")
    parser.add_argument("--block-seconds", type=float, default=(8 << 20) / 41.3e9,
                        help="what one block takes its device (default: 8 MiB at 41.3 GB/s)")
    parser.add_argument("--lanes", type=int, default=4, help="lanes per worker's pool")
    parser.add_argument("--worker-threads", type=int, default=1,
                        help="Dask threads per worker (tasks it runs at once; the models "
                        "assume 1)")
    parser.add_argument("--tasks", default="1000,250,100",
                        help="Dask tasks per run for each --blocks-per-task, and at least "
                        "--tasks-per-worker times the workers (blocks: tasks x blocks per task)")
    parser.add_argument("--tasks-per-worker", type=int, default=4)
    parser.add_argument("--placement", choices=("grouped", "interleaved"), default="grouped",
                        help="each task's blocks made on one worker, or each block placed "
                        "on its own (see above)")
    parser.add_argument("--blocks-alone", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--from-json", help="print the table of a run --json saved")
    parser.add_argument("--pools-at-once", action="store_true",
                        help="beside each point, the same tasks on as many pools without "
                        "Dask, one process each, all at once (see above)")
    parser.add_argument("--cores", type=int, default=0,
                        help="the host's cores for the host model (default: this machine's)")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as saved:
            stored = json.load(saved)
        # A file --json wrote, or several such runs under keys of one object (as
        # bench/results/dask_cluster_model.json keeps them).
        runs = [stored] if "rows" in stored else [
            v for v in stored.values() if isinstance(v, dict) and "rows" in v]
        if not runs:
            raise SystemExit(f"{args.from_json}: no run with rows (a run cut short before one "
                             "worker's points allowed the fit keeps its points alone)")
        for run in runs:
            args.placement = "interleaved"  # what runs saved before --placement had
            for key, value in run["args"].items():
                if key not in ("json", "from_json", "cores"):
                    setattr(args, key, value)
            args.cores = run.get("cores") or args.cores
            report(args, run["g_blocks_per_s"],
                   [(r["workers"], r["blocks_per_task"], r["blocks"], r["blocks_per_s"],
                     r.get("cpu_us_per_block", 0) / 1e6, r.get("moved"))
                    for r in run["rows"]],
                   {(p["workers"], p["blocks_per_task"]): p["blocks_per_s"]
                    for p in run.get("pools_at_once", [])})
        return
    worker_counts = [int(w) for w in args.workers.split(",")]
    groupings = [int(b) for b in args.blocks_per_task.split(",")]
    task_counts = [int(t) for t in args.tasks.split(",")]
    if len(task_counts) != len(groupings):
        raise SystemExit("--tasks needs one count for each of --blocks-per-task")

    g = pool_alone(args)
    print(json.dumps({"g_blocks_per_s": round(g)}), flush=True)
    measured = []
    at_once = {}  # (workers, blocks per task): blocks/s of as many pools without Dask
    for workers in worker_counts:
        if args.pools_at_once:
            # Before the cluster starts, whose idle processes would take part of the cores.
            for bpt, tasks in zip(groupings, task_counts):
                blocks = max(tasks, args.tasks_per_worker * workers) * bpt
                at_once[(workers, bpt)] = pools_at_once(args, workers, blocks, bpt)
                print(json.dumps({"pools_at_once": workers, "blocks_per_task": bpt,
                                  "blocks_per_s": round(at_once[(workers, bpt)])}), flush=True)
        with LocalCluster(n_workers=workers, threads_per_worker=args.worker_threads,
                          processes=True,
                          host="127.0.0.1", dashboard_address=None) as cluster, \
                Client(cluster) as client:
            gd.install(client, **pool_options(args))
            for bpt, tasks in zip(groupings, task_counts):
                blocks = max(tasks, args.tasks_per_worker * workers) * bpt
                rate, cpu, moved = cluster_rate(client, args, blocks, bpt)
                measured.append((workers, bpt, blocks, rate, cpu, moved))
                print(json.dumps({"workers": workers, "blocks_per_task": bpt,
                                  "blocks_per_s": round(rate),
                                  "cpu_us_per_block": round(cpu * 1e6, 1),
                                  "moved": round(moved, 3)}), flush=True)
                # A run cut short (a time limit, Ctrl-C) keeps the points it measured.
                save(args, g, measured, at_once, complete=False)

    report(args, g, measured, at_once)


def fitted(measured, g):
    """t_w, t_b (seconds) from one worker's points with the fewest and most blocks per task,
    and S (tasks/s): the highest rate of one block per task."""
    alone = sorted((b, rate) for w, b, _, rate, *_ in measured if w == 1)
    if len(alone) < 2 or alone[0][0] == alone[-1][0]:
        raise SystemExit("the fit needs one worker at two or more blocks per task")
    (b1, r1), (b2, r2) = alone[0], alone[-1]
    t_b = max((b2 / r2 - b1 / r1) / (b2 - b1), 1 / g)
    t_w = max(b1 / r1 - b1 * t_b, 0.0)
    singles = [rate for _, b, _, rate, *_ in measured if b == b1]
    return t_w, t_b, max(singles) / b1


def model_rows(args, g, measured, at_once=None):
    """The fitted t_w, t_b and S, the cores, and every point beside the models' predictions."""
    t_w, t_b, scheduler = fitted(measured, g)
    cores = args.cores or os.cpu_count()
    # CPU seconds per block with one worker, per blocks per task: what the host's cores bound
    # when every worker shares them.
    cpu_alone = {b: cpu for w, b, _, _, cpu, _ in measured if w == 1}
    rows = []
    for workers, bpt, blocks, rate, cpu, moved in measured:
        bound_model = min(workers * g, scheduler * bpt)
        worker_model = min(workers * bpt / (t_w + bpt * t_b), scheduler * bpt)
        host_model = min(worker_model, cores / cpu_alone[bpt]) if cpu_alone.get(bpt) else None
        rows.append({"workers": workers, "blocks_per_task": bpt, "blocks": blocks,
                     "blocks_per_s": round(rate), "cpu_us_per_block": round(cpu * 1e6, 1),
                     "bound_model": round(bound_model), "worker_model": round(worker_model),
                     "host_model": host_model and round(host_model),
                     "over_bound_model": round(rate / bound_model, 3),
                     "over_worker_model": round(rate / worker_model, 3),
                     "over_host_model": host_model and round(rate / host_model, 3),
                     "n_star": round(scheduler * bpt / g, 2),
                     "moved": None if moved is None else round(moved, 3)})
        pools = (at_once or {}).get((workers, bpt))
        if pools:
            rows[-1].update({"pools_at_once": round(pools),
                             "over_pools_at_once": round(rate / pools, 3)})
    return t_w, t_b, scheduler, cores, rows


def save(args, g, measured, at_once=None, complete=True):
    """Writes --json: the fit and the rows, once one worker's points allow the fit; before
    that, the points alone. A file of a run cut short says so ("complete": false)."""
    if not args.json:
        return
    result = {"g_blocks_per_s": g, "args": vars(args), "complete": complete}
    if len({b for w, b, *_ in measured if w == 1}) >= 2:
        t_w, t_b, scheduler, cores, rows = model_rows(args, g, measured, at_once)
        result.update({"s_tasks_per_s": scheduler, "t_w_seconds": t_w, "t_b_seconds": t_b,
                       "cores": cores, "rows": rows})
    else:
        result["points"] = [{"workers": w, "blocks_per_task": b, "blocks": n,
                             "blocks_per_s": round(rate), "cpu_us_per_block": round(cpu * 1e6, 1),
                             "moved": None if moved is None else round(moved, 3)}
                            for w, b, n, rate, cpu, moved in measured]
    if at_once:
        result["pools_at_once"] = [{"workers": w, "blocks_per_task": b, "blocks_per_s": round(r)}
                                   for (w, b), r in at_once.items()]
    with open(args.json, "w", encoding="utf-8") as out:
        json.dump(result, out, indent=1)


def report(args, g, measured, at_once=None):
    t_w, t_b, scheduler, cores, rows = model_rows(args, g, measured, at_once)
    print(f"\n{cores} cores, {platform.processor() or platform.machine()}, gpupool "
          f"{gpupool.__version__}, CPU stand-ins paced at {args.block_seconds * 1e3:.3f} ms a "
          f"block ({args.block_elements * 8} bytes), {args.lanes} lanes and "
          f"{args.worker_threads} thread(s) per worker, blocks {args.placement}")
    print(f"g = {g:,.0f} blocks/s per device alone; t_w = {t_w * 1e3:.2f} ms per task and "
          f"t_b = {t_b * 1e6:.0f} us per block on a worker; S = {scheduler:,.0f} tasks/s")
    print(f"{'workers':>7} {'B':>3} {'blocks/s':>9} {'CPU us/block':>12} {'bound model':>11} "
          f"{'ratio':>6} {'worker model':>12} {'ratio':>6} {'host model':>10} {'ratio':>6} "
          f"{'N*':>6} {'moved':>5}" + (f" {'pools at once':>13} {'ratio':>6}" if at_once else ""))
    for r in rows:
        pools = ""
        if at_once:
            pools = (f" {r['pools_at_once']:>13} {r['over_pools_at_once']:>6.2f}"
                     if "pools_at_once" in r else f" {'-':>13} {'-':>6}")
        print(f"{r['workers']:>7} {r['blocks_per_task']:>3} {r['blocks_per_s']:>9} "
              f"{r['cpu_us_per_block']:>12} {r['bound_model']:>11} {r['over_bound_model']:>6.2f} "
              f"{r['worker_model']:>12} {r['over_worker_model']:>6.2f} "
              f"{r['host_model'] or '-':>10} {r['over_host_model'] or '-':>6} {r['n_star']:>6} "
              f"{'-' if r['moved'] is None else format(r['moved'], '.2f'):>5}{pools}")
    save(args, g, measured, at_once)


if __name__ == "__main__":
    main()
