"""Where the time of W5 from Python goes: Executor.map of a compiled FMA kernel over 2,000 CuPy
arrays of 16,384 float32 (as `gpupool compare` runs it), split into the map call (describing the
arrays and queueing the batches), the wait for the results, and a cProfile of the whole, beside
CuPy's one launch over all the data. Results are checked against CuPy's own kernel first.

    python bench/w5_profile.py [--chunks 2000] [--size 16384] [--fmas 2048] [--repeat 5] [--trace]
        [--table] [--lanes N]

With --trace, one more round of the map runs inside ``ex.trace()``: when each batch was queued,
taken by a lane and run on the GPU (the lanes' kernel spans), against the map call's start and
end (marked by a built-in kernel task submitted just before and just after it), and how long the
GPU had no batch running between the first batch's start and the last one's end (a stamp
lands late while other lanes' kernels fill the GPU, so spans look longer and gaps can hide);
--table prints every batch's times.

The "whole" rounds also report, for the thread that makes the map call, how much of the call's
wall time it spent on a CPU and how often the system took its core away (involuntary context
switches, where the platform counts them per thread): a call that runs long while its thread
spends little time on a CPU, or is switched out often, was held up by other threads (the lanes
polling the GPU among them), not by its own work.
"""

import argparse
import cProfile
import gc
import io
import pstats
import resource
import statistics
import time
from typing import Any, Dict, List

import numpy as np

import gpupool

A, B = 0.999, 0.001


def fma_body(fmas: int) -> str:
    """``fmas`` dependent FMAs per element (W5), the body gpupool compare's W5 uses; written
    out here so that this script runs unchanged under older packages (paired runs)."""
    return f"float v = x;\nfor (int i = 0; i < {fmas}; ++i) v = v * a + b;\ny = v;"


def traced_round(ex: Any, kernel: Any, chunks: List[Any], cp: Any, reference: Any,
                 table: bool, into: Any = None) -> None:
    """Prints when the batches of a traced map were queued, taken and run (us since the map call
    began), and the GPU's time without a batch running; with `table`, every batch's times.
    With `into` (a device array as long as all chunks), the round is a map_into it instead."""
    marker = np.ones(16, dtype=np.float32)
    with ex.trace() as trace:
        begin = ex.submit(gpupool.kernels.square, marker)
        if into is None:
            got = ex.map(kernel, chunks, A, B)
            end = ex.submit(gpupool.kernels.square, marker)
            written = cp.concatenate(list(got))
        else:
            into.fill(float("nan"))
            written = ex.map_into(kernel, chunks, A, B, out=into)
            end = ex.submit(gpupool.kernels.square, marker)
        cp.cuda.runtime.deviceSynchronize()
        begin.result(), end.result()
    if not bool(cp.allclose(written, reference, rtol=1e-5, atol=1e-6)):
        raise SystemExit("FAIL: the traced map differs from CuPy's kernel")
    del written
    records = sorted(trace.records(), key=lambda r: r["id"])
    if len(records) < 3 or records[0]["name"] != "square" or records[-1]["name"] != "square":
        raise SystemExit("FAIL: the traced round lacks its marker tasks")
    t0, t_end = records[0]["submitted"], records[-1]["submitted"]
    batches = [r for r in records[1:-1] if r["kernel"]]
    if len(batches) != len(records) - 2:
        raise SystemExit("FAIL: a batch of the traced map has no kernel span")
    what = "map" if into is None else "map_into"
    print(f"traced {what} round: {len(batches)} batches; the call returned at {t_end - t0:.0f} us, "
          f"the last batch ended (done) at {max(r['done'] for r in batches) - t0:.0f} us")
    spans = sorted((r["kernel"][0], r["kernel"][1]) for r in batches)
    idle: List[Dict[str, float]] = []
    reach = spans[0][1]
    for start, stop in spans[1:]:
        if start > reach:
            idle.append({"from": reach - t0, "us": start - reach})
        reach = max(reach, stop)
    first, last = spans[0][0] - t0, reach - t0
    print(f"  GPU: first batch started at {first:.0f} us, the last ended at {last:.0f} us; "
          f"without a batch running for {sum(g['us'] for g in idle):.0f} us in "
          f"{len(idle)} gap(s) between")
    for g in sorted(idle, key=lambda g: -g["us"])[:8]:
        print(f"    {g['us']:7.0f} us from {g['from']:.0f}")
    taken = sorted(r["started"] - r["submitted"] for r in batches)
    ended = sorted(r["done"] - r["kernel"][1] for r in batches)
    print(f"  from queued to taken by a lane: median {statistics.median(taken):.0f} us, "
          f"longest {taken[-1]:.0f}; from kernel end to done: median "
          f"{statistics.median(ended):.0f} us, longest {ended[-1]:.0f}")
    if not table:
        return
    print("  batch  queued  taken  kernel start  kernel end  done  (us since the map call began; "
          "lane; the kernel's stamps land late while other lanes' kernels fill the GPU)")
    for r in batches:
        print(f"  {r['id']:5d} {r['submitted'] - t0:7.0f} {r['started'] - t0:6.0f} "
              f"{r['kernel'][0] - t0:13.0f} {r['kernel'][1] - t0:11.0f} {r['done'] - t0:5.0f}"
              f"  lane {r['lane']}")


