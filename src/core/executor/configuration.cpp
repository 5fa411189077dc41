#include "core/executor/configuration.hpp"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "core/backend.hpp"
#include "core/environment.hpp"
#include "core/tuning/tuning.hpp"
#include "gpupool/error.hpp"
#include "gpupool/executor.hpp"  // measuring runs executors (choose_settings)

namespace gpupool::detail {
namespace {

constexpr std::size_t chunk_alignment = 256;
// Lane threads of one executor, all devices together: far beyond any useful count, and low
// enough that a mistaken option fails at once instead of exhausting the process's threads.
constexpr int most_lanes = limits::most_lanes_per_executor;
// Two device buffers per slot: two-input kernels stage both inputs.
constexpr std::size_t device_buffers_per_slot = 2;

// Checks the lanes per device chosen (given, measured or fixed) against the limits.
int check_lanes(int lanes, std::size_t devices) {
  if (lanes < 1 || lanes > most_lanes_per_device)
    throw std::invalid_argument("gpupool: lanes_per_device must be from 1 to " +
                                std::to_string(most_lanes_per_device) + ", not " +
                                std::to_string(lanes));
  if (static_cast<std::size_t>(lanes) * devices > static_cast<std::size_t>(most_lanes))
    throw std::invalid_argument("gpupool: " + std::to_string(devices) + " devices x " +
                                std::to_string(lanes) + " lanes is more than the limit of " +
                                std::to_string(most_lanes) + " lanes per executor");
  return lanes;
}

// The chunk size chosen (given, measured or fixed), fitted to the device memory budget.
std::size_t fit_chunk_bytes(const executor_options& options, std::size_t chunk, int lanes) {
  if (options.device_memory_budget != 0) {
    const std::size_t buffers = static_cast<std::size_t>(lanes) *
                                static_cast<std::size_t>(options.slots_per_lane) *
                                device_buffers_per_slot;
    chunk = std::min(chunk, options.device_memory_budget / buffers);
  }
  chunk = chunk / chunk_alignment * chunk_alignment;
  if (chunk < smallest_chunk) {
    if (options.device_memory_budget != 0)
      throw std::invalid_argument(
          "gpupool: device_memory_budget of " + std::to_string(options.device_memory_budget) +
          " bytes is too small for " + std::to_string(lanes) + " lanes x " +
          std::to_string(options.slots_per_lane) + " slots (each needs " +
          std::to_string(device_buffers_per_slot * smallest_chunk) + " bytes at least)");
    throw std::invalid_argument("gpupool: chunk_bytes must be at least " +
                                std::to_string(smallest_chunk));
  }
  return chunk;
}

}  // namespace

std::vector<int> choose_ordinals(const executor_options& options, int available) {
  std::vector<int> ordinals = options.devices;
  if (ordinals.empty()) ordinals = devices_from_environment().value_or(std::vector<int>{});
  if (ordinals.empty()) {
    for (int i = 0; i < available; ++i) ordinals.push_back(i);
  }
  if (ordinals.empty()) throw backend_unavailable("gpupool: the backend has no devices");
  // One ordinal named several times makes that many devices of it (the executor divides what
  // they share); each still needs a lane, so the lane limit bounds how many.
  for (int d : ordinals) {
    if (d < 0 || d >= available)
      throw std::invalid_argument("gpupool: device " + std::to_string(d) + " does not exist (" +
                                  std::to_string(available) + " visible)");
  }
  if (ordinals.size() > static_cast<std::size_t>(limits::most_lanes_per_executor))
    throw std::invalid_argument("gpupool: " + std::to_string(ordinals.size()) +
                                " devices is more than an executor's " +
                                std::to_string(limits::most_lanes_per_executor) + " lanes");
  return ordinals;
}

executor_settings checked_settings(const executor_options& options, backend& b,
                                   const std::vector<int>& ordinals) {
  check_priority(options.priority, "executor_options::priority");
  // Before any measuring: a priority the devices' streams cannot have refuses the executor.
  for (int ordinal : ordinals) b.check_stream_priority(ordinal, options.priority);
  if (options.slots_per_lane < 1 || options.slots_per_lane > limits::most_slots_per_lane)
    throw std::invalid_argument("gpupool: slots_per_lane must be from 1 to " +
                                std::to_string(limits::most_slots_per_lane));
  if (options.host_lanes < 0 || options.host_lanes > limits::most_host_lanes)
    throw std::invalid_argument("gpupool: host_lanes must be from 0 to " +
                                std::to_string(limits::most_host_lanes));
  if (options.lanes_per_device != 0) (void)check_lanes(options.lanes_per_device, ordinals.size());
  if (options.chunk_bytes != 0)
    (void)fit_chunk_bytes(options, options.chunk_bytes, std::max(options.lanes_per_device, 1));
  executor_settings s = choose_settings(options, b, ordinals);
  s.lanes_per_device = check_lanes(s.lanes_per_device, ordinals.size());
  s.chunk_bytes = fit_chunk_bytes(options, s.chunk_bytes, s.lanes_per_device);
  return s;
}

}  // namespace gpupool::detail

namespace gpupool {

const char* to_string(when_full w) noexcept {
  return w == when_full::raise ? "raise" : "block";
}

std::optional<when_full> when_full_from_name(std::string_view name) noexcept {
  for (when_full w : {when_full::block, when_full::raise})
    if (name == to_string(w)) return w;
  return std::nullopt;
}

void check_priority(int priority, const char* what) {
  if (priority < limits::lowest_priority || priority > limits::highest_priority)
    throw std::invalid_argument("gpupool: " + std::string(what) + " must be an integer from " +
                                std::to_string(limits::lowest_priority) + " to " +
                                std::to_string(limits::highest_priority) +
                                " (higher is more "
                                "urgent), not " +
                                std::to_string(priority));
}

}  // namespace gpupool
