// The small interface every backend implements: devices, streams, copies, memory, kernels,
// events, and its registration (whether it can run, making it, its host memory: see
// core/memory/host_memory.hpp). The core (executor, lanes, queues, futures, pinned memory) is
// written against these alone and never includes CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpupool/elementwise.hpp"
#include "gpupool/error.hpp"
#include "gpupool/types.hpp"

namespace gpupool::detail {

/// A point in a stream's work. Reusable: record again to move it.
class backend_event {
 public:
  virtual ~backend_event() = default;
  /// Marks "everything enqueued on the stream so far".
  virtual void record() = 0;
  /// True once the stream has passed the recorded point. @throw cuda_error on a device fault.
  [[nodiscard]] virtual bool ready() = 0;
  /// Blocks until the stream has passed the recorded point. @throw cuda_error on a device fault.
  virtual void wait() = 0;
};

/// A timestamp taken in stream order (on CUDA the GPU's global clock, written by a one-thread
/// kernel; a host clock reading on the CPU).
class backend_timer {
 public:
  virtual ~backend_timer() = default;
  /// Marks "now, in stream order".
  virtual void record() = 0;
  /// Microseconds from `earlier`'s mark to this one; both must have been passed by the stream.
  [[nodiscard]] virtual double microseconds_since(backend_timer& earlier) = 0;
};

/// A user kernel compiled for one backend (and device architecture).
class compiled_kernel {
 public:
  explicit compiled_kernel(std::vector<bool> is_array) : is_array_(std::move(is_array)) {}
  virtual ~compiled_kernel() = default;
  /// Per input: an array (true) or a scalar.
  [[nodiscard]] const std::vector<bool>& is_array() const noexcept { return is_array_; }

 private:
  std::vector<bool> is_array_;
};

/// One lane's ordered queue of device work. Used only from its lane's thread.
class backend_stream {
 public:
  virtual ~backend_stream() = default;
  [[nodiscard]] virtual void* native_handle() const noexcept = 0;
  [[nodiscard]] virtual std::unique_ptr<backend_event> make_event() = 0;
  [[nodiscard]] virtual std::unique_ptr<backend_timer> make_timer() = 0;

  /// Stream-ordered device allocation (no hidden device-wide synchronisation).
  [[nodiscard]] virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;

  /// Asynchronous copies; `host` must stay valid until the stream passes them.
  virtual void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) = 0;
  /// Enqueues `out = k(x[, y])` over `count` elements of type `t`.
  virtual void launch(const builtin_kernel& k, dtype t, const void* x, const void* y, void* out,
                      std::size_t count) = 0;
  /// `launch`, with `begin` marked when the kernel starts and `end` when it has finished. This
  /// default records the marks around the launch; a backend whose kernels can take the marks
  /// themselves overrides it (on CUDA that saves two stream operations per traced piece).
  virtual void launch_marked(const builtin_kernel& k, dtype t, const void* x, const void* y,
                             void* out, std::size_t count, backend_timer& begin,
                             backend_timer& end) {
    begin.record();
    launch(k, t, x, y, out, count);
    end.record();
  }
  /// Enqueues a compiled user kernel over `count` elements. `args` holds, per input, a device
  /// array or a pointer to the scalar's value (host memory, read before this returns), then the
  /// output device array.
  virtual void launch_compiled(const compiled_kernel& k, void* const* args, std::size_t count) = 0;
  /// Enqueues `rows` calls of `k` at once. `table` holds, per row, one 8-byte slot per input
  /// (the device array's address, or the scalar's bytes from the slot's start), the output's
  /// address and the element count. The backend may read `table` until the stream has passed
  /// this work (a copy of it queued on the stream), so it must stay valid that long. This
  /// default launches each row on its own; backends that can run a whole table in one launch
  /// override it.
  virtual void launch_compiled_batch(const compiled_kernel& k, const std::uint64_t* table,
                                     std::size_t rows);
  virtual void synchronize() = 0;
  /// True if everything enqueued on the stream has finished; never waits. False too when the
  /// stream reports a failure (whoever waits for the stream next reports it).
  [[nodiscard]] virtual bool idle() noexcept = 0;
};

/// The kernels one backend has compiled, by a key naming everything compiling depends on
/// (detail::compile_for makes it). Thread-safe; entries live as long as the backend.
class compiled_memo {
 public:
  /// The kernel stored under `key`, else `compile()`'s, stored (a compile that throws stores
  /// nothing). Compiles outside the lock: a first compile can take seconds, and the backend's
  /// own caches already make racing compiles of one kernel wait for each other.
  template <class Compile>
  std::shared_ptr<const compiled_kernel> get(const std::string& key, Compile compile) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = kernels_.find(key); it != kernels_.end()) return it->second;
    }
    std::shared_ptr<const compiled_kernel> made = compile();
    std::lock_guard lock(mutex_);
    return kernels_.try_emplace(key, std::move(made)).first->second;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const compiled_kernel>> kernels_;
};

