// The CUDA backend: host-side runtime calls only (kernels live in elementwise.cu).
// cudart is linked statically and loads the driver at run time, so a process without a driver
// or GPU still starts; its probe then reports why and the CPU backend takes over.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <compare>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/kernels/balanced_grid.hpp"
#include "core/kernels/kernel_source.hpp"
#include "core/lanes/event_wait.hpp"
#include "core/memory/host_memory.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_source.hpp"
#include "cuda/cuda_traits.hpp"
#include "cuda/elementwise.hpp"
#include "cuda/host_memory.hpp"
#include "cuda/nvrtc_compiler.hpp"
#include "cuda/timestamp.hpp"
#include "gpupool/error.hpp"
#include "gpupool/fork.hpp"

namespace gpupool::detail {
namespace cuda {

[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  throw cuda_error(static_cast<int>(code), cudaGetErrorName(code), cudaGetErrorString(code), call,
                   file, line);
}

void* host_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::bad_alloc();
  }
  return p;
}

void host_free(void* p) noexcept {
  // At process exit the runtime may already be unloading; nothing is left to free then.
  const cudaError_t status = cudaFreeHost(p);
  if (status != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace cuda

namespace {

// Restores the calling thread's current device on scope exit.
class device_scope {
 public:
  explicit device_scope(int ordinal) {
    GPUPOOL_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != ordinal) GPUPOOL_CUDA_CHECK(cudaSetDevice(ordinal));
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// How a lane waits for its stream (GPUPOOL_EVENT_WAIT, read once): see core/lanes/event_wait.hpp.
// A spinning event leaves the polling to the driver (cudaEventSynchronize under the device's
// default scheduling, which spins while the process has fewer CUDA contexts than cores).
event_wait lane_event_wait() {
  static const event_wait how = event_wait_from_environment();
  return how;
}

class cuda_event final : public backend_event {
 public:
  explicit cuda_event(cudaStream_t stream) : stream_(stream) {
    const unsigned wait = lane_event_wait() == event_wait::block ? cudaEventBlockingSync : 0u;
    GPUPOOL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming | wait));
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  ~cuda_event() override { (void)cudaEventDestroy(event_); }

  void record() override { GPUPOOL_CUDA_CHECK(cudaEventRecord(event_, stream_)); }
  bool ready() override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    GPUPOOL_CUDA_CHECK(status);
    return true;
  }
  void wait() override { GPUPOOL_CUDA_CHECK(cudaEventSynchronize(event_)); }

 private:
  cudaStream_t stream_;
  cudaEvent_t event_ = nullptr;
};

// A stream-ordered timestamp: a one-thread kernel writes the GPU's global nanosecond clock into
// pinned host memory when the stream reaches it. Timing CUDA events would do the same job, but
// near the copy engines' limit they cost copy throughput (four per piece, each making the engine
// that passes it write a timestamp); reading a stamp is a load from host memory rather than a
// driver call. A launch costs host time of its own, so the built-in kernels take their own
// stamps (cuda_stream::launch_marked) and only the copies' ends need these.
class cuda_timer final : public backend_timer {
 public:
  explicit cuda_timer(cudaStream_t stream)
      : stream_(stream),
        stamp_(static_cast<std::uint64_t*>(cuda::host_alloc(sizeof(std::uint64_t)))) {
    *stamp_ = 0;
  }
  cuda_timer(const cuda_timer&) = delete;
  cuda_timer& operator=(const cuda_timer&) = delete;
  ~cuda_timer() override { cuda::host_free(stamp_); }

  void record() override { cuda::record_timestamp(stamp_, stream_); }
  /// Where the stamp lands, for kernels that take it themselves.
  [[nodiscard]] std::uint64_t* stamp() const noexcept { return stamp_; }
  double microseconds_since(backend_timer& earlier) override {
    // Both kernels have run (the caller waited for the stream to pass them), so their writes are
    // visible; volatile because the GPU, not this thread, wrote them. Subtracted as integers: the
    // clock's nanosecond counts are too large for a double to hold exactly.
    const std::uint64_t now = *static_cast<volatile std::uint64_t*>(stamp_);
    const std::uint64_t then =
        *static_cast<volatile std::uint64_t*>(checked_cast<cuda_timer>(earlier).stamp_);
    return static_cast<double>(static_cast<std::int64_t>(now - then)) * 1e-3;
  }

 private:
  cudaStream_t stream_;
  std::uint64_t* stamp_;
};

// A CUBIN loaded into the process (cudaLibrary: context-independent, loaded into each device's
// context on first launch there) and the kernels taken from it. The library is unloaded when the
// last holder lets it go: the executors' backends hold their kernels (so do tasks in flight),
// and an executor's lanes have waited out their streams before its backend goes, so no launch
// of it is pending then. Without the unload, every executor that ran a compiled kernel left
// its copy of the code loaded, host and device memory, for the rest of the process.
class cuda_compiled final : public compiled_kernel {
 public:
  // `image_owner` keeps the bytes (and so their address, which identifies them in the process's
  // table of loaded libraries) alive as long as this library.
  cuda_compiled(std::vector<bool> is_array, std::shared_ptr<const void> image_owner,
                const std::string& image, const char* entry, const char* batch_entry,
                launch_shape shape)
      : compiled_kernel(std::move(is_array)), image_owner_(std::move(image_owner)), shape_(shape) {
    GPUPOOL_CUDA_CHECK(
        cudaLibraryLoadData(&library_, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    try {
      GPUPOOL_CUDA_CHECK(cudaLibraryGetKernel(&single_, library_, entry));
      if (batch_entry != nullptr)
        GPUPOOL_CUDA_CHECK(cudaLibraryGetKernel(&batch_, library_, batch_entry));
    } catch (...) {
      unload();
      throw;
    }
  }
  cuda_compiled(const cuda_compiled&) = delete;
  cuda_compiled& operator=(const cuda_compiled&) = delete;
  ~cuda_compiled() override { unload(); }

  [[nodiscard]] const void* single() const noexcept { return single_; }
  [[nodiscard]] const void* batch() const noexcept { return batch_; }
  /// A raw kernel's launch shape; elementwise kernels use the default block and a grid capped at
  /// one full wave of the device (their loop strides over the rest).
  [[nodiscard]] launch_shape shape() const noexcept { return shape_; }
  [[nodiscard]] bool is_raw() const noexcept { return batch_ == nullptr; }

 private:
  void unload() noexcept {
    if (library_ == nullptr) return;
    // At process exit the runtime may already be unloading (cudaErrorCudartUnloading), and with
    // it every library: nothing is left to free then.
    if (cudaLibraryUnload(library_) != cudaSuccess) (void)cudaGetLastError();
    library_ = nullptr;
  }

  std::shared_ptr<const void> image_owner_;
  cudaLibrary_t library_ = nullptr;
  cudaKernel_t single_ = nullptr;
  cudaKernel_t batch_ = nullptr;
  launch_shape shape_;
};

// What a loaded kernel is made of: its compiled image (the address of bytes its library keeps
// alive) and what the image alone does not say. A raw kernel's image depends only on its source
// and entry, so two raw kernels of one source with another launch shape or other array
// declarations share the image and need entries of their own.
struct loaded_key {
  std::uintptr_t image;
  std::vector<bool> is_array;
  unsigned block;
  unsigned grid;
  auto operator<=>(const loaded_key&) const = default;
};

// The libraries loaded now, shared by every executor of the process (and every device, which
// loads a library on first launch), each held only by those that use it: an executor made while
// another runs the same kernel loads nothing, and one made after the last user went loads the
// image again. Entries of libraries gone are dropped as new ones come, so the table holds no
// more than the libraries alive and as many again.
class loaded_libraries {
 public:
  std::shared_ptr<const compiled_kernel> get(std::shared_ptr<const void> image_owner,
                                             const std::string& bytes,
                                             const std::vector<bool>& is_array, const char* entry,
                                             const char* batch_entry, launch_shape shape) {
    loaded_key key{reinterpret_cast<std::uintptr_t>(image_owner.get()), is_array, shape.block,
                   shape.grid};
    std::lock_guard lock(mutex_);
    if (auto it = loaded_.find(key); it != loaded_.end())
      if (auto alive = it->second.lock()) return alive;
    if (loaded_.size() >= 2 * live_after_sweep_ + 16) sweep();
    auto made = std::make_shared<cuda_compiled>(is_array, std::move(image_owner), bytes, entry,
                                                batch_entry, shape);
    loaded_[std::move(key)] = made;
    return made;
  }

  /// Libraries loaded now (for tests).
  [[nodiscard]] std::size_t alive() {
    std::lock_guard lock(mutex_);
    sweep();
    return loaded_.size();
  }

 private:
  void sweep() {
    std::erase_if(loaded_, [](const auto& entry) { return entry.second.expired(); });
    live_after_sweep_ = loaded_.size();
  }

  std::mutex mutex_;
  std::map<loaded_key, std::weak_ptr<const compiled_kernel>> loaded_;
  std::size_t live_after_sweep_ = 0;
};

// Never destroyed: kernels may be let go by static destructors after main returns.
loaded_libraries& libraries() {
  static auto* const table = new loaded_libraries;
  return *table;
}

// The CUDA stream priority of gpupool priority `priority` on the current device `ordinal`.
// Above 0, each step is one CUDA level above the device's least (its streams' default); 0 and
// below take the least, as CUDA has nothing lower. A level the device lacks is refused: work the
// caller marked urgent must not quietly run at another level.
int cuda_stream_priority(int ordinal, int priority) {
  int least = 0, greatest = 0;
  GPUPOOL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  if (priority <= 0) return least;
  const int wanted = least - priority;
  if (wanted < greatest)
    throw std::invalid_argument(
        "gpupool: priority " + std::to_string(priority) + " needs CUDA stream priority " +
        std::to_string(wanted) + ", beyond the range of GPU " + std::to_string(ordinal) + " (" +
        std::to_string(least) + " to " + std::to_string(greatest) +
        "); an executor's priority may be at most " + std::to_string(least - greatest) + " here");
  return wanted;
}

class cuda_stream final : public backend_stream {
 public:
  cuda_stream(unsigned resident_threads, int cuda_priority) : resident_threads_(resident_threads) {
    GPUPOOL_CUDA_CHECK(
        cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, cuda_priority));
  }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  ~cuda_stream() override {
    if (blocks_done_ != nullptr) (void)cudaFreeAsync(blocks_done_, stream_);
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }

  void* native_handle() const noexcept override { return stream_; }
  std::unique_ptr<backend_event> make_event() override {
    return std::make_unique<cuda_event>(stream_);
  }
  std::unique_ptr<backend_timer> make_timer() override {
    return std::make_unique<cuda_timer>(stream_);
  }

  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t status = cudaMallocAsync(&p, bytes, stream_);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw out_of_memory("gpupool: the device has no room for " + std::to_string(bytes) +
                          " more bytes (cudaMallocAsync: cudaErrorMemoryAllocation)");
    }
    GPUPOOL_CUDA_CHECK(status);
    return p;
  }
  void deallocate(void* p) noexcept override {
    if (cudaFreeAsync(p, stream_) != cudaSuccess) (void)cudaGetLastError();
  }

  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    GPUPOOL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    GPUPOOL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  void launch(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
              std::size_t count) override {
    cuda::launch_elementwise(k, t, x, y, out, count, stream_);
  }
  // The built-in kernels stamp their own start and finish: two stream operations fewer per
  // traced piece than stamping kernels around them.
  void launch_marked(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
                     std::size_t count, backend_timer& begin, backend_timer& end) override {
    if (count == 0) {  // no kernel runs
      backend_stream::launch_marked(k, t, x, y, out, count, begin, end);
      return;
    }
    if (blocks_done_ == nullptr) {
      void* p = allocate(sizeof(unsigned int));
      const cudaError_t status = cudaMemsetAsync(p, 0, sizeof(unsigned int), stream_);
      if (status != cudaSuccess) {
        deallocate(p);
        GPUPOOL_CUDA_CHECK(status);
      }
      blocks_done_ = static_cast<unsigned int*>(p);
    }
    const cuda::kernel_clock clock{checked_cast<cuda_timer>(begin).stamp(),
                                   checked_cast<cuda_timer>(end).stamp(), blocks_done_};
    cuda::launch_elementwise(k, t, x, y, out, count, stream_, &clock);
  }
  void launch_compiled(const compiled_kernel& k, void* const* args, std::size_t count) override {
    if (count == 0) return;
    const auto& c = checked_cast<const cuda_compiled>(k);
    // cudaLaunchKernel wants, per parameter, the address of its value: the array pointer's own
    // address for arrays, the scalar's bytes for scalars; then the output and the count.
    const std::vector<bool>& is_array = c.is_array();
    std::vector<void*> params(is_array.size() + 2);
    std::vector<void*> pointers(args, args + is_array.size() + 1);
    for (std::size_t i = 0; i < is_array.size(); ++i)
      params[i] = is_array[i] ? static_cast<void*>(&pointers[i]) : pointers[i];
    params[is_array.size()] = &pointers[is_array.size()];
    unsigned long long n = count;
    params[is_array.size() + 1] = &n;
    const launch_shape shape = c.shape();
    const unsigned long long wanted = (n + shape.block - 1) / shape.block;
    unsigned grid = shape.grid;
    if (grid == 0)
      grid = static_cast<unsigned>(c.is_raw() ? std::min<unsigned long long>(wanted, 0x7fffffffull)
                                              : balanced_blocks(wanted, wave_blocks(shape.block)));
    GPUPOOL_CUDA_CHECK(
        cudaLaunchKernel(c.single(), dim3(grid), dim3(shape.block), params.data(), 0, stream_));
  }
  void launch_compiled_batch(const compiled_kernel& k, const std::uint64_t* table,
                             std::size_t rows) override {
    const auto& c = checked_cast<const cuda_compiled>(k);
    if (c.batch() == nullptr || rows == 0) {
      backend_stream::launch_compiled_batch(k, table, rows);  // one launch per row
      return;
    }
    const std::size_t stride = c.is_array().size() + 2;
    constexpr std::size_t max_rows = 65535;  // grid.y
    for (std::size_t first = 0; first < rows; first += max_rows) {
      const std::size_t n_rows = std::min(max_rows, rows - first);
      const std::uint64_t* part = table + first * stride;
      std::uint64_t longest = 0;
      for (std::size_t r = 0; r < n_rows; ++r)
        longest = std::max(longest, part[r * stride + stride - 1]);
      if (longest == 0) continue;
      // From pinned memory (a slot's buffer, which outlives the copy) the copy is queued and
      // returns at once; from pageable memory CUDA copies the table into a staging buffer
      // before returning (so it may go out of scope at once), and may first wait for the
      // stream to drain.
      const std::size_t bytes = n_rows * stride * sizeof(std::uint64_t);
      void* device_table = allocate(bytes);
      GPUPOOL_CUDA_CHECK(
          cudaMemcpyAsync(device_table, part, bytes, cudaMemcpyHostToDevice, stream_));
      const unsigned block = 256;
      const unsigned long long per_row = (longest + block - 1) / block;
      const unsigned long long wave_per_row =
          std::max<unsigned long long>(1, wave_blocks(block) / n_rows);
      const dim3 grid(static_cast<unsigned>(balanced_blocks(per_row, wave_per_row)),
                      static_cast<unsigned>(n_rows));
      void* params[] = {&device_table};
      const cudaError_t launched =
          cudaLaunchKernel(c.batch(), grid, dim3(block), params, 0, stream_);
      deallocate(device_table);
      GPUPOOL_CUDA_CHECK(launched);
    }
  }
  void synchronize() override { GPUPOOL_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  // cudaErrorNotReady while work runs; an error is left for the next wait to report.
  bool idle() noexcept override { return cudaStreamQuery(stream_) == cudaSuccess; }

 private:
  // Blocks of `block` threads the whole device holds at once.
  [[nodiscard]] unsigned long long wave_blocks(unsigned block) const noexcept {
    return std::max<unsigned long long>(1, resident_threads_ / block);
  }

  cudaStream_t stream_ = nullptr;
  unsigned resident_threads_;  // threads resident on the whole device at once
  // The counter the built-in kernels' last block uses to stamp their finish (made on first use).
  unsigned int* blocks_done_ = nullptr;
};

class cuda_backend final : public backend {
 public:
  explicit cuda_backend(int devices) : devices_(devices) {}
  backend_kind kind() const noexcept override { return backend_kind::cuda; }
  const backend_traits& traits() const noexcept override { return cuda_traits; }
  int device_count() const override { return devices_; }

  device_info describe(int ordinal) const override {
    cudaDeviceProp props{};
    GPUPOOL_CUDA_CHECK(cudaGetDeviceProperties(&props, ordinal));
    device_info info;
    info.ordinal = ordinal;
    info.backend = backend_kind::cuda;
    info.name = props.name;
    info.total_memory = props.totalGlobalMem;
    info.compute_major = props.major;
    info.compute_minor = props.minor;
    info.multiprocessors = props.multiProcessorCount;
    return info;
  }

  void bind_thread(int ordinal) override {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == ordinal) return;
    GPUPOOL_CUDA_CHECK(cudaSetDevice(ordinal));
  }

  std::shared_ptr<const compiled_kernel> compile(const elementwise_kernel& k,
                                                 const std::vector<bool>& is_array,
                                                 int ordinal) override {
    const auto [major, minor] = compute_capability(ordinal);
    auto image = cuda::compile_cubin(k, is_array, major, minor);
    const std::string& bytes = *image;
    return libraries().get(std::move(image), bytes, is_array, kernel_entry_point,
                           kernel_batch_entry_point, launch_shape{});
  }

  std::shared_ptr<const compiled_kernel> compile(const raw_kernel& k, int ordinal) override {
    const auto [major, minor] = compute_capability(ordinal);
    auto image = cuda::compile_raw_cubin(k, major, minor);
    std::vector<bool> is_array;
    for (const auto& p : k.inputs()) is_array.push_back(p.array);
    const cuda::raw_cubin& compiled = *image;
    return libraries().get(std::move(image), compiled.image, is_array, compiled.entry.c_str(),
                           nullptr, k.shape());
  }

  void check_stream_priority(int ordinal, int priority) const override {
    device_scope scope(ordinal);
    (void)cuda_stream_priority(ordinal, priority);
  }

  std::unique_ptr<backend_stream> open_stream(int ordinal, int priority) override {
    device_scope scope(ordinal);
    const int cuda_priority = cuda_stream_priority(ordinal, priority);
    int sms = 0, threads_per_sm = 0;
    GPUPOOL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal));
    GPUPOOL_CUDA_CHECK(
        cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, ordinal));
    return std::make_unique<cuda_stream>(static_cast<unsigned>(sms * threads_per_sm),
                                         cuda_priority);
  }

  std::pair<int, int> compute_capability(int ordinal) const {
    int major = 0, minor = 0;
    GPUPOOL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal));
    GPUPOOL_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal));
    return {major, minor};
  }

  // CUDA's "sticky" errors: after one, every later CUDA call of the process fails with it, on
  // every device (CUDA's documentation: the process must be restarted), so no device is left to
  // move work to.
  fault_scope classify_fault(const std::exception& e) const noexcept override {
    const auto* failure = dynamic_cast<const cuda_error*>(&e);
    if (failure == nullptr) return backend::classify_fault(e);
    switch (static_cast<cudaError_t>(failure->code())) {
      case cudaErrorIllegalAddress:
      case cudaErrorLaunchFailure:
      case cudaErrorLaunchTimeout:
      case cudaErrorHardwareStackError:
      case cudaErrorIllegalInstruction:
      case cudaErrorMisalignedAddress:
      case cudaErrorInvalidAddressSpace:
      case cudaErrorInvalidPc:
      case cudaErrorAssert:
      case cudaErrorECCUncorrectable:
        return fault_scope::every_device;
      default:
        return fault_scope::none;
    }
  }

  std::size_t free_memory(int ordinal) const override {
    device_scope scope(ordinal);
    std::size_t free = 0, total = 0;
    GPUPOOL_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    // What the device's pool keeps after gpupool freed it (prepare_device keeps everything) is
    // free for gpupool's purposes: without this, one executor's big allocation, long freed,
    // shrank the default in-flight budget of every executor made after it in the process.
    cudaMemPool_t pool = nullptr;
    std::uint64_t reserved = 0, used = 0;
    if (cudaDeviceGetDefaultMemPool(&pool, ordinal) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) ==
            cudaSuccess &&
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess) {
      if (reserved > used) free += static_cast<std::size_t>(reserved - used);
    } else {
      (void)cudaGetLastError();
    }
    return std::min(free, total);
  }

  void prepare_device(int ordinal) override {
    device_scope scope(ordinal);
    // Keep freed memory in the pool: without this, every synchronisation hands it back to the
    // driver and the next cudaMallocAsync pays for a fresh mapping.
    cudaMemPool_t pool = nullptr;
    GPUPOOL_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal));
    std::uint64_t keep_everything = UINT64_MAX;
    GPUPOOL_CUDA_CHECK(
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  }

 private:
  int devices_;
};

