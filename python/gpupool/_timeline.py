"""A trace's timeline as a picture, drawn with matplotlib: one row per lane (host work above,
stream work below) and one per device engine; and the Trace object that holds a recording.
The stages, their tracks, engines and colours come from the C++ library's stage table
(``gpupool._ext.trace_stages()``): this is the one drawing of a timeline."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Union

from ._figure import Target, new_figure, save, to_bytes



def stage_table(stages: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """The stages of a task's journey (key, label, track, engine, colour): ``stages`` if given
    (a records file carries the table it was written with), else the C++ library's table."""
    if stages is None:
        from ._ext import trace_stages

        stages = trace_stages()
    return list(stages)


def timeline_figure(records: List[Dict[str, Any]], backend: str = "",
                    title: Optional[str] = None,
                    stages: Optional[List[Dict[str, Any]]] = None) -> Any:
    if not records:
        raise ValueError("gpupool: the trace is empty: nothing to draw")
    table = stage_table(stages)
    # The device engines the stages name, in the order of their first stage.
    engines = list(dict.fromkeys(s["engine"] for s in table if s["engine"]))
    t0 = min(r["started"] for r in records)
    t1 = max(r["done"] for r in records)
    rows = []  # (label, key)
    for device in sorted({r["device"] for r in records}):
        for lane in sorted({r["lane"] for r in records if r["device"] == device}):
            rows.append((f"device {device}, lane {lane}", ("lane", device, lane)))
        for engine in engines:
            rows.append((f"device {device}: {engine}", ("engine", device, engine)))
    index = {key: i for i, (_, key) in enumerate(rows)}
    fig = new_figure(14, 0.45 * len(rows) + 1.5)
    ax = fig.subplots()
    # Stages narrower than a pixel or two (a 10 us kernel in a 60 ms run) would vanish from the
    # picture: draw every stage at least about 1.5 pixels wide.
    narrowest = (t1 - t0) / 1e3 / 800
    for r in records:
        for stage in table:
            span = r.get(stage["key"])
            if span is None:
                continue
            begin, end = (span[0] - t0) / 1e3, (span[1] - t0) / 1e3
            width = max(end - begin, narrowest)
            y = index[("lane", r["device"], r["lane"])]
            offset = -0.2 if stage["track"] == "host" else 0.2
            ax.barh(y + offset, width, left=begin, height=0.35, color=stage["colour"])
            # A submit() task's run is drawn on its lane only: it is not the device's work.
            if stage["engine"] and r.get("on_stream", True):
                ax.barh(index[("engine", r["device"], stage["engine"])], width, left=begin,
                        height=0.7, color=stage["colour"], alpha=0.5)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_xlim(0, max((t1 - t0) / 1e3, 1e-6))
    total = sum(r["bytes_in"] for r in records)
    seconds = max(t1 - t0, 1e-9)
    ax.set_title(title or f"gpupool timeline: {len(records)} tasks on the {backend} backend, "
                 f"{(t1 - t0) / 1e3:.3f} ms, {total / (seconds * 1e3):.2f} GB/s of input")
    from matplotlib.patches import Rectangle

    handles = [Rectangle((0, 0), 1, 1, color=s["colour"]) for s in table]
    ax.legend(handles, [f"{s['label']} ({s['track']})" for s in table], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(rows) > 6 else -0.25), ncol=len(table),
              fontsize=8)
    fig.tight_layout()
    return fig


def draw_timeline(records: List[Dict[str, Any]], target: Target, backend: str = "",
                  title: Optional[str] = None, format: Optional[str] = None,
                  stages: Optional[List[Dict[str, Any]]] = None) -> None:
    """Draws the records (``Trace.records()``) to ``target``: .png, .svg or .pdf by its
    extension (or ``format``). ``stages``: the stage table (default: the library's)."""
    save(timeline_figure(records, backend, title, stages), target, format)


def draw_png(records: List[Dict[str, Any]], path: str, backend: str = "",
             title: Optional[str] = None) -> None:
    """Kept for earlier callers: draw_timeline to a .png."""
    draw_timeline(records, path, backend, title, format="png")


