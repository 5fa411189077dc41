"""What benchmarks outside the package use of gpupool compare: its workloads' checks and kernel
bodies, and its way of timing and checking a variant. A stable surface; the private modules
behind it (``_harness``, ``_workloads``, ``_frameworks``) may change.

Checks (each returns a function that raises :class:`WrongResult` when a run's output differs):

- :func:`check_squares` (data): the output is each input squared, in order (W4).
- :func:`check_returned` (inputs): the output is each input itself, in order (a no-op).

Kernels:

- :func:`fma_body` (fmas, addend="b"): the body of W5's elementwise kernel, ``fmas`` dependent
  FMAs per element (``float32 x, float32 a, float32 b`` in, ``float32 y`` out).
- :func:`cupy_fma_kernel` (fmas): that kernel as a CuPy ElementwiseKernel (needs CuPy).
- :func:`fma_reference` (x, fmas): its result computed with NumPy.

Timing: :func:`measure` runs a variant once as a warm-up, checks its output, then times it
(:class:`Timing` says how many repeats, for how long) and returns a :class:`Result`;
:func:`measure_interleaved` does so for several :class:`Contender` s in turn. A variant's
setup raises :class:`Skip` when it cannot run here. ``OK``, ``SKIPPED`` and ``FAILED`` are a
result's statuses.

Example::

    from gpupool.compare.harness import check_squares, fma_body
"""

from __future__ import annotations

from ._frameworks import cupy_fma_kernel, fma_body
from ._harness import (FAILED, OK, SKIPPED, Contender, Result, Skip, Timing, WrongResult,
                       measure, measure_interleaved)
from ._workloads import Check, check_returned, check_squares, fma_reference

__all__ = ["Check", "Contender", "FAILED", "OK", "Result", "SKIPPED", "Skip", "Timing",
           "WrongResult", "check_returned", "check_squares", "cupy_fma_kernel", "fma_body",
           "fma_reference", "measure", "measure_interleaved"]
