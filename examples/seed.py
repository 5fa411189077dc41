"""The motivating program, with one line changed.

The widely copied original squares chunks with CuPy inside a ThreadPoolExecutor:

    with ThreadPoolExecutor(max_workers=5) as executor:          # the original line
        results = list(executor.map(square, data))

Every thread there shares CuPy's default stream. With gpupool.Executor each task runs on a lane
with its own stream made CuPy's current stream, so the same `square` overlaps across lanes.
The last lines show the fast path: the built-in kernel runs in C++ with the GIL released.

Runs on a GPU with CuPy, and on the CPU backend (NumPy stands in for CuPy) anywhere else.
"""

import numpy as np

import gpupool

try:
    import cupy as cp

    on_gpu = gpupool.cuda_available()[0]
except ImportError:
    on_gpu = False


def square(chunk):
    if on_gpu:
        return cp.asnumpy(cp.array(chunk) ** 2)
    return np.array(chunk) ** 2


data = [np.random.rand(1_000_000) for _ in range(5)]

with gpupool.Executor(threads_per_gpu=5) as executor:  # the one changed line
    results = list(executor.map(square, data))

    fast = list(executor.map(gpupool.kernels.square, data))  # no GIL, no CuPy needed
    backend = executor.backend

assert all(np.array_equal(r, d * d) and np.array_equal(f, d * d)
           for r, f, d in zip(results, fast, data))
for i, r in enumerate(results):
    print(f"task {i}: {r[:5]}")
print(f"{len(data)} chunks squared on the {backend} backend; results match NumPy")
