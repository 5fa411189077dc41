"""A trace's timeline as a picture, drawn with matplotlib: one row per lane (host work above,
stream work below) and one per device engine; and the Trace object that holds a recording.
The stages, their tracks, engines and colours come from the C++ library's stage table
(``gpupool._ext.trace_stages()``): this is the one drawing of a timeline.

A trace with few tasks per lane is drawn bar by bar. Where bars would be thinner than a pixel
(or there are too many to draw one by one), each row's time is cut into the picture's pixel
columns and each column shows the share of its time spent in each stage, as stacked colours
in one image: the time to draw then grows with the records only as far as sorting their spans."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from ._figure import DPI, Target, new_figure, save, to_bytes

Floats = npt.NDArray[np.float64]

#: The device of a record a host lane ran (``gpupool._ext.HOST_DEVICE``; kept here so that a
#: records file can be drawn without the extension).
HOST_DEVICE = -1

#: Above this many records a timeline is always drawn aggregated per pixel column: one shape
#: per bar costs time (and, in an SVG, bytes) in proportion to the bars.
EXACT_RECORDS_LIMIT = 20_000
# A lane whose tasks would get fewer pixel columns each than this is drawn aggregated: its
# stages would be about a pixel wide or less, and bars widened to be seen would cover each other.
_MIN_COLUMNS_PER_TASK = 4.0
# Geometry of a row (one unit of y): a lane's host band above its stream band, an engine's band.
_TRACK_OFFSET = {"host": -0.2, "stream": 0.2}
_LANE_BAND = 0.35
_ENGINE_BAND = 0.7
_ENGINE_ALPHA = 0.5
_NO_SPAN = (np.nan, np.nan)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector while a block makes many containers that form no
    cycles (a record per task): otherwise it walks every object made so far again and again as
    they pile up, which can take longer than making them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def stage_table(stages: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """The stages of a task's journey (key, label, track, engine, colour): ``stages`` if given
    (a records file carries the table it was written with), else the C++ library's table."""
    if stages is None:
        from ._ext import trace_stages

        stages = trace_stages()
    return list(stages)


class _Columns:
    """The records' fields that the picture needs, one array each (times in microseconds); a
    stage a record lacks is NaN."""

    def __init__(self, records: Sequence[Dict[str, Any]], table: List[Dict[str, Any]]) -> None:
        n = len(records)
        self.n = n
        self.device = np.fromiter((r["device"] for r in records), np.int64, n)
        self.lane = np.fromiter((r["lane"] for r in records), np.int64, n)
        self.started = np.fromiter((r["started"] for r in records), np.float64, n)
        self.done = np.fromiter((r["done"] for r in records), np.float64, n)
        self.on_stream = np.fromiter((bool(r.get("on_stream", True)) for r in records), bool, n)
        self.bytes_in = sum(r["bytes_in"] for r in records)
        #: Per stage key: (begin, end) arrays.
        self.spans: Dict[str, Tuple[Floats, Floats]] = {}
        for stage in table:
            key = stage["key"]
            flat = np.fromiter(itertools.chain.from_iterable(
                _NO_SPAN if r.get(key) is None else r[key] for r in records), np.float64, 2 * n)
            self.spans[key] = (flat[0::2], flat[1::2])

    @classmethod
    def of_arrays(cls, columns: Dict[str, Any], table: List[Dict[str, Any]]) -> "_Columns":
        """From the extension's ``Trace.columns()``: the same fields, made without a Python
        object per record."""
        made = cls([], table)
        made.device = columns["device"]
        made.n = int(made.device.size)
        made.lane = columns["lane"]
        made.started = columns["started"]
        made.done = columns["done"]
        made.on_stream = columns["on_stream"]
        made.bytes_in = int(columns["bytes_in"])
        made.spans = {stage["key"]: (columns["spans"][stage["key"]][:, 0],
                                     columns["spans"][stage["key"]][:, 1]) for stage in table}
        return made


