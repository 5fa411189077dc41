// A raw kernel that writes one element past the end of its output, for compute-sanitizer:
//   compute-sanitizer --tool memcheck --error-exitcode 3 gpupool_oob_write
// must report an invalid global write and exit 3 (`scripts/gpu check` checks both). Without the
// sanitizer the stray write lands in the memory pool's slack and nothing notices - which is why
// the sanitizer run exists. Exits 0 without running anything when no GPU is usable.
#include <cstdio>
#include <vector>

#include "gpupool/gpupool.hpp"

int main() {
  if (!gpupool::cuda_availability().usable) {
    std::puts("no usable GPU: nothing to check");
    return 0;
  }
  gpupool::executor_options options;
  options.backend = gpupool::backend_kind::cuda;
  options.lanes_per_device = 1;
  gpupool::executor ex(options);
  const gpupool::raw_kernel past_the_end(R"(
extern "C" __global__ void past_the_end(const float* x, float* out, unsigned long long n) {
  const unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i <= n) out[i] = x[i < n ? i : 0];  // i == n writes one element too far
}
)",
                                         "past_the_end", "float32* x", "float32* out");
  std::vector<float> host(1000, 1.0f);
  ex.submit([&](gpupool::lane& l) {
      auto x = l.upload(std::span<const float>(host));
      auto out = l.allocate<float>(host.size());
      l.run(past_the_end, {x}, out);
      l.synchronize();
    }).get();
  std::puts("the kernel ran");
  return 0;
}
