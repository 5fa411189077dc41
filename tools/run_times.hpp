// The spread of a demo's timed runs: median, quartiles and extremes, so that the steady state is
// reported as a distribution and one slow or fast run cannot pass for the typical one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace gpupool_cli {

struct run_times {
  std::size_t count = 0;
  double min = 0;
  double q1 = 0;  // 25th percentile
  double median = 0;
  double q3 = 0;  // 75th percentile
  double max = 0;
};

/// The `q` quantile (0..1) of sorted, non-empty `v`, interpolated linearly between the two
/// nearest ranks (NumPy's default), so the Python front end computes the same figures.
inline double quantile_of_sorted(const std::vector<double>& v, double q) {
  const double rank = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

/// The summary of `values` (all zero when empty).
inline run_times summarise_runs(std::vector<double> values) {
  run_times t;
  if (values.empty()) return t;
  std::sort(values.begin(), values.end());
  t.count = values.size();
  t.min = values.front();
  t.q1 = quantile_of_sorted(values, 0.25);
  t.median = quantile_of_sorted(values, 0.5);
  t.q3 = quantile_of_sorted(values, 0.75);
  t.max = values.back();
  return t;
}

}  // namespace gpupool_cli
