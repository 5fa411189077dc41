// The executor: owns devices and lanes, queues tasks, hands them to lanes, returns futures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpupool/elementwise.hpp"
#include "gpupool/future.hpp"
#include "gpupool/host_vector.hpp"
#include "gpupool/lane.hpp"
#include "gpupool/options.hpp"
#include "gpupool/trace.hpp"
#include "gpupool/types.hpp"
#include "gpupool/user_task.hpp"

namespace gpupool {

/// Device memory held by gpupool on one device.
struct device_memory_stats {
  std::size_t in_use = 0;  ///< Bytes allocated now (staging slots and lane allocations).
  std::size_t peak = 0;    ///< Most bytes allocated at once since the executor started.
  std::size_t budget = 0;  ///< The configured budget; 0 for none.
};

/// Work admitted against the in-flight budget (see executor_options::in_flight_budget), all
/// devices together.
struct in_flight_stats {
  std::size_t bytes = 0;    ///< Bytes of work queued or running now.
  std::size_t peak = 0;     ///< Most bytes in flight at once since the executor started.
  std::size_t budget = 0;   ///< The budget of all devices together (SIZE_MAX: none).
  std::size_t waiting = 0;  ///< Submitters waiting for room now.
  std::uint64_t waits = 0;  ///< Submits that had to wait for room since the executor started.
};

/// Small tasks that ran together: consecutive queued `map` inputs and `transform`s of one
/// built-in kernel (alpha included) and element type, each within one piece, are gathered into
/// one staging copy, one launch and one download (each keeps its own future).
struct coalescing_stats {
  std::uint64_t batches = 0;  ///< Launches that carried two or more tasks.
  std::uint64_t tasks = 0;    ///< Tasks that ran inside such a launch.
};

/// Where small calls of built-in kernels ran (see executor_options::host_lanes): on the host
/// lanes or on the devices, since the executor started.
struct placement_stats {
  std::uint64_t host_tasks = 0;  ///< Calls queued for the host lanes (then run, or cancelled).
  /// Calls small enough for the host lanes queued for the devices.
  std::uint64_t device_tasks = 0;
  /// The host lanes' share of a push large against both sides' latencies: the host's pace over
  /// the sum of the two (before any is measured, from the lanes' counts; 0 without host lanes).
  /// A smaller push goes mostly where it would end first.
  double host_share = 0;
  /// Each side's pace measured so far: bytes (in and out) per second of its calls once they
  /// run, apart from its latency; 0 until measured.
  double host_bytes_per_second = 0;
  double device_bytes_per_second = 0;
  /// Each side's latency measured so far: seconds from queueing a call to its end on a side with
  /// nothing pending, apart from the time per byte; 0 until measured.
  double host_latency_seconds = 0;
  double device_latency_seconds = 0;
};

/// Runs tasks on every lane of every device. Thread-safe: any thread may submit, and tasks may
/// submit further tasks (but a task that waits on another can deadlock a full executor).
class executor {
 public:
  /// Finds the devices, starts the lanes.
  /// @throw backend_unavailable if the requested backend cannot run here;
  ///        std::invalid_argument for bad options (unknown device, zero lanes, budget too small).
  explicit executor(executor_options options = {});
  /// Drains: waits for every queued task, then stops the lanes. Destroying an executor from one
  /// of its own tasks is a programming error and terminates the process.
  ~executor();
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;

