"""Executor.trace(): the journey of every task, its exports and stats."""

import json
import pathlib
import time
import xml.etree.ElementTree as ET

import gpupool
import numpy as np
import pytest
from gpupool._timeline import gc_paused, timeline_figure
from gpupool.plot import draw_timeline


def traced_run(ex, tmp_path, name="trace.json"):
    data = [np.random.default_rng(i).random(200_000) for i in range(6)]
    with ex.trace(tmp_path / name) as t:
        out = list(ex.map(gpupool.kernels.square, data))
        ex.submit(sum, [1, 2, 3]).result()
    assert all(np.array_equal(o, d * d) for o, d in zip(out, data))
    return t, data


def test_chrome_trace_is_valid_and_complete(executor, tmp_path):
    t, data = traced_run(executor, tmp_path)
    # One record per piece of the map, then the submitted call. chunk_bytes bounds a piece; a
    # small call may be cut finer so that every lane works (docs/configuration.md).
    pieces = len(t) - 1
    assert sum(-(-d.nbytes // executor.chunk_bytes) for d in data) <= pieces
    assert pieces <= sum(-(-d.nbytes // (1 << 20)) for d in data)
    doc = json.loads((tmp_path / "trace.json").read_text())
    events = doc["traceEvents"]
    tasks = [e for e in events if e.get("cat") == "task"]
    assert len(tasks) == pieces + 1
    for stage in ("upload", "kernel", "download"):
        assert len([e for e in events if e["name"] == stage and e["ph"] == "X"]) == pieces
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    begins = {(e["cat"], e["id"]): e["ts"] for e in events if e["ph"] == "b"}
    ends = {(e["cat"], e["id"]): e["ts"] for e in events if e["ph"] == "e"}
    assert begins.keys() == ends.keys()
    assert all(ends[k] >= begins[k] for k in begins)


def test_records_are_in_order_and_consistent(executor, tmp_path):
    t, _ = traced_run(executor, tmp_path)
    records = t.records()
    assert [r["id"] for r in records] == sorted(r["id"] for r in records)
    for r in records:
        assert r["submitted"] <= r["started"] <= r["done"]
        for stage in ("stage_in", "upload", "kernel", "download", "stage_out"):
            if r[stage] is not None:
                assert r[stage][0] <= r[stage][1]


def test_stats_add_up(executor, tmp_path):
    t, data = traced_run(executor, tmp_path)
    stats = t.stats()
    totals = [s for s in stats if s["lane"] is None]
    lanes = [s for s in stats if s["lane"] is not None]
    assert sum(s["bytes_in"] for s in totals) == sum(d.nbytes for d in data)
    assert sum(s["bytes_in"] for s in lanes) == sum(s["bytes_in"] for s in totals)
    assert sum(s["tasks"] for s in lanes) == len(t)
    assert all(s["queue_wait_p50_us"] <= s["queue_wait_p99_us"] for s in stats)
    assert "GB/s" in t.stats_table()


def test_pictures_follow_the_extension(executor, tmp_path):
    t, _ = traced_run(executor, tmp_path)
    t.write(tmp_path / "timeline.svg")
    ET.fromstring((tmp_path / "timeline.svg").read_text())  # well-formed XML
    t.write(tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    t.write(tmp_path / "timeline.pdf")
    assert (tmp_path / "timeline.pdf").read_bytes()[:5] == b"%PDF-"
    with pytest.raises(ValueError, match=r"\.png, \.svg or \.pdf"):
        t.picture("jpeg")
    assert not (tmp_path / "timeline.jpg").exists()


def test_jupyter_shows_a_trace_as_its_timeline(executor, tmp_path):
    t, _ = traced_run(executor, tmp_path)
    assert t._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "records" in repr(t)
    with executor.trace() as empty:
        pass
    assert empty._repr_png_() is None  # nothing to draw: Jupyter falls back to the text


def test_tracing_is_off_outside_the_block(executor):
    with executor.trace() as t:
        pass
    assert len(t) == 0
    executor.submit(abs, -1).result()
    with executor.trace() as t2:
        executor.submit(abs, -2).result()
    assert len(t2) == 1
    with pytest.raises(ValueError, match="format"):
        t2.write("trace.bmp")


def test_every_writer_follows_the_stage_table(executor, tmp_path):
    """The C++ stage table is what the records, the stats, the Chrome trace and the picture use:
    every stage appears in each under the table's names, and nothing else does."""
    table = gpupool._ext.trace_stages()
    assert [s["key"] for s in table] == ["stage_in", "upload", "kernel", "download", "stage_out"]
    assert len({s["key"] for s in table}) == len(table)
    data = [np.random.default_rng(i).random(100_000) for i in range(4)]
    with executor.trace() as t:
        list(executor.map(gpupool.kernels.square, data))
        executor.submit(sum, [1, 2]).result()
    assert t.stages() == table
    records = t.records()
    pieces = [r for r in records if r["on_stream"]]
    assert pieces and len(pieces) == len(records) - 1
    # Records: a field per stage, by its key.
    for r in records:
        assert all(s["key"] in r for s in table)
    # Stats: the time in each stage, by key, adding up to the records' spans.
    lanes = [s for s in t.stats() if s["lane"] is not None]
    for stage in table:
        spent = sum(r[stage["key"]][1] - r[stage["key"]][0] for r in records
                    if r[stage["key"]] is not None)
        assert sum(s["stage_us"][stage["key"]] for s in lanes) == pytest.approx(spent)
        assert stage["label"] + " ms" in t.stats_table()
    # Chrome: one event per present stage, named by the label, on the table's track; the
    # engines' tracks are the table's engines.
    events = json.loads(t.chrome_json())["traceEvents"]
    for stage in table:
        shown = [e for e in events if e["ph"] == "X" and e["name"] == stage["label"]]
        expected = [r for r in (pieces if stage["track"] == "stream" else records)
                    if r[stage["key"]] is not None]
        assert len(shown) == len(expected), stage
        assert all(e["cat"] == stage["track"] for e in shown)
    engines = {e["args"]["name"] for e in events
               if e["name"] == "thread_name" and e["tid"] >= 100000}
    assert engines == {s["engine"] for s in table if s["engine"]}
    # The picture: a legend entry per stage, with the table's label and colour.
    svg = t.picture("svg").decode()
    for stage in table:
        assert f"{stage['label']} ({stage['track']})" in svg
        assert stage["colour"] in svg.lower()


def test_the_docs_list_the_stage_table():
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs" / "tracing.md"
    if not docs.is_file():
        pytest.skip("no docs beside these tests (not a checkout)")
    text = docs.read_text()
    for s in gpupool._ext.trace_stages():
        row = (f"| `{s['key']}` | {s['label']} | {s['track']} | {s['engine'] or '-'} | "
               f"`{s['colour']}` |")
        assert row in text, f"docs/tracing.md lacks the row {row}"


AGGREGATED = "bars aggregated per pixel column"


def synthetic_records(tasks, lanes=16, lanes_per_device=8, period_us=10.0):
    """Records in Trace.records()'s form (as records_from_json reads them from a records file),
    made without running the tasks: the lanes take tasks in turn, one every ``period_us`` each,
    and every task spends 10% of its period staging in, 10% uploading, 40% in its kernel, 10%
    downloading and 10% staging out. No cycles among them, so the collector is paused while
    they are made (it would walk them all again and again as they pile up)."""
    lane = np.arange(tasks) % lanes
    start = (np.arange(tasks) // lanes) * period_us + lane * (period_us / lanes)
    marks = [(start + f * period_us).tolist() for f in (0.0, 0.05, 0.15, 0.25, 0.65, 0.75, 0.85,
                                                        0.9)]
    with gc_paused():
        return [{"id": i, "name": "square", "device": n // lanes_per_device, "lane": n,
                 "submitted": s, "started": s, "stage_in": (a, b), "upload": (b, c),
                 "kernel": (c, d), "download": (d, e), "stage_out": (e, f), "done": g,
                 "bytes_in": 8192, "bytes_out": 8192, "failed": False, "on_stream": True}
                for i, (n, s, a, b, c, d, e, f, g) in enumerate(zip(lane.tolist(), *marks))]


def test_a_million_tasks_draw_in_seconds_aggregated_per_pixel_column(tmp_path):
    """Drawn one bar per stage and task, a big trace ran for minutes; aggregated per pixel
    column, a million tasks draw in seconds, and the picture says it is aggregated."""
    records = synthetic_records(1_000_000)
    for kind in ("png", "svg"):
        began = time.perf_counter()
        draw_timeline(records, tmp_path / f"timeline.{kind}", backend="cpu")
        took = time.perf_counter() - began
        assert took < 60, f"drawing a million tasks as {kind} took {took:.1f} s"
    svg = (tmp_path / "timeline.svg").read_text()
    ET.fromstring(svg)  # well-formed XML
    assert "1,000,000 tasks" in svg and AGGREGATED in svg
    assert "<image" in svg  # the bars as one picture, not a shape per bar
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    pixels = (imread(tmp_path / "timeline.png")[..., :3] * 255).round()
    for stage in gpupool.Trace.stages():
        colour = [int(stage["colour"][i:i + 2], 16) for i in (1, 3, 5)]
        assert (pixels == colour).all(axis=-1).sum() > 1000, f"{stage['key']} is not drawn"


def test_an_aggregated_column_shows_each_stage_as_its_share_of_the_time():
    """Every lane spends 40% of its time in kernels and 10% in each other stage: in the middle
    column of the picture, lane 0's bands show each stage as that share of their height
    (within a pixel and a half)."""
    from matplotlib.colors import to_rgba

    fig = timeline_figure(synthetic_records(40_000, lanes=4, lanes_per_device=4), "cpu")
    assert AGGREGATED in fig.axes[0].get_title()
    (image,) = fig.axes[0].images
    column = np.asarray(image.get_array())[:, image.get_array().shape[1] // 2]
    rows = len(fig.axes[0].get_yticks())
    assert rows == 4 + 3  # four lanes, then the device's three engines
    band = column.shape[0] // rows  # pixels per row: lane 0's row comes first
    lane0 = column[:band]
    colours = {s["key"]: np.array(to_rgba(s["colour"])) for s in gpupool.Trace.stages()}
    for key, share in (("kernel", 0.4), ("upload", 0.1), ("download", 0.1),
                       ("stage_in", 0.1), ("stage_out", 0.1)):
        drawn = np.isclose(lane0, colours[key]).all(axis=-1).sum()
        band_pixels = round(0.35 * band)  # a lane's host or stream band is 0.35 of its row
        assert abs(drawn - share * band_pixels) <= 1.5, (key, drawn, band_pixels)


def test_aggregation_keeps_when_the_work_happened():
    """One lane busy with back-to-back kernels for the first half of the trace and idle for
    the second: the first half of the picture's columns is kernel on that lane, the second
    half is empty."""
    records = [{"id": i, "name": "task", "device": 0, "lane": 0, "submitted": i, "started": i,
                "stage_in": None, "upload": None, "kernel": (i, i + 1.0), "download": None,
                "stage_out": None, "done": i + 1.0, "bytes_in": 0, "bytes_out": 0,
                "failed": False, "on_stream": False} for i in range(5_000)]
    records.append(dict(records[-1], id=5_000, kernel=None, started=9_999.0, done=10_000.0))
    fig = timeline_figure(records, "cpu")
    assert AGGREGATED in fig.axes[0].get_title()
    (image,) = fig.axes[0].images
    drawn = np.asarray(image.get_array())[..., 3] > 0  # rows x columns: anything drawn
    columns = drawn.shape[1]
    busy = drawn[:, : int(columns * 0.49)].sum(axis=0)
    assert (busy == busy[0]).all() and busy[0] > 5
    assert not drawn[:, int(columns * 0.51):].any()
    # The engines' rows stay empty: a submit() task's run is not the device's work.
    assert drawn[: drawn.shape[0] // 4].sum() == drawn.sum()


def test_a_small_trace_keeps_a_bar_per_stage_and_task():
    records = synthetic_records(100, lanes=4, lanes_per_device=4)
    fig = timeline_figure(records, "cpu")
    ax = fig.axes[0]
    assert not ax.images and AGGREGATED not in ax.get_title()
    assert "100 tasks" in ax.get_title()
    bars = sum(len(c.get_paths()) for c in ax.collections)
    # Five stages on each task's lane, and the three stream stages on their engines' rows.
    assert bars == 100 * (5 + 3)


def test_a_big_traces_outputs_are_quick(executor, tmp_path):
    """A trace of real tasks past the limit of bars drawn one by one: the picture (also as
    Jupyter shows it), the stats and the table."""
    tasks = 30_000
    with executor.trace(capacity=tasks) as t:
        for _ in executor.map(gpupool.kernels.square, [np.ones(4)] * tasks):
            pass
    assert len(t) == tasks
    began = time.perf_counter()
    assert AGGREGATED in t.svg()
    assert t._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sum(s["tasks"] for s in t.stats() if s["lane"] is None) == tasks
    assert "GB/s" in t.stats_table()
    took = time.perf_counter() - began
    assert took < 60, f"a trace of {tasks} tasks took {took:.1f} s to draw and summarise"


def test_the_columns_a_picture_is_drawn_from_match_the_records(executor):
    with executor.trace() as t:
        list(executor.map(gpupool.kernels.square, [np.ones(1000)] * 50))
        executor.submit(lambda: None).result()
        # Urgent and small: runs express where the backend's kernels reach pinned memory.
        executor.submit(gpupool.kernels.square, np.ones(1000), priority=1).result()
    records = t.records()
    columns = t._core().columns()
    assert columns["device"].tolist() == [r["device"] for r in records]
    assert columns["lane"].tolist() == [r["lane"] for r in records]
    assert columns["started"].tolist() == [r["started"] for r in records]
    assert columns["done"].tolist() == [r["done"] for r in records]
    assert columns["on_stream"].tolist() == [r["on_stream"] for r in records]
    assert columns["express"].tolist() == [r["express"] for r in records]
    assert columns["express"].any()  # the urgent call's
    assert columns["bytes_in"] == sum(r["bytes_in"] for r in records)
    for stage in t.stages():
        spans = columns["spans"][stage["key"]]
        assert spans.shape == (len(records), 2)
        for (begin, end), r in zip(spans.tolist(), records):
            if r[stage["key"]] is None:
                assert np.isnan(begin) and np.isnan(end)
            else:
                assert (begin, end) == tuple(r[stage["key"]])
