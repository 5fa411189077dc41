// The CUDA backend: host-side runtime calls only (kernels live in elementwise.cu).
// cudart is linked statically and loads the driver at run time, so a process without a driver
// or GPU still starts; probe_cuda() then reports why and the CPU backend takes over.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "core/backend.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/elementwise.hpp"
#include "cuda/host_memory.hpp"
#include "gpupool/error.hpp"

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

bool host_is_pinned(const void* p) noexcept {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

void describe(const void* p, int& kind, int& device) noexcept {
  kind = 0;
  device = -1;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  switch (attributes.type) {
    case cudaMemoryTypeHost:
      kind = 1;
      break;
    case cudaMemoryTypeDevice:
      kind = 2;
      device = attributes.device;
      break;
    case cudaMemoryTypeManaged:
      kind = 3;
      device = attributes.device;
      break;
    default:
      break;
  }
}

void synchronize_stream(std::uintptr_t stream) {
  GPUPOOL_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
}

}  // namespace cuda

namespace {

constexpr const char* runtime_kernels_not_built =
    "gpupool: run-time compiled elementwise kernels run on the CPU backend only so far; the "
    "CUDA backend's NVRTC path is not built yet";

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

// How a lane waits for its oldest task: `block` (default) sleeps in the driver, leaving the core
// to lanes busy with staging copies; `spin` polls, for the lowest latency on tiny tasks.
// GPUPOOL_EVENT_WAIT=spin|block chooses.
unsigned event_wait_flags() {
  static const unsigned flags = [] {
    const char* value = std::getenv("GPUPOOL_EVENT_WAIT");
    if (value == nullptr || std::string(value) == "block") return unsigned{cudaEventBlockingSync};
    if (std::string(value) == "spin") return 0u;
    throw std::invalid_argument("GPUPOOL_EVENT_WAIT must be 'spin' or 'block', not '" +
                                std::string(value) + "'");
  }();
  return flags;
}

class cuda_event final : public backend_event {
 public:
  explicit cuda_event(cudaStream_t stream) : stream_(stream) {
    GPUPOOL_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_, cudaEventDisableTiming | event_wait_flags()));
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

class cuda_timer final : public backend_timer {
 public:
  explicit cuda_timer(cudaStream_t stream) : stream_(stream) {
    GPUPOOL_CUDA_CHECK(cudaEventCreate(&event_));
  }
  cuda_timer(const cuda_timer&) = delete;
  cuda_timer& operator=(const cuda_timer&) = delete;
  ~cuda_timer() override { (void)cudaEventDestroy(event_); }

  void record() override { GPUPOOL_CUDA_CHECK(cudaEventRecord(event_, stream_)); }
  double microseconds_since(backend_timer& earlier) override {
    float ms = 0.0f;
    GPUPOOL_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cuda_timer&>(earlier).event_, event_));
    return static_cast<double>(ms) * 1e3;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t event_ = nullptr;
};

class cuda_stream final : public backend_stream {
 public:
  cuda_stream() { GPUPOOL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  ~cuda_stream() override {
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
  void launch(const kernel& k, dtype t, const void* x, const void* y, void* out,
              std::size_t count) override {
    cuda::launch_elementwise(k, t, x, y, out, count, stream_);
  }
  void launch_compiled(const compiled_kernel& /*k*/, void* const* /*args*/,
                       std::size_t /*count*/) override {
    throw error(runtime_kernels_not_built);
  }
  void synchronize() override { GPUPOOL_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

class cuda_backend final : public backend {
 public:
  explicit cuda_backend(int devices) : devices_(devices) {}
  backend_kind kind() const noexcept override { return backend_kind::cuda; }
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

  void bind_thread(int ordinal) override { GPUPOOL_CUDA_CHECK(cudaSetDevice(ordinal)); }

  std::shared_ptr<const compiled_kernel> compile(const elementwise_kernel& /*k*/,
                                                 const std::vector<bool>& /*is_array*/,
                                                 int /*ordinal*/) override {
    throw error(runtime_kernels_not_built);
  }

  std::unique_ptr<backend_stream> open_stream(int ordinal) override {
    device_scope scope(ordinal);
    return std::make_unique<cuda_stream>();
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

}  // namespace

cuda_probe probe_cuda() {
  static const cuda_probe result = [] {
    // More busy streams than this share hardware queues and falsely serialise. The driver reads
    // it when a context is created, so set it (unless the user did) before the first CUDA call.
    ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    cuda_probe p;
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      p.reason = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(status) + ", " +
                 cudaGetErrorString(status);
      return p;
    }
    if (count == 0) {
      p.reason = "no CUDA device is visible";
      return p;
    }
    p.usable = true;
    p.devices = count;
    return p;
  }();
  return result;
}

std::shared_ptr<backend> make_cuda_backend() {
  const cuda_probe p = probe_cuda();
  if (!p.usable)
    throw backend_unavailable("gpupool: the CUDA backend was requested, but " + p.reason);
  return std::make_shared<cuda_backend>(p.devices);
}

}  // namespace gpupool::detail