# Where the platform counts involuntary context switches per thread (Linux); None elsewhere.
RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)


def involuntary_switches() -> int:
    """How often the calling thread has had its core taken away so far (0 where the platform
    does not count it per thread: then the figures print as n/a)."""
    return resource.getrusage(RUSAGE_THREAD).ru_nivcsw if RUSAGE_THREAD is not None else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--size", type=int, default=16384)
    parser.add_argument("--fmas", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--table", action="store_true",
                        help="with --trace, print every batch's times too")
    parser.add_argument("--lanes", type=int, default=None,
                        help="lanes per GPU (default: the executor's own choice)")
    args = parser.parse_args()
    import cupy as cp  # type: ignore[import-not-found, import-untyped, unused-ignore]

    data = cp.random.uniform(-1, 1, args.chunks * args.size, dtype=cp.float32)
    chunks = [data[i * args.size:(i + 1) * args.size] for i in range(args.chunks)]
    kernel = gpupool.elementwise("float32 x, float32 a, float32 b", "float32 y",
                                 fma_body(args.fmas), f"w5_profile_{args.fmas}")
    reference = cp.empty_like(data)
    cupy_kernel = cp.ElementwiseKernel("float32 x, float32 a, float32 b", "float32 y",
                                       fma_body(args.fmas), f"compare_fma_{args.fmas}")

    def one_launch() -> None:
        cupy_kernel(data, A, B, reference)
        cp.cuda.runtime.deviceSynchronize()

    with gpupool.Executor(threads_per_gpu=args.lanes or "auto") as ex:
        got = list(ex.map(kernel, chunks, A, B))
        one_launch()
        for i in (0, args.chunks // 2, args.chunks - 1):
            if not bool(cp.allclose(got[i], reference[i * args.size:(i + 1) * args.size],
                                    rtol=1e-5, atol=1e-6)):
                raise SystemExit(f"FAIL: chunk {i} differs from CuPy's kernel")
        del got
        # The same map into outputs made beforehand (out=): no view made per call.
        given = cp.full_like(data, float("nan"))
        given_chunks = [given[i * args.size:(i + 1) * args.size] for i in range(args.chunks)]
        got = list(ex.map(kernel, chunks, A, B, out=given_chunks))
        cp.cuda.runtime.deviceSynchronize()
        if any(g is not o for g, o in zip(got, given_chunks)) or not bool(
                cp.allclose(given, reference, rtol=1e-5, atol=1e-6)):
            raise SystemExit("FAIL: the map into given outputs differs from CuPy's kernel")
        del got
        # The same map into one array end to end (map_into, where this package has it): no
        # object per call at all.
        one = cp.full_like(data, float("nan"))
        has_into = hasattr(ex, "map_into")
        if has_into:
            ex.map_into(kernel, chunks, A, B, out=one)
            if not bool(cp.allclose(one, reference, rtol=1e-5, atol=1e-6)):
                raise SystemExit("FAIL: the map into one array differs from CuPy's kernel")
        whole_out = ex.submit(kernel, data, A, B).result()
        cp.cuda.runtime.deviceSynchronize()
        if not bool(cp.allclose(whole_out, reference, rtol=1e-5, atol=1e-6)):
            raise SystemExit("FAIL: gpupool's one launch differs from CuPy's kernel")
        del whole_out
        launch, calls, waits, wholes, gc_off, into, own = [], [], [], [], [], [], []
        own_into: List[float] = []
        into_one: List[float] = []
        call_cpu: List[float] = []
        switches: List[int] = []
        for _ in range(args.repeat):
            # gpupool's own kernel in one launch over all the data: the GPU's floor for the map.
            t0 = time.perf_counter()
            whole_out = ex.submit(kernel, data, A, B).result()
            cp.cuda.runtime.deviceSynchronize()
            own.append(time.perf_counter() - t0)
            del whole_out
            if has_into:
                # The same one launch into an array made beforehand: what the output's
                # allocation and its hand-back cost of the launch above.
                t0 = time.perf_counter()
                ex.map_into(kernel, [data], A, B, out=one)
                cp.cuda.runtime.deviceSynchronize()
                own_into.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = list(ex.map(kernel, chunks, A, B, out=given_chunks))
            cp.cuda.runtime.deviceSynchronize()
            into.append(time.perf_counter() - t0)
            del got
            if has_into:
                t0 = time.perf_counter()
                ex.map_into(kernel, chunks, A, B, out=one)
                cp.cuda.runtime.deviceSynchronize()
                into_one.append(time.perf_counter() - t0)
            # The same map with Python's cyclic collector off: how much of the spread between
            # rounds its collections make (2,000 views and their lists are young objects).
            gc.disable()
            try:
                t0 = time.perf_counter()
                got = list(ex.map(kernel, chunks, A, B))
                cp.cuda.runtime.deviceSynchronize()
                gc_off.append(time.perf_counter() - t0)
            finally:
                gc.enable()
            del got
            t0 = time.perf_counter()
            one_launch()
            launch.append(time.perf_counter() - t0)
            switched = involuntary_switches()
            cpu0 = time.thread_time()
            t0 = time.perf_counter()
            results = ex.map(kernel, chunks, A, B)
            t1 = time.perf_counter()
            call_cpu.append(time.thread_time() - cpu0)
            switches.append(involuntary_switches() - switched)
            got = list(results)
            cp.cuda.runtime.deviceSynchronize()
            t2 = time.perf_counter()
            calls.append(t1 - t0)
            waits.append(t2 - t1)
            wholes.append(t2 - t0)
            del got, results
        ms = lambda v: 1e3 * statistics.median(v)  # noqa: E731
        print(f"W5 from Python: {args.chunks} x {args.size} float32, {args.fmas} FMAs, "
              f"{ex.threads_per_gpu} lanes per GPU, {len(ex.devices)} GPU(s); medians of "
              f"{args.repeat}, results checked")
        print(f"  CuPy one launch        {ms(launch):8.2f} ms")
        print(f"  gpupool one launch     {ms(own):8.2f} ms  ({ms(own) / ms(launch):.2f}x CuPy's)")
        if has_into:
            print(f"    into one array       {ms(own_into):8.2f} ms  "
                  f"({ms(own_into) / ms(launch):.2f}x CuPy's; map_into of one call)")
        print(f"  gpupool map, whole     {ms(wholes):8.2f} ms  ({ms(wholes) / ms(launch):.2f}x one launch)")
        print(f"    the map call         {ms(calls):8.2f} ms  ({1e3 * ms(calls) / args.chunks:.1f} us per array)")
        switched_out = (f"{statistics.median(switches):g}" if RUSAGE_THREAD is not None
                        else "n/a")
        print(f"    of it on a CPU       {ms(call_cpu):8.2f} ms  (the calling thread; switched out "
              f"{switched_out} times a call, median)")
        print(f"    results and wait     {ms(waits):8.2f} ms")
        print(f"  the collector off      {ms(gc_off):8.2f} ms  ({ms(gc_off) / ms(launch):.2f}x one launch)")
        print(f"  into given outputs     {ms(into):8.2f} ms  ({ms(into) / ms(launch):.2f}x one launch)")
        if has_into:
            print(f"  into one array         {ms(into_one):8.2f} ms  "
                  f"({ms(into_one) / ms(launch):.2f}x one launch; map_into)")
        print("  every round (ms): whole " + " ".join(f"{1e3 * t:.2f}" for t in wholes)
              + "; collector off " + " ".join(f"{1e3 * t:.2f}" for t in gc_off)
              + "; into given outputs " + " ".join(f"{1e3 * t:.2f}" for t in into))
        print("  every round, the map call (ms wall / on a CPU / switched out): "
              + " ".join(f"{1e3 * c:.2f}/{1e3 * u:.2f}/"
                         f"{n if RUSAGE_THREAD is not None else 'n/a'}"
                         for c, u, n in zip(calls, call_cpu, switches)))
        if args.trace:
            traced_round(ex, kernel, chunks, cp, reference, args.table)
            if has_into:
                traced_round(ex, kernel, chunks, cp, reference, args.table, into=one)
        profile = cProfile.Profile()
        profile.enable()
        got = list(ex.map(kernel, chunks, A, B))
        cp.cuda.runtime.deviceSynchronize()
        profile.disable()
        del got
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(20)
        print(text.getvalue())
    # What CuPy itself costs per array, the floor of any per-array path: reading what a kernel
    # needs of an input, and making one output view into a flat buffer.
    # Three ways to make the output views, each checked to address the same memory.
    flat = cp.empty(args.chunks * args.size, dtype=cp.float32)
    itemsize = flat.dtype.itemsize
    shape = (args.size,)
    rows = flat.reshape(args.chunks, args.size)
    ways = {
        "a slice": lambda i: flat[i * args.size:(i + 1) * args.size],
        "ndarray(memptr=data + offset)": lambda i: cp.ndarray(
            shape, flat.dtype, flat.data + i * args.size * itemsize),
        "the memory pointer alone": lambda i: flat.data + i * args.size * itemsize,
        "a row of a 2-D reshape": lambda i: rows[i],
    }
    ends = [(i + 1) * args.size for i in range(args.chunks)]
    split = cp.array_split(flat, ends)  # what gpupool does: all the views in one call
    if any(split[i].data.ptr != flat.data.ptr + i * args.size * itemsize
           or split[i].shape != shape for i in (0, args.chunks - 1)):
        raise SystemExit("FAIL: a view made by array_split is not where it should be")
    del split
    for name in ("a slice", "ndarray(memptr=data + offset)", "a row of a 2-D reshape"):
        for i in (0, args.chunks - 1):
            view = ways[name](i)
            if view.data.ptr != flat.data.ptr + i * args.size * itemsize or view.shape != shape:
                raise SystemExit(f"FAIL: view {i} made by {name} is not where it should be")
    reads: list[float] = []
    split_name = "array_split, all in one call"
    iterated = "list() of a 2-D reshape"
    timings: dict[str, list[float]] = {split_name: [], iterated: [],
                                       **{name: [] for name in ways}}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for c in chunks:
            c.dtype, c._c_contiguous, c.data.ptr, c.data.device_id, c.size, c.shape
        reads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        made = cp.array_split(flat, ends)
        timings[split_name].append(time.perf_counter() - t0)
        del made
        t0 = time.perf_counter()
        made = list(flat.reshape(args.chunks, args.size))
        timings[iterated].append(time.perf_counter() - t0)
        del made
        for name, make in ways.items():
            t0 = time.perf_counter()
            made = [make(i) for i in range(args.chunks)]
            timings[name].append(time.perf_counter() - t0)
            del made
    per = lambda v: 1e6 * statistics.median(v) / args.chunks  # noqa: E731
    print(f"CuPy per array: reading an input's attributes {per(reads):.2f} us")
    for name, values in timings.items():
        print(f"CuPy per output view, {name}: {per(values):.2f} us")


if __name__ == "__main__":
    main()
