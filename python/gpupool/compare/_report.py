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


def copy_rate(limits: Dict[str, float], gpus: int) -> Optional[Tuple[float, str]]:
    """(GB/s of input, what it is): the fastest any program can move data to the GPUs and back,
    both directions at once on every GPU the run uses (the copy engines, measured with pinned
    memory so that no host copy slows them). Without GPU copies measured (the CPU backend), the
    host memcpy rate: there every program reads its input and writes its output in host
    memory."""
    if limits.get("all_both_gb_s"):
        return limits["all_both_gb_s"], ("pinned copies both ways at once on every GPU: the "
                                         "copy engines")
    if limits.get("both_gb_s"):
        if gpus > 1:  # measured on GPU 0 alone (through CuPy): each GPU at most as fast
            return limits["both_gb_s"] * gpus, (f"GPU 0's pinned copies both ways at once x "
                                                f"{gpus} GPUs: the copy engines")
        return limits["both_gb_s"], "pinned copies both ways at once: the copy engines"
    if limits.get("host_memcpy_gb_s"):
        return limits["host_memcpy_gb_s"], ("host memcpy, best thread count (no GPU copies "
                                            "measured)")
    return None


def workload_limit(workload: str, limits: Dict[str, float], results: Sequence[Result],
                   size: Dict[str, Any], gpus: int) -> Tuple[Optional[float], str]:
    """(value, what it is) or (None, why none). The value bounds every program doing the
    workload on this machine (docs/compare.md says why for each). It is in the workload's unit,
    except W6's: GB/s of input on every GPU, since W6's rows are speed-ups and what the copy
    engines bound is their rate on every GPU."""
    copies = copy_rate(limits, gpus)
    if workload in ("W2", "W3", "W8@W2") and copies:
        return copies[0], copies[1]
    if workload == "W1" and copies:
        chunks, elements = size["W1"]
        return (chunks * elements * 8 / 1e9 / copies[0] * 1e3,
                f"W1's bytes at {copies[0]:.1f} GB/s, {copies[1]}")
    if workload in ("W4", "W8@W4") and copies:
        task_bytes = size["W4"][1] * 8
        return (copies[0] * 1e9 / task_bytes,
                f"every task's {task_bytes:,} bytes at {copies[0]:.1f} GB/s, {copies[1]}")
    if workload == "W5":
        one = best([r for r in results if r.workload == "W5"], (LIMIT,))
        if one is not None:
            return one.figure, f"{one.variant}: the same arithmetic with no per-array cost"
    if workload == "W6" and limits.get("all_both_gb_s"):
        return limits["all_both_gb_s"], ("pinned copies both ways at once on every GPU: the "
                                         "copy engines; of limit: each row's rate on every GPU")
    if workload == "W6c" and gpus >= 2:
        return float(gpus), f"{gpus} GPUs, the work shared perfectly"
    return None, "not measured in this run"


def _every_gpu_rate(r: Result) -> Optional[float]:
    """A W6 row's GB/s of input on every GPU (Python rows keep it in extra, the C++ programs'
    in extra["per_device"])."""
    rate = r.extra.get("gb_per_s_every_gpu")
    if rate is None and isinstance(r.extra.get("per_device"), dict):
        rate = r.extra["per_device"].get("gb_per_s_every_gpu")
    return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None


def _is_floor(r: Result) -> bool:
    """A floor does none of the work (a no-op through a pool): it has no share of the limit."""
    return r.kind == LIMIT and "(floor)" in r.variant


