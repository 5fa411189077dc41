"""gpupool.elementwise and gpupool.raw_kernel: kernels compiled at run time, mapped over NumPy
arrays in C++ on every backend (host compiler on the CPU, NVRTC on CUDA), and over device arrays
(CuPy, PyTorch) on the GPU."""

import os
import subprocess
import sys
import textwrap

import gpupool
import numpy as np
import pytest


@pytest.fixture
def cpu_executor(backend):
    """Despite the name, on each backend: the CPU everywhere, CUDA where a GPU is usable."""
    with gpupool.Executor(threads_per_gpu=2, backend=backend, chunk_bytes=64 << 10) as ex:
        yield ex


@pytest.fixture
def gpu_executor():
    if not gpupool.cuda_available()[0]:
        pytest.skip("no usable GPU")
    with gpupool.Executor(threads_per_gpu=4, backend="cuda") as ex:
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
            # (the GPU may fuse a multiply and an add into one rounding)
            assert np.allclose(o, want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-5)


def test_arrays_and_scalars_mix_and_submit_works(cpu_executor):
    k = gpupool.elementwise("float64 x, float64 w", "float64 y", "y = w * x + sin(x);", "mix")
    x = np.linspace(-3, 3, 10_000)
    w = np.random.default_rng(2).random(10_000)
    assert np.allclose(cpu_executor.submit(k, x, w).result(), w * x + np.sin(x), rtol=1e-12)
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
    assert list((tmp_path / "cache" / "host").glob("*.so.entry"))


def test_numpy_scalars_and_zero_d_arrays_are_broadcast_numbers(cpu_executor):
    k = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = a * x;", "times")
    x = np.arange(5.0)
    for scalar in (np.float64(2.0), np.int64(2), np.array(2.0), 2):
        (out,) = cpu_executor.map(k, [x], scalar)
        assert out.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0], scalar
    assert cpu_executor.submit(k, x, np.float32(3.0)).result().tolist() == [0, 3, 6, 9, 12]


SAXPY = r"""
extern "C" __global__ void saxpy(const float* x, float a, const float* y, float* out,
                                 unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    out[i] = a * x[i] + y[i];
}
"""


def test_raw_kernels_run_on_the_gpu_and_say_why_not_on_the_cpu(cpu_executor):
    k = gpupool.raw_kernel(SAXPY, "saxpy", "float32* x, float32 a, float32* y", "float32* out")
    assert k.name == "saxpy" and k.inputs[0] == ("float32", "x", True)
    rng = np.random.default_rng(3)
    xs = [rng.random(n, dtype=np.float32) for n in (5, 100_000)]
    ys = [rng.random(n, dtype=np.float32) for n in (5, 100_000)]
    if cpu_executor.backend == "cpu":
        with pytest.raises(gpupool.BackendUnavailableError, match="needs a GPU"):
            cpu_executor.map(k, xs, 2.0, ys)
        return
    for out, x, y in zip(cpu_executor.map(k, xs, 2.0, ys), xs, ys):
        assert np.allclose(out, 2.0 * x + y, rtol=1e-6)
    with pytest.raises(ValueError, match="must be an array"):
        cpu_executor.map(k, xs, 2.0, 3.0)


def test_raw_kernel_signatures_are_checked():
    with pytest.raises(ValueError, match="exactly one output"):
        gpupool.raw_kernel(SAXPY, "saxpy", "float32* x", "float32* a, float32* b")
    with pytest.raises(ValueError, match="block"):
        gpupool.raw_kernel(SAXPY, "saxpy", "float32* x", "float32* y", block=4096)


FMA_CHAIN = "float v = x;\nfor (int i = 0; i < 64; ++i) v = v * a + b;\ny = v;"


def _fma_chain(x, a, b):
    v = x.astype(np.float64)
    for _ in range(64):
        v = v * a + b
    return v


