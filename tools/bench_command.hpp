// `gpupool bench`: the machine's copy limits, then a sweep of lanes per device x chunk size.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "gpupool/options.hpp"

namespace gpupool_cli {

struct bench_flags {
  std::vector<int> lanes{1, 2, 4, 8};
  std::vector<std::string> sizes{"64K", "128K", "256K", "512K", "1M", "2M",
                                 "4M",  "8M",   "16M",  "32M",  "64M"};
  std::string dtype = "float64";
  std::string kernel = "square";
  std::string total = "512M";  // input bytes per measurement
  int repeat = 3;
  std::string csv_path;
  std::string json_path;
  std::string plot_path;  // .svg drawn here; .png through the Python package (matplotlib)
};

/// The median of `values` (not empty).
double median(std::vector<double> values);

/// Parses "64K", "8M", "1G" or a plain byte count. @throw std::invalid_argument.
std::size_t parse_bytes(const std::string& text);

/// Runs the bench; returns the process exit code.
int run_bench(const gpupool::executor_options& base, const bench_flags& flags);

}  // namespace gpupool_cli
