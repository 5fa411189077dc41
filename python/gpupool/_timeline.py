"""The timeline as a PNG, drawn with matplotlib: one row per lane (host work above, stream work
below) and one per device engine, as in Trace.svg()."""

STAGES = [("stage_in", "stage in (host copy)", "#9e9e9e", "host"),
          ("upload", "upload", "#1f77b4", "stream"),
          ("kernel", "kernel / task", "#2ca02c", "stream"),
          ("download", "download", "#ff7f0e", "stream"),
          ("stage_out", "stage out (host copy)", "#9467bd", "host")]
ENGINES = {"upload": "copies in (H2D)", "kernel": "kernels", "download": "copies out (D2H)"}


def draw_png(records, path, backend="", title=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not records:
        raise ValueError("gpupool: the trace is empty")
    t0 = min(r["started"] for r in records)
    t1 = max(r["done"] for r in records)
    rows = []  # (label, key)
    for device in sorted({r["device"] for r in records}):
        for lane in sorted({r["lane"] for r in records if r["device"] == device}):
            rows.append((f"device {device}, lane {lane}", ("lane", device, lane)))
        for stage, engine in ENGINES.items():
            rows.append((f"device {device}: {engine}", ("engine", device, stage)))
    index = {key: i for i, (_, key) in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(rows) + 1.5))
    # Stages narrower than a pixel or two (a 10 us kernel in a 60 ms run) would vanish from the
    # picture: draw every stage at least about 1.5 pixels wide.
    narrowest = (t1 - t0) / 1e3 / 800
    for r in records:
        for stage, _, color, where in STAGES:
            span = r[stage]
            if span is None:
                continue
            begin, end = (span[0] - t0) / 1e3, (span[1] - t0) / 1e3
            y = index[("lane", r["device"], r["lane"])]
            offset = -0.2 if where == "host" else 0.2
            ax.barh(y + offset, max(end - begin, narrowest), left=begin, height=0.35, color=color)
            if stage in ENGINES and r["upload"] is not None:
                ax.barh(index[("engine", r["device"], stage)], max(end - begin, narrowest),
                        left=begin, height=0.7, color=color, alpha=0.5)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_xlim(0, (t1 - t0) / 1e3)
    total = sum(r["bytes_in"] for r in records)
    ax.set_title(title or f"gpupool timeline: {len(records)} tasks on the {backend} backend, "
                 f"{(t1 - t0) / 1e3:.3f} ms, {total / ((t1 - t0) * 1e3):.2f} GB/s of input")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, _, c, _ in STAGES]
    ax.legend(handles, [label for _, label, _, _ in STAGES], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(rows) > 6 else -0.25), ncol=5, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
