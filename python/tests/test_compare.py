"""gpupool compare: a tiny CPU-backend run, and wrong results reported FAILED, never timed."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gpupool.compare import main
from gpupool.compare import _programs, _report
from gpupool.compare._harness import (ALTERNATIVE, ANCHOR, FAILED, GPUPOOL, LIMIT, OK, SKIPPED,
                                      Contender, Result, Skip, Timing, WrongResult, measure,
                                      measure_interleaved)
from gpupool.compare._workloads import check_squares, sizes

HAS_CUPY = importlib.util.find_spec("cupy") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None


def rows(document, workload):
    return {r["variant"]: r for r in document["results"] if r["workload"] == workload}


def test_tiny_cpu_run_checks_and_times_what_can_run(tmp_path, capsys):
    out = tmp_path / "compare.json"
    argv = ["--tiny", "--backend", "cpu", "--repeat", "2", "--min-repeat", "1",
            "--seconds", "0.2", "--workloads", "W1,W2,W4,W5,W6,W8", "--json", str(out)]
    plot = importlib.util.find_spec("matplotlib") is not None
    if plot:
        argv += ["--plot", str(tmp_path / "compare.png")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert document["settings"]["backend"] == "cpu"
    assert document["machine"]["numpy"] == np.__version__

    for workload in ("W1", "W2", "W4"):
        got = rows(document, workload)
        numpy_row = got["NumPy on the CPU, 1 thread"]
        assert numpy_row["status"] == OK and numpy_row["figure"] > 0
        assert len(numpy_row["repeats_s"]) >= 1
        ours = [r for name, r in got.items() if name.startswith("gpupool (Python) map, defaults")]
        assert ours and ours[0]["status"] == OK and ours[0]["figure"] > 0
        assert any("best of sweep" in name and r["status"] == OK for name, r in got.items())
        motivating = got["motivating program, 5 threads"]
        if not HAS_CUPY:
            assert motivating["status"] == SKIPPED
            assert "CuPy is not installed" in motivating["reason"]
            careful = [r for name, r in got.items() if name.startswith("careful CuPy")]
            assert careful and all(r["status"] == SKIPPED for r in careful)
        if not HAS_TORCH:
            torch_rows = [r for name, r in got.items() if name.startswith("careful PyTorch")]
            assert torch_rows and all(r["status"] == SKIPPED and "PyTorch" in r["reason"]
                                      for r in torch_rows)
    submit = [r for name, r in rows(document, "W4").items() if "submit loop" in name]
    assert submit and submit[0]["status"] == OK and submit[0]["figure"] > 0
    assert rows(document, "W5")["NumPy on the CPU (float32 FMA chain)"]["status"] == OK
    assert all(r["status"] == SKIPPED for r in rows(document, "W6").values())
    assert all(r["status"] == SKIPPED for r in rows(document, "W8@W2").values())
    # The C++ baseline needs CUDA: never run on the CPU backend, always listed with a reason.
    baseline = [r for r in document["results"] if "hand-written C++" in r["variant"]]
    assert baseline and all(r["status"] == SKIPPED and r["reason"] for r in baseline)
    # Where the project's build tree holds gpupool_bench_compare, its rows ran and were checked.
    cpp = [r for r in document["results"] if r["variant"].startswith("gpupool (C++)")]
    assert cpp and all(r["status"] in (OK, SKIPPED) for r in cpp)
    assert all(r["reason"] for r in cpp if r["status"] == SKIPPED)

    limits = rows(document, "limits")
    assert limits["host memcpy (NumPy copyto), 1 thread"]["status"] == OK
    assert document["limits"]["host_memcpy_gb_s"] > 0
    table = document["tables"]["W2"]
    numpy_entry = next(r for r in table["rows"] if r["variant"] == "NumPy on the CPU, 1 thread")
    assert numpy_entry["of_limit"] > 0
    assert "W2:" in printed and "x best alt" in printed
    # No share of a limit above 100% goes unremarked: the limit bounds any program.
    for workload, t in document["tables"].items():
        for entry in t["rows"]:
            if (entry.get("of_limit") or 0) > 1:
                assert "measured low" in entry["note"], (workload, entry)
                assert any(entry["variant"] in n for n in t["notes"])
    if plot:
        assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_wrong_variant_is_failed_and_not_timed():
    data = [np.arange(10.0), np.arange(5.0)]
    calls = []

    def setup():
        def run():
            calls.append(1)
            return [d * 2 for d in data]  # not the square
        return run

    result = measure("W1", "wrong on purpose", GPUPOOL, "ms", 2.0, setup, check_squares(data),
                     Timing(repeat=5, min_repeat=3, seconds=10))
    assert result.status == FAILED and "wrong result" in result.reason
    assert result.figure is None and result.repeats_s == []
    assert len(calls) == 1  # the warm-up only: nothing was timed


def test_a_variant_wrong_only_in_timed_runs_is_failed_without_times():
    data = [np.arange(8.0)]
    calls = []

    def setup():
        def run():
            calls.append(1)
            return [data[0] ** 2] if len(calls) == 1 else [data[0] + 1]
        return run

    result = measure("W2", "right once", GPUPOOL, "GB/s", 1.0, setup, check_squares(data),
                     Timing(repeat=3, min_repeat=3, seconds=10))
    assert result.status == FAILED and result.figure is None and result.repeats_s == []
    assert len(calls) == 4


def _contender(name, log, data, fail_at=None, setup_skips=False, always_wrong=False):
    """A variant squaring `data` (adding one instead where `always_wrong`) that writes its name to
    `log` at each run; its run number `fail_at` (0: the warm-up) raises."""
    runs = []

    def setup():
        if setup_skips:
            raise Skip("not here")

        def run():
            runs.append(1)
            log.append(name)
            if fail_at is not None and len(runs) - 1 == fail_at:
                raise RuntimeError(f"{name} broke")
            if always_wrong:
                return [d + 1 for d in data]
            return [d ** 2 for d in data]
        return run

    return Contender("W4", name, GPUPOOL, "tasks/s", float(len(data)), setup,
                     check_squares(data))


def test_interleaved_variants_take_turns_each_round_starting_one_later():
    data = [np.arange(4.0)]
    log, closed = [], []
    results = measure_interleaved([_contender(n, log, data) for n in "abc"],
                                  Timing(repeat=4, min_repeat=4, seconds=100),
                                  teardown=lambda: closed.append(1))
    assert log == list("abc") + list("abc" "bca" "cab" "abc")  # warm-ups, then four rounds
    assert closed == [1]
    for r, others in zip(results, (["b", "c"], ["a", "c"], ["a", "b"])):
        assert r.status == OK and len(r.repeats_s) == 4 and r.figure > 0
        assert r.extra["interleaved_with"] == others


def test_an_interleaved_variant_that_fails_drops_out_and_the_others_go_on():
    data = [np.arange(3.0)]
    log = []
    results = measure_interleaved(
        [_contender("ok", log, data), _contender("breaks", log, data, fail_at=2),
         _contender("skips", log, data, setup_skips=True),
         _contender("wrong", log, data, always_wrong=True)],
        Timing(repeat=3, min_repeat=3, seconds=100))
    ok, breaks, skips, wrong = results
    assert ok.status == OK and len(ok.repeats_s) == 3
    assert breaks.status == FAILED and "RuntimeError: breaks broke" in breaks.reason
    assert breaks.figure is None and breaks.repeats_s == []
    assert skips.status == SKIPPED and skips.reason == "not here"
    assert wrong.status == FAILED and "wrong result" in wrong.reason and wrong.repeats_s == []
    # Warm-ups (none for the one that skipped), then the rounds: "breaks" breaks in the second
    # (its second timed run, that round's first) and is out of the third; "wrong" never ran
    # timed.
    assert log == ["ok", "breaks", "wrong", "ok", "breaks", "breaks", "ok", "ok"]


def test_interleaved_rounds_stop_at_min_repeat_once_the_time_is_spent():
    data = [np.arange(2.0)]
    log = []
    results = measure_interleaved([_contender(n, log, data) for n in "ab"],
                                  Timing(repeat=5, min_repeat=2, seconds=0))
    assert log == list("ab") + list("ab" "ba")  # warm-ups, then the two rounds at least
    assert all(r.status == OK and len(r.repeats_s) == 2 for r in results)


def test_a_failed_variant_shows_in_the_table_and_the_exit_status():
    class Comparison:
        limits, size, gpus = {}, {"W1": (5, 10)}, 0

    def good():
        return lambda: [np.arange(3.0) ** 2]

    check = check_squares([np.arange(3.0)])
    Comparison.results = [
        measure("W1", "right", GPUPOOL, "ms", 1.0, good, check, Timing(2, 1, 1.0)),
        measure("W1", "wrong", GPUPOOL, "ms", 1.0, lambda: (lambda: [np.zeros(3)]), check,
                Timing(2, 1, 1.0)),
    ]
    text = _report.table_text(_report.summarise(Comparison), lambda w: "test")
    assert "FAILED: wrong result" in text


def test_check_squares_rejects_shape_and_count():
    check = check_squares([np.arange(4.0)])
    with pytest.raises(WrongResult):
        check([np.arange(4.0) ** 2, np.arange(4.0)])
    with pytest.raises(WrongResult):
        check([np.arange(4.0).reshape(2, 2) ** 2])
    check([np.arange(4.0) ** 2])


def test_program_lines_keep_their_status_and_a_missing_program_says_why(tmp_path):
    failed = _programs.to_result({"workload": "W2", "variant": "map", "kind": "gpupool",
                                  "unit": "GB/s", "amount": 1.0, "status": "FAILED",
                                  "reason": "result 3 is wrong", "repeats_s": [0.1]}, "C++ ")
    assert failed.status == FAILED and failed.figure is None and failed.repeats_s == []
    ok = _programs.to_result({"workload": "W2", "variant": "map", "unit": "GB/s", "amount": 2.0,
                              "status": "ok", "repeats_s": [0.5, 1.0, 2.0]}, "")
    assert ok.status == OK and ok.figure == pytest.approx(2.0)
    path, why = _programs.find_program(_programs.BASELINE, str(tmp_path))
    assert path is None and "not found" in why and "GPUPOOL_BENCH_DIR" in why


def test_unknown_workload_is_an_error(capsys):
    with pytest.raises(SystemExit):
        main(["--workloads", "W9"])
    assert "unknown workload" in capsys.readouterr().err


@pytest.mark.parametrize("option, name, why", [
    ("--json", "missing/out.json", "no such directory"),
    ("--plot", "missing/out.png", "no such directory"),
    ("--plot", "out.gif", "extension"),
    ("--json", ".", "it is a directory"),
])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(tmp_path, monkeypatch,
                                                                     capsys, option, name, why):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("gpupool.compare.run", lambda args: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as exited:
        main(["--tiny", "--workloads", "W1", option, name])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert name in err and why in err


def test_a_whole_run_reports_a_wrong_variant_failed_untimed_and_exits_1(tmp_path, monkeypatch):
    # NumPy's own square, as the NumPy-on-the-CPU variants call it, made wrong for this test.
    monkeypatch.setattr(np, "square", lambda x: x + 1.0)
    out = tmp_path / "compare.json"
    status = main(["--tiny", "--backend", "cpu", "--repeat", "2", "--min-repeat", "1",
                   "--seconds", "0.2", "--workloads", "W1", "--quiet", "--json", str(out)])
    assert status == 1
    got = rows(json.loads(out.read_text()), "W1")
    wrong = got["NumPy on the CPU, 1 thread"]
    assert wrong["status"] == FAILED and "wrong result" in wrong["reason"]
    assert wrong["figure"] is None and wrong["repeats_s"] == []
    ours = next(r for name, r in got.items() if name.startswith("gpupool (Python) map, defaults"))
    assert ours["status"] == OK and ours["repeats_s"]


def test_the_gpupool_command_runs_compare(tmp_path):
    out = tmp_path / "compare.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gpupool", "compare", "--tiny", "--backend", "cpu", "--repeat", "1",
         "--min-repeat", "1", "--seconds", "0.1", "--workloads", "W1", "--quiet",
         "--json", str(out)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, GPUPOOL_QUIET="1"))
    assert proc.returncode == 0, proc.stderr
    ours = next(r for name, r in rows(json.loads(out.read_text()), "W1").items()
                if name.startswith("gpupool (Python) map, defaults"))
    assert ours["status"] == OK and ours["repeats_s"]


def test_w8_alone_runs_on_data_of_its_own(tmp_path):
    # Without W2 and W4 in the run, W8 makes data of their sizes rather than asking for them: on a
    # GPU with CuPy its rows run (and their results are checked); elsewhere they say why not.
    out = tmp_path / "compare.json"
    status = main(["--tiny", "--repeat", "1", "--min-repeat", "1", "--seconds", "0.1",
                   "--workloads", "W8", "--quiet", "--json", str(out)])
    document = json.loads(out.read_text())
    assert not rows(document, "W2") and not rows(document, "W4")  # W8 alone ran
    runs_here = document["settings"]["backend"] == "cuda" and HAS_CUPY
    for table in ("W8@W2", "W8@W4"):
        got = rows(document, table)
        assert got, table
        for name, r in got.items():
            assert "--workloads" not in r["reason"], (table, name, r["reason"])
            if runs_here:
                assert r["status"] == OK and r["figure"] > 0, (table, name, r["reason"])
            else:
                assert r["status"] == SKIPPED and "CuPy" in r["reason"], (table, name)
    assert status == 0


FULL_SIZE = sizes(False, 1.0)
W1_BYTES = FULL_SIZE["W1"][0] * FULL_SIZE["W1"][1] * 8
W4_TASK_BYTES = FULL_SIZE["W4"][1] * 8


def limit_of(workload, limits, gpus=1, results=()):
    return _report.workload_limit(workload, limits, list(results), FULL_SIZE, gpus)[0]


def test_each_limit_is_the_bound_of_any_program():
    """The copy engines (pinned copies both ways at once, on every GPU) bound W1-W4 and W8: a
    program may skip the host memcpy (a slower rate here) and coalesce W4's tasks into few
    launches, so neither is a limit. W4's is its data volume at that rate."""
    limits = {"both_gb_s": 48.0, "all_both_gb_s": 48.5, "host_memcpy_gb_s": 30.0,
              "launch_us": 5.0}
    for workload in ("W2", "W3", "W8@W2"):
        assert limit_of(workload, limits) == 48.5
    assert limit_of("W1", limits) == pytest.approx(W1_BYTES / 48.5e9 * 1e3)
    for workload in ("W4", "W8@W4"):
        assert limit_of(workload, limits) == pytest.approx(48.5e9 / W4_TASK_BYTES)
        assert limit_of(workload, limits) > 1e6 / limits["launch_us"]
    # GPU 0's copies alone (through CuPy) on a machine of two: as fast on each GPU at best.
    assert limit_of("W2", {"both_gb_s": 40.0, "host_memcpy_gb_s": 9.0}, gpus=2) == 80.0
    assert limit_of("W2", {"both_gb_s": 40.0, "host_memcpy_gb_s": 9.0}) == 40.0
    # No GPU copies measured (the CPU backend): every program reads and writes host memory.
    assert limit_of("W2", {"host_memcpy_gb_s": 9.0}) == 9.0
    assert limit_of("W4", {"host_memcpy_gb_s": 9.0}) == pytest.approx(9e9 / W4_TASK_BYTES)
    # W5: the fastest one launch over all the data (ms: the lowest); W6: every GPU's copies at
    # once (GB/s: its rows' rate on every GPU is what it bounds); W6c: the GPUs.
    launches = [Result("W5", "CuPy one launch over all the data (limit)", LIMIT, OK, "ms", 4.1),
                Result("W5", "CUDA one launch over all the data (limit)", LIMIT, OK, "ms", 3.6),
                Result("W5", "gpupool (Python) map", GPUPOOL, OK, "ms", 3.0)]
    assert limit_of("W5", limits, results=launches) == 3.6
    assert limit_of("W6", limits, gpus=2) == 48.5
    assert limit_of("W6c", limits, gpus=4) == 4.0
    assert limit_of("W2", {}) is None


