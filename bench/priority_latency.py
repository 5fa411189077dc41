"""Priorities under a backlog: the latency of a tiny urgent task (W4's size, 1,024 float64)
submitted while a W2-sized map (200 x 1,000,000 float64, built-in square) is queued, against its
latency on an idle executor and against a tiny task of the default priority behind the same
backlog; and the map's throughput with such urgent tasks arriving every millisecond against
without them. Every result (the map's and each tiny task's) is checked against NumPy before any
time counts.

    python3 bench/priority_latency.py [--chunks 200] [--elements 1000000] [--tiny 1024]
        [--interval-ms 1] [--rounds 5] [--idle-probes 200] [--lanes 0] [--slots 0]
        [--chunk-bytes 0] [--backend cuda]

A probe is one `submit(gpupool.kernels.square, x, priority=P)` waited for with `result()`; while
a map runs, probes go one at a time, each at least --interval-ms after the one before (sooner
is never: a probe waits for its result first); only probes submitted while some of the map was
still queued (not yet taken by a lane) count as behind it. The map's consumer is a second thread reading its results,
as a user's would. Idle probes (urgent ones, the figure the targets compare with, alternating
with default-priority ones, which take the copy engines' path rather than the express slot) are
spaced the same way, so the idle figure includes waking a
lane that went to sleep. A fourth run sends the probes to a second executor of two lanes made
with priority 3 (on CUDA its lanes' streams have a higher stream priority too), the way to give
urgent work lanes a bulk map never holds. Rounds interleave the four runs of the map (no
probes, urgent probes, default-priority probes, probes to the urgent executor). Prints which
path each kind of probe took (the trace's `express`), the medians and whether the issue's
targets hold
(urgent latency behind the backlog <= 2x idle; the map's throughput with urgent probes >= 0.95x
without); exits 1 if a result is wrong.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any, List, Optional, Tuple

import numpy as np

import gpupool

URGENT = 3  # gpupool's highest priority


def probe(ex: gpupool.Executor, tiny: np.ndarray, expected: np.ndarray,
          priority: Optional[int], to: Optional[gpupool.Executor] = None) -> Tuple[bool, float]:
    """One tiny task, submitted (to `to`, else `ex`) and waited for: whether work was queued on
    `ex` (not yet taken by a lane) when it was submitted, and its latency in seconds (its result
    checked)."""
    backlog = ex.queued > 0
    start = time.perf_counter()
    out = (to or ex).submit(gpupool.kernels.square, tiny, priority=priority).result()
    latency = time.perf_counter() - start
    if not np.array_equal(out, expected):
        raise SystemExit("FAIL: a tiny task's result differs from NumPy's")
    return backlog, latency


def run_map(ex: gpupool.Executor, xs: List[np.ndarray], expected: List[np.ndarray],
            tiny: np.ndarray, tiny_expected: np.ndarray, interval: float,
            priority: Optional[int], probing: bool,
            to: Optional[gpupool.Executor] = None) -> Tuple[float, List[float]]:
    """The map once (probes every `interval` while it runs, if `probing`): its wall time and
    the latencies of the probes submitted while some of it was still queued (later ones found
    no backlog)."""
    results: List[Any] = []
    done = threading.Event()
    start = time.perf_counter()
    in_order = ex.map(gpupool.kernels.square, xs)  # its first window is queued here

    def consume() -> None:
        results.extend(in_order)
        done.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    probes: List[Tuple[float, float]] = []
    next_at = start
    while probing and not done.is_set():
        next_at = max(next_at + interval, time.perf_counter())
        done.wait(max(0.0, next_at - time.perf_counter()))
        if done.is_set():
            break
        probes.append(probe(ex, tiny, tiny_expected, priority, to))
    consumer.join()
    seconds = time.perf_counter() - start
    if len(results) != len(expected) or not all(
            np.array_equal(a, b) for a, b in zip(results, expected)):
        raise SystemExit("FAIL: a result of the map differs from NumPy's")
    return seconds, [latency for behind, latency in probes if behind]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=200, help="arrays in the map (W2: 200)")
    parser.add_argument("--elements", type=int, default=1_000_000,
                        help="float64 per array of the map (W2: 1,000,000)")
    parser.add_argument("--tiny", type=int, default=1024, help="float64 per tiny task (W4: 1,024)")
    parser.add_argument("--interval-ms", type=float, default=1.0,
                        help="least time between probes while the map runs")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle-probes", type=int, default=200)
    parser.add_argument("--lanes", type=int, default=0, help="lanes per device (0: auto)")
    parser.add_argument("--slots", type=int, default=0,
                        help="slots per lane: pieces a lane keeps in flight (0: the default)")
    parser.add_argument("--chunk-bytes", type=int, default=0,
                        help="largest piece, and coalesced batch, of the map (0: auto)")
    parser.add_argument("--backend", default=None)
    args = parser.parse_args()
    if min(args.chunks, args.elements, args.tiny, args.rounds, args.idle_probes) < 1:
        parser.error("sizes, --rounds and --idle-probes must be at least 1")
    rng = np.random.default_rng(1)
    xs = [rng.random(args.elements) for _ in range(args.chunks)]
    expected = [x * x for x in xs]
    tiny = rng.random(args.tiny)
    tiny_expected = tiny * tiny
    interval = args.interval_ms / 1e3

    threads: Any = "auto" if args.lanes == 0 else args.lanes
    options: Any = {}
    if args.slots:
        options["slots_per_lane"] = args.slots
    if args.chunk_bytes:
        options["chunk_bytes"] = args.chunk_bytes
    # The urgent executor: a few lanes of its own at the highest priority (on CUDA, its
    # streams' priority too), so that an urgent task never waits for a lane of the map's.
    with gpupool.Executor(threads_per_gpu=threads, backend=args.backend, **options) as ex, \
            gpupool.Executor(threads_per_gpu=2, backend=args.backend, priority=URGENT) as hi:
        print(f"backend {ex.backend}, {ex.lane_count} lanes, {ex.slots_per_lane} slots "
              f"each, chunk {ex.chunk_bytes} bytes; map "
              f"{args.chunks} x {args.elements} float64, tiny {args.tiny} float64, probes every "
              f">= {args.interval_ms} ms")
        # Warm-up: the map's and the tiny task's paths, pinned blocks included.
        run_map(ex, xs, expected, tiny, tiny_expected, interval, URGENT, probing=True)
        # Which path each kind of probe takes, from the trace (untimed): an urgent one should run
        # in its lane's express slot, a default one the copy engines' way.
        with ex.trace() as traced:
            probe(ex, tiny, tiny_expected, URGENT)
            probe(ex, tiny, tiny_expected, None)
        paths = {r["priority"]: "express" if r["express"] else "ordinary"
                 for r in traced.records()}
        print(f"  paths: an urgent probe {paths.get(URGENT, 'untraced')}, a default one "
              f"{paths.get(ex.priority, 'untraced')}")
        idle: List[float] = []
        idle_default: List[float] = []
        for _ in range(args.idle_probes):
            idle.append(probe(ex, tiny, tiny_expected, URGENT)[1])
            time.sleep(interval)
            idle_default.append(probe(ex, tiny, tiny_expected, None)[1])
            time.sleep(interval)
        plain_s: List[float] = []
        urgent_s: List[float] = []
        urgent_lat: List[float] = []
        default_lat: List[float] = []
        own_s: List[float] = []
        own_lat: List[float] = []
        run_map(ex, xs, expected, tiny, tiny_expected, interval, None, probing=True, to=hi)
        for _ in range(args.rounds):
            plain_s.append(run_map(ex, xs, expected, tiny, tiny_expected, interval, None,
                                   probing=False)[0])
            seconds, lat = run_map(ex, xs, expected, tiny, tiny_expected, interval, URGENT,
                                   probing=True)
            urgent_s.append(seconds)
            urgent_lat += lat
            default_lat += run_map(ex, xs, expected, tiny, tiny_expected, interval, None,
                                   probing=True)[1]
            seconds, lat = run_map(ex, xs, expected, tiny, tiny_expected, interval, None,
                                   probing=True, to=hi)
            own_s.append(seconds)
            own_lat += lat
    if not urgent_lat or not default_lat or not own_lat:
        raise SystemExit("FAIL: the map ended before any probe; make it larger (--chunks)")
    gb = args.chunks * args.elements * 8 / 1e9
    idle_us = statistics.median(idle) * 1e6
    urgent_us = statistics.median(urgent_lat) * 1e6
    default_us = statistics.median(default_lat) * 1e6
    plain = statistics.median(plain_s)
    probed = statistics.median(urgent_s)
    print(f"  tiny task, priority {URGENT}, idle      {idle_us:10.1f} us median "
          f"({len(idle)} probes)")
    print(f"  tiny task, default, idle executor  {statistics.median(idle_default) * 1e6:10.1f} us "
          f"median ({len(idle_default)} probes; the copy engines' path)")
    print(f"  tiny task, priority {URGENT}, behind map {urgent_us:10.1f} us median "
          f"({len(urgent_lat)} probes) = {urgent_us / idle_us:.2f}x idle")
    print(f"  tiny task, default, behind map     {default_us:10.1f} us median "
          f"({len(default_lat)} probes) = {default_us / idle_us:.2f}x idle")
    own_us = statistics.median(own_lat) * 1e6
    own = statistics.median(own_s)
    print(f"  tiny task, executor of priority {URGENT}  {own_us:10.1f} us median "
          f"({len(own_lat)} probes) = {own_us / idle_us:.2f}x idle")
    print(f"  map alone                          {gb / plain:10.2f} GB/s ({plain * 1e3:.1f} ms)")
    print(f"  map with urgent probes             {gb / probed:10.2f} GB/s ({probed * 1e3:.1f} ms)"
          f" = {plain / probed:.3f}x")
    print(f"  map, probes to the other executor  {gb / own:10.2f} GB/s ({own * 1e3:.1f} ms)"
          f" = {plain / own:.3f}x")
    for name, latency, seconds in (("urgent probes", urgent_us, probed),
                                   (f"an executor of priority {URGENT}", own_us, own)):
        latency_met = latency <= 2 * idle_us
        throughput_met = plain / seconds >= 0.95
        print(f"  targets, {name}: latency <= 2x idle: {'met' if latency_met else 'missed'}; "
              f"throughput with probes >= 0.95x: {'met' if throughput_met else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