def write_by_suffix(path: Union[str, "os.PathLike[str]"], who: str,
                    texts: Dict[str, Callable[[], str]],
                    files: Optional[Dict[str, Callable[[str], None]]] = None) -> None:
    """Writes ``path`` by its extension: the text ``texts[suffix]()`` makes, or what
    ``files[suffix](path)`` writes itself. Other extensions are refused (ValueError)."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    files = files or {}
    if suffix in files:
        files[suffix](path)
        return
    if suffix not in texts:
        known = [*texts, *files]
        raise ValueError(f"{who}: cannot tell the format of {path!r}: use "
                         f"{', '.join(known[:-1])} or {known[-1]}")
    text = texts[suffix]()
    with open(path, "w", encoding="utf-8") as out:
        out.write(text)


class Trace:
    """Each task's journey: queued, staged, uploaded, computed, downloaded, handed back.

    In Jupyter, a Trace shows its timeline (``_repr_png_``)."""

    def __init__(self) -> None:
        self._snapshot: Any = None
        #: Records dropped because the executor's trace ring was full (the oldest go first).
        self.dropped = 0

    def _core(self) -> Any:
        if self._snapshot is None:
            raise RuntimeError("gpupool: the trace is filled when its `with` block ends")
        return self._snapshot

    def __len__(self) -> int:
        return len(self._core())

    @property
    def backend(self) -> str:
        """The backend the traced executor ran on: ``"cuda"`` or ``"cpu"``."""
        return str(self._core().backend)

    @staticmethod
    def stages() -> List[Dict[str, Any]]:
        """The stages of a task's journey: key (each record's field), label, track ("host" or
        "stream"), engine (a device engine's row, or None) and colour."""
        return stage_table()

    def records(self) -> List[Dict[str, Any]]:
        """One dict per task (per piece for kernels over arrays), in submission order. Times are
        microseconds since the executor started; each stage of ``stages()`` (by key) is
        (begin, end) or None; ``on_stream`` says whether the work went through the lane's
        stream (a submit() task's ``kernel`` is its whole run on the lane)."""
        return list(self._core().records())

    def stats(self) -> List[Dict[str, Any]]:
        """Per lane, then per device (``lane`` None): tasks, bytes each way, busy time, queue
        wait (median, 99th percentile), achieved GB/s of input, and ``stage_us``: the time
        spent in each stage of ``stages()``, by key."""
        return list(self._core().stats())

    def stats_table(self) -> str:
        """The stats as an aligned text table."""
        return str(self._core().stats_table())

    def chrome_json(self) -> str:
        """The trace in Chrome trace format, for Perfetto or chrome://tracing."""
        return str(self._core().chrome_json())

    def picture(self, format: str = "png") -> bytes:
        """The timeline drawn as ``"png"``, ``"svg"`` or ``"pdf"`` (matplotlib)."""
        return to_bytes(timeline_figure(self.records(), self.backend), format)

    def svg(self) -> str:
        """The timeline as an SVG picture: a row per lane and per device engine."""
        return self.picture("svg").decode("utf-8")

    def _repr_png_(self) -> Optional[bytes]:
        # Jupyter shows the picture; an empty (or unfinished) trace falls back to the text repr.
        if self._snapshot is None or len(self._snapshot) == 0:
            return None
        return self.picture("png")

    def __repr__(self) -> str:
        if self._snapshot is None:
            return "<gpupool.Trace (recording)>"
        return f"<gpupool.Trace: {len(self._snapshot)} records on the {self.backend} backend>"

    def write(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the trace by the file's extension: ``.json`` Chrome trace, ``.txt`` stats
        table, ``.png``, ``.svg`` or ``.pdf`` picture of the timeline. Other extensions are
        refused (ValueError)."""
        def picture(path: str) -> None:
            draw_timeline(self.records(), path, backend=self.backend)

        write_by_suffix(path, "gpupool", {".json": self.chrome_json, ".txt": self.stats_table},
                        {".png": picture, ".svg": picture, ".pdf": picture})