// Page-locked, portable host memory (usable by every device): what the pinned cache hands out.
class cuda_pinned_resource final : public memory_resource {
 public:
  void* allocate(std::size_t bytes) override { return cuda::host_alloc(bytes); }
  void deallocate(void* p, std::size_t /*bytes*/) noexcept override { cuda::host_free(p); }
};

class cuda_host_memory final : public host_memory {
 public:
  memory_resource& pinned() noexcept override { return pinned_; }

  pointer_info describe(const void* p) const noexcept override {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    switch (attributes.type) {
      case cudaMemoryTypeHost:
        return {memory_kind::pinned_host, -1};
      case cudaMemoryTypeDevice:
        return {memory_kind::device, attributes.device};
      case cudaMemoryTypeManaged:
        return {memory_kind::managed, attributes.device};
      default:  // cudaMemoryTypeUnregistered: pageable host memory, or unknown to CUDA
        return {};
    }
  }

  void wait_for_stream(std::uintptr_t stream) override {
    GPUPOOL_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
  }

 private:
  cuda_pinned_resource pinned_;
};

// More busy streams than this share hardware queues and falsely serialise. The driver reads it
// when a context is created, so it is set (unless the user did) when the library is loaded, before
// any CUDA call. Not later (it was once set by the first probe): setenv while other threads read
// the environment can crash them (glibc may free the array they read), and a probe can run on any
// thread, while lanes read their settings; at load time no gpupool thread exists yet.
[[maybe_unused]] const bool connections_set = [] {
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  return true;
}();

