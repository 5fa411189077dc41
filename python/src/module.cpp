// gpupool._ext: the thin binding between the C++ core and the Python package. It adapts only:
// the GIL (released in every blocking call and for all array work), exceptions, and the array
// protocols. The Executor semantics live in python/gpupool/_executor.py.
//
// One file per concept: errors, kernels, arrays (intake, pinned results, futures of arrays),
// trace, lane and executor; each binds its part through one bind_* call.
#include <nanobind/nanobind.h>

#include "common.hpp"
#include "gpupool/gpupool.hpp"

NB_MODULE(_ext, m) {
  using namespace gpupool_python;
  m.doc() = "gpupool's C++ core (internal; use the gpupool package)";

  bind_errors(m);
  bind_kernels(m);
  bind_arrays(m);
  bind_trace(m);
  bind_lane(m);
  bind_futures(m);
  bind_kernel_map(m);
  bind_executor(m);

  m.def("cuda_availability", []() {
    const auto a = gpupool::cuda_availability();
    return nb::make_tuple(a.usable, a.devices, a.reason);
  });
  m.attr("__version__") = GPUPOOL_VERSION_STRING;
  m.attr("HAS_CUDA") = bool(GPUPOOL_HAS_CUDA);
  // One source for the limits and names the Python layer checks against and documents.
  m.attr("MOST_LANES_PER_DEVICE") = gpupool::limits::most_lanes_per_device;
  m.attr("MOST_LANES_PER_EXECUTOR") = gpupool::limits::most_lanes_per_executor;
  m.attr("MOST_SLOTS_PER_LANE") = gpupool::limits::most_slots_per_lane;
  m.attr("MOST_CPU_DEVICES") = gpupool::limits::most_cpu_devices;
  m.attr("LEAST_CPU_COPY_RATE") = gpupool::limits::least_cpu_copy_rate;
  m.attr("MOST_HOST_LANES") = gpupool::limits::most_host_lanes;
  m.attr("MOST_HOST_TASK_BYTES") = gpupool::limits::most_host_task_bytes;
  m.attr("HOST_DEVICE") = gpupool::host_device;  // the device of a host lane's trace records
  m.attr("LOWEST_PRIORITY") = gpupool::limits::lowest_priority;
  m.attr("HIGHEST_PRIORITY") = gpupool::limits::highest_priority;
  nb::list backends;
  for (const auto& b : gpupool::backend_names) backends.append(b.name);
  m.attr("BACKENDS") = nb::tuple(backends);
  m.attr("WHEN_FULL_MODES") = nb::make_tuple(gpupool::to_string(gpupool::when_full::block),
                                             gpupool::to_string(gpupool::when_full::raise));
  nb::list tunings;
  for (auto t : {gpupool::tuning::automatic, gpupool::tuning::measured, gpupool::tuning::remeasure,
                 gpupool::tuning::fixed})
    tunings.append(gpupool::to_string(t));
  m.attr("TUNING_MODES") = nb::tuple(tunings);
}
