"""Built-in kernels through Executor.map/submit: the C++ fast path over NumPy arrays."""

import gc
import pathlib
import subprocess
import sys
import time

import gpupool
import numpy as np
import pytest

DTYPES = [np.float32, np.float64, np.int32, np.int64]


def random_array(rng, shape, dtype):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-20000, 20000, size=shape, dtype=dtype)
    return rng.uniform(-100, 100, size=shape).astype(dtype)


def close(got, want, dtype):
    if np.issubdtype(dtype, np.integer):
        return np.array_equal(got, want)
    return np.allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_results_equal_numpy_on_random_data(backend, dtype):
    rng = np.random.default_rng(7)
    with gpupool.Executor(threads_per_gpu=3, backend=backend, chunk_bytes=64 << 10) as ex:
        xs = [random_array(rng, n, dtype) for n in (1, 1000, 100_003)]
        ys = [random_array(rng, x.shape, dtype) for x in xs]
        for got, x in zip(ex.map(gpupool.kernels.square, xs), xs):
            assert got.dtype == x.dtype and got.shape == x.shape
            assert close(got, x * x, dtype)
        for got, x in zip(ex.map(gpupool.kernels.scale(3), xs), xs):
            assert close(got, x * dtype(3), dtype)
        for got, x, y in zip(ex.map(gpupool.kernels.add, xs, ys), xs, ys):
            assert close(got, x + y, dtype)
        for got, x, y in zip(ex.map(gpupool.kernels.axpy(2), xs, ys), xs, ys):
            assert close(got, dtype(2) * x + y, dtype)
        assert close(ex.submit(gpupool.kernels.square, xs[2]).result(30), xs[2] * xs[2], dtype)


def test_shape_is_kept(executor):
    m = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    (out,) = executor.map(gpupool.kernels.square, [m])
    assert out.shape == (2, 3, 4)
    assert np.array_equal(out, m * m)


def test_results_outlive_the_executor():
    with gpupool.Executor(threads_per_gpu=2, backend="cpu") as ex:
        results = list(ex.map(gpupool.kernels.square, [np.arange(5.0)] * 3))
    del ex
    assert [r.tolist() for r in results] == [[0.0, 1.0, 4.0, 9.0, 16.0]] * 3


def test_empty_inputs(executor):
    assert list(executor.map(gpupool.kernels.square, [])) == []
    (out,) = executor.map(gpupool.kernels.square, [np.zeros(0, dtype=np.float32)])
    assert out.shape == (0,) and out.dtype == np.float32


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (np.array(["a", "b"], dtype=object), TypeError, "dtype object"),
        (np.zeros(3, dtype=np.complex128), TypeError,
         r"unsupported dtype complex128; supported: float32, float64, int32, int64"),
        (np.zeros(3, dtype=np.float16), TypeError, r"dtype float16.*float32, float64, int32"),
        ([1.0, 2.0], TypeError, "is a list"),
        (np.zeros((4, 4))[:, ::2], ValueError, "not C-contiguous"),
    ],
)
def test_bad_inputs_fail_at_the_call_before_any_work(executor, bad, error, message):
    good = np.ones(10)
    with pytest.raises(error, match=message):
        executor.map(gpupool.kernels.square, [good, bad])
    with pytest.raises(error, match=message):
        executor.submit(gpupool.kernels.square, bad)


def test_mismatched_pairs_fail_at_the_call(executor):
    x = np.ones(10)
    with pytest.raises(ValueError, match=r"x\[0\] and y\[0\] differ in length or shape \(10 and 11"):
        executor.map(gpupool.kernels.add, [x], [np.ones(11)])
    with pytest.raises(ValueError, match=r"differ in dtype \(float64 and float32\)"):
        executor.map(gpupool.kernels.add, [x], [np.ones(10, dtype=np.float32)])
    with pytest.raises(ValueError, match=r"input lists differ in length \(2 arrays and 1\)"):
        executor.map(gpupool.kernels.add, [x, x], [x])
    with pytest.raises(ValueError, match="takes two"):
        executor.map(gpupool.kernels.add, [x])
    with pytest.raises(TypeError):
        executor.submit(gpupool.kernels.square, x, x)


