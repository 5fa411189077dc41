"""gpupool: many worker lanes per GPU, on every GPU, behind a concurrent.futures Executor.

    import gpupool
    with gpupool.Executor(threads_per_gpu=8) as ex:
        squares = list(ex.map(gpupool.kernels.square, chunks))   # C++, GIL released

Python callables submitted to the Executor run on a lane thread with that lane's device current
and, where CuPy or PyTorch is imported, that lane's stream made their current stream.

The `gpupool` command (also `python -m gpupool`): `info`, `demo`, `bench`, `--version`.
On the CPU backend, a one-line notice says so once per process; GPUPOOL_QUIET=1 silences it.
"""

from typing import Tuple

from . import kernels
from ._executor import Executor, Trace, current_lane
from ._ext import (
    BackendUnavailableError,
    CompileError,
    CudaError,
    DeviceFaultError,
    GpupoolError,
    Lane,
    OutOfMemoryError,
    __version__,
)
from ._pinned import empty_pinned, is_pinned, pinned_array, zeros_pinned
from ._ext import BuiltinKernel, ElementwiseKernel, RawKernel
from ._ext import cuda_availability as _cuda_availability


def elementwise(inputs: str, output: str, body: str, name: str = "elementwise") -> ElementwiseKernel:
    """An elementwise kernel compiled at run time, in the spirit of CuPy's ElementwiseKernel:

        k = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = a * x * x + sin(x)")
        results = list(ex.map(k, chunks, 2.5))    # numbers are broadcast to every call

    Types: float32, float64, int32, int64. The body is C++ over one element; it runs in C++
    with the GIL released. Compiled once per process on first use and cached on disk
    (GPUPOOL_CACHE_DIR, default ~/.cache/gpupool); a syntax error raises gpupool.CompileError
    with the compiler's log and the body's line. The CPU backend compiles with the host's C++
    compiler (GPUPOOL_CXX, else CXX, else the first of c++, g++, clang++).

    Arguments may also be device arrays (CuPy, PyTorch, CUDA Array Interface): the kernel then
    runs where they are, with no host copy, and many small arrays share a few launches."""
    return ElementwiseKernel(inputs, output, body, name)


def raw_kernel(source: str, entry: str, inputs: str, output: str, *, block: int = 256,
               grid: int = 0) -> RawKernel:
    """A kernel from CUDA source, for users who already have one:

        k = gpupool.raw_kernel(source, "saxpy", "float32* x, float32 a, float32* y", "float32* out")
        results = list(ex.map(k, xs, 2.0, ys))

    The entry point (``extern "C"`` or a C++ name) takes, in order, each input - a device array
    (``const float*``) where declared ``type* name``, the number by value where declared
    ``type name`` - then the output array and ``unsigned long long n``, the element count. Host
    arrays are streamed in pieces with one launch per piece, so ``out[i]`` must depend on the
    inputs' element ``i``. ``block`` threads per block; ``grid`` blocks, or 0 for one thread per
    element. Compiled with NVRTC for each GPU's architecture and cached like elementwise kernels;
    on the CPU backend a call raises BackendUnavailableError (a GPU is needed)."""
    return RawKernel(source, entry, inputs, output, block, grid)


def cuda_available() -> Tuple[bool, int, str]:
    """(usable, devices, reason): whether the CUDA backend can run in this process."""
    usable, devices, reason = _cuda_availability()
    return bool(usable), int(devices), str(reason)


__all__ = [
    "BackendUnavailableError",
    "CompileError",
    "CudaError",
    "DeviceFaultError",
    "Executor",
    "GpupoolError",
    "Lane",
    "OutOfMemoryError",
    "Trace",
    "__version__",
    "cuda_available",
    "BuiltinKernel",
    "elementwise",
    "ElementwiseKernel",
    "raw_kernel",
    "RawKernel",
    "current_lane",
    "empty_pinned",
    "is_pinned",
    "kernels",
    "pinned_array",
    "zeros_pinned",
]
