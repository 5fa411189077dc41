"""What one task costs through gpupool's Python API, beside the standard library's pool, in one
run: W4's shape (20,000 x 1,024 float64) submitted one call at a time, with the cyclic garbage
collector on and off, with one lane and the default lanes, and before and after CuPy and PyTorch
are imported (a lane binds their streams before each Python call once they are). Every
variant's results are checked before its rate is printed.

    python bench/python_task_cost.py [--repeat 5] [--tasks 20000] [--only VARIANT]
                                     [--lanes N] [--host-lanes N] [--profile-signal N]

--only "A|B" runs the timed rounds of the variants whose names contain A or B, nothing else (to
profile one, or to compare a few under another setting). --lanes N gives the variants of the
default lanes N lanes per device instead (named "N lanes"). --host-lanes N adds the square's map
and submit loop with N host lanes (``Executor(host_lanes=N)``), and says where their calls ran.
--profile-signal N sends this process signal N before each variant's timed rounds and after them,
so that a profiler that signal switches on and off (gperftools' CPUPROFILESIGNAL=N) samples those
rounds alone, not the imports, the data's making or the warm-up.

Each line gives the rate of the best round, the median and slowest rounds' rates, the share of
the best round the submits took, and the CPU time the calling thread spent per task in that round
(`time.thread_time`): what the caller pays per task, apart from the lanes' work, which on a
machine of few cores also competes for the CPU.
"""

import argparse
import gc
import importlib
import os
import signal
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

import gpupool
from gpupool.compare.harness import check_returned, check_squares


def noop(x: Any) -> Any:
    return x


