"""gpupool: many worker lanes per GPU, on every GPU, behind a concurrent.futures Executor.

    import gpupool
    with gpupool.Executor(threads_per_gpu=8) as ex:
        squares = list(ex.map(gpupool.kernels.square, chunks))   # C++, GIL released

Python callables submitted to the Executor run on a lane thread with that lane's device current
and, where CuPy or PyTorch is imported, that lane's stream made their current stream.
"""

from . import kernels
from ._executor import Executor, Trace, current_lane
from ._ext import (
    BackendUnavailableError,
    CompileError,
    CudaError,
    GpupoolError,
    Lane,
    OutOfMemoryError,
    __version__,
)
from ._pinned import empty_pinned, is_pinned, pinned_array, zeros_pinned
from ._ext import ElementwiseKernel
from ._ext import cuda_availability as _cuda_availability


def elementwise(inputs: str, output: str, body: str, name: str = "elementwise") -> ElementwiseKernel:
    """An elementwise kernel compiled at run time, in the spirit of CuPy's ElementwiseKernel:

        k = gpupool.elementwise("float64 x, float64 a", "float64 y", "y = a * x * x + sin(x)")
        results = list(ex.map(k, chunks, 2.5))    # numbers are broadcast to every call

    Types: float32, float64, int32, int64. The body is C++ over one element; it runs in C++
    with the GIL released. Compiled once per process on first use and cached on disk
    (GPUPOOL_CACHE_DIR, default ~/.cache/gpupool); a syntax error raises gpupool.CompileError
    with the compiler's log and the body's line. The CPU backend compiles with the host's C++
    compiler (GPUPOOL_CXX, else CXX, else the first of c++, g++, clang++)."""
    return ElementwiseKernel(inputs, output, body, name)


def cuda_available():
    """(usable, devices, reason): whether the CUDA backend can run in this process."""
    return _cuda_availability()


__all__ = [
    "BackendUnavailableError",
    "CompileError",
    "CudaError",
    "Executor",
    "GpupoolError",
    "Lane",
    "OutOfMemoryError",
    "Trace",
    "__version__",
    "cuda_available",
    "elementwise",
    "ElementwiseKernel",
    "current_lane",
    "empty_pinned",
    "is_pinned",
    "kernels",
    "pinned_array",
    "zeros_pinned",
]
