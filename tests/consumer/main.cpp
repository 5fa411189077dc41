#include <cstdio>
#include <vector>

#include <gpupool/gpupool.hpp>

int main() {
  gpupool::executor pool({.lanes_per_device = 2, .quiet = true});
  const std::vector<std::vector<int>> inputs{{1, 2, 3}, {4, 5}};
  const auto out = pool.map(gpupool::builtin_kernel::square(), inputs).get();
  const bool ok = out.size() == 2 && out[0][2] == 9 && out[1][1] == 25;
  std::printf("consumer on %s: %s\n", gpupool::to_string(pool.backend()), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