/// How far a failure reaches (backend::classify_fault).
enum class fault_scope { none, device, every_device };

/// A backend: finds devices and opens streams on them. Thread-safe.
class backend {
 public:
  virtual ~backend() = default;
  [[nodiscard]] virtual backend_kind kind() const noexcept = 0;
  [[nodiscard]] virtual int device_count() const = 0;
  /// Describes backend device `ordinal` (its `id` field is left for the executor to set).
  [[nodiscard]] virtual device_info describe(int ordinal) const = 0;
  /// Makes `ordinal` the calling thread's current device.
  virtual void bind_thread(int ordinal) = 0;
  /// Opens a new stream on `ordinal`; call from a thread bound to it.
  [[nodiscard]] virtual std::unique_ptr<backend_stream> open_stream(int ordinal) = 0;
  /// Prepares the device for many streams and stream-ordered allocation (memory pool policy).
  virtual void prepare_device(int ordinal) = 0;
  /// Bytes of the device's memory free now (for the CPU backend: host memory available).
  [[nodiscard]] virtual std::size_t free_memory(int ordinal) const = 0;
  /// Compiles `k` for device `ordinal`, with arrays where `is_array` is true and scalars
  /// elsewhere. Cached; thread-safe. @throw compile_error with the compiler's log.
  [[nodiscard]] virtual std::shared_ptr<const compiled_kernel> compile(
      const elementwise_kernel& k, const std::vector<bool>& is_array, int ordinal) = 0;
  /// Compiles a raw CUDA kernel for device `ordinal`. Cached; thread-safe.
  /// @throw compile_error; backend_unavailable where CUDA kernels cannot run.
  [[nodiscard]] virtual std::shared_ptr<const compiled_kernel> compile(const raw_kernel& k,
                                                                       int ordinal) = 0;
  /// What `e`, a task's failure on one of this backend's devices, leaves unable to run anything
  /// more: nothing (an ordinary failure), that device (a device_fault a task threw), or every
  /// device of the process (CUDA's sticky errors, such as an illegal address: "the process is
  /// left in an inconsistent state and any further CUDA work will return the same error", on
  /// every device of the process, not only the one that faulted).
  [[nodiscard]] virtual fault_scope classify_fault(const std::exception& e) const noexcept {
    return dynamic_cast<const device_fault*>(&e) != nullptr ? fault_scope::device
                                                            : fault_scope::none;
  }
  /// What this backend has compiled (detail::compile_for looks there first).
  [[nodiscard]] compiled_memo& compiled() noexcept { return compiled_; }

 private:
  compiled_memo compiled_;
};

/// Chooses the backend for an executor: `requested`, else GPUPOOL_BACKEND, else the first
/// registered backend that can run here (CUDA when a usable GPU exists, else the CPU backend,
/// printing one notice per process unless `quiet`).
/// @throw backend_unavailable when a backend that cannot run is requested.
std::shared_ptr<backend> select_backend(const std::optional<backend_kind>& requested,
                                        int cpu_devices, bool quiet);

class host_memory;

/// Whether a backend can run in this process, and if not, why (for messages).
struct backend_probe {
  bool usable = false;
  int devices = 0;
  std::string reason;
};

/// One backend as the core sees it before any executor exists: whether it can run, how to make
/// it, and its host memory. Each backend's own translation unit defines its registration.
struct backend_registration {
  backend_kind kind;
  /// Whether it can run here; computed once, cheap afterwards.
  backend_probe (*probe)();
  /// Makes it, standing in for `stand_in_devices` devices where it stands in for them (the CPU
  /// backend). @throw backend_unavailable where it cannot run.
  std::shared_ptr<backend> (*make)(int stand_in_devices);
  /// Its host memory (pinned blocks, pointer descriptions, waiting for its streams); null for a
  /// backend this build does not contain. Called only where the backend can run.
  host_memory& (*host)();
};

/// The backends built into the library (select_backend's table lists them in the order it tries
/// them). Adding a backend: a folder src/<name>/ defining its registration, a line here and one in
/// that table. In builds without the CUDA toolkit, src/cuda/cuda_unavailable.cpp defines the CUDA
/// registration: a probe that says why it cannot run.
extern const backend_registration cuda_backend_registration;
extern const backend_registration cpu_backend_registration;

}  // namespace gpupool::detail
