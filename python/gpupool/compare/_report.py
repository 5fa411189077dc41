"""The printed table, the JSON file and the summary plot of a comparison run."""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._harness import ALTERNATIVE, ANCHOR, GPUPOOL, LIMIT, OK, UNITS, Result, best, faster

if TYPE_CHECKING:
    from ._workloads import Comparison


def workload_limit(workload: str, limits: Dict[str, float], results: Sequence[Result],
                   size: Dict[str, Any], gpus: int) -> Tuple[Optional[float], str]:
    """(value in the workload's unit, what it is) or (None, why none)."""
    def rate(*keys: str) -> Optional[Tuple[float, str]]:
        """The lowest of the limits measured (non-zero) among ``keys``, with its key."""
        found = [(limits[k], k) for k in keys if limits.get(k)]
        return min(found) if found else None

    pageable = rate("both_gb_s", "host_memcpy_gb_s")
    name = {"both_gb_s": "pinned copies both ways at once, one GPU",
            "host_memcpy_gb_s": "host memcpy, best thread count"}
    if workload in ("W2", "W8@W2") and pageable:
        return pageable[0], name[pageable[1]]
    if workload == "W1" and pageable:
        chunks, elements = size["W1"]
        return chunks * elements * 8 / 1e9 / pageable[0] * 1e3, \
            f"W1's bytes at {pageable[0]:.1f} GB/s ({name[pageable[1]]})"
    if workload == "W3" and limits.get("both_gb_s"):
        return limits["both_gb_s"], name["both_gb_s"]
    if workload in ("W4", "W8@W4") and limits.get("launch_us"):
        return 1e6 / limits["launch_us"], "one kernel launch per task (measured launch latency)"
    if workload == "W5":
        one = best([r for r in results if r.workload == "W5"], (LIMIT,))
        if one is not None:
            return one.figure, one.variant
    if workload == "W6" and limits.get("all_both_gb_s") and limits.get("both_gb_s"):
        return limits["all_both_gb_s"] / limits["both_gb_s"], \
            "copies both ways on every GPU at once vs one GPU"
    if workload == "W6c" and gpus >= 2:
        return float(gpus), f"{gpus} GPUs, perfectly shared"
    return None, "not measured in this run"


def summarise(comparison: Comparison) -> Dict[str, Any]:
    """Per workload: its rows with the ratios the table shows."""
    tables: Dict[str, Any] = {}
    order: List[str] = []
    for r in comparison.results:
        if r.workload not in order:
            order.append(r.workload)
    for workload in order:
        rows = [r for r in comparison.results if r.workload == workload]
        anchor = next((r for r in rows if r.kind == ANCHOR and r.status == OK), None)
        alternative = best(rows, (ALTERNATIVE,))
        limit, limit_what = workload_limit(workload, comparison.limits, comparison.results,
                                           comparison.size, comparison.gpus)
        table = []
        for r in rows:
            entry: Dict[str, Any] = {"variant": r.variant, "kind": r.kind, "status": r.status,
                                     "unit": r.unit, "figure": r.figure, "reason": r.reason}
            if r.status == OK and r.figure and workload != "limits":
                entry["x_motivating"] = faster(r.unit, r.figure, anchor.figure) if anchor \
                    else None
                entry["x_best_alternative"] = faster(r.unit, r.figure, alternative.figure) \
                    if alternative else None
                entry["of_limit"] = (faster(r.unit, r.figure, limit) if limit else None)
            table.append(entry)
        tables[workload] = {
            "motivating": anchor.variant if anchor else None,
            "best_alternative": alternative.variant if alternative else None,
            "limit": limit, "limit_is": limit_what, "rows": table}
    return tables


def _num(x: Optional[float], unit: str = "") -> str:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "-"
    if unit == "%":
        return f"{100 * x:.0f}%"
    if unit == "x":
        return f"{x:.2f}x"
    return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"


def table_text(tables: Dict[str, Any], describe: Callable[[str], str]) -> str:
    lines = []
    for workload, t in tables.items():
        unit = next((r["unit"] for r in t["rows"] if r["unit"]), "")
        better = "" if not unit else (" higher is better" if UNITS.get(unit, True)
                                      else " lower is better")
        try:
            title = describe(workload)
        except KeyError:
            title = ""
        lines.append("")
        lines.append(f"{workload}: {title}  [{unit};{better}]")
        if workload != "limits":
            limit = f"{_num(t['limit'])} {unit} ({t['limit_is']})" if t["limit"] else \
                t["limit_is"]
            lines.append(f"  limit: {limit}")
        lines.append(f"  {'variant':<66} {'figure':>16} {'x motiv.':>9} {'x best alt':>10} "
                     f"{'of limit':>8}")
        for r in t["rows"]:
            name = r["variant"] if len(r["variant"]) <= 66 else r["variant"][:63] + "..."
            if r["status"] != OK:
                lines.append(f"  {name:<66} {r['status'].upper()}: {r['reason']}")
                continue
            lines.append(f"  {name:<66} {_num(r['figure']) + ' ' + r['unit']:>16} "
                         f"{_num(r.get('x_motivating'), 'x'):>9} "
                         f"{_num(r.get('x_best_alternative'), 'x'):>10} "
                         f"{_num(r.get('of_limit'), '%'):>8}")
    lines.append("")
    lines.append("x motiv.: times faster than the motivating program (CuPy + ThreadPoolExecutor, "
                 "first row marked so) in this run; x best alt: than the best non-gpupool "
                 "alternative; of limit: share of the machine's limit measured in this run.")
    return "\n".join(lines)


