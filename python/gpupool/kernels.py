"""Built-in elementwise kernels. Passed to Executor.map or Executor.submit, they run entirely in
C++ (GIL released): NumPy inputs are read in place and results come back as NumPy arrays.

    ex.map(gpupool.kernels.square, chunks)          # out = x * x
    ex.map(gpupool.kernels.scale(2.5), chunks)      # out = 2.5 * x
    ex.map(gpupool.kernels.add, xs, ys)             # out = x + y
    ex.map(gpupool.kernels.axpy(2.0), xs, ys)       # out = 2.0 * x + y

Inputs: C-contiguous float32, float64, int32 or int64 arrays of any shape; results keep the
input's shape and dtype.

alpha: a real number (bool, int or float; NumPy scalars and 0-d arrays too). It is checked
against each array's dtype at the call, by NumPy's "same_kind" rule and the dtype's range: a
float alpha for int arrays raises TypeError, an int outside int32's range for int32 arrays
OverflowError; nothing is converted out of range.
"""

from ._ext import Kernel

square = Kernel.square()
add = Kernel.add()


def scale(alpha: float) -> Kernel:
    """out = alpha * x (alpha: bool, int or float; see the module's notes)"""
    return Kernel.scale(alpha)


def axpy(alpha: float) -> Kernel:
    """out = alpha * x + y (alpha: bool, int or float; see the module's notes)"""
    return Kernel.axpy(alpha)


__all__ = ["Kernel", "add", "axpy", "scale", "square"]