def over_limit_note(share: float, what: str, variant: str) -> str:
    """What a share above 100% means: no program doing the work can pass the limit, so it was
    measured low in this run (or the row moved no data through a GPU: NumPy on the CPU)."""
    note = (f"{100 * share:.0f}% of the limit ({what}), which bounds every program doing this "
            "work: the limit was measured low in this run, and every share of it here is "
            "overstated")
    if variant.startswith("NumPy") and "copy engines" in what:
        note += "; or, as this row runs on the CPU alone, it does not pass through the copy engines"
    return note


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
        notes: List[str] = []
        for r in rows:
            entry: Dict[str, Any] = {"variant": r.variant, "kind": r.kind, "status": r.status,
                                     "unit": r.unit, "figure": r.figure, "reason": r.reason}
            if r.status == OK and r.figure and workload != "limits":
                entry["x_motivating"] = faster(r.unit, r.figure, anchor.figure) if anchor \
                    else None
                entry["x_best_alternative"] = faster(r.unit, r.figure, alternative.figure) \
                    if alternative else None
                share: Optional[float] = None
                if limit and not _is_floor(r):
                    if workload == "W6":
                        rate = _every_gpu_rate(r)
                        share = rate / limit if rate else None
                    else:
                        share = faster(r.unit, r.figure, limit)
                entry["of_limit"] = share
                if share is not None and share > 1.0:
                    entry["note"] = over_limit_note(share, limit_what, r.variant)
                    notes.append(f"{r.variant}: {entry['note']}")
            table.append(entry)
        tables[workload] = {
            "motivating": anchor.variant if anchor else None,
            "best_alternative": alternative.variant if alternative else None,
            "limit": limit, "limit_unit": "GB/s" if workload == "W6" else None,
            "limit_is": limit_what, "notes": notes, "rows": table}
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
            limit_unit = t.get("limit_unit") or unit
            limit = f"{_num(t['limit'])} {limit_unit} ({t['limit_is']})" if t["limit"] else \
                t["limit_is"]
            lines.append(f"  limit: {limit}")
        lines.append(f"  {'variant':<66} {'figure':>16} {'x motiv.':>9} {'x best alt':>10} "
                     f"{'of limit':>8}")
        for r in t["rows"]:
            name = r["variant"] if len(r["variant"]) <= 66 else r["variant"][:63] + "..."
            if r["status"] != OK:
                lines.append(f"  {name:<66} {r['status'].upper()}: {r['reason']}")
                continue
            share = _num(r.get("of_limit"), "%") + ("!" if r.get("note") else "")
            lines.append(f"  {name:<66} {_num(r['figure']) + ' ' + r['unit']:>16} "
                         f"{_num(r.get('x_motivating'), 'x'):>9} "
                         f"{_num(r.get('x_best_alternative'), 'x'):>10} "
                         f"{share:>8}")
        for note in t.get("notes", []):
            lines.append(f"  ! above the limit: {note}")
    lines.append("")
    lines.append("x motiv.: times faster than the motivating program (CuPy + ThreadPoolExecutor, "
                 "first row marked so) in this run; x best alt: than the best non-gpupool "
                 "alternative; of limit: share of the machine's limit measured in this run, which "
                 "bounds any program (!: above it, so the limit was measured low).")
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


#: Characters per line of a variant's name in the plot (longer names take more lines).
LABEL_WIDTH = 46

COLOURS = {ANCHOR: "#d62728", ALTERNATIVE: "#7f7f7f", GPUPOOL: "#1f77b4", LIMIT: "#2ca02c"}


def plot(tables: Dict[str, Any], path: str, title: str) -> None:
    """Draws ``figure(tables, title)`` into ``path`` (PNG, SVG or PDF by the extension)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure(tables, title)
    fig.savefig(path)
    plt.close(fig)


def figure(tables: Dict[str, Any], title: str) -> Any:
    """One matplotlib figure: per workload, each measured variant's figure as a bar coloured by
    kind, its limit as a dashed line. Variant names are wrapped onto as many lines as they need,
    never cut, and the layout makes room for them inside the figure."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    shown = {w: t for w, t in tables.items() if w != "limits" and
             any(r["status"] == OK and r.get("figure") for r in t["rows"])}
    if not shown:
        shown = {w: t for w, t in tables.items() if any(r["status"] == OK for r in t["rows"])}
    labels = {w: ["\n".join(textwrap.wrap(r["variant"], LABEL_WIDTH)) or " "
                  for r in t["rows"] if r["status"] == OK and r.get("figure")]
              for w, t in shown.items()}
    columns = 2 if len(shown) > 1 else 1
    names = list(shown)
    grid_rows = [names[i:i + columns] for i in range(0, len(names), columns)] or [[]]
    # Each bar's band holds its label's lines; a row of plots is as tall as its tallest.
    heights = [max([0.9 + 0.13 * sum(label.count("\n") + 1 for label in labels[w]) + 0.06 *
                    len(labels[w]) for w in row] or [2.0]) for row in grid_rows]
    fig, axes = plt.subplots(len(grid_rows), columns, squeeze=False,
                             figsize=(16, sum(heights) + 1.2), dpi=110,
                             gridspec_kw={"height_ratios": heights})
    for ax, (workload, t) in zip(axes.flat, shown.items()):
        measured = [r for r in t["rows"] if r["status"] == OK and r.get("figure")]
        unit = measured[0]["unit"] if measured else ""
        values = [r["figure"] for r in measured]
        ax.barh(range(len(values)), values, color=[COLOURS.get(r["kind"], "#999")
                                                   for r in measured])
        ax.set_yticks(range(len(values)), labels[workload], fontsize=7)
        ax.invert_yaxis()
        if t.get("limit") and workload != "limits" and not t.get("limit_unit"):
            ax.axvline(t["limit"], color=COLOURS[LIMIT], linestyle="--", linewidth=1)
        better = "higher is better" if UNITS.get(unit, True) else "lower is better"
        over = "; some bars pass the limit, measured low (see the table)" if t.get("notes") \
            else ""
        ax.set_title(f"{workload} ({unit}, {better}{over})", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    fig.legend(handles, ["motivating program", "alternative", "gpupool", "limit / floor"],
               loc="upper right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.9, 0.97))
    return fig
