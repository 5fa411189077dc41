// Your own math, compiled at run time: an elementwise kernel from a one-line body (runs on every
// backend), and a raw CUDA kernel from source (runs where a GPU is). Results are checked.
#include <cmath>
#include <cstdio>
#include <vector>

#include <gpupool/gpupool.hpp>

int main() {
  gpupool::executor pool;  // every visible GPU, or the CPU backend
  std::vector<double> x(1'000'000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i) * 1e-6;

  // y = a*x^2 + sin(x), with a = 2.5 broadcast to every element. Compiled on first use (NVRTC on
  // a GPU, the host compiler on the CPU backend) and cached on disk for the next process.
  gpupool::elementwise_kernel poly("float64 x, float64 a", "float64 y", "y = a * x * x + sin(x);",
                                   "poly");
  std::vector<double> y(x.size());
  pool.transform<double>(poly, {x, 2.5}, y).get();
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::abs(y[i] - (2.5 * x[i] * x[i] + std::sin(x[i]))) > 1e-12) {
      std::printf("element %zu is wrong\n", i);
      return 1;
    }
  std::printf("%s backend: poly(x[999999]) = %.9f, all %zu results checked\n",
              gpupool::to_string(pool.backend()), y.back(), y.size());

  // A kernel you already have, in CUDA source: out = a*x + y.
  gpupool::raw_kernel saxpy(R"(
extern "C" __global__ void saxpy(const double* x, double a, const double* y, double* out,
                                 unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    out[i] = a * x[i] + y[i];
})",
                            "saxpy", "float64* x, float64 a, float64* y", "float64* out");
  std::vector<double> out(x.size());
  try {
    pool.transform<double>(saxpy, {x, 3.0, y}, out).get();
  } catch (const gpupool::backend_unavailable& e) {
    std::printf("raw kernel skipped: %s\n", e.what());
    return 0;
  }
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::abs(out[i] - (3.0 * x[i] + y[i])) > 1e-12 * (1.0 + std::abs(out[i]))) {
      std::printf("saxpy element %zu is wrong\n", i);
      return 1;
    }
  std::printf("saxpy on the GPU: all %zu results checked\n", out.size());
  return 0;
}
