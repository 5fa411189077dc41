"""The `gpupool` command that `pip install .` installs, and `python -m gpupool`: the commands of
the C++ tool, with pictures drawn by matplotlib; outputs that cannot be written are errors."""

import json
import os
import pathlib
import pty
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import gpupool
import numpy as np
import pytest
from gpupool import _cli

PNG = b"\x89PNG\r\n\x1a\n"
QUIET = dict(os.environ, GPUPOOL_QUIET="1", GPUPOOL_BACKEND="cpu")


def console_script():
    script = pathlib.Path(sys.executable).parent / "gpupool"
    if not script.exists():
        pytest.skip(f"no gpupool console script beside {sys.executable} (not a pip install)")
    return [str(script)]


MODULE = [sys.executable, "-m", "gpupool"]


def run(command, *args, env=QUIET):
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_the_package_holds_the_tool():
    assert _cli.tool_path().is_file(), "pip install . puts the C++ tool in gpupool/bin"


@pytest.mark.parametrize("how", ["script", "module"])
def test_demo_draws_the_timeline_as_png(how, tmp_path):
    command = console_script() if how == "script" else MODULE
    picture = tmp_path / "demo timeline $HOME.png"  # a space and a $ stay part of the name
    done = run(command, "demo", "--size", 20000, "--show", 0, "--timeline", picture)
    assert done.returncode == 0, done.stderr
    assert "all 100000 results equal the CPU reference" in done.stdout
    assert picture.read_bytes()[:8] == PNG
    assert f"timeline: {picture}" in done.stderr


def test_version_and_info():
    for command in (console_script(), MODULE):
        done = run(command, "--version")
        assert done.returncode == 0 and done.stdout.strip() == f"gpupool {gpupool.__version__}"
    done = run(MODULE, "info")
    assert done.returncode == 0 and "backend:          cpu" in done.stdout


def test_picture_types_follow_the_extension(tmp_path):
    done = run(MODULE, "demo", "--size", 5000, "--show", 0, "--timeline", tmp_path / "t.svg",
               "--trace", tmp_path / "t.json")
    assert done.returncode == 0, done.stderr
    ET.parse(tmp_path / "t.svg")
    assert "traceEvents" in json.loads((tmp_path / "t.json").read_text())
    done = run(MODULE, "demo", "--size", 5000, "--show", 0, "--timeline", tmp_path / "t.pdf")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "t.pdf").read_bytes()[:5] == b"%PDF-"
    # .json: the records themselves, written by the tool.
    done = run(MODULE, "demo", "--size", 5000, "--show", 0, "--timeline", tmp_path / "r.json")
    assert done.returncode == 0 and json.loads((tmp_path / "r.json").read_text())["records"]
    done = run(MODULE, "demo", "--size", 5000, "--timeline", tmp_path / "t.jpg")
    assert done.returncode == 2
    assert "--timeline" in done.stderr and ".png, .svg, .pdf" in done.stderr
    assert not (tmp_path / "t.jpg").exists()


def test_bench_plots_and_writes_its_json(tmp_path):
    done = run(MODULE, "bench", "--lanes-list", "1,2", "--sizes", "64K,128K", "--total", "1M",
               "--repeat", 1, "--plot", tmp_path / "b.png", "--json", tmp_path / "b.json",
               "--csv", tmp_path / "b.csv")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "b.png").read_bytes()[:8] == PNG
    assert len(json.loads((tmp_path / "b.json").read_text())["points"]) == 4
    assert len((tmp_path / "b.csv").read_text().splitlines()) == 5
    assert f"plot: {tmp_path / 'b.png'}" in done.stdout


@pytest.mark.parametrize("args", [
    ["demo", "--size", 1000, "--timeline", "/nonexistent/dir/t.png"],
    ["demo", "--size", 1000, "--trace", "/nonexistent/dir/t.json"],
    ["bench", "--sizes", "64K", "--lanes-list", 1, "--total", "1M", "--plot",
     "/nonexistent/dir/b.svg"],
    ["bench", "--sizes", "64K", "--lanes-list", 1, "--total", "1M", "--json",
     "/nonexistent/dir/b.json"],
])
def test_outputs_that_cannot_be_written_are_errors(args):
    done = run(MODULE, *args)
    assert done.returncode != 0
    assert "cannot write /nonexistent/dir/" in done.stderr
    assert "gpupool: gpupool:" not in done.stderr


