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
#include <span>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "gpupool/elementwise.hpp"
#include "gpupool/error.hpp"
#include "gpupool/options.hpp"
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

/// A backend's code generator for elementwise kernels: the source its compiler takes for a call's
/// pattern of arrays and scalars. Each backend owns its generator (src/<name>/); the core keeps
/// only what every generator shares (parsing, names, the body's placement; kernel_source.hpp).
/// The text is the kernel cache's key: a generator must give the same text for the same kernel
/// and pattern.
class kernel_generator {
 public:
  /// The language of the source, for messages ("host C++", "CUDA C++").
  [[nodiscard]] virtual const char* language() const noexcept = 0;
  /// Source for `k` called with arrays where `is_array` is true and scalars elsewhere, defining
  /// `extern "C"` kernel_entry_point (and whatever else the backend's launches need).
  [[nodiscard]] virtual std::string source(const elementwise_kernel& k,
                                           const std::vector<bool>& is_array) const = 0;
  /// The line of `source(k, ...)` on which the body's first line stands (compiler messages are
  /// made relative to the body).
  [[nodiscard]] virtual int body_first_line(const elementwise_kernel& k) const = 0;

 protected:
  ~kernel_generator() = default;
};

/// What a backend is like, where the core, the tuning and the bindings need to know: its
/// defaults and what it can do. Each backend fills one, constant for the process, reachable
/// before any executor exists (backend_registration::traits, traits_of) and from the backend
/// (backend::traits). The core and the bindings read these and never ask which backend it is.
struct backend_traits {
  /// Fixed default lanes per device for an executor over `devices` devices on a host with
  /// `host_cores` cores (both at least 1).
  int (*default_lanes)(std::size_t devices, unsigned host_cores);
  /// The default in-flight budget of `device`, in bytes (executor_options::in_flight_budget 0),
  /// from its description as the executor made it (free memory included).
  std::size_t (*default_in_flight_budget)(const device_info& device);
  /// The fewest elements worth one batch of an elementwise kernel over device arrays
  /// (map_on_device) on `device`; 1 where every batch counts.
  std::size_t (*least_device_batch_elements)(const device_info& device);
  /// What `tuning::automatic` means on this backend: `measured` or `fixed`.
  tuning automatic_tuning;
  /// The measuring sweep's lane counts for `devices` devices on `host_cores` cores, in order.
  std::vector<int> (*sweep_lanes)(std::size_t devices, unsigned host_cores);
  /// The measuring sweep's chunk sizes, in order.
  std::span<const std::size_t> sweep_chunks;
  /// Bytes one sweep configuration squares per device, at least and at most (each configuration
  /// sizes its array between the two; tuning bounds the total over all devices).
  std::size_t sweep_bytes_per_device;
  std::size_t most_sweep_bytes_per_device;
  /// Its device memory is host memory (device pointers may be read on the host; copies are
  /// plain memcpy).
  bool device_memory_is_host;
  /// Its device pointers are CUDA device pointers on its devices: arrays of CUDA libraries
  /// (CuPy, PyTorch) there are used in place, and their streams can be waited for.
  bool cuda_device_pointers;
  /// It runs raw kernels (CUDA source, raw_kernel).
  bool runs_raw_kernels;
  /// Its kernels may read and write, in place, the pinned host memory its host_memory allocated
  /// (on CUDA: mapped into every device's address space): an urgent item of few bytes then runs
  /// without copies, in its lane's express slot (core/lanes/express_slot.hpp).
  bool kernels_reach_pinned_host;
  /// Its code generator for elementwise kernels (never null).
  const kernel_generator* generator;
};

/// How far a failure reaches (backend::classify_fault).
enum class fault_scope { none, device, every_device };