def _share_of_time(begin: Floats, end: Floats, edges: Floats, union: bool) -> Floats:
    """For each column between ``edges``, the time the spans cover in it over its width:
    summed over the spans (``union`` False; over 1 where they overlap), or the time at least
    one span covers (``union`` True; at most 1). Exact, whatever the spans' widths: the
    covered time up to t is piecewise linear between the spans' ends, so interpolating it at
    the edges loses nothing."""
    if begin.size == 0:
        return np.zeros(edges.size - 1)
    times = np.concatenate([begin, end])
    order = np.argsort(times, kind="stable")
    times = times[order]
    depth = np.cumsum(np.concatenate([np.ones(begin.size), -np.ones(end.size)])[order])
    level = depth[:-1] > 0.5 if union else depth[:-1]
    covered = np.concatenate([[0.0], np.cumsum(level * np.diff(times))])
    shares: Floats = np.diff(np.interp(edges, times, covered)) / np.diff(edges)
    return shares


def _stack_heights(shares: Floats, pixels: int) -> npt.NDArray[np.int64]:
    """Stacked shares (stages x columns, each column summing to at most 1) as whole pixels of a
    band ``pixels`` high: a stage present in a column keeps at least one pixel, so brief work
    stays visible, and the tallest gives way where that overfills the column."""
    heights = np.rint(shares * pixels).astype(np.int64)
    heights[(shares > 1e-9) & (heights == 0)] = 1
    excess = np.maximum(heights.sum(axis=0) - pixels, 0)
    tallest = heights.argmax(axis=0)
    columns = np.arange(shares.shape[1])
    heights[tallest, columns] = np.maximum(heights[tallest, columns] - excess, 0)
    return heights


def _row_label(device: int, lane: int) -> str:
    return f"host, lane {lane}" if device == HOST_DEVICE else f"device {device}, lane {lane}"


class _Layout:
    """The picture's rows: per device, its lanes, then its engines; then the host lanes (records
    of HOST_DEVICE), which have no stream and no engines: their work is drawn on their own rows
    only. And each lane's records."""

    def __init__(self, cols: _Columns, engines: List[str]) -> None:
        # One number per (device, lane), ordered as the pairs are (from their ranks, which
        # cannot overflow whatever numbers a records file holds).
        _, device_rank = np.unique(cols.device, return_inverse=True)
        lanes, lane_rank = np.unique(cols.lane, return_inverse=True)
        keys, inverse = np.unique(device_rank.reshape(-1) * lanes.size + lane_rank.reshape(-1),
                                  return_inverse=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(keys.size + 1))
        #: Indices of each lane's records, lanes in the order of lane_row.
        self.lane_records = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        first = order[bounds[:-1]]  # a record of each lane
        self.labels: List[str] = []
        #: Row of each lane, in the order of lane_records.
        self.lane_row: List[int] = []
        #: Row of (device, engine).
        self.engine_row: Dict[Tuple[int, str], int] = {}
        lane_devices = cols.device[first]
        # The host lanes after the devices, as their lane numbers follow the devices' lanes.
        devices = sorted(np.unique(lane_devices).tolist(), key=lambda d: (d == HOST_DEVICE, d))
        rows_of_lanes: List[npt.NDArray[np.intp]] = []  # per device, its lanes' indices
        for device in devices:
            mine = np.flatnonzero(lane_devices == device)
            rows_of_lanes.append(mine)
            for lane in cols.lane[first[mine]]:
                self.lane_row.append(len(self.labels))
                self.labels.append(_row_label(device, int(lane)))
            if device == HOST_DEVICE:
                continue
            for engine in engines:
                self.engine_row[(int(device), engine)] = len(self.labels)
                self.labels.append(f"device {device}: {engine}")
        # lane_row is in the order of the rows above: lane_records follows it.
        self.lane_records = [self.lane_records[i] for i in np.concatenate(rows_of_lanes)]
        self.record_device = cols.device


def _track(stage: Dict[str, Any]) -> str:
    """The band of its lane's row that a stage is drawn on: host work above, the rest below."""
    return "host" if stage["track"] == "host" else "stream"


def _band(row: int, track: Optional[str]) -> Tuple[float, float]:
    """(top, bottom) in data units (the y axis points down) of a lane's track or an engine's
    band (``track`` None)."""
    if track is None:
        return row - _ENGINE_BAND / 2, row + _ENGINE_BAND / 2
    centre = row + _TRACK_OFFSET[track]
    return centre - _LANE_BAND / 2, centre + _LANE_BAND / 2


