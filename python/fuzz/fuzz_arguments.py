"""Fuzzes the Python API's argument checks with atheris (libFuzzer for Python): random argument
types, values, shapes and dtypes into Executor.submit/map with built-in and compiled kernels,
kernels.scale/axpy, empty_pinned and friends, elementwise kernel declarations.

Every refusal must be a clear exception of an expected type, never a crash, a hang, a raw
nanobind "incompatible function arguments" message, or a number changed silently (results of
calls that are accepted are checked against NumPy).

    .venv/bin/python python/fuzz/fuzz_arguments.py -max_total_time=60 build/fuzz-corpus \\
        python/fuzz/corpus
"""

import array
import math
import operator
import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    import gpupool
    import numpy as np

EXPECTED = (TypeError, ValueError, OverflowError, BufferError, gpupool.GpupoolError)

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128]
SUPPORTED = [np.float32, np.float64, np.int32, np.int64]
TYPECODES = "bBhHiIlLqQfd"
SPECIAL_FLOATS = [0.0, -0.0, 0.5, 2.9, -1.5, float("nan"), float("inf"), -float("inf"), 1e20,
                  -1e20, 1e300, 3.4028235e38, 3.5e38, 5e-324, 2.0**53, 2.0**63, 2.0**64]
SPECIAL_INTS = [0, 1, -1, 2, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32, 2**53, 2**53 + 1,
                2**63 - 1, 2**63, -2**63, -2**63 - 1, 2**64, 2**70, -2**70, 2**200, 2**2000]

# A kernel cache of its own keeps the fuzzer from touching the user's (scripts/python-fuzz
# gives it one under build/; libFuzzer ends the process without running atexit handlers).
if "GPUPOOL_CACHE_DIR" not in os.environ:
    os.environ["GPUPOOL_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpupool-fuzz-cache-")
EXECUTOR = gpupool.Executor(threads_per_gpu=2, backend="cpu")
ELEMENTWISE = {
    name: gpupool.elementwise(f"{name} x, {name} a", f"{name} y", "y = x + a",
                              name=f"fuzz_add_{name}")
    for name in ("float32", "float64", "int32", "int64")
}
MIXED = gpupool.elementwise("float64 x, int32 n, float32 s", "float64 y", "y = x * n + s",
                            name="fuzz_mixed")


def pick(fdp, options):
    return options[fdp.ConsumeIntInRange(0, len(options) - 1)]


def make_shape(fdp):
    ndim = fdp.ConsumeIntInRange(0, 3)
    return tuple(fdp.ConsumeIntInRange(0, 40) for _ in range(ndim))


def make_array(fdp, dtypes=DTYPES):
    dtype = np.dtype(pick(fdp, dtypes))
    shape = make_shape(fdp)
    data = np.frombuffer(fdp.ConsumeBytes(int(np.prod(shape)) * dtype.itemsize)
                         .ljust(int(np.prod(shape)) * dtype.itemsize, b"\1"), dtype=dtype)
    a = data.reshape(shape).copy()
    layout = fdp.ConsumeIntInRange(0, 5)
    if layout == 1 and a.ndim:
        a = a[::2]  # strided
    elif layout == 2 and a.ndim >= 2:
        a = a.T  # Fortran order
    elif layout == 3:
        a.flags.writeable = False
    return a


def make_number(fdp):
    choice = fdp.ConsumeIntInRange(0, 9)
    if choice == 0:
        return pick(fdp, SPECIAL_INTS)
    if choice == 1:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 20))
    if choice == 2:
        return pick(fdp, SPECIAL_FLOATS)
    if choice == 3:
        return fdp.ConsumeRegularFloat()
    if choice == 4:
        return fdp.ConsumeBool()
    if choice == 5:
        return complex(fdp.ConsumeRegularFloat(), pick(fdp, [0.0, 1.0]))
    if choice in (6, 7):  # a NumPy scalar of any dtype
        dtype = np.dtype(pick(fdp, DTYPES))
        raw = fdp.ConsumeBytes(dtype.itemsize).ljust(dtype.itemsize, b"\0")
        return np.frombuffer(raw, dtype=dtype)[0]
    if choice == 8:  # a 0-d array
        dtype = np.dtype(pick(fdp, DTYPES))
        raw = fdp.ConsumeBytes(dtype.itemsize).ljust(dtype.itemsize, b"\0")
        return np.frombuffer(raw, dtype=dtype).reshape(()).copy()
    return pick(fdp, [2, 2.5, -3, 0.0])