def test_submit_of_a_built_in_over_numpy_checks_and_computes_as_map_does(backend):
    """submit(kernel, x[, y]) over NumPy arrays takes one call into the extension: the same
    results, errors and priorities as the general path (out=, a subclass, a list)."""
    x, y = np.arange(12.0), np.full(12, 0.5)
    with gpupool.Executor(threads_per_gpu=2, backend=backend) as ex:
        assert np.array_equal(ex.submit(gpupool.kernels.square, x).result(30), x * x)
        assert np.array_equal(ex.submit(gpupool.kernels.add, x, y).result(30), x + y)
        assert np.array_equal(ex.submit(gpupool.kernels.axpy(2), x, y).result(30), 2 * x + y)
        assert np.array_equal(ex.submit(gpupool.kernels.scale(3), x, priority=2).result(30),
                              3 * x)
        with pytest.raises(TypeError, match="kernel 'square' takes 1 array"):
            ex.submit(gpupool.kernels.square, x, y)
        with pytest.raises(TypeError, match="kernel 'add' takes 2 array"):
            ex.submit(gpupool.kernels.add, x)
        with pytest.raises(ValueError, match=r"x\[0\] and y\[0\] differ in length or shape"):
            ex.submit(gpupool.kernels.add, x, np.ones(11))
        with pytest.raises(TypeError, match=r"dtype complex128"):
            ex.submit(gpupool.kernels.square, np.zeros(3, dtype=np.complex128))
        with pytest.raises(TypeError, match="is a list"):
            ex.submit(gpupool.kernels.add, x, [0.5] * 12)
        with pytest.raises(ValueError, match="priority"):
            ex.submit(gpupool.kernels.square, x, priority=9)
        out = np.empty_like(x)
        assert ex.submit(gpupool.kernels.square, x, out=out).result(30) is out
        assert np.array_equal(out, x * x)
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(gpupool.kernels.square, x)


def test_no_memory_growth_over_ten_thousand_tasks(executor):
    arrays = [np.random.default_rng(i).random(2048) for i in range(100)]

    def batch():
        squares = list(executor.map(gpupool.kernels.square, arrays))
        futures = [executor.submit(gpupool.kernels.scale(2), a) for a in arrays[:50]]
        futures += [executor.submit(len, a) for a in arrays[:50]]
        assert np.array_equal(squares[-1], arrays[-1] ** 2)
        assert np.array_equal(futures[0].result(30), 2 * arrays[0])
        assert futures[-1].result(30) == 2048
        for f in futures:
            f.result(30)

    batch()
    gc.collect()  # results caught in reference cycles are freed by the collector, not at once
    pinned = gpupool._ext.pinned_bytes_in_use()
    device = [m["in_use"] for m in executor.memory_stats()]
    for _ in range(50):  # 50 x 200 = 10,000 tasks
        batch()
    gc.collect()
    assert gpupool._ext.pinned_bytes_in_use() <= pinned
    assert [m["in_use"] for m in executor.memory_stats()] == device


def test_pinned_arrays():
    a = gpupool.empty_pinned((3, 5), np.float32)
    assert a.shape == (3, 5) and a.dtype == np.float32
    assert gpupool.is_pinned(a) and gpupool.is_pinned(a[2])
    assert not gpupool.is_pinned(np.zeros(15))
    z = gpupool.zeros_pinned(7, np.int64)
    assert not z.any()
    c = gpupool.pinned_array(np.arange(4.0))
    assert gpupool.is_pinned(c) and c.tolist() == [0.0, 1.0, 2.0, 3.0]
    with gpupool.Executor(threads_per_gpu=2, backend="cpu") as ex:
        (out,) = ex.map(gpupool.kernels.square, [c])
        assert out.tolist() == [0.0, 1.0, 4.0, 9.0]


def test_results_live_in_pinned_memory_that_is_reused(executor):
    arrays = [np.random.default_rng(i).random(100_000) for i in range(8)]
    first = list(executor.map(gpupool.kernels.square, arrays))
    assert all(gpupool.is_pinned(r) for r in first)
    del first
    gc.collect()
    held = gpupool._ext.pinned_memory_stats()
    second = list(executor.map(gpupool.kernels.square, arrays))
    after = gpupool._ext.pinned_memory_stats()
    # The second round reuses the first round's blocks: nothing new is page-locked.
    assert after["in_use"] + after["cached"] == held["in_use"] + held["cached"]
    assert all(np.array_equal(r, a * a) for r, a in zip(second, arrays))


