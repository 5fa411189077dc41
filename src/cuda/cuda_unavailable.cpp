// The CUDA backend's registration in builds without the CUDA toolkit: it never runs, and says why
// to whoever asks for it.
#include <memory>
#include <string>

#include "core/backend.hpp"
#include "cuda/cuda_traits.hpp"
#include "gpupool/error.hpp"

namespace gpupool::detail {
namespace {

backend_probe probe() {
  return {false, 0, "this gpupool was built without the CUDA backend"};
}

std::shared_ptr<backend> make(const stand_in_devices& /*stand_ins*/) {
  throw backend_unavailable("gpupool: the CUDA backend was requested, but " + probe().reason);
}

}  // namespace

constinit const backend_registration cuda_backend_registration{backend_kind::cuda, &probe, &make,
                                                               nullptr, &cuda_traits};

}  // namespace gpupool::detail