def submit_loop(pool: Any, fn: Any, data: List[np.ndarray]) -> Tuple[List[Any], float]:
    """Every call submitted, then every result taken; returns the results and the seconds the
    submits alone took."""
    t0 = time.perf_counter()
    futures = [pool.submit(fn, d) for d in data]
    submitted = time.perf_counter() - t0
    return [f.result() for f in futures], submitted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1_024)
    parser.add_argument("--only", default=None)
    parser.add_argument("--lanes", type=int, default=0)
    parser.add_argument("--host-lanes", type=int, default=0)
    parser.add_argument("--profile-signal", type=int, default=0)
    args = parser.parse_args()
    if args.lanes < 0 or args.host_lanes < 0:
        parser.error("--lanes and --host-lanes cannot be negative")
    if args.repeat < 1 or args.tasks < 1 or args.size < 1:
        parser.error("--repeat, --tasks and --size must be at least 1")
    if args.profile_signal:
        if args.profile_signal not in set(signal.valid_signals()):
            parser.error(f"--profile-signal {args.profile_signal} is not a signal")
        # Unhandled, the signal would end the process at the first timed round.
        if signal.getsignal(args.profile_signal) in (signal.SIG_DFL, signal.SIG_IGN):
            parser.error(f"--profile-signal {args.profile_signal}: nothing handles it here (run "
                         f"under a profiler it switches, such as gperftools with "
                         f"CPUPROFILESIGNAL={args.profile_signal})")
    default_lanes = (f"{args.lanes} lane{'s' if args.lanes > 1 else ''}" if args.lanes
                     else "default lanes")
    rng = np.random.default_rng(7)
    data = [rng.uniform(-10, 10, args.size) for _ in range(args.tasks)]
    square = gpupool.kernels.square
    rows: List[Tuple[str, float, float]] = []
    pools: Dict[str, Any] = {}

    def pool(name: str, make: Callable[[], Any]) -> Any:
        if name not in pools:
            pools[name] = make()
        return pools[name]

    def executor(lanes: Optional[int]) -> Any:
        return pool(f"gpupool {lanes}", lambda: gpupool.Executor(lanes or args.lanes or "auto"))

    def hosted(host_lanes: int) -> Any:
        return pool(f"gpupool + {host_lanes} host lanes",
                    lambda: gpupool.Executor(args.lanes or "auto", host_lanes=host_lanes))

    def tpe(threads: int) -> Any:
        return pool(f"tpe {threads}", lambda: ThreadPoolExecutor(max_workers=threads))

    Run = Callable[[], Tuple[List[Any], float]]

    # A run over every input through pool_of(size), made at the first run (a variant --only
    # leaves out makes no pool): its map, or a submit loop.
    def mapped(pool_of: Callable[[Any], Any], size: Any, fn: Any) -> Run:
        return lambda: ([*pool_of(size).map(fn, data)], 0.0)

    def looped(pool_of: Callable[[Any], Any], size: Any, fn: Any,
               inputs: Optional[List[np.ndarray]] = None) -> Run:
        return lambda: submit_loop(pool_of(size), fn, data if inputs is None else inputs)

    def measure(name: str, run: Run,
                check: Callable[[Iterable[Any]], None], gc_off: bool = False,
                tasks: Optional[int] = None) -> None:
        if args.only is not None and not any(part in name for part in args.only.split("|")):
            return
        check(run()[0])  # the warm-up round, checked
        best, submit_share, caller = float("inf"), 0.0, 0.0
        times: List[float] = []
        if args.profile_signal:
            os.kill(os.getpid(), args.profile_signal)  # the profiler on
        for _ in range(args.repeat):
            if gc_off:
                gc.disable()
            try:
                c0 = time.thread_time()
                t0 = time.perf_counter()
                out, submitted = run()
                seconds = time.perf_counter() - t0
                cpu = time.thread_time() - c0
            finally:
                gc.enable()
            check(out)
            times.append(seconds)
            if seconds < best:
                best, submit_share, caller = seconds, submitted / seconds, cpu
            del out
        if args.profile_signal:
            os.kill(os.getpid(), args.profile_signal)  # and off
        count = tasks or args.tasks
        rate = count / best
        rows.append((name, rate, submit_share))
        print(f"{name:62s} {rate:>10,.0f} tasks/s  (median {count / statistics.median(times):,.0f}"
              f", slowest {count / max(times):,.0f})  submits {submit_share:4.0%}  "
              f"caller {caller / count * 1e6:5.2f} us/task", flush=True)

    squares, same = check_squares(data), check_returned(data)
    pinned = [gpupool.pinned_array(d) for d in data]
    squares_pinned = check_squares(pinned)
    few = data[:max(1, len(data) // 10)]
    same_few, squares_few = check_returned(few), check_squares(few)
    for when in ("", ", CuPy and PyTorch imported"):
        if when:
            for module in ("cupy", "torch"):
                try:
                    importlib.import_module(module)
                except ImportError as e:
                    print(f"({module} not imported: {e})")
        for threads in (1, 8):
            measure(f"ThreadPoolExecutor no-op map, {threads} thread(s){when}",
                    mapped(tpe, threads, noop), same)
            measure(f"ThreadPoolExecutor no-op submit loop, {threads} thread(s){when}",
                    looped(tpe, threads, noop), same)
        for lanes in (None, 1) if args.lanes != 1 else (None,):  # --lanes 1: those rows once
            label = default_lanes if lanes is None else f"{lanes} lane"
            measure(f"gpupool square submit loop, {label}{when}", looped(executor, lanes, square),
                    squares)
            measure(f"gpupool square submit loop, {label}, gc off{when}",
                    looped(executor, lanes, square), squares, gc_off=True)
            measure(f"gpupool no-op submit loop, {label}{when}", looped(executor, lanes, noop),
                    same)
            measure(f"gpupool no-op map, {label}{when}", mapped(executor, lanes, noop), same)
        measure(f"gpupool square map, {default_lanes}{when}", mapped(executor, None, square),
                squares)
        if args.host_lanes:
            hosts = f"{default_lanes} + {args.host_lanes} host lanes"
            measure(f"gpupool square map, {hosts}{when}", mapped(hosted, args.host_lanes, square),
                    squares)
            measure(f"gpupool square submit loop, {hosts}{when}",
                    looped(hosted, args.host_lanes, square), squares)
            made = pools.get(f"gpupool + {args.host_lanes} host lanes")  # none if --only left out
            if made is not None:
                placement = made.placement()
                placed = placement["host_tasks"] + placement["device_tasks"]
                print(f"  host lanes ran {placement['host_tasks'] / max(placed, 1):.0%} of "
                      f"{placed:,} calls (of a large push now: {placement['host_share']:.2f})",
                      flush=True)
        measure(f"gpupool square submit loop, pinned inputs, {default_lanes}{when}",
                looped(executor, None, square, pinned), squares_pinned)
        # One task in flight: the round trip of a task (a tenth of the tasks).
        measure(f"ThreadPoolExecutor no-op one at a time, 8 threads{when}",
                lambda: ([tpe(8).submit(noop, d).result() for d in few], 0.0), same_few,
                tasks=len(few))
        measure(f"gpupool no-op one at a time, {default_lanes}{when}",
                lambda: ([executor(None).submit(noop, d).result() for d in few], 0.0), same_few,
                tasks=len(few))
        measure(f"gpupool square one at a time, {default_lanes}{when}",
                lambda: ([executor(None).submit(square, d).result() for d in few], 0.0),
                squares_few, tasks=len(few))
    for p in pools.values():
        p.shutdown(wait=True)
    if rows:
        print(f"median of all rows: {statistics.median(r[1] for r in rows):,.0f} tasks/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