def summary_of(results, limits, gpus=1):
    class Comparison:
        pass

    Comparison.results, Comparison.limits, Comparison.size, Comparison.gpus = \
        results, limits, FULL_SIZE, gpus
    return _report.summarise(Comparison)


def test_a_share_above_the_limit_is_never_shown_silently():
    limits = {"all_both_gb_s": 40.0, "host_memcpy_gb_s": 30.0}
    results = [Result("W2", "motivating program, 5 threads", ANCHOR, OK, "GB/s", 2.0),
               Result("W2", "NumPy on the CPU, 16 threads", ALTERNATIVE, OK, "GB/s", 30.0),
               Result("W2", "gpupool (Python) map, defaults", GPUPOOL, OK, "GB/s", 42.0)]
    tables = summary_of(results, limits)
    rows = {r["variant"]: r for r in tables["W2"]["rows"]}
    over = rows["gpupool (Python) map, defaults"]
    assert over["of_limit"] == pytest.approx(42 / 40)
    assert "105% of the limit" in over["note"] and "measured low" in over["note"]
    assert "note" not in rows["NumPy on the CPU, 16 threads"]
    assert rows["NumPy on the CPU, 16 threads"]["of_limit"] == pytest.approx(0.75)
    assert len(tables["W2"]["notes"]) == 1
    text = _report.table_text(tables, lambda w: "test")
    assert "105%!" in text
    assert "! above the limit: gpupool (Python) map, defaults: 105% of the limit" in text
    # Within the limit: no mark, no note.
    results[2].figure = 39.0
    tables = summary_of(results, limits)
    assert tables["W2"]["notes"] == [] and "%!" not in _report.table_text(tables, lambda w: "")


