"""Executor.trace(): the journey of every task, its exports and stats."""

import json
import pathlib
import xml.etree.ElementTree as ET

import gpupool
import numpy as np
import pytest


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
