"""How the way lanes wait for the GPU (GPUPOOL_EVENT_WAIT) changes small and large work.

Each round runs, under every wait in turn (rounds interleave the waits, so that a drift of the
machine shows up in every column rather than in one):

- W1 from Python (`Executor.map` of the built-in square), median ms;
- W1 and W4's shape from C++ (`gpupool demo`: 5 x 1M float64; 20,000 x 1,024), median ms;
- W2, W3 and W4 from C++ (`gpupool_bench_compare`: 200 x 1M float64 pageable, and pinned; 20,000
  x 1,024), median GB/s or tasks/s of the executor's defaults and of 16 lanes x 2 MiB;
- one task at a time from Python, and a submit loop (`bench/python_task_cost.py`), tasks/s.

Every program checks its own results (the demo counts wrong elements, the benchmark compares
with the CPU, python_task_cost checks each result) and a failed run stops this script. Prints
one table: per measurement, the median over rounds for each wait and its ratio to the first.

    python3 bench/event_wait.py --bin build-gpu [--waits block,spin] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

HERE = Path(__file__).resolve().parent
Row = Tuple[str, str, float]  # (measurement, unit, value)


def run(cmd: Sequence[str], wait: str, timeout: float) -> str:
    env = dict(os.environ, GPUPOOL_EVENT_WAIT=wait, GPUPOOL_QUIET="1")
    done = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode != 0:
        sys.exit(f"event_wait: {' '.join(cmd)} (GPUPOOL_EVENT_WAIT={wait}) failed "
                 f"({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def demo(bin_dir: Path, name: str, args: Sequence[str]) -> Callable[[str], List[Row]]:
    def measure(wait: str) -> List[Row]:
        out = json.loads(run([str(bin_dir / "tools" / "gpupool"), "demo", "--json", *args], wait,
                             120))
        if out["wrong"] != 0:
            sys.exit(f"event_wait: {name} gave {out['wrong']} wrong elements")
        return [(f"{name} (demo, {out['lanes_per_device']} lanes)", "ms", out["median_ms"])]
    return measure


def harness(bin_dir: Path, workload: str, shape: Sequence[str] = ()) -> Callable[[str], List[Row]]:
    """`gpupool compare`'s C++ program on one workload: the defaults and 16 lanes x 2 MiB."""
    def measure(wait: str) -> List[Row]:
        rows: List[Row] = []
        out = run([str(bin_dir / "bench" / "gpupool_bench_compare"), "--workload", workload,
                   *shape, "--repeat", "5", "--lanes-list", "16", "--chunk-list", "2097152"],
                  wait, 300)
        for line in out.splitlines():
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r["status"] != "ok":
                sys.exit(f"event_wait: {workload} {r['variant']}: {r['status']}")
            seconds = statistics.median(r["repeats_s"])
            value = seconds * 1e3 if r["unit"] == "ms" else r["amount"] / seconds
            rows.append((f"{workload} {r['variant']}", r["unit"], value))
        if not rows:
            sys.exit(f"event_wait: {workload} printed no results")
        return rows
    return measure


# W1 through the Python API: the motivating program's shape, the built-in square, checked.
W1_PYTHON = """
import statistics, sys, time
import numpy as np
import gpupool
chunks = [np.random.default_rng(i).random(1_000_000) for i in range(5)]
with gpupool.Executor() as ex:
    times = []
    for _ in range(31):
        t0 = time.perf_counter()
        out = list(ex.map(gpupool.kernels.square, chunks))
        times.append(time.perf_counter() - t0)
        if not all(np.array_equal(o, c * c) for o, c in zip(out, chunks)):
            sys.exit("W1 from Python: wrong results")
    print(statistics.median(times[1:]) * 1e3, ex.threads_per_gpu)
"""


def w1_python(wait: str) -> List[Row]:
    ms, lanes = run([sys.executable, "-c", W1_PYTHON], wait, 120).split()
    return [(f"W1 (Python map, {lanes} lanes)", "ms", float(ms))]


RATE = re.compile(r"^(?P<name>.*?)\s{2,}(?P<rate>[\d,]+) tasks/s")


def python_tasks(wait: str) -> List[Row]:
    out = run([sys.executable, str(HERE / "python_task_cost.py"), "--repeat", "3", "--only",
               "one at a time|square submit loop, default lanes"], wait, 300)
    rows: List[Row] = []
    for line in out.splitlines():
        m = RATE.match(line)
        if m:
            rows.append((m["name"], "tasks/s", float(m["rate"].replace(",", ""))))
    if not rows:
        sys.exit("event_wait: python_task_cost printed no rates")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, default=Path("build-gpu"),
                        help="the build folder holding tools/gpupool and bench/")
    parser.add_argument("--waits", default="block,spin",
                        help="GPUPOOL_EVENT_WAIT values, the first being the reference")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="W1,W1py,W4,W4c,W2,W3,python",
                        help="which measurements: W1, W1py (W1 from Python), W4, W4c (W4 in the "
                             "harness's program), W2, W3, python")
    a = parser.parse_args()
    waits = [w for w in a.waits.split(",") if w]
    unknown = [w for w in waits if w not in ("spin", "block")]
    if unknown or not waits:
        parser.error(f"--waits takes 'spin' and 'block', not {unknown or a.waits!r}")
    if a.rounds < 1:
        parser.error("--rounds must be at least 1")
    available: Dict[str, Callable[[str], List[Row]]] = {
        "W1": demo(a.bin, "W1", ["--repeat", "30"]),
        "W1py": w1_python,
        "W4": demo(a.bin, "W4", ["--chunks", "20000", "--size", "1024", "--repeat", "10"]),
        "W2": harness(a.bin, "W2"),
        "W3": harness(a.bin, "W3"),
        "W4c": harness(a.bin, "W4", ["--chunks", "20000", "--size", "1024"]),
        "python": python_tasks,
    }
    chosen = [available[k] for k in a.only.split(",") if k]
    values: Dict[Tuple[str, str], Dict[str, List[float]]] = {}
    for round_ in range(1, a.rounds + 1):
        for wait in waits:
            for measure in chosen:
                for name, unit, value in measure(wait):
                    values.setdefault((name, unit), {}).setdefault(wait, []).append(value)
                    print(f"round {round_} {wait:>8}  {name}: {value:,.3f} {unit}", flush=True)
    print()
    width = max(len(name) for name, _ in values)
    print(f"{'median over rounds':<{width}}  " + "  ".join(f"{w:>18}" for w in waits))
    for (name, unit), by_wait in values.items():
        medians = {w: statistics.median(v) for w, v in by_wait.items()}
        reference = medians[waits[0]]
        cells = [f"{medians[waits[0]]:>10,.2f} {unit:>7}"]
        cells += [f"{medians[w]:>10,.2f} {medians[w] / reference:>6.2f}x" for w in waits[1:]]
        print(f"{name:<{width}}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
