// Reports: what an executor says of itself (its devices, settings and placement) as the Python
// dicts that gpupool.Executor returns.

#pragma once

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// The entries of Executor.devices: one device and the lanes it runs.
nb::dict device_dict(const gpupool::device_info& d, int lanes);

// Executor.placement()'s dict: the fields of gpupool::placement_stats, under their names.
nb::dict placement_dict(const gpupool::placement_stats& p);

// Executor.settings: lanes and chunk size, where each came from, the sweep's samples.
nb::dict settings_dict(const gpupool::executor_settings& s);

}  // namespace gpupool_python