def test_bad_environment_values_are_refused():
    done = run(MODULE, "info", env=dict(QUIET, GPUPOOL_EVENT_WAIT="bogus"))
    assert done.returncode != 0
    assert "GPUPOOL_EVENT_WAIT must be 'spin' or 'block', not 'bogus'" in done.stderr
    for name, value, message in (
            ("GPUPOOL_PINNED_CACHE_BYTES", "lots", "GPUPOOL_PINNED_CACHE_BYTES"),
            ("GPUPOOL_LANE_SPIN_US", "-5", "GPUPOOL_LANE_SPIN_US must be microseconds .*'-5'")):
        with pytest.raises(ValueError, match=message):
            os.environ[name] = value
            try:
                gpupool.Executor(backend="cpu")
            finally:
                del os.environ[name]


def test_cpu_notice_once_per_process_and_silenced_by_GPUPOOL_QUIET():
    code = ("import gpupool\n"
            "for _ in range(3):\n"
            "    gpupool.Executor().shutdown()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GPUPOOL_BACKEND", "GPUPOOL_QUIET")}
    if gpupool.cuda_available()[0]:
        pytest.skip("a usable GPU: there is no CPU-backend notice")
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert loud.stderr.count("running on the CPU backend") == 1
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(env, GPUPOOL_QUIET="1"))
    assert quiet.returncode == 0 and quiet.stderr == ""
    # The quiet option does the same for its executor.
    option = subprocess.run([sys.executable, "-c", code.replace("Executor()",
                                                                "Executor(quiet=True)")],
                            capture_output=True, text=True, env=env)
    assert option.returncode == 0 and option.stderr == ""


def test_progress_line_is_cleared_before_the_results():
    # On a terminal the demo draws a progress line on standard error; the results on standard
    # output must start on a clean line.
    tool = _cli.tool_path()
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(str(tool), [str(tool), "demo", "--size", "2000", "--repeat", "20"], QUIET)
    output = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    os.waitpid(pid, 0)
    assert b"demo runs:" in output, output
    before, _, _ = output.partition(b"task 0:")
    assert before.endswith(b"\r\x1b[K"), before[-80:]


def test_choices_come_from_the_tables(tmp_path):
    """--kernel offers every built-in of the C++ table and --dtype every dtype; a two-array
    built-in runs in the bench; the demo's records file carries the stage table."""
    done = run(MODULE, "bench", "--help")
    assert done.returncode == 0, done.stderr
    names = [k["name"] for k in gpupool._ext.builtin_kernels()]
    assert "{" + ",".join(names) + "}" in done.stdout
    assert "{" + ",".join(gpupool._ext.dtypes()) + "}" in done.stdout
    done = run(MODULE, "bench", "--lanes-list", "1", "--sizes", "64K", "--total", "256K",
               "--repeat", "1", "--kernel", "axpy", "--dtype", "int32",
               "--json", tmp_path / "b.json")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "b.json").read_text())["kernel"] == "axpy"
    done = run(MODULE, "bench", "--kernel", "cube")
    assert done.returncode != 0 and "cube not in" in done.stderr
    done = run(MODULE, "demo", "--size", 5000, "--show", 0, "--timeline", tmp_path / "r.json")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "r.json").read_text())["stages"] == \
        gpupool._ext.trace_stages()


STEADY = re.compile(r"^  steady state: (?P<median>[\d.]+) ms median of (?P<repeat>\d+) timed runs "
                    r"after (?P<warmup>\d+) warm-up runs? \(min (?P<min>[\d.]+), IQR "
                    r"(?P<q1>[\d.]+)-(?P<q3>[\d.]+), max (?P<max>[\d.]+) ms\): [\d.]+ GB/s of "
                    r"input$", re.M)
COLD = re.compile(r"^  cold first run: (?P<cold>[\d.]+) ms \(", re.M)


def test_demo_reports_the_steady_state_apart_from_the_cold_first_run():
    """The headline is the median of the timed runs after the warm-up, with its spread; the
    first run, which pays what a process pays once, is on a line of its own."""
    done = run(MODULE, "demo", "--size", 20000, "--show", 0, "--warmup", 2, "--repeat", 7,
               "--no-compare")
    assert done.returncode == 0, done.stderr
    steady, cold = STEADY.search(done.stdout), COLD.search(done.stdout)
    assert steady and cold, done.stdout
    assert (int(steady["repeat"]), int(steady["warmup"])) == (7, 2)
    figures = [float(steady[k]) for k in ("min", "q1", "median", "q3", "max")]
    assert figures == sorted(figures) and figures[0] > 0, figures
    assert float(cold["cold"]) > 0
    assert done.stdout.index("steady state:") < done.stdout.index("cold first run:")
    assert "motivating program" not in done.stdout  # --no-compare

    # The same figures in the JSON object: each timed run, and the cold one apart from them.
    done = run(MODULE, "demo", "--size", 20000, "--warmup", 2, "--repeat", 7, "--json",
               "--no-compare")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    times = report["times_ms"]
    assert len(times) == 7 and report["warmup"] == 2 and report["cold_ms"] > 0
    assert report["median_ms"] == pytest.approx(float(np.median(times)))
    assert report["q1_ms"] == pytest.approx(float(np.percentile(times, 25)))
    assert report["q3_ms"] == pytest.approx(float(np.percentile(times, 75)))
    assert (report["best_ms"], report["max_ms"]) == (min(times), max(times))
    assert report["wrong"] == 0 and "motivating_program" not in report