def _draw_exact(ax: Any, cols: _Columns, layout: _Layout, table: List[Dict[str, Any]],
                t0: float, t1: float) -> None:
    # Stages narrower than a pixel or two (a 10 us kernel in a 60 ms run) would vanish from the
    # picture: draw every stage at least about 1.5 pixels wide.
    narrowest = (t1 - t0) / 1e3 / 800
    for stage in table:
        begin, end = cols.spans[stage["key"]]
        for row, members in zip(layout.lane_row, layout.lane_records):
            members = members[~np.isnan(begin[members])]
            top, bottom = _band(row, _track(stage))
            _bars(ax, begin[members], end[members], t0, narrowest, top, bottom,
                  stage["colour"], 1.0)
        if not stage["engine"]:
            continue
        # A submit() task's run is drawn on its lane only: it is not the device's work.
        for (device, engine), row in layout.engine_row.items():
            if engine != stage["engine"]:
                continue
            members = np.flatnonzero((layout.record_device == device) & cols.on_stream
                                     & ~np.isnan(begin))
            top, bottom = _band(row, None)
            _bars(ax, begin[members], end[members], t0, narrowest, top, bottom,
                  stage["colour"], _ENGINE_ALPHA)


def _bars(ax: Any, begin: Floats, end: Floats, t0: float, narrowest: float, top: float,
          bottom: float, colour: str, alpha: float) -> None:
    if begin.size == 0:
        return
    left = (begin - t0) / 1e3
    width = np.maximum((end - begin) / 1e3, narrowest)
    ax.broken_barh(np.column_stack([left, width]), (top, bottom - top), facecolors=colour,
                   alpha=alpha, linewidth=0)


def _draw_aggregated(ax: Any, cols: _Columns, layout: _Layout, table: List[Dict[str, Any]],
                     t0: float, t1: float, columns: int, pixels_per_row: int) -> None:
    """One image over the plot: per row and pixel column, the stages stacked from the band's
    bottom, each as tall as its share of the column's time (on an engine's row: the share in
    which it had work, however many lanes' work overlapped)."""
    from matplotlib.colors import to_rgba

    edges = np.linspace(t0, t1, columns + 1)
    image = np.zeros((len(layout.labels) * pixels_per_row, columns, 4), np.float32)
    centres = -0.5 + (np.arange(image.shape[0]) + 0.5) / pixels_per_row

    def paint(top: float, bottom: float, shares: List[Floats], colours: List[Any]) -> None:
        rows = np.flatnonzero((centres >= top) & (centres < bottom))[::-1]  # from the bottom up
        if rows.size == 0 or not shares:
            return
        stacked = np.cumsum(_stack_heights(np.array(shares), rows.size), axis=0)
        # Pixel k of the band (from its bottom) shows the first stage whose stack passes it.
        stage = (stacked[None, :, :] <= np.arange(rows.size)[:, None, None]).sum(axis=1)
        palette = np.array([*colours, (0.0, 0.0, 0.0, 0.0)])
        image[rows] = palette[stage]

    for track in ("host", "stream"):
        stages = [s for s in table if _track(s) == track]
        for row, members in zip(layout.lane_row, layout.lane_records):
            shares = []
            for stage in stages:
                begin, end = cols.spans[stage["key"]]
                present = members[~np.isnan(begin[members])]
                shares.append(_share_of_time(begin[present], end[present], edges, union=False))
            # Overlapping work on one track (not expected: one thread, one stream) is shown
            # in proportion rather than overflowing the band.
            total = np.maximum(np.sum(shares, axis=0), 1.0) if shares else 1.0
            paint(*_band(row, track), [s / total for s in shares],
                  [to_rgba(s["colour"]) for s in stages])
    for (device, engine), row in layout.engine_row.items():
        on_engine = (layout.record_device == device) & cols.on_stream
        stages = [s for s in table if s["engine"] == engine]
        shares = []
        for stage in stages:
            begin, end = cols.spans[stage["key"]]
            present = on_engine & ~np.isnan(begin)
            shares.append(_share_of_time(begin[present], end[present], edges, union=True))
        total = np.maximum(np.sum(shares, axis=0), 1.0) if shares else 1.0
        paint(*_band(row, None), [s / total for s in shares],
              [to_rgba(s["colour"], _ENGINE_ALPHA) for s in stages])
    ax.imshow(image, extent=(0.0, (t1 - t0) / 1e3, len(layout.labels) - 0.5, -0.5),
              aspect="auto", interpolation="nearest", origin="upper")


