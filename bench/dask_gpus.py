"""W2-sized work (200 x 1M float64, squared) on a Dask cluster of one worker per GPU, against the
same GPUs driven by one single-GPU gpupool.Executor per process, both at once. Prints JSON.

    python bench/dask_gpus.py --gpus 2                 # on a machine with 2 GPUs
    GPUPOOL_BACKEND=cpu python bench/dask_gpus.py --gpus 2 --elements 100000 --blocks 40  # a try

1. Baseline: --gpus processes at the same time, process i with CUDA_VISIBLE_DEVICES=i, each making
   --blocks/--gpus blocks in its own memory and timing ex.map(gpupool.kernels.square, blocks)
   (results into pinned NumPy arrays). Rate: all the input bytes over the time from the first
   start to the last end (median of --repeat runs).
2. Dask: a cluster with one worker process per GPU (worker i: CUDA_VISIBLE_DEVICES=i, as
   dask-cuda's LocalCUDACluster lays them out; dask-cuda is not needed), gpupool.dask.install,
   the blocks made on the workers (one seeded block per task of a small Blockwise graph,
   persisted and spread evenly before the clock starts), then
   gpupool.dask.map_blocks(square, x, blocks_per_task) persisted, for each of
   --blocks-per-task: results stay on the workers, as the baseline's stay in its processes.
   Rate: input bytes over the wall time (median of --repeat). blocks_per_task=1 is one Dask
   task per block; more write each group's results into one chunk.
   For reference, the same graph (the same tasks, each with the same inputs) with NumPy's
   square run in the task instead of the pool (dask_numpy), and with a task that only hands on
   its first block (dask_floor: what Dask itself costs for that grouping on these workers, the
   most any pool could reach under it), each run timing the three graphs in turn;
   --no-references leaves them out.
3. gpupool.dask.Executor: map(square, block futures, chunksize=--executor-chunksize); its
   results come back to this process, as concurrent.futures results must, so this one also
   measures the link between the workers and the client (loopback TCP here).

With --trace, one more run of the pools' graph and of the floor's, each under gpupool.dask.trace
and Dask's task stream, gives each worker's pool stats and where the run's wall time went
(timeline_parts): the pool busy, a block queued for a lane, a task's own Python with nothing of
it in the pool (ours), and no task computing (Dask between tasks).

ratio = dask rate / baseline rate, per blocks_per_task (the target: at least 0.9). Every
measurement that squares checks its last run's results (each block squared) and stops at a
wrong one; the floor's tasks and the traced run compute nothing checked.

With --one-gpu every process and worker sees GPU 0 alone: --gpus processes share one GPU, so
that a machine with one GPU measures what Dask costs over the pools it drives (one worker
against one process; two workers sharing the GPU against two processes sharing it):

    python bench/dask_gpus.py --gpus 1 --one-gpu                          # W2's size
    python bench/dask_gpus.py --gpus 2 --one-gpu --blocks 20000 --elements 1000 \
        --blocks-per-task 100,1000                                        # W4's size
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

os.environ.setdefault("GPUPOOL_QUIET", "1")


def single(args):
    """One process, one executor over the GPUs it sees; waits for --start-at, then times."""
    import numpy as np

    import gpupool

    rng = np.random.default_rng(os.getpid())
    blocks = [rng.random(args.elements) for _ in range(args.blocks)]
    spans = []
    with gpupool.Executor(threads_per_gpu=args.threads_per_gpu) as ex:
        list(ex.map(gpupool.kernels.square, blocks[:4]))  # warm: lanes, pinned cache
        info = {"backend": ex.backend, "devices": [d["ordinal"] for d in ex.devices],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        for run in range(args.repeat):
            target = args.start_at + run * args.run_spacing
            time.sleep(max(0.0, target - time.time()))
            start = time.time()
            results = list(ex.map(gpupool.kernels.square, blocks))
            end = time.time()
            spans.append([start, end])
            if run == args.repeat - 1:  # after the last run, so that no run starts late
                check_squares(blocks, results, "a single-GPU process")
            del results
    print(json.dumps(dict(info, spans=spans)), flush=True)


def check_squares(blocks, results, who):
    """Raises unless each result is its block squared (exactly: one IEEE product each)."""
    import numpy as np

    if len(results) != len(blocks):
        raise SystemExit(f"{who}: {len(results)} results for {len(blocks)} blocks")
    for i, (block, result) in enumerate(zip(blocks, results)):
        if not np.array_equal(np.asarray(result), np.square(block)):
            raise SystemExit(f"{who}: result {i} is not its block squared")


def ordered_futures(array):
    """The futures of a persisted 1-d dask array's blocks, in block order."""
    from dask.core import flatten
    from distributed import futures_of

    by_key = {f.key: f for f in futures_of(array)}
    return [by_key[k] for k in flatten(array.__dask_keys__())]


