// `gpupool bench`: the machine's copy limits, then a sweep of lanes per device x chunk size.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "gpupool/options.hpp"

namespace gpupool_cli {

struct bench_flags {
  std::vector<int> lanes{1, 2, 4, 8};
  std::vector<std::size_t> sizes{
      std::size_t{64} << 10, std::size_t{128} << 10, std::size_t{256} << 10, std::size_t{512} << 10,
      std::size_t{1} << 20,  std::size_t{2} << 20,   std::size_t{4} << 20,   std::size_t{8} << 20,
      std::size_t{16} << 20, std::size_t{32} << 20,  std::size_t{64} << 20};
  std::string dtype = "float64";
  std::string kernel = "square";
  std::size_t total = std::size_t{512} << 20;  // input bytes per measurement
  int repeat = 3;
  std::string csv_path;
  std::string json_path;
  std::string plot_path;  // refused here: pictures are drawn by the Python package's command
};

/// The median of `values` (not empty).
double median(std::vector<double> values);

/// Runs the bench; returns the process exit code.
int run_bench(const gpupool::executor_options& base, const bench_flags& flags);

}  // namespace gpupool_cli