def make_value(fdp):
    """Anything a caller might pass."""
    choice = fdp.ConsumeIntInRange(0, 11)
    if choice <= 2:
        return make_number(fdp)
    if choice <= 5:
        return make_array(fdp, SUPPORTED if choice <= 4 else DTYPES)
    if choice == 6:
        code = pick(fdp, TYPECODES)
        return array.array(code, bytes(array.array(code).itemsize * fdp.ConsumeIntInRange(0, 50)))
    if choice == 7:
        return bytearray(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64)))
    if choice == 8:
        raw = bytearray(8 * fdp.ConsumeIntInRange(0, 16))
        return memoryview(raw).cast(pick(fdp, "dfiq"))
    if choice == 9:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))
    if choice == 10:
        return [make_number(fdp) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return pick(fdp, [None, object(), {}, (), b"\0\0\0\0\0\0\0\0", np.float64, print])


def builtin_kernel(fdp):
    choice = fdp.ConsumeIntInRange(0, 3)
    if choice == 0:
        return gpupool.kernels.square, None
    if choice == 1:
        return gpupool.kernels.add, None
    alpha = make_number(fdp) if fdp.ConsumeBool() else make_value(fdp)
    kernel = gpupool.kernels.scale(alpha) if choice == 2 else gpupool.kernels.axpy(alpha)
    return kernel, alpha


def item(value):
    return value.item() if hasattr(value, "item") else value


def is_number(value):
    """A number as gpupool reads one: Python's and NumPy's scalars, and 0-d arrays."""
    return isinstance(value, (int, float, np.generic)) or (
        isinstance(value, np.ndarray) and value.ndim == 0)


def check_builtin_result(kernel, alpha, args, got):
    """An accepted call computes what NumPy computes in the array's dtype."""
    x = args[0]
    if not isinstance(x, np.ndarray) or not isinstance(got, np.ndarray):
        return
    assert got.shape == x.shape and got.dtype == x.dtype, (got.shape, got.dtype, x.shape, x.dtype)
    with np.errstate(all="ignore"):
        if kernel.name == "square":
            want = x * x
        elif kernel.name == "add":
            want = x + args[1]
        else:
            a = np.asarray(item(alpha)).astype(x.dtype)
            want = a * x if kernel.name == "scale" else a * x + args[1]
    if np.issubdtype(x.dtype, np.integer):
        assert np.array_equal(got, want), (kernel, alpha, x, got, want)
    else:
        assert np.allclose(got, want, rtol=1e-5, equal_nan=True) or \
            np.array_equal(np.isfinite(got), np.isfinite(want)), (kernel, alpha, x, got, want)


def call_builtin(fdp):
    kernel, alpha = builtin_kernel(fdp)
    arity = kernel.arity if fdp.ConsumeIntInRange(0, 7) else fdp.ConsumeIntInRange(0, 3)
    args = [make_value(fdp) for _ in range(arity)]
    if len(args) == 2 and fdp.ConsumeBool() and isinstance(args[0], np.ndarray):
        args[1] = args[0].copy()  # a pair that fits, so that the kernel runs
    if fdp.ConsumeBool():
        got = EXECUTOR.submit(kernel, *args).result(60)
        check_builtin_result(kernel, alpha, args, got)
    else:
        results = list(EXECUTOR.map(kernel, *[[a] for a in args]))
        if results:
            check_builtin_result(kernel, alpha, args, results[0])


def call_elementwise(fdp):
    if fdp.ConsumeIntInRange(0, 3) == 0:
        kernel = MIXED
        args = [make_value(fdp) for _ in range(fdp.ConsumeIntInRange(2, 4))]
    else:
        name = pick(fdp, list(ELEMENTWISE))
        kernel = ELEMENTWISE[name]
        x = make_array(fdp, [np.dtype(name).type]) if fdp.ConsumeBool() else make_value(fdp)
        args = [x, make_value(fdp) if fdp.ConsumeBool() else make_number(fdp)]
    if fdp.ConsumeBool():
        got = EXECUTOR.submit(kernel, *args).result(60)
    else:
        columns = [[a] if isinstance(a, np.ndarray) else a for a in args]
        got = next(iter(EXECUTOR.map(kernel, *columns)), None)
    if kernel is not MIXED and isinstance(got, np.ndarray) and all(
            isinstance(a, np.ndarray) or is_number(a) for a in args):
        # As gpupool reads the arguments: a 0-d array is a number, and the result is shaped like
        # the first array of one or more dimensions (every array has the result's element count).
        shaped = [a for a in args if isinstance(a, np.ndarray) and a.ndim > 0]
        assert shaped and got.shape == shaped[0].shape, (args, got.shape)
        with np.errstate(all="ignore"):
            x, a = (np.asarray(item(v) if np.ndim(v) == 0 else v).astype(got.dtype).reshape(-1)
                    for v in args)
            want = (x + a).reshape(got.shape)
        assert np.array_equal(got, want, equal_nan=got.dtype.kind == "f"), (args, got, want)


def call_pinned(fdp):
    choice = fdp.ConsumeIntInRange(0, 3)
    if choice == 0:
        shape = make_number(fdp)
    elif choice == 1:
        shape = tuple(make_number(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3)))
    elif choice == 2:
        shape = tuple(fdp.ConsumeIntInRange(-3, 6) for _ in range(fdp.ConsumeIntInRange(0, 3)))
    else:
        shape = make_value(fdp)
    dtype = pick(fdp, DTYPES + [object, "V0", "U3", "S0", "float64", None, 3])
    function = pick(fdp, [gpupool.empty_pinned, gpupool.zeros_pinned])
    if 64 << 20 < planned_bytes(shape, dtype) <= sys.maxsize:
        return  # a size that may well succeed: not for a fuzzer on a shared machine
    a = function(shape, dtype)
    assert a.size * a.dtype.itemsize < 1 << 32, a.shape
    if function is gpupool.zeros_pinned and a.dtype.kind in "biufc":
        assert not a.any()
    assert gpupool.is_pinned(a) or a.size == 0


