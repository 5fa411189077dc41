"""README.md's Python and command-line sections work as written."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_python_blocks_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUPOOL_QUIET", "1")
    python_blocks = blocks("python")
    if importlib.util.find_spec("distributed") is None:  # without the dask extra
        python_blocks = [b for b in python_blocks if "gpupool.dask" not in b]
    code = "\n".join(python_blocks)
    assert "import gpupool" in code
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})  # noqa: S102
    assert (tmp_path / "w2.json").exists()
    assert (tmp_path / "w2.png").read_bytes()[:4] == b"\x89PNG"


def test_command_line_examples_run(tmp_path):
    script = pathlib.Path(sys.executable).parent / "gpupool"
    if not script.exists():
        pytest.skip("no gpupool console script beside this Python (not a pip install)")
    demo = next(line for block in blocks("sh") for line in block.splitlines()
                if line.startswith("gpupool demo"))
    env = dict(os.environ, GPUPOOL_QUIET="1", PATH=f"{script.parent}{os.pathsep}"
               f"{os.environ.get('PATH', '')}")
    done = subprocess.run(demo.split(), cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "demo.json").exists()
