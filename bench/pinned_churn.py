"""Does a pinned cache filled by sizes no longer asked for make later work page-lock its blocks?

A Dask worker's pool caps gpupool's pinned cache (an eighth of the worker's memory limit), and
earlier graphs fill it: one block per task leaves the pool's 8 MB results, ten per task 80 MB
joined chunks. A later graph of 25 blocks per task joins 201 MB chunks, which a cache that keeps
what it filled up with first would page-lock and give back on every run. This runs that story in
one process:

1. the cache is capped (``--cache-mb``) and filled: ``--fill-blocks`` results of the pool's
   ``map`` (8 MB each at the default size) and as many joined chunks of ten blocks as fit,
   all dropped, so that the cache is full of those two sizes;
2. rounds as the later graph runs them, for at least ``--seconds``: ``--groups`` chunks of
   ``--group-blocks`` blocks each, every block written into its place by
   ``submit(kernel, block, out=slice)`` from pageable input;
3. the same rounds after the cache is emptied, where nothing is cached to begin with.

It prints each phase's median round over the last half of its rounds (``LABEL  MEDIAN ms``, as
``scripts/gpu paired --python`` reads), the cache's bytes after each phase, and a JSON line. Every
round's results are checked. On a GPU machine: ``scripts/gpu paired --python
bench/pinned_churn.py`` against a baseline staged with ``scripts/stage-baseline``; anywhere (CPU
backend) with smaller sizes, ``--elements 100000 --cache-mb 64``.
"""
import argparse
import json
import statistics
import sys
import time
from typing import Dict, List

import numpy as np

import gpupool
from gpupool import _ext


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lanes", type=int, default=8, help="lanes per GPU")
    p.add_argument("--cache-mb", type=int, default=4096, help="the pinned cache's limit")
    p.add_argument("--elements", type=int, default=1_000_000, help="float64 per block")
    p.add_argument("--fill-blocks", type=int, default=200)
    p.add_argument("--groups", type=int, default=8, help="joined chunks per round")
    p.add_argument("--group-blocks", type=int, default=25, help="blocks per joined chunk")
    p.add_argument("--seconds", type=float, default=4.0,
                   help="least time each phase's rounds run (the cache ages sizes by the second)")
    p.add_argument("--repeat", type=int, default=1, help="times the whole story runs")
    a = p.parse_args()
    for name in ("lanes", "cache_mb", "elements", "fill_blocks", "groups", "group_blocks",
                 "repeat"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not a.seconds > 0:
        p.error("--seconds must be more than 0")
    return a


def cached_mb() -> float:
    return _ext.pinned_memory_stats()["cached"] / 2**20


def fill(pool: gpupool.Executor, blocks: List[np.ndarray], a: argparse.Namespace) -> None:
    """The cache full of the pool's results and of ten-block chunks, all dropped."""
    results = list(pool.map(gpupool.kernels.square, blocks[:a.fill_blocks]))
    del results
    limit = a.cache_mb * 2**20
    chunk_bytes = 10 * a.elements * 8
    chunks = [gpupool.empty_pinned(10 * a.elements, np.float64)
              for _ in range(max(1, limit // chunk_bytes))]
    del chunks


def rounds(pool: gpupool.Executor, blocks: List[np.ndarray], squares: List[float],
           a: argparse.Namespace) -> List[float]:
    """Rounds of joined chunks for at least a.seconds; each round's milliseconds."""
    n = a.elements
    times: List[float] = []
    began = time.perf_counter()
    while time.perf_counter() - began < a.seconds or len(times) < 4:
        start = time.perf_counter()
        joined, futures = [], []
        for g in range(a.groups):
            out = gpupool.empty_pinned(a.group_blocks * n, np.float64)
            joined.append(out)
            for j in range(a.group_blocks):
                block = blocks[(g * a.group_blocks + j) % len(blocks)]
                futures.append(pool.submit(gpupool.kernels.square, block,
                                           out=out[j * n:(j + 1) * n]))
        for f in futures:
            f.result()
        times.append((time.perf_counter() - start) * 1e3)
        for g, out in enumerate(joined):
            for j in range(a.group_blocks):
                want = squares[(g * a.group_blocks + j) % len(blocks)]
                if out[j * n] != want or out[(j + 1) * n - 1] != want:
                    sys.exit(f"FAIL: group {g}, block {j}: {out[j * n]} where {want}")
        del joined, futures
    return times


def settled(times: List[float]) -> float:
    return statistics.median(times[len(times) // 2:])


def main() -> None:
    a = parse()
    _ext.trim_pinned_cache()
    _ext.set_pinned_cache_limit(a.cache_mb * 2**20)
    count = max(a.fill_blocks, a.groups * a.group_blocks)
    blocks = [np.full(a.elements, float(i % 7 + 1)) for i in range(count)]
    squares = [float((i % 7 + 1) ** 2) for i in range(count)]
    report: Dict[str, List[float]] = {"full": [], "emptied": [], "full_rounds": [],
                                      "cached_mb_after_full": [], "cached_mb_after_emptied": []}
    with gpupool.Executor(threads_per_gpu=a.lanes) as pool:
        list(pool.map(gpupool.kernels.square, blocks[:2 * a.lanes]))  # lanes and kernels ready
        for _ in range(a.repeat):
            _ext.trim_pinned_cache()
            fill(pool, blocks, a)
            full = rounds(pool, blocks, squares, a)
            report["full"].append(settled(full))
            report["full_rounds"].append(len(full))
            report["cached_mb_after_full"].append(cached_mb())
            _ext.trim_pinned_cache()
            emptied = rounds(pool, blocks, squares, a)
            report["emptied"].append(settled(emptied))
            report["cached_mb_after_emptied"].append(cached_mb())
        backend = pool.backend
    gb = a.groups * a.group_blocks * a.elements * 8 / 1e9
    print(f"backend {backend}; cache {a.cache_mb} MB; rounds of {a.groups} x {a.group_blocks} "
          f"blocks of {a.elements * 8 / 1e6:g} MB ({gb:.2f} GB in)")
    print(f"cached after the rounds: {statistics.median(report['cached_mb_after_full']):.0f} MB "
          f"(cache filled first), {statistics.median(report['cached_mb_after_emptied']):.0f} MB "
          f"(emptied first)")
    print(f"round, cache full of other sizes  {statistics.median(report['full']):.2f} ms")
    print(f"round, cache emptied first  {statistics.median(report['emptied']):.2f} ms")
    print(json.dumps({"args": vars(a), "gb_per_round": gb, **report}))


if __name__ == "__main__":
    main()