@pytest.mark.gpu
def test_many_small_cupy_arrays_stay_on_the_gpu(gpu_executor):
    cp = pytest.importorskip("cupy")
    k = gpupool.elementwise("float32 x, float32 a, float32 b", "float32 y", FMA_CHAIN, "chain")
    rng = np.random.default_rng(9)
    host = [rng.uniform(-1, 1, n).astype(np.float32) for n in [1, 7, 16384] * 100 + [0]]
    chunks = [cp.asarray(h) for h in host]
    out = list(gpu_executor.map(k, chunks, 0.99, 0.01))
    assert len(out) == len(chunks)
    for o, h in zip(out, host):
        assert isinstance(o, cp.ndarray) and o.shape == h.shape and o.dtype == np.float32
        assert np.allclose(cp.asnumpy(o), _fma_chain(h, 0.99, 0.01), rtol=1e-4, atol=1e-5)
    # Shapes are kept, and one call through submit works too.
    m = cp.asarray(rng.random((30, 40), dtype=np.float32))
    got = gpu_executor.submit(k, m, 0.5, 0.0).result()
    assert got.shape == (30, 40)
    assert np.allclose(cp.asnumpy(got), _fma_chain(cp.asnumpy(m), 0.5, 0.0), rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_raw_kernels_and_torch_tensors_on_the_gpu(gpu_executor):
    torch = pytest.importorskip("torch")
    k = gpupool.raw_kernel(SAXPY, "saxpy", "float32* x, float32 a, float32* y", "float32* out")
    shapes = (3, 5000, 70_000, (40, 50))
    xs = [torch.rand(n, device="cuda") for n in shapes]
    ys = [torch.rand(n, device="cuda") for n in shapes]
    for out, x, y in zip(gpu_executor.map(k, xs, 3.0, ys), xs, ys):
        assert isinstance(out, torch.Tensor) and out.device.type == "cuda"
        assert out.shape == x.shape and out.is_contiguous()
        assert torch.allclose(out, 3.0 * x + y)


@pytest.mark.gpu
def test_host_and_device_arrays_do_not_mix(gpu_executor):
    cp = pytest.importorskip("cupy")
    k = gpupool.elementwise("float64 x, float64 y", "float64 z", "z = x + y;", "plus")
    with pytest.raises(TypeError, match="not a device array"):
        gpu_executor.map(k, [cp.ones(4)], [np.ones(4)])
    with pytest.raises(ValueError, match="elements"):
        gpu_executor.map(k, [cp.ones(4)], [cp.ones(5)])


UNUSABLE_CACHE = textwrap.dedent("""
    import sys, numpy as np, gpupool
    for c in (2.0, 3.0):  # two kernels, each in an executor of its own
        k = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = a * x + 0.25;",
                                "fallback_%d" % c)
        with gpupool.Executor(threads_per_gpu=1, chunk_bytes=1 << 20, backend=sys.argv[1]) as ex:
            (out,) = ex.map(k, [np.arange(1000.0)], c)
        assert out.tolist() == [c * i + 0.25 for i in range(1000)], out[:5]
    print("compiled", gpupool._ext.kernels_compiled())
""")


@pytest.mark.parametrize("place", ["under a file", "open to others", "of another user"])
def test_an_unusable_cache_folder_compiles_for_the_process_and_says_so_once(backend, place,
                                                                            tmp_path):
    (tmp_path / "file").write_text("not a folder\n")
    cache = tmp_path / "cache"
    if place == "under a file":  # refused to anyone, root included
        cache = tmp_path / "file" / "cache"
    else:
        cache.mkdir()
        if place == "open to others":
            cache.chmod(0o777)
        else:
            if os.geteuid() != 0:
                pytest.skip("giving a folder to another user needs root (CI runs as root)")
            os.chown(cache, 65534, 65534)
    env = dict(os.environ, GPUPOOL_CACHE_DIR=str(cache))
    env.pop("GPUPOOL_QUIET", None)
    proc = subprocess.run([sys.executable, "-c", UNUSABLE_CACHE, backend], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["compiled", "2"], proc.stdout
    warnings = [line for line in proc.stderr.splitlines()
                if "not using the kernel cache" in line]
    assert len(warnings) == 1, proc.stderr
    assert str(cache) in warnings[0], warnings[0]
    if cache.is_dir():
        assert not any(p.is_file() for p in cache.rglob("*")), "nothing is written there"
    # GPUPOOL_QUIET=1 silences the notice; the kernels still run.
    quiet = subprocess.run([sys.executable, "-c", UNUSABLE_CACHE, backend],
                           env=dict(env, GPUPOOL_QUIET="1"), capture_output=True, text=True,
                           timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert "not using the kernel cache" not in quiet.stderr, quiet.stderr
