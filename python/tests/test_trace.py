"""Executor.trace(): the journey of every task, its exports and stats."""

import json
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
    pieces = sum(-(-d.nbytes // executor.chunk_bytes) for d in data)
    assert len(t) == pieces + 1
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
