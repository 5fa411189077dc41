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
    CudaError,
    GpupoolError,
    Lane,
    OutOfMemoryError,
    __version__,
)
from ._pinned import empty_pinned, is_pinned, pinned_array, zeros_pinned
from ._ext import cuda_availability as _cuda_availability


def cuda_available():
    """(usable, devices, reason): whether the CUDA backend can run in this process."""
    return _cuda_availability()


__all__ = [
    "BackendUnavailableError",
    "CudaError",
    "Executor",
    "GpupoolError",
    "Lane",
    "OutOfMemoryError",
    "Trace",
    "__version__",
    "cuda_available",
    "current_lane",
    "empty_pinned",
    "is_pinned",
    "kernels",
    "pinned_array",
    "zeros_pinned",
]
