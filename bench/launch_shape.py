"""How the launch shape of a compiled elementwise kernel changes its time on the GPU: W5's kernel
(2,048 dependent FMAs per float32 element over 32M elements) as gpupool generates it, launched
with one wave of blocks whose threads stride over the rest (how gpupool launches a single call)
and with a thread per element, beside CuPy's own ElementwiseKernel of the same body. Each
variant's output is checked against CuPy's before its time counts; times are CUDA-event medians.

    python3 bench/launch_shape.py [--elements 33554432] [--fmas 2048] [--repeat 9]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable, Dict, List

# gpupool's generated single-launch kernel (not the batch kernel a map over many device arrays
# runs: a 2-D grid over a table of calls) for "float32 x, float32 a, float32 b" -> "float32 y"
# (src/core/kernels/kernel_source.cpp), with the index type made a parameter.
SOURCE = """
extern "C" __global__ void gpupool_kernel(
    const float* __restrict__ gpupool_in0,
    const float gpupool_in1,
    const float gpupool_in2,
    float* __restrict__ gpupool_out,
    unsigned long long gpupool_n) {
  for (INDEX gpupool_i =
           blockIdx.x * (INDEX)blockDim.x + threadIdx.x;
       gpupool_i < gpupool_n; gpupool_i += (INDEX)gridDim.x * blockDim.x) {
    const float x = gpupool_in0[gpupool_i];
    const float a = gpupool_in1;
    const float b = gpupool_in2;
    float y{};
    {
float v = x;
for (int i = 0; i < FMAS; ++i) v = v * a + b;
y = v;
;
    }
    gpupool_out[gpupool_i] = y;
  }
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=2000 * 16384)
    parser.add_argument("--fmas", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    import cupy as cp  # type: ignore[import-not-found, import-untyped, unused-ignore]

    n, a, b = args.elements, cp.float32(0.999), cp.float32(0.001)
    x = cp.random.uniform(-1, 1, n, dtype=cp.float32)
    body = f"float v = x;\nfor (int i = 0; i < {args.fmas}; ++i) v = v * a + b;\ny = v;"
    reference_kernel = cp.ElementwiseKernel("float32 x, float32 a, float32 b", "float32 y", body,
                                            "launch_shape_reference")
    reference = cp.empty_like(x)
    device = cp.cuda.Device()
    sms = device.attributes["MultiProcessorCount"]
    resident = sms * device.attributes["MaxThreadsPerMultiProcessor"]
    kernels = {index: cp.RawKernel(SOURCE.replace("INDEX", index)
                                   .replace("FMAS", str(args.fmas)), "gpupool_kernel")
               for index in ("unsigned long long", "unsigned int")}

    def raw(index: str, block: int, grid: int) -> Callable[[Any], None]:
        kernel = kernels[index]
        return lambda out: kernel((grid,), (block,), (x, a, b, out, cp.uint64(n)))

    variants: Dict[str, Callable[[Any], None]] = {
        "CuPy ElementwiseKernel": lambda out: reference_kernel(x, a, b, out),
    }
    for block in (256, 128):
        wave = max(1, resident // block)
        for index in ("unsigned long long", "unsigned int"):
            short = "64-bit" if index.startswith("unsigned long") else "32-bit"
            variants[f"{short} index, block {block}, one wave ({wave} blocks)"] = raw(
                index, block, wave)
            variants[f"{short} index, block {block}, 4 waves"] = raw(index, block, 4 * wave)
            variants[f"{short} index, block {block}, a thread per element"] = raw(
                index, block, (n + block - 1) // block)
    reference_kernel(x, a, b, reference)
    times: Dict[str, List[float]] = {name: [] for name in variants}
    outputs = {name: cp.full_like(x, cp.nan) for name in variants}
    for name, launch in variants.items():  # each checked (and compiled) before it is timed
        launch(outputs[name])
        if not bool(cp.allclose(outputs[name], reference, rtol=1e-5, atol=1e-6)):
            raise SystemExit(f"FAIL: {name} differs from CuPy's kernel")
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(args.repeat):  # rounds interleave the variants
        for name, launch in variants.items():
            start.record()
            launch(outputs[name])
            stop.record()
            stop.synchronize()
            times[name].append(cp.cuda.get_elapsed_time(start, stop))
    for index, kernel in kernels.items():
        print(f"{index} index: {kernel.attributes['num_regs']} registers per thread")
    base = statistics.median(times["CuPy ElementwiseKernel"])
    print(f"{n} float32, {args.fmas} FMAs each, {sms} SMs; medians of {args.repeat}, checked")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:52s} {median:7.3f} ms  {median / base:5.2f}x CuPy's")


if __name__ == "__main__":
    main()
