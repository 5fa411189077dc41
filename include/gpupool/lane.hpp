// A lane: one host thread bound to one device, with its own stream. Tasks given to `submit`
// receive their lane and use it to move data and run kernels, ordered on the lane's stream.
#pragma once

#include <cstddef>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "gpupool/elementwise.hpp"
#include "gpupool/types.hpp"

namespace gpupool {

class lane;

/// Device memory owned by a lane's stream-ordered pool. Move-only; freed (stream-ordered, on the
/// lane's stream) when destroyed. Must not outlive its executor.
template <class T>
class device_array {
 public:
  device_array() = default;
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  device_array(device_array&& other) noexcept
      : lane_(std::exchange(other.lane_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  device_array& operator=(device_array&& other) noexcept {
    if (this != &other) {
      release();
      lane_ = std::exchange(other.lane_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~device_array() { release(); }

  /// Device pointer (host memory on the CPU backend). Never dereference it on the host with CUDA.
  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  /// As an argument of a compiled kernel run on this array's lane (`lane::run`).
  operator kernel_argument() const noexcept {  // NOLINT: implicit on purpose
    return kernel_argument(std::span<const T>(data_, size_));
  }

 private:
  friend class lane;
  device_array(lane* owner, T* data, std::size_t size) noexcept
      : lane_(owner), data_(data), size_(size) {}
  void release() noexcept;

  lane* lane_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The lane a task runs on. Only valid inside that task, on that lane's thread.
/// Every operation is ordered on the lane's stream; results that land in host memory are there
/// once the task's future is ready, or after `synchronize()`.
class lane {
 public:
  lane(const lane&) = delete;
  lane& operator=(const lane&) = delete;

  /// The executor's device index (0..devices-1) this lane is bound to.
  [[nodiscard]] virtual int device() const noexcept = 0;
  /// Index of this lane among all the executor's lanes.
  [[nodiscard]] virtual int index() const noexcept = 0;
  /// Index of this lane among its device's lanes.
  [[nodiscard]] virtual int index_on_device() const noexcept = 0;
  [[nodiscard]] virtual backend_kind backend() const noexcept = 0;
  /// The lane's native stream (`cudaStream_t` on CUDA, created non-blocking; null on the CPU).
  [[nodiscard]] virtual void* native_stream() const noexcept = 0;

  /// Allocates `n` elements from the device's stream-ordered pool.
  /// @throw out_of_memory beyond the device memory budget; cuda_error on a CUDA failure.
  template <class T>
  device_array<T> allocate(std::size_t n) {
    return device_array<T>(
        this,
        static_cast<T*>(allocate_bytes(detail::checked_bytes(n, sizeof(T), "lane::allocate"))), n);
  }

  /// Copies host data to a new device array: directly when `host` is pinned, otherwise through
  /// the lane's pinned staging slot.
  template <class T>
  device_array<T> upload(std::span<const T> host) {
    auto dev = allocate<T>(host.size());
    upload_bytes(dev.data(), host.data(), host.size_bytes());
    return dev;
  }

  /// Copies a device array into host memory of the same length.
  /// @throw std::invalid_argument if the sizes differ.
  template <class T>
  void download(const device_array<T>& dev, std::span<T> host) {
    if (dev.size() != host.size())
      throw std::invalid_argument("gpupool::lane::download: device and host sizes differ");
    download_bytes(host.data(), dev.data(), dev.size_bytes());
  }

  /// Runs a one-input built-in kernel in place: x = k(x).
  template <class T>
  void apply(const builtin_kernel& k, device_array<T>& x) {
    require_arity(k, 1);
    apply_bytes(k, dtype_of<T>(), x.data(), nullptr, x.data(), x.size());
  }

  /// Runs a two-input built-in kernel: y = k(x, y).
  template <class T>
  void apply(const builtin_kernel& k, const device_array<T>& x, device_array<T>& y) {
    require_arity(k, 2);
    if (x.size() != y.size())
      throw std::invalid_argument("gpupool::lane::apply: input sizes differ");
    apply_bytes(k, dtype_of<T>(), x.data(), y.data(), y.data(), y.size());
  }

  /// Runs a compiled kernel once over arrays already on this lane's device: every array input
  /// (a device_array, or a span over device memory) has `out`'s length; scalars are broadcast.
  /// The kernel is compiled for this device on first use (cached in memory and on disk).
  /// @throw compile_error; std::invalid_argument for wrong argument counts, types or sizes;
  ///        backend_unavailable for a raw kernel on the CPU backend.
  template <class T>
  void run(const elementwise_kernel& k, const std::vector<kernel_argument>& inputs,
           device_array<T>& out) {
    run_bytes(k, inputs, dtype_of<T>(), out.data(), out.size());
  }
  template <class T>
  void run(const raw_kernel& k, const std::vector<kernel_argument>& inputs, device_array<T>& out) {
    run_bytes(k, inputs, dtype_of<T>(), out.data(), out.size());
  }

  /// Waits until everything enqueued on this lane's stream has finished.
  virtual void synchronize() = 0;
  /// True if everything enqueued on this lane's stream has finished (never waits; false while
  /// work runs, or if the stream reports a failure). Always true on the CPU backend.
  [[nodiscard]] virtual bool stream_idle() noexcept = 0;
  /// Makes this lane's device the calling thread's current one again (call it on the lane's own
  /// thread, inside a task): after code that switched devices, the lane's own work, and the
  /// next task, run on the lane's device. Cheap when it already is current.
  virtual void make_device_current() = 0;
  /// The largest piece upload/download moves through a staging buffer at once (the executor's
  /// chunk_bytes).
  [[nodiscard]] virtual std::size_t staging_bytes() const noexcept = 0;

  // Untyped operations behind the templates above; usable directly with raw device pointers.
  virtual void* allocate_bytes(std::size_t bytes) = 0;
  virtual void deallocate_bytes(void* p, std::size_t bytes) noexcept = 0;
  virtual void upload_bytes(void* device_dst, const void* host_src, std::size_t bytes) = 0;
  virtual void download_bytes(void* host_dst, const void* device_src, std::size_t bytes) = 0;
  virtual void apply_bytes(const builtin_kernel& k, dtype t, const void* x, const void* y,
                           void* out, std::size_t count) = 0;
  /// `out` holds `count` elements of `out_type` in device memory.
  virtual void run_bytes(const elementwise_kernel& k, const std::vector<kernel_argument>& inputs,
                         dtype out_type, void* out, std::size_t count) = 0;
  virtual void run_bytes(const raw_kernel& k, const std::vector<kernel_argument>& inputs,
                         dtype out_type, void* out, std::size_t count) = 0;

 protected:
  lane() = default;
  ~lane() = default;

 private:
  static void require_arity(const builtin_kernel& k, int arity) {
    if (k.arity() != arity)
      throw std::invalid_argument(std::string("gpupool::lane::apply: kernel '") + k.name() +
                                  "' takes " + std::to_string(k.arity()) + " input(s)");
  }
};

template <class T>
void device_array<T>::release() noexcept {
  if (lane_ && data_) lane_->deallocate_bytes(data_, size_ * sizeof(T));
  lane_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace gpupool
