// The lane a Python task runs on: gpupool.current_lane() and the Lane object.
#pragma once

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// Whether device arrays of CUDA libraries (CuPy, PyTorch) on the backend's devices are used in
// place and their streams waited for: what the backend says of itself, never its name.
bool takes_cuda_arrays(gpupool::backend_kind kind);

// Makes `l` the current lane of this thread for its lifetime (a Python task running on it).
class lane_scope {
 public:
  explicit lane_scope(gpupool::lane* l);
  lane_scope(const lane_scope&) = delete;
  lane_scope& operator=(const lane_scope&) = delete;
  ~lane_scope();

 private:
  gpupool::lane* previous_;
};

}  // namespace gpupool_python
