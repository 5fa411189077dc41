"""Pictures of what the command-line tool measured, drawn with matplotlib (.png, .svg, .pdf):

    python -m gpupool.plot bench.json out.png              # `gpupool bench --json`: GB/s per
                                                           # lane count against chunk size
    python -m gpupool.plot timeline records.json out.png   # `gpupool demo --timeline t.json`

In Jupyter, ``gpupool.plot.BenchResult.load("bench.json")`` shows itself as its picture.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Union

from ._figure import Target, new_figure, save, to_bytes
from ._timeline import draw_timeline, gc_paused

__all__ = ["BenchResult", "draw_bench", "draw_timeline", "main", "plot_bench",
           "records_from_json"]


def bench_figure(results: Dict[str, Any]) -> Any:
    fig = new_figure(9, 5.5)
    ax = fig.subplots()
    for lanes in sorted({p["lanes"] for p in results["points"]}):
        points = sorted((p for p in results["points"] if p["lanes"] == lanes),
                        key=lambda p: p["chunk_bytes"])
        ax.plot([p["chunk_bytes"] for p in points], [p["input_gb_per_s"] for p in points],
                marker="o", label=f"{lanes} lane{'s' if lanes > 1 else ''} per device")
    limit = results["limits_gb_per_s"]["both"]
    ax.axhline(limit, color="black", linestyle="--", label=f"copy limit, both ways ({limit:.1f})")
    ax.set_xscale("log", base=2)
    sizes = sorted({p["chunk_bytes"] for p in results["points"]})
    ax.set_xticks(sizes, [_human(s) for s in sizes], rotation=45)
    ax.set_xlabel("chunk size")
    ax.set_ylabel("GB/s of input")
    ax.set_ylim(bottom=0)
    ax.set_title(f"gpupool bench: {results['kernel']} on {results['dtype']}, "
                 f"{results['backend']} (pageable in, pinned out)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def draw_bench(results: Dict[str, Any], target: Target, format: Optional[str] = None) -> None:
    """Draws `gpupool bench --json`'s results to ``target`` (.png, .svg or .pdf)."""
    save(bench_figure(results), target, format)


def plot_bench(results: Dict[str, Any], path: str) -> None:
    """Kept for earlier callers: draw_bench."""
    draw_bench(results, path)


class BenchResult:
    """What ``gpupool bench --json`` wrote: the copy limits and one point per lane count and
    chunk size. In Jupyter it shows itself as the throughput picture (``_repr_png_``)."""

    def __init__(self, results: Dict[str, Any]) -> None:
        self.results = results

    @classmethod
    def load(cls, path: Union[str, "os.PathLike[str]"]) -> "BenchResult":
        with open(path, encoding="utf-8") as f:
            return cls(json.load(f))

    @property
    def points(self) -> List[Dict[str, Any]]:
        return list(self.results["points"])

    def picture(self, format: str = "png") -> bytes:
        """The throughput curves as ``"png"``, ``"svg"`` or ``"pdf"``."""
        return to_bytes(bench_figure(self.results), format)

    def write(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Draws the picture to ``path`` (.png, .svg or .pdf by the extension)."""
        draw_bench(self.results, path)

    def _repr_png_(self) -> Optional[bytes]:
        return self.picture("png") if self.results.get("points") else None

    def __repr__(self) -> str:
        return (f"<gpupool.plot.BenchResult: {len(self.results.get('points', []))} points, "
                f"{self.results.get('backend', '?')}>")


def records_from_json(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The records of `gpupool demo --timeline t.json` in Trace.records()'s form. (The file's
    ``stages`` is the stage table they were written with: pass it to draw_timeline.)"""
    with gc_paused():
        return [{k: tuple(v) if isinstance(v, list) else v for k, v in r.items()}
                for r in data["records"]]


def _human(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 3 and args[0] == "timeline":
        # A big records file is millions of containers, none in a cycle: the collector would
        # walk them again and again while they load. The drawing takes the spans as lists.
        with open(args[1], encoding="utf-8") as f, gc_paused():
            trace = json.load(f)
        draw_timeline(trace["records"], args[2], backend=trace["backend"],
                      stages=trace.get("stages"))
        return
    if len(args) != 2:
        raise SystemExit("usage: python -m gpupool.plot bench.json out.png|svg|pdf\n"
                         "       python -m gpupool.plot timeline records.json out.png|svg|pdf")
    with open(args[0], encoding="utf-8") as f:
        draw_bench(json.load(f), args[1])


if __name__ == "__main__":
    main()