def fake_cupy(folder, square="x ** 2", importable=True):
    """A `cupy` module on NumPy that the demo finds first on the path: one GPU, the motivating
    program's calls, and `array ** 2` computed as `square` says."""
    folder.mkdir()
    if not importable:
        (folder / "cupy.py").write_text("raise ImportError('no cupy here')\n")
    else:
        (folder / "cupy.py").write_text(
            "import types\nimport numpy as np\n"
            "class _A(np.ndarray):\n"
            f"    def __pow__(self, p):\n        x = np.asarray(self)\n        return {square}\n"
            "def array(x):\n    return np.array(x).view(_A)\n"
            "asnumpy = np.asarray\nzeros = np.zeros\n"
            "class _Device:\n    def synchronize(self):\n        pass\n"
            "cuda = types.SimpleNamespace(Device=_Device, runtime=types.SimpleNamespace("
            "getDeviceCount=lambda: 1))\n")
    return dict(QUIET, PYTHONPATH=os.pathsep.join(
        p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p))


def test_without_cupy_the_demo_says_in_one_line_that_the_comparison_was_skipped(tmp_path):
    done = run(MODULE, "demo", "--size", 2000, "--repeat", 3,
               env=fake_cupy(tmp_path / "none", importable=False))
    assert done.returncode == 0, done.stderr
    about = [line for line in done.stdout.splitlines() if "motivating program" in line]
    assert about == ["motivating program (CuPy in a ThreadPoolExecutor) not run beside it: "
                     "CuPy is not installed"], done.stdout
    done = run(MODULE, "demo", "--size", 2000, "--repeat", 3, "--json",
               env=fake_cupy(tmp_path / "none-json", importable=False))
    assert json.loads(done.stdout)["motivating_program"] == {"skipped": "CuPy is not installed"}


def test_with_cupy_the_motivating_program_runs_beside_it_checked_with_the_ratio(tmp_path):
    env = fake_cupy(tmp_path / "cupy")
    done = run(MODULE, "demo", "--size", 3000, "--chunks", 3, "--warmup", 1, "--repeat", 4,
               env=env)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "motivating program (cupy.asnumpy(cupy.array(chunk) ** 2) in " \
           "ThreadPoolExecutor(max_workers=5)" in text and "results equal NumPy's" in text
    beside = text[text.index("motivating program (cupy"):]
    steady = STEADY.search(beside)
    assert steady and (steady["repeat"], steady["warmup"]) == ("4", "1"), beside
    assert COLD.search(beside), beside
    ratio = re.search(r"^gpupool vs the motivating program: ([\d.]+)x as fast in the steady "
                      r"state \(([\d.]+) vs ([\d.]+) ms median\), ([\d.]+)x on the cold first "
                      r"run", text, re.M)
    assert ratio, text
    # The ratio is of the unrounded medians; the times are printed to 0.001 ms (and the ratio
    # to 0.01), which for the tiny sizes here can move it by several percent.
    mine, theirs = float(ratio[2]), float(ratio[3])
    low = (theirs - 0.0005) / (mine + 0.0005) - 0.005
    high = (theirs + 0.0005) / max(mine - 0.0005, 1e-9) + 0.005
    assert low <= float(ratio[1]) <= high, (ratio[0], low, high)

    done = run(MODULE, "demo", "--size", 3000, "--chunks", 3, "--repeat", 4, "--json", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    beside_json = report["motivating_program"]
    assert (beside_json["chunks"], beside_json["size"], len(beside_json["times_ms"])) == \
        (3, 3000, 4)
    assert beside_json["x_steady"] == pytest.approx(beside_json["median_ms"] /
                                                    report["median_ms"])
    assert beside_json["x_cold"] == pytest.approx(beside_json["cold_ms"] / report["cold_ms"])


def test_a_wrong_motivating_result_fails_the_demo(tmp_path):
    done = run(MODULE, "demo", "--size", 1000, "--repeat", 2,
               env=fake_cupy(tmp_path / "cupy", square="x * x + 1"))
    assert done.returncode == 1
    assert "the motivating program's first run differs from NumPy" in done.stderr
