"""Draws what the command-line tool measured, as PNG (matplotlib):

    python -m gpupool.plot bench.json out.png          # `gpupool bench --json`: GB/s per lane
                                                       # count against chunk size, copy limit dashed
    python -m gpupool.plot timeline records.json out.png   # a trace's records (Trace.svg's picture)
"""

import json
import sys


def plot_bench(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _human(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and argv[0] == "timeline":
        from ._timeline import draw_png

        with open(argv[1], encoding="utf-8") as f:
            trace = json.load(f)
        records = [{k: tuple(v) if isinstance(v, list) else v for k, v in r.items()}
                   for r in trace["records"]]
        draw_png(records, argv[2], backend=trace["backend"])
        return
    if len(argv) != 2:
        raise SystemExit("usage: python -m gpupool.plot bench.json out.png\n"
                         "       python -m gpupool.plot timeline records.json out.png")
    with open(argv[0], encoding="utf-8") as f:
        plot_bench(json.load(f), argv[1])


if __name__ == "__main__":
    main()
