// Choosing a backend: the caller's wish, then GPUPOOL_BACKEND, then whatever can run here.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include "core/backend.hpp"
#include "core/environment.hpp"
#include "core/lanes/event_wait.hpp"
#include "core/memory/host_memory.hpp"
#include "core/memory/pinned_cache.hpp"
#include "core/scheduling/lane_spin.hpp"
#include "gpupool/availability.hpp"
#include "gpupool/error.hpp"
#include "gpupool/fork.hpp"
#include "gpupool/options.hpp"

namespace gpupool::detail {
namespace {

std::optional<backend_kind> backend_from_environment() {
  const char* value = std::getenv("GPUPOOL_BACKEND");
  if (value == nullptr || *value == '\0') return std::nullopt;
  if (auto kind = backend_from_name(value)) return kind;
  throw std::invalid_argument("GPUPOOL_BACKEND must be " + backend_name_list() + ", not '" +
                              std::string(value) + "'");
}

int cpu_devices_from_environment() {
  return static_cast<int>(
      count_from_environment({"GPUPOOL_CPU_DEVICES", "a count", 1, limits::most_cpu_devices})
          .value_or(1));
}

// The variables read elsewhere only when their feature is used (GPUPOOL_EVENT_WAIT by the CUDA
// backend's first event, GPUPOOL_PINNED_CACHE_BYTES by the first pinned allocation,
// GPUPOOL_LANE_SPIN_US by the executor after the backend is chosen, GPUPOOL_DEVICES
// where the options name no devices) are checked
// here too, so that a typo is refused when an executor is made, on every backend, instead of
// being ignored on one.
void check_environment() {
  (void)event_wait_from_environment();
  (void)lane_spin_from_environment();
  (void)pinned_cache_bytes_from_environment();
  (void)quiet_from_environment();
  (void)backend_from_environment();
  (void)cpu_devices_from_environment();
  (void)devices_from_environment();
}

// The backends built in, in the order the automatic choice tries them.
constexpr const backend_registration* registrations[] = {&cuda_backend_registration,
                                                         &cpu_backend_registration};

const backend_registration& registration(backend_kind kind) {
  for (const backend_registration* r : registrations)
    if (r->kind == kind) return *r;
  throw std::logic_error(std::string("gpupool: no registration for the ") + to_string(kind) +
                         " backend");
}

bool can_run(const backend_registration& r) noexcept {
  try {
    return r.probe().usable;
  } catch (...) {
    return false;
  }
}

host_memory& choose_host_memory() noexcept {
  std::optional<backend_kind> named;
  try {
    named = backend_from_environment();
  } catch (const std::invalid_argument&) {
    // A bad value is refused when an executor is made; pinned memory does not wait for one.
  }
  const auto usable = [](const backend_registration* r) {
    return r->host != nullptr && can_run(*r);
  };
  for (const backend_registration* r : registrations)
    if (named == r->kind && usable(r)) return r->host();
  for (const backend_registration* r : registrations)
    if (usable(r)) return r->host();
  return cpu_backend_registration.host();  // runs everywhere
}

// The choice, made at the first use, and the fork generation it was made under: a fork()ed child
// chooses again (the parent's backend may not run there: CUDA does not survive fork(); its probe
// then says so and the CPU's memory is chosen). The generation is published after the choice, so
// a thread that finds its own generation finds the choice made under it. Not a fork_fresh: there
// is no lock to inherit held, and choosing probes backends, which a fork handler may not do.
std::atomic<host_memory*> chosen_host_memory{nullptr};
std::atomic<unsigned> chosen_generation{0};

}  // namespace

const backend_traits& traits_of(backend_kind kind) {
  return *registration(kind).traits;
}

bool kernels_reach_pinned_blocks(backend_kind kind) noexcept {
  try {
    const backend_registration& r = registration(kind);
    if (!r.traits->kernels_reach_pinned_host) return false;
    // Kernels that run on the host reach host memory of any kind.
    if (r.traits->device_memory_is_host) return true;
    return r.host != nullptr && can_run(r) && &r.host() == &process_host_memory();
  } catch (...) {  // no registration for it
    return false;
  }
}

void throw_wrong_type(const std::type_info& actual, const std::type_info& expected) {
  throw std::logic_error(std::string("gpupool: a backend was handed an object of type ") +
                         actual.name() + " where it expects its own " + expected.name() +
                         " (objects of one backend used with another)");
}

host_memory& process_host_memory() noexcept {
  const unsigned generation = fork_generation();
  if (chosen_generation.load(std::memory_order_acquire) == generation)
    if (host_memory* known = chosen_host_memory.load(std::memory_order_acquire)) return *known;
  // Racing first users choose the same (each backend's host memory is one object per process).
  host_memory& chosen = choose_host_memory();
  chosen_host_memory.store(&chosen, std::memory_order_release);
  chosen_generation.store(generation, std::memory_order_release);
  return chosen;
}

std::shared_ptr<backend> select_backend(const executor_options& options) {
  if (options.cpu_devices < 0 || options.cpu_devices > limits::most_cpu_devices)
    throw std::invalid_argument(
        "gpupool: cpu_devices must be from 0 (GPUPOOL_CPU_DEVICES, else 1) to " +
        std::to_string(limits::most_cpu_devices) + ", not " + std::to_string(options.cpu_devices));
  // 0, or finite and not below the floor; the largest double is far beyond any bus, so no upper
  // bound.
  const double rate = options.cpu_copy_rate;
  if (rate != 0 && !(std::isfinite(rate) && rate >= limits::least_cpu_copy_rate)) {
    char shown[32];
    std::snprintf(shown, sizeof shown, "%.17g", rate);
    throw std::invalid_argument(
        "gpupool: cpu_copy_rate must be 0 (no limit) or a finite number "
        "of bytes per second of at least " +
        std::to_string(static_cast<long>(limits::least_cpu_copy_rate)) + ", not " + shown);
  }
  check_environment();
  const stand_in_devices stand_ins{
      options.cpu_devices > 0 ? options.cpu_devices : cpu_devices_from_environment(), rate};
  const std::optional<backend_kind> wanted =
      options.backend ? options.backend : backend_from_environment();
  if (wanted) return registration(*wanted).make(stand_ins);

  std::string skipped;  // why the backends before the one chosen cannot run
  for (const backend_registration* r : registrations) {
    const backend_probe probe = r->probe();
    if (!probe.usable) {
      skipped += (skipped.empty() ? "" : "; ") + probe.reason;
      continue;
    }
    if (!skipped.empty() && !options.quiet && !quiet_from_environment()) {
      static std::once_flag notice;
      std::call_once(notice, [&] {
        std::fprintf(stderr, "gpupool: no usable GPU (%s); running on the CPU backend\n",
                     skipped.c_str());
      });
    }
    return r->make(stand_ins);
  }
  throw backend_unavailable("gpupool: no backend can run here (" + skipped + ")");
}

}  // namespace gpupool::detail

namespace gpupool {

bool takes_cuda_arrays(backend_kind kind) {
  return detail::traits_of(kind).cuda_device_pointers;
}

backend_availability cuda_availability() noexcept {
  try {
    const detail::backend_probe p = detail::registration(backend_kind::cuda).probe();
    return {p.usable, p.devices, p.reason};
  } catch (const std::exception& e) {
    return {false, 0, e.what()};
  }
}

}  // namespace gpupool
