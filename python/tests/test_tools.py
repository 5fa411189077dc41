"""Progress bars on long maps, and the bench plot."""

import json
import xml.etree.ElementTree as ET

import gpupool
import numpy as np
import pytest
from gpupool.plot import BenchResult, plot_bench


def test_map_with_progress_gives_the_same_results(executor, capsys):
    xs = [np.full(1000, i, dtype=np.float64) for i in range(30)]
    squares = list(executor.map(gpupool.kernels.square, xs, progress=True))
    assert [s[0] for s in squares] == [float(i * i) for i in range(30)]
    assert list(executor.map(abs, range(-5, 0), progress=True)) == [5, 4, 3, 2, 1]
    # Not a terminal here: the bar stays silent.
    assert "gpupool" not in capsys.readouterr().err


def test_bench_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    results = {
        "backend": "cpu", "dtype": "float64", "kernel": "square", "total_bytes": 1 << 20,
        "limits_gb_per_s": {"h2d": 20.0, "d2h": 21.0, "both": 18.0},
        "points": [{"lanes": lanes, "chunk_bytes": size, "seconds": 0.01,
                    "input_gb_per_s": lanes * size / 1e5, "fraction_of_limit": 0.5}
                   for lanes in (1, 2) for size in (65536, 131072)],
    }
    (tmp_path / "bench.json").write_text(json.dumps(results))
    plot_bench(json.loads((tmp_path / "bench.json").read_text()), str(tmp_path / "bench.png"))
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_png_from_records_json(executor, tmp_path):
    pytest.importorskip("matplotlib")
    from gpupool.plot import main

    with executor.trace() as t:
        list(executor.map(gpupool.kernels.square, [np.ones(50_000)] * 4))
    (tmp_path / "records.json").write_text(
        json.dumps({"backend": executor.backend, "records": t.records()}))
    main(["timeline", str(tmp_path / "records.json"), str(tmp_path / "timeline.png")])
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def bench_results(backend="cpu"):
    return {
        "backend": backend, "dtype": "float64", "kernel": "square", "total_bytes": 1 << 20,
        "limits_gb_per_s": {"h2d": 20.0, "d2h": 21.0, "both": 18.0},
        "points": [{"lanes": lanes, "chunk_bytes": size, "seconds": 0.01,
                    "input_gb_per_s": lanes * size / 1e5, "fraction_of_limit": 0.5}
                   for lanes in (1, 2) for size in (65536, 131072)],
    }


def test_jupyter_shows_a_bench_result_as_its_picture(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps(bench_results()))
    result = BenchResult.load(tmp_path / "bench.json")
    assert result._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(result.points) == 4


def test_names_in_svg_pictures_are_escaped(tmp_path):
    # A device name is written into the picture's title: markup in it must stay text.
    name = 'cpu, <GPU & "friends">'
    svg = BenchResult(bench_results(name)).picture("svg").decode()
    root = ET.fromstring(svg)
    assert any(name in "".join(e.itertext()) for e in root.iter())
    assert "<GPU" not in svg
