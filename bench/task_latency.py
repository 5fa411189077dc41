"""Where the round trip of one task goes when a caller waits for each result before submitting
the next (``pool.submit(fn, x).result()`` in a loop): the standard library's pool beside gpupool
on each backend, with one worker and with several, in one run. The function records when it
starts on its worker, so each round trip splits into

    submit   the caller's submit() call, until it returns
    start    from submit's return until the function starts on a worker (the hand-off: a
             sleeping worker woken, the GIL handed to it)
    back     from the function's start until result() returns to the caller (the function, the
             hand-over of its result, the caller woken, the GIL handed back)

Printed per row: tasks per second over the whole loop and the median of each part in
microseconds. The built-in kernel one at a time (no Python on the lane, so no split) is printed
beside them. Every result is checked.

With --trace, one more round of the built-in kernel per gpupool row runs inside ``ex.trace()``,
and its records split each task further (medians, us): ``queued`` (submitted until a lane took
it), ``lane`` (taken until its download ended), ``finish`` (download end until the task was
done) and ``handover`` (the round trip less done - submitted: submit's own work before the task
was queued, and the result's way back to the caller).

    python bench/task_latency.py [--tasks 3000] [--rounds 3] [--lanes 1,8]
        [--backends cpu,cuda] [--trace]
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

import gpupool

Round = Tuple[float, List[float], List[float], List[float]]


def stamped(x: Any) -> Tuple[Any, float]:
    """The task: its input back, with when it started on its worker."""
    return x, time.perf_counter()


def one_at_a_time(pool: Any, data: List[np.ndarray]) -> Round:
    """Seconds for the loop, and per task: submit, start and back, in seconds."""
    submit, start, back = [], [], []
    t_loop = time.perf_counter()
    for d in data:
        t0 = time.perf_counter()
        future = pool.submit(stamped, d)
        t1 = time.perf_counter()
        out, t_start = future.result()
        t2 = time.perf_counter()
        if out is not d:
            raise SystemExit("FAIL: a task returned another input")
        submit.append(t1 - t0)
        start.append(t_start - t1)
        back.append(t2 - t_start)
    return time.perf_counter() - t_loop, submit, start, back


def kernel_one_at_a_time(pool: Any, data: List[np.ndarray]) -> float:
    t0 = time.perf_counter()
    results = [pool.submit(gpupool.kernels.square, d).result() for d in data]
    seconds = time.perf_counter() - t0
    if not all(np.array_equal(r, np.square(d)) for r, d in zip(results, data)):
        raise SystemExit("FAIL: a square differs from numpy.square")
    return seconds


def traced_kernel_parts(ex: Any, data: List[np.ndarray]) -> Dict[str, float]:
    """Medians (us) of a traced round of the built-in kernel, one task at a time."""
    trips = []
    with ex.trace() as trace:
        for d in data:
            t0 = time.perf_counter()
            result = ex.submit(gpupool.kernels.square, d).result()
            trips.append((time.perf_counter() - t0) * 1e6)
            if not np.array_equal(result, np.square(d)):
                raise SystemExit("FAIL: a square differs from numpy.square")
    records = sorted(trace.records(), key=lambda r: r["id"])
    if len(records) != len(data):
        raise SystemExit(f"FAIL: {len(records)} records for {len(data)} tasks")
    parts: Dict[str, List[float]] = {"queued": [], "lane": [], "finish": [], "handover": []}
    for r, trip in zip(records, trips):
        ended = r["download"][1] if r["download"] else r["started"]
        parts["queued"].append(r["started"] - r["submitted"])
        parts["lane"].append(ended - r["started"])
        parts["finish"].append(r["done"] - ended)
        parts["handover"].append(trip - (r["done"] - r["submitted"]))
    return {k: statistics.median(v) for k, v in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lanes", default="1,8")
    parser.add_argument("--backends", default="cpu,cuda")
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(5)
    data = [rng.standard_normal(1_024) for _ in range(args.tasks)]
    workers = [int(n) for n in args.lanes.split(",")]
    pools: Dict[str, Any] = {}
    for n in workers:
        pools[f"ThreadPoolExecutor, {n} threads"] = ThreadPoolExecutor(n)
    for backend in args.backends.split(","):
        for n in workers:
            try:
                pools[f"gpupool {backend}, {n} lanes"] = gpupool.Executor(
                    threads_per_gpu=n, backend=backend)
            except Exception as error:  # no GPU here: the row says so
                print(f"(gpupool {backend}, {n} lanes: {error})")
    loops: Dict[str, List[Round]] = {name: [] for name in pools}
    kernels: Dict[str, List[float]] = {name: [] for name in pools if name.startswith("gpupool")}
    for name, pool in pools.items():  # warm-up, checked like the rounds
        one_at_a_time(pool, data[:200])
        if name in kernels:
            kernel_one_at_a_time(pool, data[:200])
    for _ in range(args.rounds):  # interleaved: drift hits every row alike
        for name, pool in pools.items():
            loops[name].append(one_at_a_time(pool, data))
            if name in kernels:
                kernels[name].append(kernel_one_at_a_time(pool, data))

    def us(values: List[float]) -> str:
        return f"{statistics.median(values) * 1e6:7.1f}"

    print(f"{args.tasks} tasks one at a time, {args.rounds} rounds; the median round's rate, "
          f"the medians of its parts (us)")
    print(f"{'':36s} {'tasks/s':>9s} {'submit':>7s} {'start':>7s} {'back':>7s}")
    for name, rounds in loops.items():
        seconds, submit, start, back = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
        row = f"{name:36s} {args.tasks / seconds:9,.0f} {us(submit)} {us(start)} {us(back)}"
        if name in kernels:
            row += f"   square one at a time: {args.tasks / statistics.median(kernels[name]):,.0f}"
        print(row, flush=True)
    if args.trace:
        print("the built-in kernel one at a time, traced (medians, us):")
        for name in kernels:
            parts = traced_kernel_parts(pools[name], data)
            print(f"  {name:34s} " + "  ".join(f"{k} {v:6.1f}" for k, v in parts.items()),
                  flush=True)
    for pool in pools.values():
        pool.shutdown()


if __name__ == "__main__":
    main()