def planned_bytes(shape, dtype):
    """The bytes empty_pinned(shape, dtype) would ask for, or 0 if it must refuse first."""
    try:
        try:
            dims = (operator.index(shape),)  # as empty_pinned reads it
        except TypeError:
            dims = tuple(operator.index(n) for n in shape)
        return math.prod(dims) * np.dtype(dtype).itemsize if min(dims, default=0) >= 0 else 0
    except (TypeError, ValueError, OverflowError):
        return 0


def declare_kernel(fdp):
    # Declarations only (no compile): the parser must refuse what it cannot take.
    text = [fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 30)) for _ in range(3)]
    if fdp.ConsumeBool():
        text[0] = pick(fdp, ["float64 x", "int32 x, float32 a", "float64* x", "x", ""])
    if fdp.ConsumeBool():
        text[1] = pick(fdp, ["float64 y", "int64 y", "y", "float64 y, float64 z"])
    if fdp.ConsumeBool():
        gpupool.elementwise(text[0], text[1], "y = x;", name=text[2] or "elementwise")
    else:
        block = make_value(fdp) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(-2, 2000)
        grid = make_value(fdp) if fdp.ConsumeBool() else fdp.ConsumeInt(5)
        gpupool.raw_kernel('extern "C" __global__ void f() {}', text[2] or "f", text[0], text[1],
                           block=block, grid=grid)


OPERATIONS = [call_builtin, call_builtin, call_elementwise, call_elementwise, call_pinned,
              declare_kernel]


def test_one_input(data):
    fdp = atheris.FuzzedDataProvider(data)
    operation = pick(fdp, OPERATIONS)
    try:
        operation(fdp)
    except EXPECTED as e:
        message = str(e)
        if "incompatible function arguments" in message:
            raise AssertionError(f"raw nanobind refusal from {operation.__name__}: {message}")
        if not message:
            raise AssertionError(f"{type(e).__name__} with no message from {operation.__name__}")


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
