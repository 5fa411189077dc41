"""What a caller passes in may neither crash the process nor change a number silently: buffer
exports held while queued tasks read them, scalars checked by NumPy's casting rule, shapes
checked. The cases that crashed the process run in a child process, so that a crash fails the
test instead of ending the session."""

import array
import gc
import math
import subprocess
import sys
import textwrap
import threading
import time

import gpupool
import numpy as np
import pytest

DTYPES = [np.float32, np.float64, np.int32, np.int64]


def run_child(code, timeout=120):
    """Runs `code` in a fresh interpreter; returns its output. Fails on a crash or an error."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    assert "Fatal Python error" not in proc.stderr, proc.stderr
    return proc.stdout


class BlockedLane:
    """An executor of one lane, held by a Python task until release(): work submitted meanwhile
    stays queued."""

    def __init__(self):
        self.executor = gpupool.Executor(threads_per_gpu=1, backend="cpu", slots_per_lane=1)
        self._gate = threading.Event()
        self._started = threading.Event()

        def hold():
            self._started.set()
            self._gate.wait(60)

        self.blocker = self.executor.submit(hold)
        assert self._started.wait(30)

    def release(self):
        self._gate.set()
        self.blocker.result(30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._gate.set()
        self.executor.shutdown(wait=True)


def resizable_inputs():
    """(name, factory): host inputs whose owner can resize or free the memory."""
    return [
        ("array.array('d')", lambda: array.array("d", [1.5] * 100_000)),
        ("array.array('i')", lambda: array.array("i", range(100_000))),
        ("array.array('q')", lambda: array.array("q", range(100_000))),
        ("array.array('f')", lambda: array.array("f", [0.25] * 100_000)),
    ]


def resize(a):
    """Frees (and replaces) the memory of a resizable input."""
    del a[:]
    a.extend(a.__class__(a.typecode, [0] * 10) if isinstance(a, array.array) else b"\0" * 10)


# -- buffer lifetime ----------------------------------------------------------------------------

CHILD_PRELUDE = """
    import array, threading, sys
    import numpy as np
    import gpupool

    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", slots_per_lane=1)
    gate, started = threading.Event(), threading.Event()
    def hold():
        started.set()
        gate.wait(60)
    blocker = ex.submit(hold)
    assert started.wait(30)
