// Reports: what an executor says of itself (its devices, settings and placement) as the Python
// dicts that gpupool.Executor returns, under the C++ structs' field names.

#pragma once

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// Executor.devices()' entries: one device and the lanes it runs.
nb::dict device_dict(const gpupool::device_info& d, int lanes);

// Executor.placement()'s dict: the fields of gpupool::placement_stats.
nb::dict placement_dict(const gpupool::placement_stats& p);

// Executor.settings()' dict: lanes and chunk size, where each came from, the sweep's samples.
nb::dict settings_dict(const gpupool::executor_settings& s);

}  // namespace gpupool_python
