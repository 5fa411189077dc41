// Configuration: which devices an executor runs on, and its lanes per device, slots and chunk
// size, each checked against the limits and the chunk fitted to the device memory budget.
#pragma once

#include <vector>

#include "gpupool/options.hpp"

namespace gpupool::detail {

class backend;

// The backend ordinals `options.devices` names, else GPUPOOL_DEVICES, else all `available`
// ones once. An ordinal may repeat: each time is a device of the executor's own.
// @throw backend_unavailable without devices; std::invalid_argument for an unknown device or
//        more devices than an executor has lanes.
[[nodiscard]] std::vector<int> choose_ordinals(const executor_options& options, int available);

// The settings for `options` on `ordinals` (given, fixed or measured: see tuning/), every value
// checked against the limits, the given ones before anything is measured.
// @throw std::invalid_argument naming the value out of range.
[[nodiscard]] executor_settings checked_settings(const executor_options& options, backend& b,
                                                 const std::vector<int>& ordinals);

}  // namespace gpupool::detail
