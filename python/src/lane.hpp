// The lane a Python task runs on: gpupool.current_lane() and the Lane object.
#pragma once

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

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
