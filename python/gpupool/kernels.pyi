# The static view of gpupool.kernels, whose names are made at import from the C++ library's table
# of built-in kernels (gpupool._ext.builtin_kernels()). Type checkers read this file instead of
# kernels.py, so a misspelt name (kernels.sqaure) is an error. python/tests/test_kernels.py checks
# that the names here, and which of them take alpha, equal the table: a built-in added in C++
# fails that test until it is declared here too.
from typing import Any, Dict, List

from ._ext import BuiltinKernel as BuiltinKernel
# The old name of BuiltinKernel (the same class), kept for code written against it (using it
# warns at run time).
from ._ext import Kernel as Kernel

#: The built-in kernels as the C++ library declares them: name, arity, takes_alpha, formula.
BUILTINS: List[Dict[str, Any]]
#: The dtypes (NumPy's names) the built-in kernels compute with.
DTYPES: List[str]

# Kernels without a parameter.
square: BuiltinKernel
add: BuiltinKernel

# Factories: alpha is a real number (bool, int or float), checked against each array's dtype.
def scale(alpha: float) -> BuiltinKernel: ...
def axpy(alpha: float) -> BuiltinKernel: ...

__all__ = ["BUILTINS", "DTYPES", "BuiltinKernel", "square", "scale", "add", "axpy"]