def random_block(index, elements, block_id=None):
    """Block ``block_id`` of worker ``index``'s input: ``elements`` float64 uniform in [0, 1),
    seeded by both."""
    import numpy as np

    rng = np.random.default_rng([index, block_id[0]])
    return rng.random(elements)


def square_group(*blocks):
    """Dask's own cost, for reference: a group's blocks squared by NumPy in the task and joined,
    as gpupool.dask.map_blocks joins them."""
    import numpy as np

    return np.concatenate([np.square(b) for b in blocks])


def first_of_group(*blocks):
    """Dask's floor, for reference: a task that only hands on its first block (no work, no
    join)."""
    return blocks[0]


def numpy_groups(kernel, x, blocks_per_task, name, task=square_group):
    """The graph gpupool.dask.map_blocks makes (one task per blocks_per_task neighbouring blocks
    of a 1-d array, each with those blocks as its inputs), with NumPy's square in each task
    instead of the pool: what Dask itself costs for that grouping."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    del kernel
    n = x.numblocks[0]
    groups = [range(s, min(s + blocks_per_task, n)) for s in range(0, n, blocks_per_task)]
    layer = {(name, g): (task, *[(x.name, i) for i in members])
             for g, members in enumerate(groups)}
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    sizes = [x.chunks[0][members[0]] if task is first_of_group else
             sum(x.chunks[0][i] for i in members) for members in groups]
    chunks = (tuple(sizes),)
    return da.Array(graph, name, chunks, dtype=x.dtype)


def timeline_parts(start, end, computing, pool_busy, pool_queued=()):
    """Splits the wall time from `start` to `end` (seconds) four ways, each moment counted once,
    in this order: the pool busy (some block between started and done, on any worker); a block
    queued, waiting for a lane (between submitted and started); some Dask task computing with
    nothing of it in the pool (the task's own Python around the pool's work: ours); and no Dask
    task computing (Dask between tasks: its scheduler and the workers' event loops), of which
    how much came before the first task started and after the last one ended (the graph's way
    to the workers and the results' way back, which no pool's work can overlap). Each argument
    after `end` is a list of (begin, end) intervals on the same clock. Also the mean number of
    Dask tasks computing at once."""
    layers = [("pool_busy_s", pool_busy), ("block_queued_s", pool_queued),
              ("in_tasks_s", computing)]
    events = sorted((t, layer, step) for layer, (_, spans) in enumerate(layers)
                    for b, e in spans for t, step in ((b, 1), (e, -1)))
    edges = sorted({start, end, *(t for t, _, _ in events if start < t < end)})
    parts = dict.fromkeys([key for key, _ in layers] + ["between_tasks_s", "before_first_task_s",
                                                        "after_last_task_s"], 0.0)
    first = min((b for b, _ in computing), default=end)
    last = max((e for _, e in computing), default=start)
    open_spans = [0] * len(layers)
    i = 0
    for left, right in zip(edges, edges[1:]):
        while i < len(events) and events[i][0] <= left:  # the state from `left` on
            open_spans[events[i][1]] += events[i][2]
            i += 1
        key = next((k for (k, _), n in zip(layers, open_spans) if n > 0), "between_tasks_s")
        parts[key] += right - left
        if key == "between_tasks_s":  # edges include first and last where they lie inside
            if right <= first:
                parts["before_first_task_s"] += right - left
            elif left >= last:
                parts["after_last_task_s"] += right - left
    wall = end - start
    computed = sum(min(e, end) - max(b, start) for b, e in computing if e > start and b < end)
    return dict({k: round(v, 6) for k, v in parts.items()}, wall_s=round(wall, 6),
                tasks=len(computing),
                tasks_at_once=round(computed / wall, 3) if wall > 0 else 0.0)


def compute_spans(stream_data, prefix, delay):
    """(start, stop) of each compute of a task whose key's name starts with `prefix`, from
    Dask's task stream, less `delay[worker]` (seconds): the lead the worker that ran it added,
    its estimate of the scheduler's clock's."""
    def named(key):
        return str(key[0] if isinstance(key, tuple) else key).startswith(prefix)
    spans = []
    for task in stream_data:
        for s in task["startstops"]:
            if s["action"] == "compute" and named(task["key"]):
                if task["worker"] not in delay:
                    raise SystemExit(f"traced run: worker {task['worker']} ran a task but left "
                                     "no trace (lost or replaced during the run)")
                lead = delay[task["worker"]]
                spans.append((s["start"] - lead, s["stop"] - lead))
    return spans


def visible(args, process):
    """CUDA_VISIBLE_DEVICES of baseline process or worker number `process`."""
    return "0" if args.one_gpu else str(process)


def baseline(args, script):
    per_process = args.blocks // args.gpus
    start_at = time.time() + args.startup_s
    children = []
    for gpu in range(args.gpus):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible(args, gpu))
        command = [sys.executable, script, "--single", "--blocks", str(per_process),
                   "--elements", str(args.elements), "--threads-per-gpu",
                   str(args.threads_per_gpu), "--repeat", str(args.repeat), "--start-at",
                   str(start_at), "--run-spacing", str(args.run_spacing)]
        children.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
    reports = []
    for child in children:
        out, _ = child.communicate(timeout=args.startup_s + args.repeat * args.run_spacing + 300)
        if child.returncode != 0:
            raise SystemExit(f"a single-GPU process failed ({child.returncode})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    total = per_process * args.gpus * args.elements * 8
    walls = []
    for run in range(args.repeat):
        first = min(r["spans"][run][0] for r in reports)
        last = max(r["spans"][run][1] for r in reports)
        walls.append(last - first)
    alone = [per_process * args.elements * 8 / statistics.median(s[1] - s[0] for s in r["spans"])
             for r in reports]
    # Runs that did not start together (a process late past --start-at) are not a fair sum.
    skew = [max(r["spans"][run][0] for r in reports) - min(r["spans"][run][0] for r in reports)
            for run in range(args.repeat)]
    return {"gb_s": total / statistics.median(walls) / 1e9, "seconds": walls,
            "start_skew_s": skew,
            "per_process_gb_s": [a / 1e9 for a in alone],
            "processes": [{k: r[k] for k in ("backend", "devices", "cuda_visible_devices")}
                          for r in reports]}


def cluster_runs(args):
    import dask
    import dask.array as da
    import numpy as np
    from distributed import Client, Nanny, Scheduler, SpecCluster, get_task_stream, wait

    import gpupool
    import gpupool.dask as gd

    workers = {f"gpu{gpu}": {"cls": Nanny, "options": {
        "nthreads": args.worker_threads,
        "env": {"CUDA_VISIBLE_DEVICES": visible(args, gpu), "GPUPOOL_QUIET": "1"}}}
        for gpu in range(args.gpus)}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0", "host": "127.0.0.1"}}
    out = {}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster, Client(cluster) as client:
        client.wait_for_workers(args.gpus)
        gd.install(client, threads_per_gpu=args.threads_per_gpu)
        out["workers"] = list(gd.pool_info(client).values())
        # The input is made on the workers, an equal share on each (as data read where it
        # lives would be), before the clock starts; where the map's tasks run is Dask's choice.
        addresses = sorted(client.scheduler_info()["workers"])
        share = args.blocks // args.gpus
        xs = []
        for w, address in enumerate(addresses):
            # One Blockwise layer per worker, each block seeded by its index: a graph of a
            # few kilobytes at any number of blocks (dask.array.random embeds every block's
            # seed state in the graph).
            with dask.annotate(workers=[address], allow_other_workers=False):
                xs.append(da.map_blocks(random_block, w, args.elements, dtype=np.float64,
                                        chunks=((args.elements,) * share,),
                                        name=f"input-{w}-{uuid.uuid4().hex}"))
        xs = client.persist(xs, optimize_graph=False)
        wait(xs)
        placed = client.has_what()
        out["input_blocks_per_worker"] = {
            a: sum(1 for k in placed[a] if any(k[0] == x.name for x in xs)) for a in addresses}
        share_bytes = share * args.gpus * args.elements * 8
        out["dask"] = {}
        inputs = [client.gather(ordered_futures(x)) for x in xs]  # for the checks
        for bpt in [int(b) for b in args.blocks_per_task.split(",")]:
            floor = functools.partial(numpy_groups, task=first_of_group)
            graphs = [("dask", gd.map_blocks)]
            if args.references:
                graphs += [("dask_numpy", numpy_groups), ("dask_floor", floor)]
            seconds: dict = {what: [] for what, _ in graphs}
            placed_out: dict = {what: None for what, _ in graphs}  # the floor's: not looked at
            # The graphs in turn within each run, so that the machine's drift moves them alike.
            for run in range(args.repeat + 1):  # the first run warms up
                for what, make in graphs:
                    ys = [make(gpupool.kernels.square, x, blocks_per_task=bpt,
                               name=f"{what}-square-{uuid.uuid4().hex}") for x in xs]
                    start = time.perf_counter()
                    ys = client.persist(ys)
                    wait(ys)
                    if run:
                        seconds[what].append(time.perf_counter() - start)
                    if run == args.repeat and what != "dask_floor":
                        # Where the results are, before the check (it may copy some elsewhere).
                        held = client.has_what()
                        placed_out[what] = {a: sum(1 for k in held[a]
                                                   if any(k[0] == y.name for y in ys))
                                            for a in addresses}
                        for blocks, y in zip(inputs, ys):
                            got = np.concatenate(client.gather(ordered_futures(y)))
                            if not np.array_equal(got, np.square(np.concatenate(blocks))):
                                raise SystemExit(f"{what}: a result is not its block squared")
                    del ys
            for what, _ in graphs:
                out.setdefault(what, {})[f"blocks_per_task={bpt}"] = {
                    "gb_s": share_bytes / statistics.median(seconds[what]) / 1e9,
                    "seconds": seconds[what], "result_chunks_per_worker": placed_out[what]}
            if args.trace:
                # One more run of the pools' map, traced: each worker's stage times, and with
                # Dask's task stream, where the run's wall time went (timeline_parts); then the
                # floor's graph the same way, for Dask's own share.
                traced = {}
                for what in ("dask", "dask_floor"):
                    make = gd.map_blocks if what == "dask" else floor
                    # A name per worker's array (one name for all would make them one array
                    # to Dask), under one prefix that finds this run's tasks in the stream.
                    name = f"traced-{what}-{uuid.uuid4().hex}"
                    ys = [make(gpupool.kernels.square, x, blocks_per_task=bpt,
                               name=f"{name}-{w}") for w, x in enumerate(xs)]
                    delay_before = client.run(gd._scheduler_delay_s)
                    with gd.trace(client) as recorded, get_task_stream(client) as stream:
                        start = time.time()
                        ys = client.persist(ys)
                        wait(ys)
                        end = time.time()
                    # Dask's task stream and the cluster trace are on the scheduler's clock, each
                    # worker's times moved by its estimate of that clock's lead; every process
                    # here shares one host's clock, so each worker's estimate comes off again to
                    # line both up with this run's start and end. The trace keeps the estimate
                    # it used; Dask used the one at each task's run, which a heartbeat between
                    # may have changed: that change is the split's uncertainty.
                    delay = recorded.scheduler_delays
                    uncertainty = max(abs(delay[a] - d) for a, d in delay_before.items()
                                      if a in delay)
                    at = recorded.origin
                    ran = [(r["worker"], at + r["submitted"] / 1e6, at + r["started"] / 1e6,
                            at + r["done"] / 1e6) for r in recorded.records()
                           if r["started"] is not None and r["done"] is not None]
                    spans = compute_spans(stream.data, name, delay)
                    tasks = sum(y.numblocks[0] for y in ys)
                    if len(spans) != tasks:
                        raise SystemExit(f"traced run of {what}: {len(spans)} of its {tasks} "
                                         "tasks in Dask's task stream")
                    traced[what] = dict(timeline_parts(
                        start, end, spans,
                        [(begin - delay[w], end_ - delay[w]) for w, _, begin, end_ in ran],
                        [(queued - delay[w], begin - delay[w]) for w, queued, begin, _ in ran]),
                        clock_uncertainty_s=round(uncertainty, 6))
                    if what == "dask":
                        traced["stats"] = recorded.stats_table()
                        if args.trace_dir:
                            recorded.write(os.path.join(args.trace_dir, f"dask-bpt{bpt}.json"))
                    del ys
                traced["seconds"] = traced["dask"]["wall_s"]
                out.setdefault("traced", {})[f"blocks_per_task={bpt}"] = traced
        total = share_bytes
        if args.executor:
            block_futures = [f for x in xs for f in ordered_futures(x)]
            seconds = []
            with gd.Executor(client) as ex:
                for run in range(args.repeat + 1):
                    start = time.perf_counter()
                    results = list(ex.map(gpupool.kernels.square, block_futures,
                                          chunksize=args.executor_chunksize))
                    if run:
                        seconds.append(time.perf_counter() - start)
                    if run == args.repeat:
                        check_squares([b for blocks in inputs for b in blocks], results,
                                      "gpupool.dask.Executor")
                    del results
            out["executor"] = {"gb_s": total / statistics.median(seconds) / 1e9,
                               "seconds": seconds,
                               "note": "results come back to the client: includes the link"}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=2, help="GPUs, one worker (process) each")
    parser.add_argument("--one-gpu", action="store_true",
                        help="every process and worker on GPU 0 (--gpus of them share it)")
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--elements", type=int, default=1_000_000, help="float64 per block")
    parser.add_argument("--threads-per-gpu", type=int, default=8, help="lanes per GPU")
    parser.add_argument("--blocks-per-task", default="1,10",
                        help="comma-separated; 1 is one Dask task per block (no join), more "
                        "join each group's results into one chunk (one host copy of the output)")
    parser.add_argument("--worker-threads", type=int, default=4,
                        help="Dask threads per worker (tasks it runs at once)")
    parser.add_argument("--executor-chunksize", type=int, default=10,
                        help="gpupool.dask.Executor.map's chunksize")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-references", dest="references", action="store_false",
                        help="skip dask_numpy and dask_floor: the same Dask graph with NumPy's "
                        "square in each task instead of the pool, and with a task that only "
                        "hands on its first block (what Dask itself costs for that grouping)")
    parser.add_argument("--trace", action="store_true",
                        help="one more traced run per blocks_per_task (and one of the floor's "
                        "graph): each worker's pool stats (gpupool.dask.trace) and where the "
                        "wall time went, under 'traced'")
    parser.add_argument("--trace-dir", default=None,
                        help="with --trace, also write each run's Chrome trace here")
    parser.add_argument("--no-executor", dest="executor", action="store_false",
                        help="skip the gpupool.dask.Executor measurement")
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--run-spacing", type=float, default=3.0,
                        help="seconds between the baseline's synchronised runs")
    parser.add_argument("--startup-s", type=float, default=20.0,
                        help="seconds the baseline's processes get to start and make their data")
    args = parser.parse_args()
    if args.trace_dir and not os.path.isdir(args.trace_dir):
        parser.error(f"--trace-dir {args.trace_dir}: no such directory")
    if args.single:
        single(args)
        return
    result = {"gpus": args.gpus, "one_gpu": args.one_gpu, "blocks": args.blocks,
              "elements": args.elements,
              "threads_per_gpu": args.threads_per_gpu,
              "baseline": baseline(args, os.path.abspath(__file__))}
    result.update(cluster_runs(args))
    result["ratio"] = {name: run["gb_s"] / result["baseline"]["gb_s"]
                       for name, run in result["dask"].items()}
    for reference in ("dask_numpy", "dask_floor"):
        if reference in result:
            result[f"{reference}_ratio"] = {name: run["gb_s"] / result["baseline"]["gb_s"]
                                            for name, run in result[reference].items()}
    if "executor" in result:
        result["executor_ratio"] = result["executor"]["gb_s"] / result["baseline"]["gb_s"]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
