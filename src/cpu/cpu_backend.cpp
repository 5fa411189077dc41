// The CPU backend: host threads and host memory stand in for devices. Every "asynchronous"
// operation completes before it returns, so events are always ready; the lanes, queues, slots and
// futures above it run exactly as on a GPU.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/kernels/elementwise_math.hpp"
#include "core/memory/host_memory.hpp"
#include "cpu/host_compiler.hpp"
#include "cpu/host_source.hpp"
#include "gpupool/error.hpp"

namespace gpupool::detail {
namespace {

constexpr std::size_t device_alignment = 256;  // what cudaMalloc guarantees
constexpr std::size_t mib = std::size_t{1} << 20;

// A lane runs its work on one host core: by default the cores shared among the devices, at
// most 8 lanes each.
int default_lanes(std::size_t devices, unsigned host_cores) {
  constexpr int most_default_lanes = 8;
  return std::clamp(static_cast<int>(std::max(host_cores, 1u)) /
                        static_cast<int>(std::max<std::size_t>(devices, 1)),
                    1, most_default_lanes);
}

// A fixed gibibyte per stand-in device: its "free memory" is the host's, shared by every device.
std::size_t default_in_flight_budget(const device_info& /*device*/) {
  return std::size_t{1} << 30;
}

// A lane runs its batch on one host core, so every batch counts.
std::size_t least_device_batch_elements(const device_info& /*device*/) {
  return 1;
}

// Powers of two up to the cores each device has.
std::vector<int> sweep_lanes(std::size_t devices, unsigned host_cores) {
  const int most = std::max(1, static_cast<int>(host_cores / std::max<std::size_t>(devices, 1)));
  std::vector<int> lanes;
  for (int l : {1, 2, 4, 8, 16})
    if (l <= most) lanes.push_back(l);
  return lanes;
}

constexpr std::size_t sweep_chunks[] = {1 * mib, 2 * mib, 4 * mib, 8 * mib};

constinit const host_kernel_generator generator{};

constexpr backend_traits cpu_traits{
    .default_lanes = &default_lanes,
    .default_in_flight_budget = &default_in_flight_budget,
    .least_device_batch_elements = &least_device_batch_elements,
    // Measuring finds little on the host that the fixed defaults miss.
    .automatic_tuning = tuning::fixed,
    .sweep_lanes = &sweep_lanes,
    .sweep_chunks = sweep_chunks,
    .sweep_bytes_per_device = 32 * mib,
    .most_sweep_bytes_per_device = 128 * mib,
    .device_memory_is_host = true,
    .cuda_device_pointers = false,
    .runs_raw_kernels = false,
    // Its device memory is host memory.
    .kernels_reach_pinned_host = true,
    .generator = &generator,
};

class cpu_event final : public backend_event {
 public:
  void record() override {}
  bool ready() override { return true; }
  void wait() override {}
};

class cpu_timer final : public backend_timer {
 public:
  void record() override { at_ = std::chrono::steady_clock::now(); }
  double microseconds_since(backend_timer& earlier) override {
    return std::chrono::duration<double, std::micro>(at_ - checked_cast<cpu_timer>(earlier).at_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point at_{};
};

class cpu_compiled final : public compiled_kernel {
 public:
  cpu_compiled(std::vector<bool> is_array, std::shared_ptr<const host_kernel> f)
      : compiled_kernel(std::move(is_array)), function(std::move(f)) {}
  std::shared_ptr<const host_kernel> function;
};

// One direction of a stand-in device's copies at a fixed rate: copies take their turn, each
// lasting at least its bytes at the rate, as a GPU's copy engine carries one lane's copy after
// another. Waiting sleeps, so stand-in devices of many processes model GPUs without taking the
// host's cores.
class copy_engine {
 public:
  explicit copy_engine(double bytes_per_second) : seconds_per_byte_(1.0 / bytes_per_second) {}

  // Runs `copy` (the memcpy itself) and returns once the turn of `bytes` it took ends.
  template <class Copy>
  void paced(std::size_t bytes, Copy&& copy) {
    using clock = std::chrono::steady_clock;
    const auto duration = std::chrono::duration_cast<clock::duration>(
        std::chrono::duration<double>(static_cast<double>(bytes) * seconds_per_byte_));
    clock::time_point end;
    {
      std::lock_guard lock(mutex_);
      end = std::max(clock::now(), free_at_) + duration;
      free_at_ = end;
    }
    copy();
    std::this_thread::sleep_until(end);
  }

 private:
  const double seconds_per_byte_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point free_at_{};
};

// A stand-in device's two directions.
struct copy_engines {
  explicit copy_engines(double bytes_per_second)
      : to_device(bytes_per_second), to_host(bytes_per_second) {}
  copy_engine to_device;
  copy_engine to_host;
};

class cpu_stream final : public backend_stream {
 public:
  // `engines`: the stream's device's, or null where copies run as fast as memcpy.
  explicit cpu_stream(copy_engines* engines) : engines_(engines) {}
  void* native_handle() const noexcept override { return nullptr; }
  std::unique_ptr<backend_event> make_event() override { return std::make_unique<cpu_event>(); }
  std::unique_ptr<backend_timer> make_timer() override { return std::make_unique<cpu_timer>(); }

  void* allocate(std::size_t bytes) override {
    if (bytes > std::numeric_limits<std::size_t>::max() - device_alignment)
      throw std::length_error("gpupool: " + std::to_string(bytes) +
                              " bytes of device memory is more than any allocation can hold");
    const std::size_t rounded =
        (bytes + device_alignment - 1) / device_alignment * device_alignment;
    void* p = std::aligned_alloc(device_alignment, rounded == 0 ? device_alignment : rounded);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p) noexcept override { std::free(p); }

  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    if (engines_ == nullptr) return (void)std::memcpy(dst, src, bytes);
    engines_->to_device.paced(bytes, [&] { std::memcpy(dst, src, bytes); });
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    if (engines_ == nullptr) return (void)std::memcpy(dst, src, bytes);
    engines_->to_host.paced(bytes, [&] { std::memcpy(dst, src, bytes); });
  }
  void launch(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
              std::size_t count) override {
    apply_on_host(k, t, x, y, out, count);
  }
  void launch_compiled(const compiled_kernel& k, void* const* args, std::size_t count) override {
    (*checked_cast<const cpu_compiled>(k).function)(args, count);
  }
  void synchronize() override {}
  bool idle() noexcept override { return true; }

 private:
  copy_engines* engines_;
};

class cpu_backend final : public backend {
 public:
  explicit cpu_backend(const stand_in_devices& stand_ins) : devices_(stand_ins.count) {
    if (stand_ins.copy_rate > 0)
      for (int d = 0; d < devices_; ++d)
        engines_.push_back(std::make_unique<copy_engines>(stand_ins.copy_rate));
  }
  backend_kind kind() const noexcept override { return backend_kind::cpu; }
  const backend_traits& traits() const noexcept override { return cpu_traits; }
  int device_count() const override { return devices_; }
  device_info describe(int ordinal) const override {
    device_info info;
    info.ordinal = ordinal;
    info.backend = backend_kind::cpu;
    info.name = "CPU stand-in " + std::to_string(ordinal);
    info.multiprocessors = static_cast<int>(std::thread::hardware_concurrency());
    info.total_memory = host_memory_bytes();
    return info;
  }
  void bind_thread(int /*ordinal*/) override {}
  // Stand-in streams run their work as it comes: a priority has nothing to order.
  std::unique_ptr<backend_stream> open_stream(int ordinal, int /*priority*/) override {
    return std::make_unique<cpu_stream>(
        engines_.empty() ? nullptr : engines_.at(static_cast<std::size_t>(ordinal)).get());
  }
  void prepare_device(int /*ordinal*/) override {}
  std::size_t free_memory(int /*ordinal*/) const override {
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page)
                                 : 0;
  }
  std::shared_ptr<const compiled_kernel> compile(const elementwise_kernel& k,
                                                 const std::vector<bool>& is_array,
                                                 int /*ordinal*/) override {
    return std::make_shared<cpu_compiled>(is_array, compile_for_host(k, is_array));
  }
  std::shared_ptr<const compiled_kernel> compile(const raw_kernel& k, int /*ordinal*/) override {
    throw backend_unavailable("gpupool: raw kernel '" + k.name() +
                              "' is CUDA source and needs a GPU; this executor runs on the CPU "
                              "backend (elementwise kernels run on both)");
  }

