// The motivating program, with gpupool: square five arrays of a million float64 on every lane of
// every GPU (or on the CPU backend), results back in input order.
#include <cstdio>
#include <random>
#include <vector>

#include <gpupool/gpupool.hpp>

int main() {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<std::vector<double>> chunks(5, std::vector<double>(1'000'000));
  for (auto& c : chunks)
    for (auto& x : c) x = dist(rng);

  gpupool::executor pool;  // every visible GPU, default lanes per GPU
  auto squares =
      pool.map(gpupool::builtin_kernel::square(), chunks).get();  // gpupool::host_vector<double>s

  for (std::size_t i = 0; i < squares.size(); ++i)
    std::printf("chunk %zu: %.6f^2 = %.6f\n", i, chunks[i][0], squares[i][0]);
  return 0;
}
