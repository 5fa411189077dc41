"""Pinned (page-locked) host arrays: inputs and outputs that skip the staging copy."""

import math

import numpy as np

from . import _ext


def empty_pinned(shape, dtype=np.float64) -> np.ndarray:
    """A NumPy array in pinned host memory, uninitialised. The memory is freed when the array
    (and every view of it) is gone. Pinning is slow: allocate once and reuse."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    count = math.prod(shape)
    raw = _ext.allocate_pinned(max(count * dtype.itemsize, 1))
    return raw[: count * dtype.itemsize].view(dtype).reshape(shape)


def zeros_pinned(shape, dtype=np.float64) -> np.ndarray:
    """Like empty_pinned, filled with zeros."""
    a = empty_pinned(shape, dtype)
    a[...] = 0
    return a


def pinned_array(a) -> np.ndarray:
    """A pinned copy of `a`."""
    a = np.asarray(a)
    out = empty_pinned(a.shape, a.dtype)
    out[...] = a
    return out


def is_pinned(a) -> bool:
    """True if the array's memory is pinned (gpupool's, or page-locked by CUDA)."""
    address = np.asarray(a).__array_interface__["data"][0]
    return bool(_ext.is_pinned(address))