  [[nodiscard]] backend_kind backend() const noexcept;
  [[nodiscard]] const std::vector<device_info>& devices() const noexcept;
  /// Whether device `device` still takes work: false once a fault took it out of service (and
  /// for a device the executor does not have). Thread-safe, cheap.
  [[nodiscard]] bool in_service(int device) const noexcept;
  [[nodiscard]] int lanes_per_device() const noexcept;
  [[nodiscard]] int lane_count() const noexcept;
  [[nodiscard]] int slots_per_lane() const noexcept;
  /// The piece size actually used (`chunk_bytes`, reduced to fit the memory budget if set).
  [[nodiscard]] std::size_t chunk_bytes() const noexcept;
  /// Lanes per device and chunk size, where each came from (given, fixed default, measured or
  /// read from the cache) and the measurements behind them: see executor_options::tuning.
  [[nodiscard]] const executor_settings& settings() const noexcept;
  /// The priority of work queued without one (executor_options::priority).
  [[nodiscard]] int priority() const noexcept;
  /// Whether work of a higher priority than `priority` is queued that a lane of `device` may
  /// take. For a task that runs many things in one turn of its lane (the Python binding runs
  /// queued Python calls one after another): it should end its turn when this says so, so that
  /// the urgent work does not wait for it. False for a device the executor does not have.
  /// Thread-safe; takes the device queue's lock only when work is queued.
  /// @throw std::invalid_argument if `priority` is outside limits.
  [[nodiscard]] bool work_waits_above(int device, int priority) const;
  /// Work queued and not yet taken by a lane: a batch of coalesced tasks counts once.
  [[nodiscard]] std::size_t queued() const;
  [[nodiscard]] std::vector<device_memory_stats> memory_stats() const;
  /// The work in flight against the in-flight budget. Thread-safe, cheap.
  [[nodiscard]] in_flight_stats in_flight() const noexcept;
  /// Counts of coalesced tasks since the executor started. Thread-safe, cheap.
  [[nodiscard]] coalescing_stats coalescing() const noexcept;
  /// Host lanes beside the devices' lanes (executor_options::host_lanes).
  [[nodiscard]] int host_lanes() const noexcept;
  /// Where small calls of built-in kernels ran, and the shares the next ones get. Thread-safe.
  [[nodiscard]] placement_stats placement() const;
  /// True when called from one of this executor's lane threads (e.g. inside a task), its host
  /// lanes included (a completion callback may run there).
  [[nodiscard]] bool is_lane_thread() const noexcept;

  /// Records the journey of every task taken from now on (off by default). Records accumulate
  /// until `clear_trace()`, in a ring of `trace_capacity()` records: once it is full the oldest
  /// are dropped (and counted by `trace_dropped()`). Thread-safe.
  void set_tracing(bool on) noexcept;
  [[nodiscard]] bool tracing() const noexcept;
  /// A snapshot of every task recorded (and not dropped) so far, in submission order; with
  /// `first_task`, only tasks submitted from then on (see `next_task_id()`). Thread-safe.
  [[nodiscard]] gpupool::trace trace(std::uint64_t first_task = 0) const;
  /// Forgets every record and the dropped count, giving their memory back.
  void clear_trace();
  /// The most records kept (default 262,144, about 200-300 bytes each); at least 1.
  void set_trace_capacity(std::size_t records);
  [[nodiscard]] std::size_t trace_capacity() const;
  /// Records dropped since the last `clear_trace()` because the ring was full.
  [[nodiscard]] std::size_t trace_dropped() const;
  /// The number the next submitted task will get: pass it to `trace()` to see only later tasks.
  [[nodiscard]] std::uint64_t next_task_id() const noexcept;

  /// Runs `f(lane&)` on any lane. @throw std::runtime_error after shutdown.
  template <class F>
  auto submit(F&& f) {
    return submit_impl(std::forward<F>(f), std::nullopt);
  }

  /// submit with options: `options.priority` orders it among queued work (see task_options).
  /// @throw std::invalid_argument for a priority outside limits; as submit.
  template <class F>
  auto submit(const task_options& options, F&& f) {
    return submit_impl(std::forward<F>(f), std::nullopt, 0, options);
  }