def test_floors_have_no_share_and_w6_is_judged_by_its_rate_on_every_gpu():
    limits = {"all_both_gb_s": 90.0, "both_gb_s": 46.0}
    results = [
        Result("W4", "ThreadPoolExecutor running a no-op, 1 thread (floor)", LIMIT, OK,
               "tasks/s", 9e9),
        Result("W4", "gpupool (Python) map", GPUPOOL, OK, "tasks/s", 2.5e5),
        Result("W6", "gpupool (Python) map", GPUPOOL, OK, "x", 1.9,
               extra={"gb_per_s_every_gpu": 72.0, "gb_per_s_one_gpu": 38.0}),
        Result("W6", "gpupool (C++) map", GPUPOOL, OK, "x", 1.8,
               extra={"per_device": {"gb_per_s_every_gpu": 81.0, "gb_per_s_one_gpu": 45.0}})]
    tables = summary_of(results, limits, gpus=2)
    w4 = {r["variant"]: r for r in tables["W4"]["rows"]}
    assert w4["ThreadPoolExecutor running a no-op, 1 thread (floor)"]["of_limit"] is None
    assert w4["gpupool (Python) map"]["of_limit"] == pytest.approx(2.5e5 * W4_TASK_BYTES / 90e9)
    w6 = {r["variant"]: r for r in tables["W6"]["rows"]}
    assert w6["gpupool (Python) map"]["of_limit"] == pytest.approx(0.8)
    assert w6["gpupool (C++) map"]["of_limit"] == pytest.approx(0.9)
    assert tables["W6"]["limit_unit"] == "GB/s"
    assert "90 GB/s" in _report.table_text(tables, lambda w: "")