# Run in a process of its own: the cache's ages and its wait are the process's, which other tests
# (and a rerun of this one) would leave behind.
_SIZE_IN_USE_SCRIPT = """
import time
import numpy as np
import gpupool

ext = gpupool._ext
mb = 1 << 20
ext.set_pinned_cache_limit(64 * mb)
old = [gpupool.empty_pinned(16 * mb, np.uint8) for _ in range(4)]
del old
assert ext.pinned_memory_stats()["cached"] == 64 * mb
# Each 40 MB block is made and given back (the cache is full) until the 16 MB size has gone
# unused for two generations; then it is cached in place of three of them.
deadline = time.monotonic() + 30
while ext.pinned_memory_stats()["cached"] != 40 * mb + 16 * mb:
    assert ext.pinned_memory_stats()["cached"] == 64 * mb, ext.pinned_memory_stats()
    assert time.monotonic() < deadline, "the unused size never made way"
    block = gpupool.empty_pinned(40 * mb, np.uint8)
    del block
    time.sleep(0.02)
for _ in range(5):  # from the cache now: what is cached stays as it is
    block = gpupool.empty_pinned(40 * mb, np.uint8)
    assert ext.pinned_memory_stats()["cached"] == 16 * mb
    del block
    assert ext.pinned_memory_stats()["cached"] == 40 * mb + 16 * mb
print("kept")
"""


def test_a_full_pinned_cache_keeps_the_size_in_use_in_place_of_one_no_longer_used():
    # The process's cache, on its own clock: a size no block of which is taken or freed for two
    # generations (a second or more each, ended by a block made) makes way for the size in use,
    # which is then made no more. On a GPU machine the blocks are page-locked by CUDA.
    done = subprocess.run([sys.executable, "-c", _SIZE_IN_USE_SCRIPT], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "kept", done.stdout + done.stderr


class FakeDeviceArray:
    """Claims to live on a GPU through the CUDA Array Interface."""

    __cuda_array_interface__ = {"data": (0x1000, False), "shape": (4,), "typestr": "<f8",
                                "version": 3}


def test_device_arrays_need_the_cuda_backend():
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        with pytest.raises(TypeError, match="CUDA backend"):
            ex.map(gpupool.kernels.square, [FakeDeviceArray()])


def test_host_and_device_arrays_cannot_be_mixed_in_one_call(executor):
    with pytest.raises(TypeError):
        executor.map(gpupool.kernels.square, [np.ones(4), FakeDeviceArray()])


def test_every_built_in_of_the_table_is_exposed_and_computes_its_formula(backend):
    """gpupool.kernels is made from the C++ table: each built-in is there under its name (a
    BuiltinKernel, or a factory of one taking alpha), with the table's arity, and computes the table's
    formula (NumPy evaluates the same text) on every dtype of the table."""
    table = gpupool._ext.builtin_kernels()
    assert [k["name"] for k in table] == ["square", "scale", "add", "axpy"]
    assert gpupool.kernels.DTYPES == ["float32", "float64", "int32", "int64"]
    assert set(gpupool.kernels.__all__) >= {k["name"] for k in table}
    with gpupool.Executor(threads_per_gpu=2, backend=backend) as ex:
        for info in table:
            exposed = getattr(gpupool.kernels, info["name"])
            kernel = exposed(3) if info["takes_alpha"] else exposed
            assert isinstance(kernel, gpupool.kernels.BuiltinKernel)
            assert kernel.name == info["name"] and kernel.arity == info["arity"]
            assert info["formula"] in (exposed.__doc__ or "") + gpupool.kernels.__doc__
            for dtype in gpupool.kernels.DTYPES:
                x = np.array([1, -2, 5, 7], dtype=dtype)
                y = np.array([4, 3, -6, 0], dtype=dtype)
                want = eval(info["formula"], {"x": x, "y": y, "alpha": np.dtype(dtype).type(3)})
                args = (x, y)[:info["arity"]]
                got = ex.submit(kernel, *args).result(30)
                assert got.dtype == want.dtype and np.array_equal(got, want), (info, dtype)


def test_the_built_ins_are_builtin_kernels_and_kernel_is_the_old_name_of_that_class():
    """The built-ins' class is BuiltinKernel (beside ElementwiseKernel and RawKernel); Kernel, its
    old name, is the same class wherever it could be imported from."""
    assert isinstance(gpupool.kernels.square, gpupool.kernels.BuiltinKernel)
    assert isinstance(gpupool.kernels.scale(2), gpupool.kernels.BuiltinKernel)
    assert type(gpupool.kernels.square).__name__ == "BuiltinKernel"
    assert gpupool.kernels.BuiltinKernel is gpupool._ext.BuiltinKernel
    assert gpupool._ext.Kernel is gpupool._ext.BuiltinKernel
    with pytest.warns(DeprecationWarning, match="BuiltinKernel"):
        assert gpupool.kernels.Kernel is gpupool.kernels.BuiltinKernel
    with pytest.raises(AttributeError, match="sqaure"):
        gpupool.kernels.sqaure
    assert isinstance(gpupool._ext.Kernel.square(), gpupool.kernels.BuiltinKernel)


def test_the_docs_list_every_built_in_with_its_formula():
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs" / "kernels.md"
    if not docs.is_file():
        pytest.skip("no docs beside these tests (not a checkout)")
    text = docs.read_text()
    for k in gpupool._ext.builtin_kernels():
        row = (f"| `{k['name']}` | {k['arity']} | {'yes' if k['takes_alpha'] else 'no'} | "
               f"`{k['formula']}` |")
        assert row in text, f"docs/kernels.md lacks the row {row}"


def test_the_static_names_of_gpupool_kernels_equal_the_table():
    """kernels.pyi gives type checkers gpupool.kernels' names (made at import from the C++ table):
    a BuiltinKernel for each built-in without alpha, a function of alpha for the others, nothing else.
    A built-in added to (or renamed in) the table fails here until the stub says so too."""
    import ast

    stub = pathlib.Path(gpupool.kernels.__file__).with_suffix(".pyi")
    tree = ast.parse(stub.read_text())
    kernels, factories, exported = set(), set(), None
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.annotation) == "BuiltinKernel":
            kernels.add(node.target.id)
        elif isinstance(node, ast.FunctionDef):
            assert [a.arg for a in node.args.args] == ["alpha"], ast.unparse(node)
            assert ast.unparse(node.returns) == "BuiltinKernel"
            factories.add(node.name)
        elif isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
            exported = ast.literal_eval(node.value)
    table = gpupool._ext.builtin_kernels()
    assert kernels == {k["name"] for k in table if not k["takes_alpha"]}
    assert factories == {k["name"] for k in table if k["takes_alpha"]}
    assert exported == gpupool.kernels.__all__


