// The tuning sweep's configurations as executors: what connects the sweep (tuning.cpp, which
// knows nothing of executors) to the executor that asks for measured settings. A template over
// the executor type, instantiated only where the executor is complete
// (src/core/executor/configuration.cpp, the tests), so that neither tuning.cpp nor this header
// includes gpupool/executor.hpp: the executor uses tuning, tuning does not use the executor.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "gpupool/options.hpp"
#include "gpupool/types.hpp"

namespace gpupool {
class executor;
}  // namespace gpupool

namespace gpupool::detail {

class sweep_configuration;

/// One sweep configuration: an `Executor` made from the configuration's options, squaring with
/// the built-in kernel as a map does.
template <class Executor, class Configuration>
class executor_configuration final : public Configuration {
 public:
  explicit executor_configuration(const executor_options& options) : executor_(options) {}
  int lanes_per_device() const override { return executor_.lanes_per_device(); }
  std::size_t chunk_bytes() const override { return executor_.chunk_bytes(); }
  void square(std::span<const double> in, std::span<double> out) override {
    executor_.transform(builtin_kernel::square(), in, out).get();
  }

 private:
  Executor executor_;
};

/// The runner (tuning.hpp's sweep_runner) that measures on executors.
template <class Executor = executor, class Configuration = sweep_configuration>
auto executor_sweep_runner() {
  return [](const executor_options& options) -> std::unique_ptr<Configuration> {
    return std::make_unique<executor_configuration<Executor, Configuration>>(options);
  };
}

}  // namespace gpupool::detail