  /// Runs `f(lane&)` on any lane, counting `device_bytes` (what the task will hold in device
  /// memory and pinned staging) against the in-flight budget until it ends: past the budget the
  /// submit waits for room (or throws out_of_memory with `when_full::raise`).
  /// @throw out_of_memory, naming the sizes, if `device_bytes` alone passes the budget (such a
  ///        task could never be admitted); std::runtime_error after shutdown.
  template <class F>
  auto submit_sized(std::size_t device_bytes, F&& f) {
    const std::size_t cost = in_flight_cost(device_bytes, /*piecewise=*/false);
    admit(cost);
    return submit_impl(std::forward<F>(f), std::nullopt, cost);
  }
  /// submit_sized with options (see task_options).
  template <class F>
  auto submit_sized(std::size_t device_bytes, const task_options& options, F&& f) {
    check_priority_option(options);  // before any budget is taken
    const std::size_t cost = in_flight_cost(device_bytes, /*piecewise=*/false);
    admit(cost);
    return submit_impl(std::forward<F>(f), std::nullopt, cost, options);
  }

  /// Runs `f(lane&)` on a lane of device `device` (0..devices()-1).
  /// @throw std::out_of_range for an unknown device; std::runtime_error after shutdown.
  template <class F>
  auto submit_to(int device, F&& f) {
    check_device(device);
    return submit_impl(std::forward<F>(f), device);
  }
  /// submit_to with options (see task_options).
  template <class F>
  auto submit_to(int device, const task_options& options, F&& f) {
    check_device(device);
    return submit_impl(std::forward<F>(f), device, 0, options);
  }

  /// Applies a one-input kernel to each input array; results come back in input order, one
  /// future per input, each holding a host_vector<T> (a std::vector that skips zeroing). Inputs are
  /// read in place and must stay alive until their futures are ready. Large inputs are split into
  /// pieces of `chunk_bytes()`. Each input counts its input and output bytes against the
  /// in-flight budget (at most the whole budget: it runs in pieces); past it, `map` waits for
  /// room after queueing the inputs before. Inputs are queued in batches (one push and one
  /// wake-up pass per batch).
  /// @throw std::invalid_argument if the kernel takes two inputs; std::runtime_error after
  ///        shutdown. If queueing fails part way (out_of_memory past the budget with
  ///        when_full::raise; shut down meanwhile), the inputs queued are cancelled and those
  ///        already running waited for before the error is thrown: nothing is left reading the
  ///        inputs.
  template <class Inputs>
  auto map(const builtin_kernel& k, const Inputs& xs) {
    return map(k, xs, task_options{});
  }

  /// map with options: every piece of every input carries `options.priority` (see task_options).
  /// @throw std::invalid_argument for a priority outside limits; as map.
  template <class Inputs>
  auto map(const builtin_kernel& k, const Inputs& xs, const task_options& options) {
    using T = element_of<Inputs>;
    require_arity(k, 1, "map");
    auto next = std::ranges::begin(xs);
    return map_each<T>(
        k, std::ranges::size(xs), /*operands=*/2,
        [&next] {
          const auto sx = as_span<T>(*next);
          ++next;
          return map_input{sx.data(), nullptr, sx.size()};
        },
        options);
  }

  /// Applies a two-input kernel to pairs (xs[i], ys[i]), as the one-input map does (each pair
  /// counts its two inputs and its output against the budget).
  /// @throw std::invalid_argument (before anything runs) if the kernel takes one input, the
  ///        lists differ in length, or any pair differs in size; a failure part way as the
  ///        one-input map.
  template <class Inputs>
  auto map(const builtin_kernel& k, const Inputs& xs, const Inputs& ys) {
    return map(k, xs, ys, task_options{});
  }