def timeline_figure(records: Sequence[Dict[str, Any]], backend: str = "",
                    title: Optional[str] = None,
                    stages: Optional[List[Dict[str, Any]]] = None) -> Any:
    """The timeline of ``records`` as a matplotlib Figure: bar by bar, or aggregated per pixel
    column where bars would be under a pixel wide or too many (the title then says so)."""
    table = stage_table(stages)
    return _figure_of(_Columns(records, table), table, backend, title)


def _figure_of(cols: _Columns, table: List[Dict[str, Any]], backend: str,
               title: Optional[str]) -> Any:
    if cols.n == 0:
        raise ValueError("gpupool: the trace is empty: nothing to draw")
    # The device engines the stages name, in the order of their first stage.
    engines = list(dict.fromkeys(s["engine"] for s in table if s["engine"]))
    layout = _Layout(cols, engines)
    t0, t1 = float(cols.started.min()), float(cols.done.max())
    if t1 <= t0:
        t1 = t0 + 1e-3
    rows = len(layout.labels)
    fig = new_figure(14, 0.45 * rows + 1.5)
    ax = fig.subplots()
    ax.set_yticks(range(rows), layout.labels)
    ax.set_xlabel("ms")
    total = cols.bytes_in
    busiest = max(members.size for members in layout.lane_records)
    # Pixel columns: about the plot's width at the saved resolution (settled by the layout).
    columns = int(fig.get_figwidth() * DPI * 0.85)
    aggregated = (cols.n > EXACT_RECORDS_LIMIT
                  or busiest * _MIN_COLUMNS_PER_TASK > columns)
    heading = title or (f"gpupool timeline: {cols.n:,} tasks on the {backend} backend, "
                        f"{(t1 - t0) / 1e3:.3f} ms, {total / ((t1 - t0) * 1e3):.2f} GB/s of input")
    if aggregated:
        heading += (f"\n{cols.n:,} tasks: bars aggregated per pixel column, each stage as tall "
                    f"as its share of the column's time")
    ax.set_title(heading, fontsize=10 if aggregated else None)
    from matplotlib.patches import Rectangle

    handles = [Rectangle((0, 0), 1, 1, color=s["colour"]) for s in table]
    ax.legend(handles, [f"{s['label']} ({s['track']})" for s in table], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if rows > 6 else -0.25), ncol=len(table),
              fontsize=8)
    fig.tight_layout()
    if aggregated:
        box = ax.get_window_extent()
        scale = DPI / fig.dpi
        _draw_aggregated(ax, cols, layout, table, t0, t1,
                         columns=max(int(box.width * scale), 1),
                         pixels_per_row=max(int(box.height * scale / rows), 4))
    else:
        _draw_exact(ax, cols, layout, table, t0, t1)
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_ylim(rows - 0.5, -0.5)
    return fig


def draw_timeline(records: Sequence[Dict[str, Any]], target: Target, backend: str = "",
                  title: Optional[str] = None, format: Optional[str] = None,
                  stages: Optional[List[Dict[str, Any]]] = None) -> None:
    """Draws the records (``Trace.records()``, or a records file's, whose spans are lists) to
    ``target``: .png, .svg or .pdf by its extension (or ``format``). ``stages``: the stage
    table (default: the library's). Where
    bars would be thinner than a pixel, or there are over EXACT_RECORDS_LIMIT records, each
    lane's and engine's time is aggregated per pixel column, and the title says so."""
    save(timeline_figure(records, backend, title, stages), target, format)


def draw_png(records: Sequence[Dict[str, Any]], path: str, backend: str = "",
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
        self._columns: Optional[_Columns] = None
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
        with gc_paused():
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

    def _figure(self) -> Any:
        # A filled snapshot never changes: its records become the picture's arrays once, for
        # every picture drawn of it, straight from C++ (no dict per record).
        if self._columns is None:
            self._columns = _Columns.of_arrays(self._core().columns(), stage_table())
        return _figure_of(self._columns, stage_table(), self.backend, None)

    def picture(self, format: str = "png") -> bytes:
        """The timeline drawn as ``"png"``, ``"svg"`` or ``"pdf"`` (matplotlib): bar by bar, or,
        where bars would be thinner than a pixel, as each stage's share of every pixel column
        (the title says which)."""
        return to_bytes(self._figure(), format)

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
            save(self._figure(), path)

        write_by_suffix(path, "gpupool", {".json": self.chrome_json, ".txt": self.stats_table},
                        {".png": picture, ".svg": picture, ".pdf": picture})