// What the probe found, and the fork generation it asked CUDA under: in a child forked after that,
// the driver the parent started is not the child's, and every CUDA call there fails (CUDA does not
// survive fork()). Not a fork_fresh: a child must not probe afresh (that would call into the
// parent's driver) but learn that CUDA was started before the fork, which the generation tells.
struct probed {
  backend_probe probe;
  unsigned generation;
};

backend_probe probe() {
  static const probed result = [] {
    // The probe's first call below starts the driver; from then on a forked child cannot use it.
    probed r{{}, fork_generation()};
    backend_probe& p = r.probe;
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      p.reason = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(status) + ", " +
                 cudaGetErrorString(status);
      return r;
    }
    if (count == 0) {
      p.reason = "no CUDA device is visible";
      return r;
    }
    p.usable = true;
    p.devices = count;
    return r;
  }();
  if (fork_generation() != result.generation) {
    backend_probe forked;
    forked.reason =
        "CUDA was started in the parent process before fork(), and a forked child cannot use it "
        "(start worker processes with the 'spawn' or 'forkserver' method)";
    return forked;
  }
  return result.probe;
}

std::shared_ptr<backend> make(const stand_in_devices& /*stand_ins*/) {
  const backend_probe p = probe();
  if (!p.usable)
    throw backend_unavailable("gpupool: the CUDA backend was requested, but " + p.reason);
  return std::make_shared<cuda_backend>(p.devices);
}

host_memory& host() {
  // Never destroyed: pinned blocks may be released by static destructors after main returns,
  // when the runtime may already be unloading (host_free tolerates that).
  static auto* memory = new cuda_host_memory();
  return *memory;
}

}  // namespace

std::size_t cuda::loaded_libraries_alive() {
  return libraries().alive();
}

constinit const backend_registration cuda_backend_registration{backend_kind::cuda, &probe, &make,
                                                               &host, &cuda_traits};

}  // namespace gpupool::detail
