"""gpupool.elementwise: one-line kernels compiled at run time, mapped over NumPy arrays in C++.
These run on the CPU backend (host compiler); the CUDA backend's NVRTC path comes later."""

import os
import subprocess
import sys
import textwrap

import gpupool
import numpy as np
import pytest


@pytest.fixture
def cpu_executor():
    with gpupool.Executor(threads_per_gpu=2, backend="cpu", chunk_bytes=64 << 10) as ex:
        yield ex


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_results_equal_numpy(cpu_executor, dtype):
    k = gpupool.elementwise(f"{dtype} x, {dtype} a, {dtype} b", f"{dtype} y",
                            "y = a * x * x + b;", f"poly_{dtype}")
    rng = np.random.default_rng(4)
    if dtype.startswith("int"):
        xs = [rng.integers(-1000, 1000, n).astype(dtype) for n in (1, 999, 70_001)]
    else:
        xs = [rng.uniform(-10, 10, n).astype(dtype) for n in (1, 999, 70_001)]
    out = list(cpu_executor.map(k, xs, 3, 7))
    for o, x in zip(out, xs):
        want = np.asarray(3, dtype) * x * x + np.asarray(7, dtype)
        assert o.dtype == np.dtype(dtype) and o.shape == x.shape
        if dtype.startswith("int"):
            assert np.array_equal(o, want)
        else:
            assert np.allclose(o, want, rtol=1e-5 if dtype == "float32" else 1e-12)


def test_arrays_and_scalars_mix_and_submit_works(cpu_executor):
    k = gpupool.elementwise("float64 x, float64 w", "float64 y", "y = w * x + sin(x);", "mix")
    x = np.linspace(-3, 3, 10_000)
    w = np.random.default_rng(2).random(10_000)
    assert np.allclose(cpu_executor.submit(k, x, w).result(), w * x + np.sin(x))
    (out,) = cpu_executor.map(k, [x], 0.5)
    assert np.allclose(out, 0.5 * x + np.sin(x))
    m = x.reshape(100, 100)
    (shaped,) = cpu_executor.map(k, [m], 1.0)
    assert shaped.shape == (100, 100)


def test_a_syntax_error_raises_compile_error_with_log_and_line(cpu_executor):
    bad = gpupool.elementwise("float64 x", "float64 y", "double t = x;\ny = t +* ;", "broken")
    with pytest.raises(gpupool.CompileError) as info:
        cpu_executor.map(bad, [np.ones(4)])
    assert info.value.line == 2
    assert "error" in info.value.log
    assert isinstance(info.value, gpupool.GpupoolError)


def test_bad_calls_fail_at_the_call(cpu_executor):
    k = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = a * x;", "scale")
    with pytest.raises(TypeError, match="takes 2"):
        cpu_executor.map(k, [np.ones(3)])
    with pytest.raises(ValueError, match="elements"):
        cpu_executor.map(k, [np.ones(3)], [np.ones(4)])
    with pytest.raises(ValueError, match="float32 array"):
        cpu_executor.map(k, [np.ones(3, dtype=np.float32)], 2.0)
    with pytest.raises(TypeError, match="at least one array"):
        cpu_executor.submit(k, 1.0, 2.0)
    with pytest.raises(ValueError):
        gpupool.elementwise("float16 x", "float64 y", "y = x;")


def test_a_second_process_loads_the_kernel_without_compiling(tmp_path):
    script = textwrap.dedent("""
        import time, numpy as np, gpupool
        k = gpupool.elementwise("float64 x", "float64 y", "y = x * 3.25 - 1;", "cached")
        with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
            t0 = time.perf_counter()
            (out,) = ex.map(k, [np.arange(10.0)])
            seconds = time.perf_counter() - t0
        assert out[2] == 5.5
        print(gpupool._ext.kernels_compiled(), seconds)
    """)
    env = dict(os.environ, GPUPOOL_CACHE_DIR=str(tmp_path / "cache"))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, check=True).stdout.split() for _ in range(2)]
    (compiled_first, first_s), (compiled_second, second_s) = runs
    assert (compiled_first, compiled_second) == ("1", "0")
    print(f"first call with compiling: {float(first_s) * 1e3:.1f} ms; "
          f"from the disk cache: {float(second_s) * 1e3:.1f} ms")
    assert list((tmp_path / "cache" / "host").glob("*.so"))


def test_numpy_scalars_and_zero_d_arrays_are_broadcast_numbers(cpu_executor):
    k = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = a * x;", "times")
    x = np.arange(5.0)
    for scalar in (np.float64(2.0), np.int64(2), np.array(2.0), 2):
        (out,) = cpu_executor.map(k, [x], scalar)
        assert out.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0], scalar
    assert cpu_executor.submit(k, x, np.float32(3.0)).result().tolist() == [0, 3, 6, 9, 12]
