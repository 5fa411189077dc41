// Arbitrary work on a lane: upload, run kernels and download on the lane's own stream.
#include <cstdio>
#include <numeric>
#include <vector>

#include <gpupool/gpupool.hpp>

int main() {
  gpupool::executor pool({.lanes_per_device = 2});

  std::vector<float> x(1 << 20), y(1 << 20);
  std::iota(x.begin(), x.end(), 0.0f);
  std::fill(y.begin(), y.end(), 1.0f);

  // y = 2 * x + y, then squared; the result comes back through the future.
  auto result = pool.submit([&](gpupool::lane& lane) {
    auto dx = lane.upload<float>(x);
    auto dy = lane.upload<float>(y);
    lane.apply(gpupool::builtin_kernel::axpy(2.0), dx, dy);
    lane.apply(gpupool::builtin_kernel::square(), dy);
    std::vector<float> out(dy.size());
    lane.download<float>(dy, out);
    return out;
  });

  std::vector<float> out = result.get();
  std::printf("(2*3 + 1)^2 = %g on the %s backend\n", out[3], gpupool::to_string(pool.backend()));
  return out[3] == 49.0f ? 0 : 1;
}
