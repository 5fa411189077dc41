#include "core/fault_injection.hpp"

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/environment.hpp"
#include "gpupool/error.hpp"

namespace gpupool::detail {
namespace {

constexpr const char* kind_names[fault_kinds] = {"alloc", "copy", "launch", "call"};

double parse_rate(const std::string& text, const std::string& whole) {
  std::size_t used = 0;
  double rate = -1.0;
  try {
    rate = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(rate >= 0.0 && rate <= 1.0))
    throw std::invalid_argument("GPUPOOL_FAULTS: a rate must be a number from 0 to 1, not '" +
                                text + "' (in '" + whole + "')");
  return rate;
}

class faulty_stream final : public backend_stream {
 public:
  faulty_stream(std::unique_ptr<backend_stream> inner, fault_injector& faults)
      : inner_(std::move(inner)), faults_(faults) {}

  void* native_handle() const noexcept override { return inner_->native_handle(); }
  std::unique_ptr<backend_event> make_event() override { return inner_->make_event(); }
  std::unique_ptr<backend_timer> make_timer() override { return inner_->make_timer(); }
  void* allocate(std::size_t bytes) override {
    faults_.maybe_fail(fault_kind::allocation);
    return inner_->allocate(bytes);
  }
  void deallocate(void* p) noexcept override { inner_->deallocate(p); }
  void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) override {
    faults_.maybe_fail(fault_kind::copy);
    inner_->copy_to_device(device_dst, host_src, bytes);
  }
  void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) override {
    faults_.maybe_fail(fault_kind::copy);
    inner_->copy_to_host(host_dst, device_src, bytes);
  }
  void launch(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
              std::size_t count) override {
    faults_.maybe_fail(fault_kind::launch);
    inner_->launch(k, t, x, y, out, count);
  }
  void launch_marked(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
                     std::size_t count, backend_timer& begin, backend_timer& end) override {
    faults_.maybe_fail(fault_kind::launch);
    inner_->launch_marked(k, t, x, y, out, count, begin, end);
  }
  void launch_compiled(const compiled_kernel& k, void* const* args, std::size_t count) override {
    faults_.maybe_fail(fault_kind::launch);
    inner_->launch_compiled(k, args, count);
  }
  void launch_compiled_batch(const compiled_kernel& k, const std::uint64_t* table,
                             std::size_t rows) override {
    faults_.maybe_fail(fault_kind::launch);
    inner_->launch_compiled_batch(k, table, rows);
  }
  void synchronize() override { inner_->synchronize(); }
  bool idle() noexcept override { return inner_->idle(); }

 private:
  std::unique_ptr<backend_stream> inner_;
  fault_injector& faults_;
};

}  // namespace

bool fault_plan::any() const noexcept {
  for (double r : rate)
    if (r > 0.0) return true;
  return false;
}

fault_plan fault_plan::from_environment() {
  fault_plan plan;
  const char* value = std::getenv("GPUPOOL_FAULTS");
  if (value == nullptr || *value == '\0') return plan;
  const std::string whole = value;
  std::size_t begin = 0;
  while (begin <= whole.size()) {
    const std::size_t end = std::min(whole.find(',', begin), whole.size());
    const std::string item = whole.substr(begin, end - begin);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("GPUPOOL_FAULTS: expected kind=rate or seed=n, not '" + item +
                                  "'");
    const std::string key = item.substr(0, eq);
    const std::string text = item.substr(eq + 1);
    bool known = false;
    if (key == "seed") {
      const auto seed = parse_count(
          {"GPUPOOL_FAULTS: seed", "a whole number", 0, std::numeric_limits<std::uint64_t>::max()},
          text.c_str());
      if (!seed)  // "seed=" (parse_count takes an empty value for one not given)
        throw std::invalid_argument("GPUPOOL_FAULTS: seed must be a whole number, not ''");
      plan.seed = *seed;
      known = true;
    }
    for (std::size_t k = 0; k < fault_kinds; ++k) {
      if (key == kind_names[k] || key == "all") {
        plan.rate[k] = parse_rate(text, whole);
        known = true;
      }
    }
    if (!known)
      throw std::invalid_argument("GPUPOOL_FAULTS: unknown kind '" + key +
                                  "' (alloc, copy, launch, call, all or seed)");
    begin = end + 1;
  }
  return plan;
}

fault_injector::fault_injector(const fault_plan& plan, std::uint64_t lane)
    : plan_(plan), rng_(plan.seed * 0x9E3779B97F4A7C15ull + lane) {}

void fault_injector::maybe_fail(fault_kind kind) {
  const double rate = plan_.rate[static_cast<std::size_t>(kind)];
  if (rate <= 0.0) return;
  if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) >= rate) return;
  const std::string what =
      std::string("gpupool: injected fault (") + kind_names[static_cast<std::size_t>(kind)] + ")";
  if (kind == fault_kind::allocation) throw out_of_memory(what);
  throw error(what);
}

std::unique_ptr<backend_stream> with_faults(std::unique_ptr<backend_stream> inner,
                                            fault_injector& faults) {
  return std::make_unique<faulty_stream>(std::move(inner), faults);
}

}  // namespace gpupool::detail