def machine() -> Dict[str, Any]:
    info: Dict[str, Any] = {"platform": platform.platform(), "python": sys.version.split()[0],
            "numpy": np.__version__, "cpu": _cpu_model(), "cpu_count": os.cpu_count()}
    try:
        import gpupool

        info["gpupool"] = gpupool.__version__
        usable, devices, reason = gpupool.cuda_available()
        info["cuda_usable"], info["cuda_devices"], info["cuda_reason"] = usable, devices, reason
    except Exception as error:  # pragma: no cover - the package imports or nothing runs
        info["gpupool"] = f"unavailable: {error}"
    for module in ("cupy", "torch", "matplotlib"):
        try:
            info[module] = __import__(module).__version__
        except Exception as error:
            info[module] = f"not available ({type(error).__name__})"
    try:
        # Optional, and without annotations mypy can use where absent or untyped.
        import torch  # type: ignore[import-not-found, import-untyped, unused-ignore]

        info["torch_cuda"] = torch.version.cuda
    except Exception:
        pass
    try:
        import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]

        runtime = cupy.cuda.runtime
        info["cuda_driver"] = runtime.driverGetVersion()
        info["cuda_runtime"] = runtime.runtimeGetVersion()
        info["gpus"] = [runtime.getDeviceProperties(i)["name"].decode(errors="replace")
                        for i in range(runtime.getDeviceCount())]
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        out = _run([smi, "--query-gpu=name,driver_version,memory.total,pcie.link.gen.current,"
                    "pcie.link.width.current", "--format=csv,noheader"])
        if out:
            info["nvidia_smi"] = out.splitlines()
    info["git_commit"] = _git_commit()
    return info


def _run(argv: List[str]) -> Optional[str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _git_commit() -> Optional[str]:
    git = shutil.which("git")
    if not git:
        return None
    for root in [Path.cwd()] + list(Path(__file__).resolve().parents)[:5]:
        if (root / ".git").exists():
            commit = _run([git, "-C", str(root), "rev-parse", "HEAD"])
            # Tracked files that differ from that commit: the figures are of other code.
            changed = _run([git, "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
            return f"{commit}+modified" if commit and changed else commit
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_json(path: str, document: Dict[str, Any]) -> None:
    def clean(x: object) -> object:
        if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, (np.integer, np.floating)):
            return x.item()
        return x

    Path(path).write_text(json.dumps(clean(document), indent=1))


COLOURS = {ANCHOR: "#d62728", ALTERNATIVE: "#7f7f7f", GPUPOOL: "#1f77b4", LIMIT: "#2ca02c"}


def plot(tables: Dict[str, Any], path: str, title: str) -> None:
    """One figure: per workload, each measured variant's figure relative to the motivating
    program (or, where there is none, to the best alternative), limits drawn as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    shown = {w: t for w, t in tables.items() if w != "limits" and
             any(r["status"] == OK and r.get("figure") for r in t["rows"])}
    if not shown:
        shown = {w: t for w, t in tables.items() if any(r["status"] == OK for r in t["rows"])}
    count = max(1, len(shown))
    columns = 2 if count > 1 else 1
    rows = (count + columns - 1) // columns
    heights = [max(2.0, 0.28 * len(t["rows"]) + 0.8) for t in shown.values()] or [2.0]
    fig, axes = plt.subplots(rows, columns, figsize=(16, sum(heights) / columns + 1.5),
                             squeeze=False)
    for ax, (workload, t) in zip(axes.flat, shown.items()):
        measured = [r for r in t["rows"] if r["status"] == OK and r.get("figure")]
        unit = measured[0]["unit"] if measured else ""
        names = [r["variant"][:55] for r in measured]
        values = [r["figure"] for r in measured]
        ax.barh(range(len(values)), values, color=[COLOURS.get(r["kind"], "#999")
                                                   for r in measured])
        ax.set_yticks(range(len(values)), names, fontsize=7)
        ax.invert_yaxis()
        if t.get("limit") and workload != "limits":
            ax.axvline(t["limit"], color=COLOURS[LIMIT], linestyle="--", linewidth=1)
        better = "higher is better" if UNITS.get(unit, True) else "lower is better"
        ax.set_title(f"{workload} ({unit}, {better})", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    fig.legend(handles, ["motivating program", "alternative", "gpupool", "limit / floor"],
               loc="upper right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.92, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
