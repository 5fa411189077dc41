// Reports: an executor's devices, settings and placement as Python dicts (see reports.hpp).

#include "reports.hpp"

namespace gpupool_python {

nb::dict device_dict(const gpupool::device_info& d, int lanes) {
  nb::dict out;
  out["id"] = d.id;
  out["ordinal"] = d.ordinal;
  out["name"] = d.name;
  out["backend"] = gpupool::to_string(d.backend);
  out["total_memory"] = d.total_memory;
  out["free_memory"] = d.free_memory;
  out["compute_capability"] = nb::make_tuple(d.compute_major, d.compute_minor);
  out["multiprocessors"] = d.multiprocessors;
  out["lanes"] = lanes;
  return out;
}

nb::dict placement_dict(const gpupool::placement_stats& p) {
  nb::dict out;
  out["host_tasks"] = p.host_tasks;
  out["device_tasks"] = p.device_tasks;
  out["host_share"] = p.host_share;
  out["host_bytes_per_second"] = p.host_bytes_per_second;
  out["device_bytes_per_second"] = p.device_bytes_per_second;
  out["host_latency_seconds"] = p.host_latency_seconds;
  out["device_latency_seconds"] = p.device_latency_seconds;
  return out;
}

nb::dict settings_dict(const gpupool::executor_settings& s) {
  nb::dict out;
  out["threads_per_gpu"] = s.lanes_per_device;
  out["chunk_bytes"] = s.chunk_bytes;
  out["threads_per_gpu_from"] = gpupool::to_string(s.lanes_from);
  out["chunk_bytes_from"] = gpupool::to_string(s.chunk_from);
  nb::list samples;
  for (const auto& sample : s.samples) {
    nb::dict d;
    d["threads_per_gpu"] = sample.lanes_per_device;
    d["chunk_bytes"] = sample.chunk_bytes;
    d["bytes_per_second"] = sample.bytes_per_second;
    samples.append(d);
  }
  out["samples"] = samples;
  out["cache_file"] = s.cache_file.empty() ? nb::none() : nb::cast(s.cache_file);
  out["note"] = s.note;
  return out;
}

}  // namespace gpupool_python
