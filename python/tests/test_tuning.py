"""Lanes and chunk size left at "auto": the fixed defaults on the CPU backend, a measured and
cached choice when asked for (as on CUDA by default), reported by Executor.settings and by
`gpupool info`; given values always win."""

import os

import gpupool
import numpy
import pytest

from test_cli import MODULE, QUIET, run


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("GPUPOOL_CACHE_DIR", str(folder))
    monkeypatch.delenv("GPUPOOL_TUNING", raising=False)
    return folder


def test_auto_on_the_cpu_backend_is_the_fixed_default(cache_dir):
    with gpupool.Executor(backend="cpu", cpu_devices=1) as ex:
        s = ex.settings
        assert s["threads_per_gpu_from"] == "fixed" and s["chunk_bytes_from"] == "fixed"
        assert s["threads_per_gpu"] == ex.threads_per_gpu
        assert s["chunk_bytes"] == ex.chunk_bytes == 8 << 20
        assert s["samples"] == [] and s["cache_file"] is None
    assert not (cache_dir / "tuning").exists()


def test_a_measured_choice_is_the_best_sample_cached_and_read_back(cache_dir):
    with gpupool.Executor(backend="cpu", cpu_devices=1, tuning="measured") as ex:
        s = ex.settings
        assert s["threads_per_gpu_from"] == "measured", s["note"]
        best = max(s["samples"], key=lambda p: p["bytes_per_second"])
        assert (ex.threads_per_gpu, ex.chunk_bytes) == (best["threads_per_gpu"],
                                                        best["chunk_bytes"])
        assert os.path.isfile(s["cache_file"])
        assert str(cache_dir) in s["cache_file"]
        result = list(ex.map(gpupool.kernels.square, [numpy.array([1.0, 2.0, 3.0])]))[0]
        assert result.tolist() == [1.0, 4.0, 9.0]
    with gpupool.Executor(backend="cpu", cpu_devices=1, tuning="measured") as again:
        assert again.settings["threads_per_gpu_from"] == "cached"
        assert again.settings["samples"] == s["samples"]


def test_given_values_win_and_auto_is_spelled_auto_or_none(cache_dir):
    with gpupool.Executor(3, backend="cpu", cpu_devices=1, chunk_bytes=1 << 20,
                          tuning="remeasure") as ex:
        assert ex.settings["threads_per_gpu_from"] == "given"
        assert ex.settings["chunk_bytes_from"] == "given"
        assert (ex.threads_per_gpu, ex.chunk_bytes) == (3, 1 << 20)
    for auto in ("auto", None):
        with gpupool.Executor(auto, backend="cpu", chunk_bytes=auto) as ex:
            assert ex.settings["threads_per_gpu_from"] == "fixed"


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(threads_per_gpu="fast"), TypeError, "threads_per_gpu must be a whole number"),
    (dict(chunk_bytes="big"), TypeError, "chunk_bytes must be a byte count"),
    (dict(tuning="fastest"), ValueError, "tuning must be 'auto', 'measured'"),
])
def test_bad_tuning_arguments_name_the_parameter(kwargs, error, words):
    with pytest.raises(error, match=words):
        gpupool.Executor(backend="cpu", **kwargs)


def test_the_environment_overrides_the_option(cache_dir, monkeypatch):
    monkeypatch.setenv("GPUPOOL_TUNING", "fixed")
    with gpupool.Executor(backend="cpu", cpu_devices=1, tuning="remeasure") as ex:
        assert ex.settings["threads_per_gpu_from"] == "fixed"
    monkeypatch.setenv("GPUPOOL_TUNING", "sometimes")
    with pytest.raises(ValueError, match="GPUPOOL_TUNING .*'sometimes'"):
        gpupool.Executor(backend="cpu")


def test_gpupool_info_prints_the_choice_and_the_sweep(tmp_path):
    env = dict(QUIET, GPUPOOL_CACHE_DIR=str(tmp_path / "cache"), GPUPOOL_CPU_DEVICES="1")
    env.pop("GPUPOOL_TUNING", None)
    done = run(MODULE, "info", "--tuning", "remeasure", env=env)
    assert done.returncode == 0, done.stderr
    assert "(measured)" in done.stdout and "tuning sweep:" in done.stdout
    assert "tuning cache:" in done.stdout
    done = run(MODULE, "info", "--tuning", "measured", env=env)
    assert "(cached)" in done.stdout
    done = run(MODULE, "info", env=env)
    assert "(fixed)" in done.stdout, "the CPU backend's automatic choice is the fixed one"
    done = run(MODULE, "info", "--tuning", "sometimes", env=env)
    assert done.returncode != 0 and "--tuning" in done.stderr