def test_every_label_of_the_plot_is_whole_and_inside_the_figure():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    long_names = [
        "gpupool (Python) map of a compiled kernel over CuPy arrays into given outputs (out=), "
        "defaults (measured: 16 lanes x 4 MiB)",
        "(a) the motivating function unchanged in gpupool.Executor, 5 lanes x 4 MiB, with a "
        "name longer than any the comparison makes today",
        "motivating program, 5 threads (measured in turn with gpupool's rows) (measured in W2)",
        "NumPy on the CPU, 1 thread"]
    tables = {}
    for i, workload in enumerate(("W1", "W2", "W4", "W5", "W8@W2")):
        results = [Result(workload, name, kind, OK, "GB/s", 1.0 + j + i)
                   for j, (name, kind) in enumerate(zip(long_names,
                                                        (GPUPOOL, GPUPOOL, ANCHOR, ALTERNATIVE)))]
        tables.update(summary_of(results, {"all_both_gb_s": 3.0}))
    fig = _report.figure(tables, "gpupool compare (cpu, 0 GPU(s)): a machine with a long name")
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        texts = [t for t in fig.findobj(plt.Text) if t.get_visible() and t.get_text()]
        labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
        for name in long_names:  # each whole, wrapped at spaces, never cut
            assert sum(" ".join(label.split()) == name for label in labels) == len(tables), name
        assert len(texts) > 4 * len(tables)
        for t in texts:
            e = t.get_window_extent(renderer)
            assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, \
                (t.get_text(), e, box)
    finally:
        plt.close(fig)
