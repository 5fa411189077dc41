// Choosing a backend: the caller's wish, then GPUPOOL_BACKEND, then whatever can run here.
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include "core/backend.hpp"
#include "gpupool/availability.hpp"
#include "gpupool/error.hpp"
#include "gpupool/version.hpp"

namespace gpupool::detail {
namespace {

std::optional<backend_kind> backend_from_environment() {
  const char* value = std::getenv("GPUPOOL_BACKEND");
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string s(value);
  if (s == "cpu") return backend_kind::cpu;
  if (s == "cuda") return backend_kind::cuda;
  throw std::invalid_argument("GPUPOOL_BACKEND must be 'cpu' or 'cuda', not '" + s + "'");
}

int cpu_devices_from_environment() {
  const char* value = std::getenv("GPUPOOL_CPU_DEVICES");
  if (value == nullptr || *value == '\0') return 1;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (*end != '\0' || n < 1 || n > 1024)
    throw std::invalid_argument(
        std::string("GPUPOOL_CPU_DEVICES must be a count from 1 to 1024, not '") + value + "'");
  return static_cast<int>(n);
}

// GPUPOOL_QUIET=1 silences the CPU-backend notice, as executor_options::quiet does.
bool quiet_from_environment() {
  const char* v = std::getenv("GPUPOOL_QUIET");
  if (v == nullptr || *v == '\0' || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw std::invalid_argument(std::string("GPUPOOL_QUIET must be 0 or 1, not '") + v + "'");
}

// The variables read elsewhere only when their feature is used (GPUPOOL_EVENT_WAIT by the CUDA
// backend's first event, GPUPOOL_PINNED_CACHE_BYTES by the first pinned allocation) are checked
// here too, so that a typo is refused when an executor is made, on every backend, instead of
// being ignored on one.
void check_environment() {
  if (const char* v = std::getenv("GPUPOOL_EVENT_WAIT"); v != nullptr && *v != '\0') {
    const std::string s(v);
    if (s != "block" && s != "spin")
      throw std::invalid_argument("GPUPOOL_EVENT_WAIT must be 'block' or 'spin', not '" + s + "'");
  }
  if (const char* v = std::getenv("GPUPOOL_PINNED_CACHE_BYTES"); v != nullptr && *v != '\0') {
    const std::string s(v);
    if (s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument(
          "GPUPOOL_PINNED_CACHE_BYTES must be a byte count (digits only, e.g. 1073741824), not '" +
          s + "'");
  }
  (void)quiet_from_environment();
  (void)backend_from_environment();
  (void)cpu_devices_from_environment();
}

}  // namespace

#if !GPUPOOL_HAS_CUDA
cuda_probe probe_cuda() {
  return {false, 0, "this gpupool was built without the CUDA backend"};
}
std::shared_ptr<backend> make_cuda_backend() {
  throw backend_unavailable("gpupool: the CUDA backend was requested, but " + probe_cuda().reason);
}
#endif

bool cuda_runtime_usable() {
  static const bool usable = [] {
    const char* forced = std::getenv("GPUPOOL_BACKEND");
    if (forced != nullptr && std::string(forced) == "cpu") return false;
    return probe_cuda().usable;
  }();
  return usable;
}

std::shared_ptr<backend> select_backend(const std::optional<backend_kind>& requested,
                                        int cpu_devices, bool quiet) {
  if (cpu_devices < 0 || cpu_devices > 1024)
    throw std::invalid_argument("gpupool: cpu_devices must be from 1 to 1024 (0: " +
                                std::string("GPUPOOL_CPU_DEVICES, else 1), not ") +
                                std::to_string(cpu_devices));
  check_environment();
  const int stand_ins = cpu_devices > 0 ? cpu_devices : cpu_devices_from_environment();
  const std::optional<backend_kind> wanted = requested ? requested : backend_from_environment();
  if (wanted == backend_kind::cpu) return make_cpu_backend(stand_ins);
  if (wanted == backend_kind::cuda) return make_cuda_backend();

  const cuda_probe probe = probe_cuda();
  if (probe.usable) return make_cuda_backend();
  static std::once_flag notice;
  if (!quiet && !quiet_from_environment()) {
    std::call_once(notice, [&] {
      std::fprintf(stderr, "gpupool: no usable GPU (%s); running on the CPU backend\n",
                   probe.reason.c_str());
    });
  }
  return make_cpu_backend(stand_ins);
}

}  // namespace gpupool::detail

namespace gpupool {

backend_availability cuda_availability() noexcept {
  try {
    const detail::cuda_probe p = detail::probe_cuda();
    return {p.usable, p.devices, p.reason};
  } catch (const std::exception& e) {
    return {false, 0, e.what()};
  }
}

}  // namespace gpupool