/// A backend: finds devices and opens streams on them. Thread-safe.
class backend {
 public:
  virtual ~backend() = default;
  [[nodiscard]] virtual backend_kind kind() const noexcept = 0;
  /// What this backend is like (the same object as its registration's).
  [[nodiscard]] virtual const backend_traits& traits() const noexcept = 0;
  [[nodiscard]] virtual int device_count() const = 0;
  /// Describes backend device `ordinal` (its `id` field is left for the executor to set).
  [[nodiscard]] virtual device_info describe(int ordinal) const = 0;
  /// Makes `ordinal` the calling thread's current device.
  virtual void bind_thread(int ordinal) = 0;
  /// Opens a new stream on `ordinal`; call from a thread bound to it. `priority` is gpupool's
  /// (limits::lowest_priority..limits::highest_priority, higher more urgent): a backend whose
  /// streams have priorities maps it onto them, and throws std::invalid_argument for one the
  /// device cannot give rather than open a stream of another priority.
  [[nodiscard]] virtual std::unique_ptr<backend_stream> open_stream(int ordinal,
                                                                    int priority = 0) = 0;
  /// Throws std::invalid_argument, as open_stream would, if `ordinal`'s streams cannot have
  /// priority `priority`; for checking before an executor starts anything. Backends whose
  /// streams have no priorities accept every one.
  virtual void check_stream_priority(int /*ordinal*/, int /*priority*/) const {}
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

/// Throws the std::logic_error of checked_cast: an object of type `actual` where a backend
/// expected its own `expected`.
[[noreturn]] void throw_wrong_type(const std::type_info& actual, const std::type_info& expected);

/// What a backend that stands in for devices (the CPU backend) stands in for.
struct stand_in_devices {
  int count = 1;
  /// Each stand-in device's copy rate each way, in bytes per second, shared by its lanes as a
  /// GPU's copy engines are; 0: no limit (executor_options::cpu_copy_rate).
  double copy_rate = 0;
};

/// Chooses the backend for an executor (`options.backend`, else GPUPOOL_BACKEND, else the first
/// registered backend that can run here: CUDA when a usable GPU exists, else the CPU backend,
/// printing one notice per process unless `options.quiet`), with the stand-in devices the
/// options ask for.
/// @throw backend_unavailable when a backend that cannot run is requested.
std::shared_ptr<backend> select_backend(const executor_options& options);

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
  /// Makes it, with `stand_ins` where it stands in for devices (the CPU backend).
  /// @throw backend_unavailable where it cannot run.
  std::shared_ptr<backend> (*make)(const stand_in_devices& stand_ins);
  /// Its host memory (pinned blocks, pointer descriptions, waiting for its streams); null for a
  /// backend this build does not contain. Called only where the backend can run.
  host_memory& (*host)();
  /// What it is like; there also for a backend this build does not contain or that cannot run
  /// here (never null).
  const backend_traits* traits;
};

/// The traits of the backend `kind` (its registration's). @throw std::logic_error for a kind
/// without a registration.
[[nodiscard]] const backend_traits& traits_of(backend_kind kind);

/// Whether `kind`'s kernels reach gpupool's pinned blocks in place: its traits say its kernels
/// reach the pinned memory its own host memory allocates, and the process's pinned blocks come
/// from there (process_host_memory()), or its kernels run on the host. The blocks come from
/// another backend's memory where GPUPOOL_BACKEND names that one and an executor asks for `kind`
/// by name: for CUDA they are then pageable memory, which its kernels cannot reach.
[[nodiscard]] bool kernels_reach_pinned_blocks(backend_kind kind) noexcept;

/// `base` as the backend's own type `Derived`, checked: a core interface (a timer, a compiled
/// kernel) handed to a backend is one that backend made. The check is a type-identity
/// comparison, cheap enough for per-task paths. @throw std::logic_error naming both types.
template <class Derived, class Base>
[[nodiscard]] Derived& checked_cast(Base& base) {
  static_assert(std::is_base_of_v<std::remove_const_t<Base>, std::remove_const_t<Derived>>);
  if (typeid(base) != typeid(Derived)) [[unlikely]]
    throw_wrong_type(typeid(base), typeid(Derived));
  return static_cast<Derived&>(base);
}

/// The backends built into the library (select_backend's table lists them in the order it tries
/// them). Adding a backend: a folder src/<name>/ defining its registration, a line here and one in
/// that table. In builds without the CUDA toolkit, src/cuda/cuda_unavailable.cpp defines the CUDA
/// registration: a probe that says why it cannot run.
extern const backend_registration cuda_backend_registration;
extern const backend_registration cpu_backend_registration;

}  // namespace gpupool::detail