  /// The two-input map with options (see task_options).
  template <class Inputs>
  auto map(const builtin_kernel& k, const Inputs& xs, const Inputs& ys,
           const task_options& options) {
    using T = element_of<Inputs>;
    require_arity(k, 2, "map");
    if (std::ranges::size(xs) != std::ranges::size(ys))
      throw std::invalid_argument("gpupool::executor::map: input lists differ in length");
    std::vector<std::span<const T>> sx, sy;
    for (const auto& x : xs) sx.push_back(as_span<T>(x));
    for (const auto& y : ys) sy.push_back(as_span<T>(y));
    for (std::size_t i = 0; i < sx.size(); ++i)
      if (sx[i].size() != sy[i].size())
        throw std::invalid_argument("gpupool::executor::map: inputs " + std::to_string(i) +
                                    " differ in size (" + std::to_string(sx[i].size()) + " vs " +
                                    std::to_string(sy[i].size()) + ")");
    std::size_t i = 0;
    return map_each<T>(
        k, sx.size(), /*operands=*/3,
        [&] {
          const map_input call{sx[i].data(), sy[i].data(), sx[i].size()};
          ++i;
          return call;
        },
        options);
  }

  /// Streams `in` through the devices in pieces, writing k(in) to `out`; `out` may equal `in`.
  /// Works for arrays larger than the devices' memory. Both must stay alive until the future is
  /// ready. @throw std::invalid_argument if sizes differ or the kernel takes two inputs.
  template <class T>
  future<void> transform(const builtin_kernel& k, std::span<const T> in, std::span<T> out) {
    require_arity(k, 1, "transform");
    require_same_size(in.size(), out.size());
    return transform_impl(k, dtype_of<T>(), in.data(), nullptr, out.data(), in.size());
  }

  /// Two-input transform: out = k(x, y).
  template <class T>
  future<void> transform(const builtin_kernel& k, std::span<const T> x, std::span<const T> y,
                         std::span<T> out) {
    require_arity(k, 2, "transform");
    require_same_size(x.size(), out.size());
    require_same_size(y.size(), out.size());
    return transform_impl(k, dtype_of<T>(), x.data(), y.data(), out.data(), out.size());
  }

  /// Many transforms of one built-in kernel and element type at once, one future per call, in
  /// order: what `map` is to many inputs, for outputs the caller owns (the Python binding's
  /// `map` writes into pinned result blocks this way). The calls are queued in batches (one
  /// push and one wake-up pass per batch), each counted against the in-flight budget as
  /// `transform` counts it. Arrays must stay alive until their future is ready.
  /// @throw std::invalid_argument (before anything is queued) for a call whose `y` does not
  ///        match the kernel's arity, or an alpha `t` cannot hold. If queueing fails part way
  ///        (shut down; the budget full with when_full::raise), the calls queued are cancelled,
  ///        those already running are waited for, and the error is thrown: no call is left
  ///        running to read or write the caller's memory.
  multi_future<void> transform_each(const builtin_kernel& k, dtype t,
                                    std::span<const transform_call> calls);
  /// transform_each with options (see task_options).
  multi_future<void> transform_each(const builtin_kernel& k, dtype t,
                                    std::span<const transform_call> calls,
                                    const task_options& options);

  /// transform_each that never waits: it queues every call if the in-flight budget has room
  /// for all of them now (and they fit one batch of `map`, 256 calls), else queues nothing and
  /// returns nothing. For callers that must not block (the Python binding holds the GIL, which
  /// lanes need to hand results over). @throw as transform_each.
  std::optional<multi_future<void>> try_transform_each(const builtin_kernel& k, dtype t,
                                                       std::span<const transform_call> calls);
  /// try_transform_each with options (see task_options).
  std::optional<multi_future<void>> try_transform_each(const builtin_kernel& k, dtype t,
                                                       std::span<const transform_call> calls,
                                                       const task_options& options);

  /// Runs a run-time compiled elementwise kernel over `out.size()` elements: every array input
  /// must have that length and the parameter's type; scalars are converted and broadcast.
  /// Streams through the devices in pieces like the built-in kernels. The kernel is compiled at
  /// this call (once; then cached in memory and on disk), so compile errors are thrown here.
  /// @throw compile_error; std::invalid_argument for wrong argument counts, types or sizes.
  template <class T>
  future<void> transform(const elementwise_kernel& k, const std::vector<kernel_argument>& inputs,
                         std::span<T> out) {
    return launch_elementwise(k, inputs, dtype_of<T>(), out.data(), out.size());
  }

