"""The two C++ programs built with the project: gpupool from C++ (``gpupool_bench_compare``) and a
plain hand-written CUDA pipeline with no gpupool (``gpupool_baseline_pipeline``, also the
machine's copy limits and launch latency). Each checks its own results against the CPU (the same
arithmetic NumPy does) and prints one JSON object per line; a line whose results were wrong has
``"status": "FAILED"`` and no times."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ._harness import FAILED, OK, SKIPPED, Result, figure_from_seconds

GPUPOOL_CPP = "gpupool_bench_compare"
BASELINE = "gpupool_baseline_pipeline"
_KINDS = {"anchor", "alternative", "gpupool", "limit"}


def find_program(name: str, bench_dir: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """(path, None) for the program, or (None, why not). Looks in ``bench_dir`` (--bench-dir),
    then $GPUPOOL_BENCH_DIR, then the build trees of a source checkout (build-gpu/bench,
    build/bench) under the current directory and above this file."""
    places = []
    for given in (bench_dir, os.environ.get("GPUPOOL_BENCH_DIR")):
        if given:
            places.append(Path(given))
    if places:
        roots = []
    else:
        roots = [Path.cwd()] + list(Path(__file__).resolve().parents)[:5]
    for root in roots:
        places += [root / "build-gpu" / "bench", root / "build" / "bench"]
    for place in places:
        candidate = place / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate), None
    hint = " (built only with CUDA)" if name == BASELINE else ""
    return None, (f"{name}{hint} not found: build the project with CMake and pass --bench-dir "
                  f"or set GPUPOOL_BENCH_DIR")


def run_program(path: str, arguments: List[str],
                timeout: float) -> Tuple[List[Any], Optional[str]]:
    """Runs the program (no shell); returns (list of JSON objects, error text or None)."""
    try:
        done = subprocess.run([path, *arguments], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return [], f"{Path(path).name} ran past {timeout:.0f} s"
    except OSError as error:
        return [], f"{Path(path).name} could not start: {error}"
    rows = []
    for line in done.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        return rows, f"{Path(path).name} exited with {done.returncode}: {tail[:200]}"
    return rows, None


def to_result(row: object, prefix: str) -> Optional[Result]:
    """A Result from one JSON line of a program; None for lines that are not measurements."""
    if not isinstance(row, dict) or "workload" not in row or "variant" not in row:
        return None
    kind = row.get("kind", "gpupool")
    unit = str(row.get("unit", "ms"))
    status = row.get("status", OK)
    result = Result(str(row["workload"]), f"{prefix}{row['variant']}",
                    kind if kind in _KINDS else "alternative",
                    status if status in (OK, FAILED, SKIPPED) else FAILED, unit,
                    reason=str(row.get("reason", ""))[:300],
                    settings=row.get("settings", {}) if isinstance(row.get("settings"),
                                                                   dict) else {})
    if result.status != OK:
        return result
    times = [float(t) for t in row.get("repeats_s", []) if isinstance(t, (int, float)) and t > 0]
    if "value" in row:  # measured directly in its unit (a limit in GB/s or us, a speed-up)
        result.figure = float(row["value"])
        result.extra["direct"] = True
    elif times:
        result.figure = figure_from_seconds(unit, statistics.median(times),
                                            float(row.get("amount", 0.0)))
    else:
        result.status, result.reason = FAILED, "the program reported no times"
        return result
    result.repeats_s = [float(t) for t in row.get("repeats_s", [])]
    result.extra.update({k: v for k, v in row.items() if k in ("devices", "per_device")})
    return result
