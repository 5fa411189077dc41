# Completes the stub that nanobind's stubgen wrote for the module imported as `_ext`: the
# exception classes, which the module creates under the package's name (gpupool.GpupoolError,
# ...), are re-exported from the package, as the module does at run time; and `__version__`,
# a string attribute of the module that stubgen leaves out (the package re-exports it).
#   cmake -DIN=raw.pyi -DOUT=_ext.pyi -P finish_stub.cmake
file(READ ${IN} stub)
set(exceptions "
from gpupool import (
    BackendUnavailableError as BackendUnavailableError,
    CompileError as CompileError,
    CudaError as CudaError,
    DeviceFaultError as DeviceFaultError,
    GpupoolError as GpupoolError,
    OutOfMemoryError as OutOfMemoryError
)
")
string(FIND "${stub}" "from numpy.typing import NDArray\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${IN}: no 'from numpy.typing import NDArray' line to put the imports after")
endif()
string(REPLACE "from numpy.typing import NDArray\n" "from numpy.typing import NDArray\n${exceptions}"
  stub "${stub}")
string(FIND "${stub}" "__version__" has_version)
if(has_version EQUAL -1)
  string(APPEND stub "\n__version__: str\n")
endif()
file(WRITE ${OUT} "${stub}")