  /// The untyped form of the above: `out` holds `count` elements of `out_type`.
  future<void> launch_elementwise(const elementwise_kernel& k,
                                  const std::vector<kernel_argument>& inputs, dtype out_type,
                                  void* out, std::size_t count);
  /// launch_elementwise with options (see task_options).
  future<void> launch_elementwise(const elementwise_kernel& k,
                                  const std::vector<kernel_argument>& inputs, dtype out_type,
                                  void* out, std::size_t count, const task_options& options);

  /// A raw CUDA kernel over host arrays, streamed in pieces like the above (one launch per
  /// piece). Array arguments must be given where the kernel declares arrays.
  /// @throw compile_error; std::invalid_argument for bad calls; backend_unavailable on the CPU
  ///        backend, which cannot run CUDA source.
  template <class T>
  future<void> transform(const raw_kernel& k, const std::vector<kernel_argument>& inputs,
                         std::span<T> out) {
    return launch_raw(k, inputs, dtype_of<T>(), out.data(), out.size());
  }
  future<void> launch_raw(const raw_kernel& k, const std::vector<kernel_argument>& inputs,
                          dtype out_type, void* out, std::size_t count);
  /// launch_raw with options (see task_options).
  future<void> launch_raw(const raw_kernel& k, const std::vector<kernel_argument>& inputs,
                          dtype out_type, void* out, std::size_t count,
                          const task_options& options);

  /// Runs a compiled kernel over many calls whose arrays already live on device `device`
  /// (device pointers; host memory on the CPU backend). Every call is checked before anything
  /// runs, the kernel compiled once, and the calls shared out in batches among the device's
  /// lanes: on CUDA an elementwise kernel runs each batch as one launch, so thousands of small
  /// arrays cost a few launches, not thousands. The future is ready once every call is done.
  /// Arrays must stay alive, and not be written by other work, until then.
  /// @throw call_error (a std::invalid_argument) naming the first bad call, before anything is
  ///        queued, with the check's own error nested; compile_error; std::out_of_range for an
  ///        unknown device.
  future<void> map_on_device(int device, const elementwise_kernel& k,
                             const std::vector<device_call>& calls);
  future<void> map_on_device(int device, const raw_kernel& k,
                             const std::vector<device_call>& calls);
  /// map_on_device with options: every batch carries `options.priority` (see task_options).
  future<void> map_on_device(int device, const elementwise_kernel& k,
                             const std::vector<device_call>& calls, const task_options& options);
  future<void> map_on_device(int device, const raw_kernel& k, const std::vector<device_call>& calls,
                             const task_options& options);

  /// Stops accepting work. With `cancel_pending`, tasks not yet started are cancelled (their
  /// futures throw cancelled_error) while started ones, a partly processed map input or
  /// transform included, run to their end; otherwise every queued task runs. Returns once every
  /// lane has stopped; every future is then resolved. Idempotent. In a child process forked
  /// after the executor was made, it only stops intake (the lanes are the parent's).
  /// @throw std::logic_error when called from one of this executor's own tasks.
  void shutdown(bool cancel_pending = false);
  [[nodiscard]] bool is_shutdown() const noexcept;

 private:
  template <class Inputs>
  using element_of =
      std::remove_cv_t<std::ranges::range_value_t<std::ranges::range_reference_t<const Inputs>>>;

  template <class T, class Range>
  static std::span<const T> as_span(const Range& r) {
    return std::span<const T>(std::ranges::data(r), std::ranges::size(r));
  }