@pytest.mark.parametrize("dtype", DTYPES)
def test_submit_writes_into_a_given_output(backend, dtype):
    """``out=``: the call writes the array given (a large one in pieces, across lanes), in place
    or apart from its inputs, and the future's result is that very array."""
    rng = np.random.default_rng(11)
    with gpupool.Executor(threads_per_gpu=3, backend=backend, chunk_bytes=64 << 10) as ex:
        x = random_array(rng, (301, 333), dtype)  # several pieces
        y = random_array(rng, x.shape, dtype)
        out = np.full_like(x, 7)
        assert ex.submit(gpupool.kernels.axpy(2), x, y, out=out).result() is out
        assert close(out, dtype(2) * x + y, dtype)
        # Slices of one array, each call its own place in it: no copy afterwards.
        joined = np.empty((2 * x.shape[0],) + x.shape[1:], dtype)
        halves = [ex.submit(gpupool.kernels.square, x, out=joined[:x.shape[0]]),
                  ex.submit(gpupool.kernels.square, y, out=joined[x.shape[0]:])]
        assert all(f.result().base is joined for f in halves)
        assert close(joined, np.concatenate([x * x, y * y]), dtype)
        in_place = x.copy()
        assert ex.submit(gpupool.kernels.square, in_place, out=in_place).result() is in_place
        assert close(in_place, x * x, dtype)


def test_a_given_output_is_checked_before_any_work(executor):
    x = np.arange(12.0)

    def filled(out):
        out.fill(-1.0)  # any write by a refused call would show
        return out

    read_only = np.full(12, -1.0)
    read_only.setflags(write=False)

    class Subclass(np.ndarray):
        pass

    cases = [(np.full(12, -1.0, np.float32), TypeError, "dtype"),
             (filled(np.empty(11)), ValueError, "shape"),
             (filled(np.empty(24))[::2], ValueError, "C-contiguous"),
             (read_only, ValueError, "read-only"),
             ([0.0] * 12, TypeError, "is a list"),
             (filled(np.empty(12)).view(Subclass), TypeError, "Subclass; give a numpy.ndarray")]
    for out, error, message in cases:
        with pytest.raises(error, match=message):
            executor.submit(gpupool.kernels.square, x, out=out)
        if isinstance(out, np.ndarray):
            assert np.all(np.asarray(out) == -1.0), f"{message}: written"
    shifted = np.arange(13.0)
    with pytest.raises(ValueError, match="overlaps an input of its call part way"):
        executor.submit(gpupool.kernels.add, x, shifted[:12], out=shifted[1:])
    assert np.array_equal(shifted, np.arange(13.0))
    with pytest.raises(TypeError, match="no keyword arguments other than out"):
        executor.submit(gpupool.kernels.square, x, output=x)
    assert np.array_equal(x, np.arange(12.0))


def test_out_may_be_the_second_input_of_a_two_input_kernel(executor):
    x, y = np.arange(10.0), np.ones(10)
    assert executor.submit(gpupool.kernels.axpy(2.0), x, y, out=y).result() is y
    assert np.array_equal(y, 2.0 * np.arange(10.0) + 1.0)
