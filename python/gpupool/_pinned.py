"""Pinned (page-locked) host arrays: inputs and outputs that skip the staging copy."""

import math
import operator
import sys
from typing import Any, Iterable, Sequence, SupportsIndex, Tuple, Union, cast

import numpy as np
import numpy.typing as npt

from . import _ext


def _checked_shape(shape: object, function: str) -> Tuple[int, ...]:
    """`shape` as a tuple of non-negative Python ints (an int is a 1-d shape), as NumPy takes it;
    a bad one raises TypeError/ValueError naming the dimension."""
    # `shape` is whatever the caller passed: operator.index and tuple() are the checks (their
    # TypeError becomes a message naming the problem), so the casts only tell the type checker
    # what they accept.
    try:
        dims: Tuple[object, ...] = (operator.index(cast(SupportsIndex, shape)),)
    except TypeError:
        try:
            dims = tuple(cast(Iterable[object], shape))
        except TypeError:
            raise TypeError(f"gpupool: {function}: shape must be an int or a sequence of ints, "
                            f"not {type(shape).__name__}") from None
    checked = []
    for axis, dim in enumerate(dims):
        try:
            n = operator.index(cast(SupportsIndex, dim))
        except TypeError:
            raise TypeError(f"gpupool: {function}: dimension {axis} of shape {dims!r} is "
                            f"{dim!r}, not an int") from None
        if n < 0:
            raise ValueError(f"gpupool: {function}: dimension {axis} of shape {dims!r} is "
                             f"negative ({n})")
        checked.append(n)
    return tuple(checked)


def empty_pinned(shape: Union[SupportsIndex, Sequence[SupportsIndex]],
                 dtype: npt.DTypeLike = np.float64) -> npt.NDArray[Any]:
    """A NumPy array in pinned host memory, uninitialised. The memory is freed when the array
    (and every view of it) is gone. Pinning is slow: allocate once and reuse.

    Raises ValueError for a negative dimension, OverflowError for a size no array can have."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise TypeError(f"gpupool: empty_pinned: dtype {dtype} holds Python objects; pinned "
                        "memory holds plain numbers")
    if dtype.itemsize == 0:
        raise TypeError(f"gpupool: empty_pinned: dtype {dtype} has no size")
    shape = _checked_shape(shape, "empty_pinned")
    count = math.prod(shape)
    if count * dtype.itemsize > sys.maxsize:
        raise OverflowError(f"gpupool: empty_pinned: shape {shape} of {dtype} is "
                            f"{count * dtype.itemsize} bytes, more than any array can hold")
    try:
        raw = _ext.allocate_pinned(max(count * dtype.itemsize, 1))
    except MemoryError:
        raise MemoryError(f"gpupool: empty_pinned: no pinned memory for shape {shape} of "
                          f"{dtype} ({count * dtype.itemsize} bytes)") from None
    return raw[: count * dtype.itemsize].view(dtype).reshape(shape)


def zeros_pinned(shape: Union[SupportsIndex, Sequence[SupportsIndex]],
                 dtype: npt.DTypeLike = np.float64) -> npt.NDArray[Any]:
    """Like empty_pinned, filled with zeros."""
    a = empty_pinned(shape, dtype)
    a[...] = 0
    return a


def pinned_array(a: npt.ArrayLike) -> npt.NDArray[Any]:
    """A pinned copy of `a`."""
    a = np.asarray(a)
    out = empty_pinned(a.shape, a.dtype)
    out[...] = a
    return out


def is_pinned(a: npt.ArrayLike) -> bool:
    """True if the array's memory is pinned (gpupool's, or page-locked by CUDA)."""
    address = np.asarray(a).__array_interface__["data"][0]
    return bool(_ext.is_pinned(address))