  // Queues `f`; the `admitted` bytes (taken by admit()) are given back when it ends, or at once
  // if it cannot be queued.
  template <class F>
  auto submit_impl(F&& f, std::optional<int> device, std::size_t admitted = 0,
                   const task_options& options = {}) {
    using R = std::invoke_result_t<std::decay_t<F>&, lane&>;
    using task = detail::callable_task<std::decay_t<F>, R>;
    std::shared_ptr<detail::shared_state<R>> state;
    try {
      state = std::make_shared<detail::shared_state<R>>();
    } catch (...) {
      release_in_flight(admitted);  // nothing holds the bytes yet
      throw;
    }
    struct parts {
      F&& f;
      const std::shared_ptr<detail::shared_state<R>>& state;
    } made_of{std::forward<F>(f), state};
    queue_user_task(
        sizeof(task), alignof(task),
        [](void* storage, void* context) -> detail::user_task* {
          auto& p = *static_cast<parts*>(context);
          return ::new (storage) task(std::forward<F>(p.f), p.state);
        },
        &made_of, device, admitted, options);
    return future<R>(std::move(state));
  }

  // Makes the task that `construct(storage, context)` builds in `bytes` of storage aligned to
  // `align` (one allocation with the item a lane takes), its state holding the `admitted` bytes
  // until it ends, and queues it for `device` (nullopt: any). A task that cannot be made gives
  // the bytes back; one that cannot be queued is ended (cancelled: its bytes go back). Then the
  // reason is thrown.
  void queue_user_task(std::size_t bytes, std::size_t align,
                       detail::user_task* (*construct)(void* storage, void* context), void* context,
                       std::optional<int> device, std::size_t admitted,
                       const task_options& options);
  // Throws std::invalid_argument for a priority outside limits.
  static void check_priority_option(const task_options& options);

  // One input of map: `count` elements of `x` (and `y`, for a two-input kernel; else null).
  struct map_input {
    const void* x;
    const void* y;
    std::size_t count;
  };

  // Both maps: `count` inputs given by next() in order, each counting `operands` arrays of its
  // size against the budget; the futures' states come back from queue_maps, which does the work
  // (admission, batches, the clean-up when queueing fails part way) with the type erased.
  template <class T, class Next>
  multi_future<host_vector<T>> map_each(const builtin_kernel& k, std::size_t count, int operands,
                                        Next next, const task_options& options) {
    multi_future<host_vector<T>> futures;
    futures.reserve(count);  // before anything is queued: filling it below cannot throw
    auto states = queue_maps(
        k, dtype_of<T>(), count, operands,
        [](void* source) { return (*static_cast<Next*>(source))(); }, &next, options);
    for (auto& state : states)
      futures.emplace_back(
          std::static_pointer_cast<detail::shared_state<host_vector<T>>>(std::move(state)));
    return futures;
  }
  // The states are shared_state<host_vector<T>> for the T of `t`.
  std::vector<std::shared_ptr<detail::state_base>> queue_maps(const builtin_kernel& k, dtype t,
                                                              std::size_t count, int operands,
                                                              map_input (*next)(void*),
                                                              void* source,
                                                              const task_options& options);

  std::optional<multi_future<void>> queue_transforms(const builtin_kernel& k, dtype t,
                                                     std::span<const transform_call> calls,
                                                     bool may_wait);
  future<void> transform_impl(const builtin_kernel& k, dtype t, const void* x, const void* y,
                              void* out, std::size_t n);
  // The in-flight budget (see executor_options::in_flight_budget). in_flight_cost() is what a
  // task of `bytes` counts: a piecewise task at most the whole budget; a task that cannot be
  // split and passes the budget is refused (out_of_memory naming the sizes). admit() takes the
  // cost, waiting for room or throwing as when_full says (never waiting on a lane thread).
  [[nodiscard]] std::size_t in_flight_cost(std::size_t bytes, bool piecewise) const;
  void admit(std::size_t cost);
  void release_in_flight(std::size_t cost) noexcept;
  void check_device(int device) const;
  static void require_arity(const builtin_kernel& k, int arity, const char* what);
  static void require_same_size(std::size_t a, std::size_t b);

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace gpupool