 private:
  static std::size_t host_memory_bytes() {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page_size > 0
               ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size)
               : 0;
  }
  int devices_;
  std::vector<std::unique_ptr<copy_engines>> engines_;  // one per device; none without a rate
};

// Stands in for pinned memory: ordinary page-aligned host memory. The core tracks these blocks as
// pinned, so the CPU backend takes the same "already pinned, skip staging" paths as CUDA does.
class aligned_host_resource final : public memory_resource {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(host_page_bytes, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p, std::size_t /*bytes*/) noexcept override { std::free(p); }
};

// Without a device there is nothing but host memory to describe and no stream to wait for.
class cpu_host_memory final : public host_memory {
 public:
  memory_resource& pinned() noexcept override { return pinned_; }
  pointer_info describe(const void* /*p*/) const noexcept override { return {}; }
  void wait_for_stream(std::uintptr_t /*stream*/) override {}

 private:
  aligned_host_resource pinned_;
};

backend_probe probe() {
  return {true, 1, {}};
}

std::shared_ptr<backend> make(const stand_in_devices& stand_ins) {
  return std::make_shared<cpu_backend>(stand_ins);
}

host_memory& host() {
  // Never destroyed: pinned blocks may be released by static destructors after main returns.
  static auto* memory = new cpu_host_memory();
  return *memory;
}

}  // namespace

constinit const backend_registration cpu_backend_registration{backend_kind::cpu, &probe, &make,
                                                              &host, &cpu_traits};

}  // namespace gpupool::detail