"""


@pytest.mark.parametrize("how", ["submit", "map", "elementwise"])
def test_resizing_an_input_of_a_queued_task_raises_buffer_error(how):
    # Before: the resize freed the memory the queued task then read (signal 11).
    out = run_child(CHILD_PRELUDE + f"""
    how = {how!r}
    a = array.array("d", [1.5] * 1_000_000)
    want = np.array(a) ** 2
    if how == "submit":
        f = ex.submit(gpupool.kernels.square, a)
        get = lambda: f.result(60)
    elif how == "map":
        results = ex.map(gpupool.kernels.square, [a])
        get = lambda: next(results)
    else:
        k = gpupool.elementwise("float64 x", "float64 y", "y = x * x", name="safety_square")
        f = ex.submit(k, a)
        get = lambda: f.result(60)
    try:
        del a[:]
        a.extend([0.0] * 10)
        print("resized")
    except BufferError as e:
        print("BufferError:", e)
    gate.set()
    got = get()
    assert np.array_equal(got, want), "wrong result"
    a.extend([2.0])  # the task is over: the array is free again
    ex.shutdown()
    print("ok")
    """)
    assert "BufferError:" in out and "resized" not in out and out.strip().endswith("ok")


def test_releasing_a_memoryview_of_a_queued_input_raises_buffer_error():
    out = run_child(CHILD_PRELUDE + """
    storage = bytearray(8 * 500_000)
    base = memoryview(storage)
    view = base.cast("d")
    f = ex.submit(gpupool.kernels.square, view)
    try:
        view.release()
        base.release()
        del storage[:]
        print("freed")
    except BufferError as e:
        print("BufferError:", e)
    gate.set()
    assert not f.result(60).any()
    view.release()
    base.release()
    del storage[:]
    ex.shutdown()
    print("ok")
    """)
    assert "BufferError:" in out and "freed" not in out and out.strip().endswith("ok")


@pytest.mark.parametrize("name,make", resizable_inputs())
def test_exports_are_released_once_the_task_is_done(name, make):
    a = make()
    refs = sys.getrefcount(a)
    with gpupool.Executor(threads_per_gpu=2, backend="cpu") as ex:
        got = ex.submit(gpupool.kernels.square, a).result(30)
        want = np.array(a, dtype=got.dtype)  # a copy: no export of `a`
        assert np.array_equal(got, want * want)
        resize(a)  # no export left: no BufferError
        a = make()
        refs = sys.getrefcount(a)
        assert len(list(ex.map(gpupool.kernels.add, [a], [a]))) == 1
        resize(a)
    gc.collect()
    assert sys.getrefcount(a) == refs


def test_exports_are_released_when_a_queued_task_is_cancelled():
    with BlockedLane() as lane:
        a = array.array("d", [1.0] * 10_000)
        refs = sys.getrefcount(a)
        f = lane.executor.submit(gpupool.kernels.square, a)
        with pytest.raises(BufferError):
            resize(a)
        assert f.cancel()
        resize(a)
        lane.release()
        del f
        gc.collect()
        assert sys.getrefcount(a) == refs


def test_exports_are_released_when_shutdown_cancels_a_queued_task():
    with BlockedLane() as lane:
        a = array.array("q", range(10_000))
        f = lane.executor.submit(gpupool.kernels.square, a)
        shutdown = threading.Thread(target=lane.executor.shutdown,
                                    kwargs={"cancel_futures": True})
        shutdown.start()
        lane.release()
        shutdown.join(30)
        assert f.cancelled() or f.done()
        resize(a)


def test_exports_are_released_when_the_call_fails():
    a = array.array("d", [1.0] * 100)
    refs = sys.getrefcount(a)
    k = gpupool.elementwise("float64 x, int32 n", "float64 y", "y = x * n", name="safety_refused")
    broken = gpupool.elementwise("float64 x", "float64 y", "y = x +* 1;", name="safety_broken")
    raw = gpupool.raw_kernel('extern "C" __global__ void f(const double* x, double* out, '
                             'unsigned long long n) {}', "f", "float64* x", "float64* out")
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        with pytest.raises(TypeError):
            ex.submit(k, a, 0.5)  # the array was taken, then the number refused
        with pytest.raises(TypeError):
            ex.submit(gpupool.kernels.add, a, "not an array")
        with pytest.raises(gpupool.CompileError):
            ex.submit(broken, a)
        with pytest.raises(gpupool.BackendUnavailableError):
            ex.submit(raw, a)
    resize(a)
    gc.collect()
    assert sys.getrefcount(a) == refs


def test_exports_are_held_by_the_task_not_its_future_and_released_when_it_ends():
    # As with the standard library's executors, dropping a future does not cancel its task: the
    # queued task keeps its inputs' exports until it has run, then lets them go.
    with BlockedLane() as lane:
        a = array.array("d", [1.0] * 10_000)
        refs = sys.getrefcount(a)
        future = lane.executor.submit(gpupool.kernels.square, a)
        with pytest.raises(BufferError):
            resize(a)
        del future
        gc.collect()
        with pytest.raises(BufferError):
            resize(a)  # still queued: the lane will read it
        lane.release()
        deadline = time.monotonic() + 30
        while True:
            try:
                resize(a)
                break
            except BufferError:
                assert time.monotonic() < deadline, "the exports were never released"
                time.sleep(0.01)
        gc.collect()
        assert sys.getrefcount(a) == refs


def test_exit_with_queued_tasks_over_resizable_inputs_is_clean():
    # The interpreter finalizes while a lane still holds the exports: they are let go without a
    # crash (or leaked once it is too late to take the GIL).
    out = run_child("""
    import array, time
    import gpupool
    ex = gpupool.Executor(threads_per_gpu=1, backend="cpu", slots_per_lane=1)
    ex.submit(time.sleep, 0.3)
    inputs = [array.array("d", [1.0] * 100_000) for _ in range(20)]
    futures = [ex.submit(gpupool.kernels.square, a) for a in inputs]
    print("exiting")
    """)
    assert "exiting" in out


def test_executor_dropped_with_queued_tasks_releases_exports():
    out = run_child(CHILD_PRELUDE + """
    import gc
    a = array.array("d", [3.0] * 100_000)
    f = ex.submit(gpupool.kernels.square, a)
    threading.Timer(0.3, gate.set).start()
    del ex, blocker
    gc.collect()
    assert f.result(60)[0] == 9.0
    del a[:]
    print("ok")
    """)
    assert out.strip().endswith("ok")


# -- scalars: NumPy's same_kind rule --------------------------------------------------------------

def numpy_verdict(value, dtype):
    """What NumPy's same_kind casting and the dtype's range say of `value` for `dtype`:
    None (fine), TypeError or OverflowError."""
    kind = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}[type(value)]
    if not np.can_cast(kind, dtype, casting="same_kind"):
        return TypeError
    if type(value) is int and np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return None if info.min <= value <= info.max else OverflowError
    if type(value) in (int, float) and dtype == np.float32:
        try:
            magnitude = abs(float(value))
        except OverflowError:
            return OverflowError
        largest = float(np.finfo(np.float32).max)
        return OverflowError if math.isfinite(magnitude) and magnitude > largest else None
    if type(value) is int:
        try:
            float(value)
        except OverflowError:
            return OverflowError
    return None


SCALARS = [0, 3, -7, True, False, 0.5, 2.9, -2.0, float("nan"), float("inf"), 1e20, 1e300,
           2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**40 + 5, 2**63 - 1, 2**63, 2**70, -2**70,
           2**2000, 1j, 2 + 0j]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_builtin_alpha_follows_numpy(value, dtype):
    x = np.arange(-3, 4, dtype=dtype)
    verdict = numpy_verdict(value, dtype)
    if type(value) is complex:
        with pytest.raises(TypeError, match="alpha.*complex"):
            gpupool.kernels.scale(value)
        return
    if type(value) is int and verdict is OverflowError and abs(value) > 2**1000:
        with pytest.raises(OverflowError, match="alpha"):
            gpupool.kernels.scale(value)
        return
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        for kernel, args, want in [
                (gpupool.kernels.scale(value), (x,), lambda a: a * x),
                (gpupool.kernels.axpy(value), (x, x), lambda a: a * x + x)]:
            if verdict is None and np.issubdtype(dtype, np.integer) and type(value) is int \
                    and abs(value) > 2**53:
                verdict = OverflowError  # carried as a float64 by the built-in kernels
            if verdict is None:
                got = ex.submit(kernel, *args).result(30)
                with np.errstate(all="ignore"):
                    expected = want(np.asarray(value).astype(dtype)).astype(dtype)
                assert got.dtype == dtype
                np.testing.assert_array_equal(got, expected)
            else:
                with pytest.raises(verdict, match=r"alpha of gpupool\.kernels\.\w+ .*" +
                                   np.dtype(dtype).name):
                    ex.submit(kernel, *args).result(30)
                with pytest.raises(verdict):
                    list(ex.map(kernel, *[[a] for a in args]))


def test_the_issue_examples_are_refused_clearly():
    x = np.arange(10, dtype=np.int32)
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        with pytest.raises(TypeError, match=r"0\.5.*float.*int32"):
            ex.submit(gpupool.kernels.scale(0.5), x).result()
        with pytest.raises(TypeError, match=r"2\.9.*int32"):
            ex.submit(gpupool.kernels.axpy(2.9), x, x).result()
        with pytest.raises(OverflowError, match=r"1099511627781.*int32"):
            ex.submit(gpupool.kernels.scale(2**40 + 5), x).result()
        with pytest.raises(OverflowError, match=r"1180591620717411303424.*int32"):
            ex.submit(gpupool.kernels.scale(2**70), x).result()
        for bad in (float("nan"), float("inf"), 1e20):
            with pytest.raises(TypeError):
                ex.submit(gpupool.kernels.scale(bad), x).result()
        # Refused at the call: nothing was queued.
        assert ex._core.queued == 0


@pytest.mark.parametrize("alpha,dtype,ok", [
    (np.float32(0.5), np.int32, False), (np.float64(2.0), np.int64, False),
    (np.int64(3), np.int32, True), (np.int64(2**40), np.int32, False),
    (np.uint8(7), np.float32, True), (np.bool_(True), np.int32, True),
    (np.array(2.5), np.float32, True), (np.array(2.5), np.int32, False),
    (np.array(4, dtype=np.int16), np.int64, True), (np.float64(1e300), np.float32, False),
])
def test_numpy_scalars_and_0d_arrays_as_alpha(alpha, dtype, ok):
    x = np.arange(5, dtype=dtype)
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        if ok:
            got = ex.submit(gpupool.kernels.scale(alpha), x).result(30)
            np.testing.assert_array_equal(got, (x * alpha.item()).astype(dtype))
        else:
            with pytest.raises((TypeError, OverflowError), match="alpha"):
                ex.submit(gpupool.kernels.scale(alpha), x).result(30)


@pytest.mark.parametrize("alpha", ["2", b"2", None, [2], np.array([2.0]), 1j, np.complex64(1)])
def test_alpha_must_be_a_real_number(alpha):
    with pytest.raises(TypeError, match="alpha of gpupool.kernels.scale"):
        gpupool.kernels.scale(alpha)


def test_exact_integer_alpha_on_int64():
    x = np.array([1, -1, 3], dtype=np.int64)
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        got = ex.submit(gpupool.kernels.scale(2**53), x).result(30)
        np.testing.assert_array_equal(got, x * 2**53)
        with pytest.raises(OverflowError, match="exactly"):
            ex.submit(gpupool.kernels.scale(2**53 + 1), x).result(30)


@pytest.fixture(scope="module")
def typed_kernels():
    """An elementwise kernel per parameter type: y = x + a."""
    return {np.dtype(t).name: gpupool.elementwise(
        f"{np.dtype(t).name} x, {np.dtype(t).name} a", f"{np.dtype(t).name} y", "y = x + a",
        name=f"safety_add_{np.dtype(t).name}") for t in DTYPES}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_elementwise_scalars_follow_numpy(typed_kernels, value, dtype):
    kernel = typed_kernels[np.dtype(dtype).name]
    x = np.arange(-3, 4, dtype=dtype)
    verdict = numpy_verdict(value, dtype)
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        if verdict is None:
            got = ex.submit(kernel, x, value).result(30)
            with np.errstate(all="ignore"):
                expected = (x + np.asarray(value).astype(dtype)).astype(dtype)
            np.testing.assert_array_equal(got, expected)
            (got,) = ex.map(kernel, [x], value)
            np.testing.assert_array_equal(got, expected)
        else:
            pattern = r"argument\[1\] \('a'\) of kernel 'safety_add_\w+' is .*" + \
                np.dtype(dtype).name
            with pytest.raises(verdict, match=pattern):
                ex.submit(kernel, x, value)
            with pytest.raises(verdict, match=pattern):
                ex.map(kernel, [x], value)


def test_elementwise_scalar_examples_from_the_issue(typed_kernels):
    x = np.arange(4, dtype=np.int32)
    with gpupool.Executor(threads_per_gpu=1, backend="cpu") as ex:
        with pytest.raises(OverflowError, match=r"'a'.*1099511627781.*int32"):
            ex.submit(typed_kernels["int32"], x, 2**40 + 5)
        with pytest.raises(OverflowError, match=r"'a'.*int32"):
            ex.submit(typed_kernels["int32"], x, 2**70)
        with pytest.raises(TypeError, match=r"'a'.*0\.5.*float.*int32"):
            ex.submit(typed_kernels["int32"], x, np.float32(0.5))
        with pytest.raises(TypeError, match=r"'a'.*str"):
            ex.submit(typed_kernels["int32"], x, "5")
        got = ex.submit(typed_kernels["int32"], x, np.array(5, dtype=np.int64)).result(30)
        np.testing.assert_array_equal(got, x + 5)


# -- shapes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("function", [gpupool.empty_pinned, gpupool.zeros_pinned])
def test_pinned_arrays_refuse_negative_dimensions(function):
    with pytest.raises(ValueError, match="dimension 0.*negative"):
        function(-1)
    with pytest.raises(ValueError, match=r"dimension 1 of shape \(3, -2\) is negative"):
        function((3, -2))
    with pytest.raises(ValueError, match="negative"):
        function((-2, -3))  # a positive product of negative dimensions


@pytest.mark.parametrize("shape", [2**63, (2**62, 4), (2**40, 2**40), 2**64 + 1])
def test_pinned_arrays_refuse_absurd_sizes(shape):
    with pytest.raises(OverflowError, match="empty_pinned"):
        gpupool.empty_pinned(shape)


@pytest.mark.parametrize("shape", [1.5, (2, 2.0), "3", None, (np.float64(2),)])
def test_pinned_arrays_refuse_non_integer_shapes(shape):
    with pytest.raises(TypeError, match="empty_pinned"):
        gpupool.empty_pinned(shape)


def test_pinned_arrays_take_numpy_shapes():
    a = gpupool.empty_pinned((np.int64(2), np.int32(3)), np.int32)
    assert a.shape == (2, 3) and a.dtype == np.int32
    assert gpupool.zeros_pinned(()).shape == ()
    assert gpupool.empty_pinned(0).shape == (0,)
    with pytest.raises(TypeError, match="objects"):
        gpupool.empty_pinned(3, object)


def test_allocate_pinned_refuses_absurd_sizes():
    with pytest.raises(OverflowError, match="too large"):
        gpupool._ext.allocate_pinned(2**64 - 8)


# -- kernel declarations ---------------------------------------------------------------------------

@pytest.mark.parametrize("arguments", [
    (123, "float64 y", "y = x;"), ("float64 x", None, "y = x;"), ("float64 x", "float64 y", b"y"),
    ("float64 x", "float64 y", "y = x;", 5)])
def test_elementwise_declarations_must_be_text(arguments):
    with pytest.raises(TypeError, match=r"gpupool: elementwise: \w+ must be a str"):
        gpupool.elementwise(*arguments)


@pytest.mark.parametrize("options,error", [
    ({"block": -1}, ValueError), ({"block": 0}, ValueError), ({"block": 2**40}, ValueError),
    ({"grid": -1}, ValueError), ({"grid": 2**32}, ValueError), ({"block": 2.5}, TypeError),
    ({"grid": "2"}, TypeError), ({"block": True}, TypeError)])
def test_raw_kernel_launch_shape_is_checked(options, error):
    with pytest.raises(error, match=r"gpupool: raw_kernel: (block|grid) must be"):
        gpupool.raw_kernel('extern "C" __global__ void f() {}', "f", "float64* x",
                           "float64* out", **options)
    k = gpupool.raw_kernel('extern "C" __global__ void f() {}', "f", "float64* x",
                           "float64* out", block=np.int64(128), grid=2**32 - 1)
    assert (k.shape.block, k.shape.grid) == (128, 2**32 - 1)


# -- device arrays (CUDA) -------------------------------------------------------------------------

@pytest.mark.gpu
def test_numbers_for_device_arrays_follow_the_same_rules():
    cp = pytest.importorskip("cupy")
    x = cp.arange(-5, 5, dtype=cp.int32)
    k = gpupool.elementwise("int32 x, int32 a", "int32 y", "y = x + a", name="safety_device_add")
    with gpupool.Executor(threads_per_gpu=2, backend="cuda") as ex:
        with pytest.raises(TypeError, match=r"alpha of gpupool\.kernels\.scale .*0\.5.*int32"):
            ex.submit(gpupool.kernels.scale(0.5), x).result(60)
        with pytest.raises(OverflowError, match=r"int32"):
            list(ex.map(gpupool.kernels.axpy(2**40 + 5), [x], [x]))
        with pytest.raises(OverflowError, match=r"'a'.*1099511627781.*int32"):
            ex.submit(k, x, 2**40 + 5).result(60)
        with pytest.raises(TypeError, match=r"'a'.*2\.5.*int32"):
            list(ex.map(k, [x, x], 2.5))
        with pytest.raises(TypeError, match=r"'a'.*complex"):
            ex.submit(k, x, 1j).result(60)
        assert cp.array_equal(ex.submit(k, x, True).result(60), x + 1)
        assert cp.array_equal(ex.submit(k, x, np.int64(7)).result(60), x + 7)
        assert cp.array_equal(ex.submit(gpupool.kernels.scale(3), x).result(60), 3 * x)
