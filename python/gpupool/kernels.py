"""Built-in elementwise kernels. Passed to Executor.map or Executor.submit, they run entirely in
C++ (GIL released): NumPy inputs are read in place and results come back as NumPy arrays.

    ex.map(gpupool.kernels.square, chunks)          # out = x * x
    ex.map(gpupool.kernels.scale(2.5), chunks)      # out = 2.5 * x
    ex.map(gpupool.kernels.add, xs, ys)             # out = x + y
    ex.map(gpupool.kernels.axpy(2.0), xs, ys)       # out = 2.0 * x + y

This module holds one name per built-in of the C++ library's table (``BUILTINS``, from
``gpupool._ext.builtin_kernels()``): a BuiltinKernel for those without a parameter, a factory
taking ``alpha`` for the others. The list is at the end of this text. ``Kernel`` is the old name
of ``BuiltinKernel`` (the same class), kept so that code written against it still runs; using it
warns (DeprecationWarning).

Inputs: C-contiguous arrays of any shape of the dtypes in ``DTYPES``; results keep the input's
shape and dtype.

alpha: a real number (bool, int or float; NumPy scalars and 0-d arrays too). It is checked
against each array's dtype at the call, by NumPy's "same_kind" rule and the dtype's range: a
float alpha for int arrays raises TypeError, an int outside int32's range for int32 arrays
OverflowError; nothing is converted out of range.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Union

from ._ext import BuiltinKernel, builtin_kernels, dtypes

#: The built-in kernels as the C++ library declares them: name, arity, takes_alpha, formula.
BUILTINS: List[Dict[str, Any]] = list(builtin_kernels())
#: The dtypes (NumPy's names) the built-in kernels compute with.
DTYPES: List[str] = list(dtypes())


def _exposed(info: Dict[str, Any]) -> Union[BuiltinKernel, Callable[[float], BuiltinKernel]]:
    """The module's name for one built-in: the kernel itself, or a factory taking alpha."""
    make = getattr(BuiltinKernel, info["name"])
    if not info["takes_alpha"]:
        kernel: BuiltinKernel = make()
        return kernel

    def factory(alpha: float) -> BuiltinKernel:
        made: BuiltinKernel = make(alpha)
        return made

    factory.__name__ = factory.__qualname__ = info["name"]
    factory.__module__ = __name__
    factory.__doc__ = (f"out = {info['formula']} (alpha: bool, int or float; see the module's "
                       "notes)")
    return factory


for _info in BUILTINS:
    globals()[_info["name"]] = _exposed(_info)

__doc__ = (__doc__ or "") + "\nThe built-in kernels:\n\n" + "".join(
    f"    {k['name']}{'(alpha)' if k['takes_alpha'] else ''}: {k['arity']} array(s), "
    f"out = {k['formula']}\n" for k in BUILTINS)

__all__ = ["BUILTINS", "DTYPES", "BuiltinKernel", *(k["name"] for k in BUILTINS)]


def __getattr__(name: str) -> Any:
    """``Kernel``, the old name of BuiltinKernel: the same class, with a DeprecationWarning."""
    if name == "Kernel":
        warnings.warn("gpupool.kernels.Kernel is now gpupool.kernels.BuiltinKernel (the same "
                      "class); the old name will go", DeprecationWarning, stacklevel=2)
        return BuiltinKernel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Type checkers read kernels.pyi, which declares the same names statically (a test keeps the two
# equal), so that a misspelt kernel name is flagged.
