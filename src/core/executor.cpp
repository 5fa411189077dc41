#include "gpupool/executor.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <iterator>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>

#include <unistd.h>

#include "core/backend.hpp"
#include "core/environment.hpp"
#include "core/kernels/user_call.hpp"
#include "core/lanes/elementwise_piece.hpp"
#include "core/lanes/lane_worker.hpp"
#include "core/lanes/user_kernel_piece.hpp"
#include "core/scheduling/device_health.hpp"
#include "core/scheduling/device_map_batches.hpp"
#include "core/scheduling/lane_spin.hpp"
#include "core/scheduling/task_queue.hpp"
#include "core/tuning/tuning.hpp"
#include "gpupool/fork.hpp"

namespace gpupool {
namespace {

constexpr const char* shut_down_message =
    "gpupool: the executor is shut down and takes no more work";
constexpr std::size_t chunk_alignment = 256;
using detail::most_lanes_per_device;
using detail::smallest_chunk;
// Lane threads of one executor, all devices together: far beyond any useful count, and low
// enough that a mistaken option fails at once instead of exhausting the process's threads.
constexpr int most_lanes = limits::most_lanes_per_executor;
using limits::most_slots_per_lane;
// A call cut finer than chunk_bytes to keep every lane busy (executor::impl::piece_bytes) is cut
// into pieces of whole multiples of this, and never below the floor: smaller pieces cost more in
// per-piece overhead than the lanes they bring in gain.
constexpr std::size_t piece_alignment = std::size_t{64} << 10;
constexpr std::size_t adaptive_piece_floor = std::size_t{1} << 20;
// Two device buffers per slot: two-input kernels stage both inputs.
constexpr std::size_t device_buffers_per_slot = 2;

// The in-flight budget's default per device: half of a CUDA device's memory free when the
// executor is made (the rest is left to the staging slots, the tasks' own allocations and what
// other processes may still take; memory they hold already is not counted on); a fixed 1 GiB per
// CPU stand-in device, whose "device memory" is the host's, shared by every stand-in.
constexpr std::size_t cpu_default_in_flight_budget = std::size_t{1} << 30;
constexpr std::size_t no_limit = std::numeric_limits<std::size_t>::max();

// Bytes of work admitted and not yet done, against a budget for all devices together. Submitters
// take bytes before queueing a task, its future's completion gives them back. Taking and giving
// back are lock-free; only a submitter that must wait takes the mutex.
class in_flight_gate final : public detail::budget_account {
 public:
  in_flight_gate(std::size_t budget, when_full mode) : budget_(budget), mode_(mode) {}

  [[nodiscard]] std::size_t budget() const noexcept { return budget_; }

  // Takes `bytes` if they fit now.
  bool try_take(std::size_t bytes) noexcept {
    if (bytes == 0) return true;
    std::size_t now = in_flight_.load();
    do {
      if (now > budget_ || bytes > budget_ - now) return false;
    } while (!in_flight_.compare_exchange_weak(now, now + bytes));
    note_peak(now + bytes);
    return true;
  }

  // Takes `bytes`, waiting for room (or throwing, in raise mode). A lane thread is admitted over
  // the budget: it may be the very lane whose completions would make room.
  void take(std::size_t bytes, bool on_lane) {
    if (try_take(bytes)) return;
    if (on_lane) {
      note_peak(in_flight_.fetch_add(bytes) + bytes);
      return;
    }
    if (mode_ == when_full::raise)
      throw out_of_memory("gpupool: submitting " + std::to_string(bytes) +
                          " bytes would pass the in-flight budget of " + std::to_string(budget_) +
                          " bytes (" + std::to_string(in_flight_.load()) +
                          " in flight; when_full is raise)");
    std::unique_lock lock(mutex_);
    // Counted before the check under the lock: a release that does not see the count has
    // already given its bytes back, so the check sees them (both are sequentially consistent).
    waiting_.fetch_add(1);
    waits_.fetch_add(1, std::memory_order_relaxed);
    bool taken = false;
    cv_.wait(lock, [&] { return closed_.load() || (taken = try_take(bytes)); });
    waiting_.fetch_sub(1);
    if (!taken) throw std::runtime_error(shut_down_message);
  }

  void give_back(std::size_t bytes) noexcept override { release(bytes); }

  void release(std::size_t bytes) noexcept {
    if (bytes == 0) return;
    in_flight_.fetch_sub(bytes);
    if (waiting_.load() > 0) {
      std::lock_guard lock(mutex_);
      cv_.notify_all();
    }
  }

  // Wakes every waiting submitter to find the executor shut down.
  void close() noexcept {
    std::lock_guard lock(mutex_);
    closed_.store(true);
    cv_.notify_all();
  }

  [[nodiscard]] in_flight_stats stats() const noexcept {
    return {in_flight_.load(), peak_.load(std::memory_order_relaxed), budget_, waiting_.load(),
            waits_.load(std::memory_order_relaxed)};
  }

 private:
  void note_peak(std::size_t now) noexcept {
    std::size_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }

  const std::size_t budget_;
  const when_full mode_;
  std::atomic<std::size_t> in_flight_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<std::size_t> waiting_{0};
  std::atomic<std::uint64_t> waits_{0};
  std::atomic<bool> closed_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
};

// The in-flight budget of all `devices` together: the option per device, or its default.
std::size_t choose_in_flight_budget(const executor_options& options,
                                    const std::vector<device_info>& devices) {
  if (options.when_full != when_full::block && options.when_full != when_full::raise)
    throw std::invalid_argument("gpupool: when_full must be block or raise");
  std::size_t total = 0;
  for (const auto& d : devices) {
    std::size_t per_device = options.in_flight_budget;
    if (per_device == 0)
      per_device = d.backend == backend_kind::cuda ? std::max<std::size_t>(d.free_memory / 2, 1)
                                                   : cpu_default_in_flight_budget;
    if (per_device == no_limit || total > no_limit - per_device) return no_limit;
    total += per_device;
  }
  return total;
}

// Test hook: GPUPOOL_TEST_FAIL_LANE_START=<n> makes starting the lane thread numbered n fail as
// thread creation does when the process has no threads left (EAGAIN). -1: no fault.
int lane_start_fault() {
  const auto n = detail::count_from_environment({"GPUPOOL_TEST_FAIL_LANE_START", "a lane number", 0,
                                                 static_cast<unsigned long long>(most_lanes)});
  return n ? static_cast<int>(*n) : -1;
}

std::vector<int> choose_ordinals(const executor_options& options, int available) {
  std::vector<int> ordinals = options.devices;
  if (ordinals.empty()) {
    for (int i = 0; i < available; ++i) ordinals.push_back(i);
  }
  if (ordinals.empty()) throw backend_unavailable("gpupool: the backend has no devices");
  std::set<int> seen;
  for (int d : ordinals) {
    if (d < 0 || d >= available)
      throw std::invalid_argument("gpupool: device " + std::to_string(d) + " does not exist (" +
                                  std::to_string(available) + " visible)");
    if (!seen.insert(d).second)
      throw std::invalid_argument("gpupool: device " + std::to_string(d) + " is listed twice");
  }
  return ordinals;
}

// Checks the lanes per device chosen (given, measured or fixed) against the limits.
int check_lanes(int lanes, std::size_t devices) {
  if (lanes < 1 || lanes > most_lanes_per_device)
    throw std::invalid_argument("gpupool: lanes_per_device must be from 1 to " +
                                std::to_string(most_lanes_per_device) + ", not " +
                                std::to_string(lanes));
  if (static_cast<std::size_t>(lanes) * devices > static_cast<std::size_t>(most_lanes))
    throw std::invalid_argument("gpupool: " + std::to_string(devices) + " devices x " +
                                std::to_string(lanes) + " lanes is more than the limit of " +
                                std::to_string(most_lanes) + " lanes per executor");
  return lanes;
}

// The chunk size chosen (given, measured or fixed), fitted to the device memory budget.
std::size_t fit_chunk_bytes(const executor_options& options, std::size_t chunk, int lanes) {
  if (options.device_memory_budget != 0) {
    const std::size_t buffers = static_cast<std::size_t>(lanes) *
                                static_cast<std::size_t>(options.slots_per_lane) *
                                device_buffers_per_slot;
    chunk = std::min(chunk, options.device_memory_budget / buffers);
  }
  chunk = chunk / chunk_alignment * chunk_alignment;
  if (chunk < smallest_chunk) {
    if (options.device_memory_budget != 0)
      throw std::invalid_argument(
          "gpupool: device_memory_budget of " + std::to_string(options.device_memory_budget) +
          " bytes is too small for " + std::to_string(lanes) + " lanes x " +
          std::to_string(options.slots_per_lane) + " slots (each needs " +
          std::to_string(device_buffers_per_slot * smallest_chunk) + " bytes at least)");
    throw std::invalid_argument("gpupool: chunk_bytes must be at least " +
                                std::to_string(smallest_chunk));
  }
  return chunk;
}

}  // namespace

struct executor::impl {
  explicit impl(const executor_options& options)
      : generation(fork_generation()),
        owner(detail::select_backend(options.backend, options.cpu_devices, options.quiet)),
        ordinals(choose_ordinals(options, owner->device_count())),
        settings(checked_settings(options, *owner, ordinals)),
        lanes_per_device(settings.lanes_per_device),
        slots(options.slots_per_lane),
        chunk_bytes(settings.chunk_bytes),
        queue(static_cast<int>(ordinals.size()), detail::lane_spin_from_environment()) {
    for (std::size_t d = 0; d < ordinals.size(); ++d) {
      owner->prepare_device(ordinals[d]);
      device_info info = owner->describe(ordinals[d]);
      info.free_memory = owner->free_memory(ordinals[d]);
      info.id = static_cast<int>(d);
      devices.push_back(std::move(info));
      memory.push_back(std::make_unique<detail::device_memory>(options.device_memory_budget));
    }
    gate = std::make_unique<in_flight_gate>(choose_in_flight_budget(options, devices),
                                            options.when_full);
    std::vector<std::string> names;
    for (const device_info& info : devices) names.push_back(info.name);
    health =
        std::make_unique<detail::device_health>(*owner, queue, std::move(names), options.quiet);
    start_lanes();
  }

  // Starts every lane and waits until each holds its stream and slots. If any cannot start (no
  // thread left, no memory), those already running are stopped and joined before the error
  // leaves, so a failed constructor leaves nothing behind and never waits on a lane.
  void start_lanes() {
    const int fault_at = lane_start_fault();
    const int total = static_cast<int>(ordinals.size()) * lanes_per_device;
    std::vector<std::future<void>> ready;
    std::exception_ptr first_failure;
    try {
      for (std::size_t d = 0; d < ordinals.size(); ++d) {
        for (int i = 0; i < lanes_per_device; ++i) {
          detail::lane_setup setup;
          setup.owner = owner.get();
          setup.queue = &queue;
          setup.memory = memory[d].get();
          setup.recorder = &recorder;
          setup.faults = &faults;
          setup.device = static_cast<int>(d);
          setup.ordinal = ordinals[d];
          setup.index = static_cast<int>(lanes.size());
          setup.index_on_device = i;
          setup.slots = slots;
          setup.chunk_bytes = chunk_bytes;
          setup.tracing = &tracing;
          setup.epoch = epoch;
          setup.coalescing = &coalescing;
          setup.health = health.get();
          setup.budget = gate.get();
          lanes.push_back(std::make_unique<detail::lane_worker>(setup));
          try {
            if (setup.index == fault_at)
              throw std::system_error(
                  std::make_error_code(std::errc::resource_unavailable_try_again),
                  "injected by GPUPOOL_TEST_FAIL_LANE_START");
            ready.push_back(lanes.back()->start());
          } catch (const std::system_error& e) {
            throw std::runtime_error("gpupool: could not start lane " +
                                     std::to_string(setup.index) + " of " + std::to_string(total) +
                                     " (no thread: " + e.what() +
                                     "); the lanes already started were stopped");
          }
        }
      }
    } catch (...) {
      first_failure = std::current_exception();
    }
    for (auto& r : ready) {
      try {
        r.get();
      } catch (...) {
        if (!first_failure) first_failure = std::current_exception();
      }
    }
    if (first_failure) {
      accepting.store(false);
      queue.close();
      for (auto& l : lanes) l->join();
      lanes.clear();
      std::rethrow_exception(first_failure);
    }
  }

  // True in a child process forked after this executor was made: its lanes are not here.
  [[nodiscard]] bool forked() const { return generation != fork_generation(); }

  void stop(bool cancel_pending) {
    // A lane cannot wait for itself to stop.
    if (detail::is_lane_thread_of(queue))
      throw std::logic_error(
          "gpupool: an executor cannot be shut down or destroyed by its own tasks");
    std::lock_guard lock(shutdown_mutex);
    accepting.store(false);
    gate->close();         // submitters waiting for room find the executor shut down
    if (forked()) return;  // nothing of the parent's lanes to stop here
    if (cancel_pending) {
      // Tasks not started are cancelled; pieces of a task that has started go back to the queue
      // and run, so that task ends normally, like every running one.
      for (auto& [item, device] : queue.drain(/*spare_woken=*/true))
        if (!item->cancel() && !queue.offer(item, device))
          // Its device was taken out of service meanwhile, and no other may run it.
          item->fail(std::make_exception_ptr(
              health->refusal(queue.live_devices() > 0 ? device : std::nullopt)));
    }
    queue.close();
    for (auto& l : lanes) l->join();
  }

  // The settings for `options`, every value checked against the limits (given ones before
  // anything is measured).
  static executor_settings checked_settings(const executor_options& options, detail::backend& b,
                                            const std::vector<int>& ordinals) {
    if (options.slots_per_lane < 1 || options.slots_per_lane > most_slots_per_lane)
      throw std::invalid_argument("gpupool: slots_per_lane must be from 1 to " +
                                  std::to_string(most_slots_per_lane));
    if (options.lanes_per_device != 0) (void)check_lanes(options.lanes_per_device, ordinals.size());
    if (options.chunk_bytes != 0)
      (void)fit_chunk_bytes(options, options.chunk_bytes, std::max(options.lanes_per_device, 1));
    executor_settings s = detail::choose_settings(options, b, ordinals);
    s.lanes_per_device = check_lanes(s.lanes_per_device, ordinals.size());
    s.chunk_bytes = fit_chunk_bytes(options, s.chunk_bytes, s.lanes_per_device);
    return s;
  }

  const unsigned generation;
  std::shared_ptr<detail::backend> owner;
  std::vector<int> ordinals;
  executor_settings settings;
  int lanes_per_device;
  int slots;
  std::size_t chunk_bytes;
  detail::task_queue queue;
  std::vector<device_info> devices;
  std::vector<std::unique_ptr<detail::device_memory>> memory;
  std::unique_ptr<in_flight_gate> gate;
  std::unique_ptr<detail::device_health> health;
  std::vector<std::unique_ptr<detail::lane_worker>> lanes;
  std::atomic<bool> accepting{true};
  std::mutex shutdown_mutex;
  std::atomic<bool> tracing{false};
  detail::trace_recorder recorder;
  detail::coalescing_counters coalescing;
  const detail::fault_plan faults = detail::fault_plan::from_environment();
  std::atomic<std::uint64_t> next_id{0};
  const std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();

  void require_accepting() const {
    if (forked())
      throw std::runtime_error(
          "gpupool: this executor was made before fork(); its lanes are not in this process "
          "(pid " +
          std::to_string(getpid()) + "), so it takes no work here. Make a new executor in it");
    if (!accepting.load()) throw std::runtime_error(shut_down_message);
  }

  // Throws why work for `device` (nullopt: any device) was not queued: shut down, forked, or no
  // device that may run it is in service.
  [[noreturn]] void refuse(std::optional<int> device) const {
    require_accepting();
    if (queue.closed()) throw std::runtime_error(shut_down_message);
    throw health->refusal(queue.live_devices() > 0 ? device : std::nullopt);
  }

  // The future of work with nothing to do: already succeeded.
  static future<void> nothing_to_do() {
    auto state = std::make_shared<detail::shared_state<void>>();
    state->try_start();
    state->set_value();
    return future<void>(std::move(state));
  }

  // Run-time compiled kernels (elementwise or raw) over host arrays, and over device calls.
  template <class K>
  future<void> launch_user(const K& k, const std::vector<kernel_argument>& inputs, dtype out_type,
                           void* out, std::size_t count);
  template <class K>
  future<void> map_user_on_device(int device, const K& k, const std::vector<device_call>& calls);

  // See executor::in_flight_cost and executor::admit.
  [[nodiscard]] std::size_t in_flight_cost(std::size_t bytes, bool piecewise) const;
  void admit(std::size_t cost) {
    require_accepting();
    gate->take(cost, detail::is_lane_thread_of(queue));
  }
  // Gives `cost` back once `state` ends, however it ends (as executor::hold_until_done).
  void hold_until_done(const std::shared_ptr<detail::shared_state<void>>& state,
                       std::size_t cost) const noexcept {
    if (cost != 0) state->hold(*gate, cost);
  }
  // A new state holding `cost` (taken by admit()); the bytes go back at once if it cannot be made.
  std::shared_ptr<detail::shared_state<void>> state_holding(std::size_t cost) {
    std::shared_ptr<detail::shared_state<void>> state;
    try {
      state = std::make_shared<detail::shared_state<void>>();
    } catch (...) {
      gate->release(cost);  // nothing holds the bytes yet
      throw;
    }
    hold_until_done(state, cost);
    return state;
  }

  // Stamps an item as it is queued: its place in submission order, and when.
  void stamp(detail::work_item& item) {
    item.trace_id = next_id.fetch_add(1, std::memory_order_relaxed);
    item.submitted_us = detail::clock_us(epoch);
  }

  // The most bytes of its widest array a piece of a call moving `total` bytes takes. chunk_bytes,
  // unless that leaves lanes idle: when the chunk size was not given and less is queued than
  // there are lanes, a call too small to give every lane two pieces is cut finer (down to
  // adaptive_piece_floor), so that all lanes copy at once: a few arrays end sooner in smaller
  // pieces, while many arrays run faster in larger ones. With a backlog the lanes are busy
  // anyway, and smaller pieces would only add per-piece cost.
  [[nodiscard]] std::size_t piece_bytes(std::size_t total) const noexcept {
    if (settings.chunk_from == setting_source::given) return chunk_bytes;
    const std::size_t lanes_in_all = std::max<std::size_t>(
        static_cast<std::size_t>(queue.live_devices()) * static_cast<std::size_t>(lanes_per_device),
        1);
    if (queue.size() >= lanes_in_all) return chunk_bytes;
    const std::size_t share = total / (2 * lanes_in_all);
    const std::size_t rounded = (share + piece_alignment - 1) / piece_alignment * piece_alignment;
    return std::clamp(rounded, std::min(adaptive_piece_floor, chunk_bytes), chunk_bytes);
  }

  // Elements per piece (all pieces but the last of an array are this long) of `element`-byte
  // elements, pieces of at most `most_bytes`.
  [[nodiscard]] static std::size_t per_piece(std::size_t element, std::size_t most_bytes) noexcept {
    return std::max<std::size_t>(most_bytes / element, 1);
  }

  // Splits `job` over `count` elements into pieces of at most piece_bytes of its widest array
  // and queues them for every lane.
  template <class Piece, class Job, class... Extra>
  void enqueue_pieces(const std::shared_ptr<Job>& job, std::size_t count,
                      std::size_t widest_element, Extra... extra) {
    const std::size_t per_piece =
        impl::per_piece(widest_element, piece_bytes(count * widest_element));
    const std::size_t pieces = (count + per_piece - 1) / per_piece;
    job->set_piece_count(pieces);
    std::vector<detail::work_item_ptr> items;
    items.reserve(pieces);
    for (std::size_t p = 0; p < pieces; ++p) {
      const std::size_t offset = p * per_piece;
      items.push_back(
          std::make_unique<Piece>(job, offset, std::min(per_piece, count - offset), extra...));
      stamp(*items.back());
    }
    if (!queue.push_all(items)) {
      // Shut down meanwhile (or no device left): ended, so that the future's callbacks give back
      // its bytes.
      for (auto& item : items) (void)item->cancel();
      refuse(std::nullopt);
    }
  }
};

executor::executor(executor_options options) : impl_(std::make_unique<impl>(options)) {}

executor::~executor() {
  if (impl_->forked()) {
    // In a fork()ed child: the lanes (and the device state) belong to the parent. Joining or
    // freeing them here could hang or crash, so this copy is left as it is.
    (void)impl_.release();
    return;
  }
  try {
    shutdown(/*cancel_pending=*/false);
  } catch (const std::exception& e) {
    // Destroyed by one of its own tasks: nothing sane is left to do.
    std::fprintf(stderr, "%s\n", e.what());
    std::terminate();
  }
}

bool executor::is_lane_thread() const noexcept {
  return detail::is_lane_thread_of(impl_->queue);
}

backend_kind executor::backend() const noexcept {
  return impl_->owner->kind();
}
const std::vector<device_info>& executor::devices() const noexcept {
  return impl_->devices;
}
int executor::lanes_per_device() const noexcept {
  return impl_->lanes_per_device;
}
int executor::lane_count() const noexcept {
  return static_cast<int>(impl_->lanes.size());
}
int executor::slots_per_lane() const noexcept {
  return impl_->slots;
}
std::size_t executor::chunk_bytes() const noexcept {
  return impl_->chunk_bytes;
}

const executor_settings& executor::settings() const noexcept {
  return impl_->settings;
}
std::size_t executor::queued() const {
  return impl_->queue.size();
}
bool executor::is_shutdown() const noexcept {
  return !impl_->accepting.load();
}

std::vector<device_memory_stats> executor::memory_stats() const {
  std::vector<device_memory_stats> stats;
  for (const auto& m : impl_->memory) stats.push_back({m->in_use(), m->peak(), m->budget()});
  return stats;
}

in_flight_stats executor::in_flight() const noexcept {
  return impl_->gate->stats();
}

std::size_t executor::in_flight_cost(std::size_t bytes, bool piecewise) const {
  return impl_->in_flight_cost(bytes, piecewise);
}

std::size_t executor::impl::in_flight_cost(std::size_t bytes, bool piecewise) const {
  const std::size_t budget = gate->budget();
  if (budget == no_limit) return 0;  // nothing to wait for: no accounting on the submit path
  if (bytes <= budget) return bytes;
  // Its pieces stream through the staging slots, so it never holds more than they do at once:
  // it counts as the whole budget and runs once everything before it has made room.
  if (piecewise) return budget;
  const std::size_t count = devices.size();
  throw out_of_memory("gpupool: a task of " + std::to_string(bytes) +
                      " bytes cannot run in pieces and is larger than the in-flight budget of " +
                      std::to_string(budget) + " bytes (" + std::to_string(budget / count) +
                      " per device x " + std::to_string(count) +
                      " devices); raise in_flight_budget or split the task");
}

void executor::admit(std::size_t cost) {
  impl_->admit(cost);
}

bool executor::try_admit(std::size_t cost) noexcept {
  return impl_->gate->try_take(cost);
}

void executor::release_in_flight(std::size_t cost) noexcept {
  impl_->gate->release(cost);
}

detail::budget_account& executor::in_flight_account() noexcept {
  return *impl_->gate;
}

void executor::shutdown(bool cancel_pending) {
  impl_->stop(cancel_pending);
}

void executor::set_tracing(bool on) noexcept {
  impl_->tracing.store(on);
}
bool executor::tracing() const noexcept {
  return impl_->tracing.load();
}

trace executor::trace(std::uint64_t first_task) const {
  std::vector<std::string> names;
  for (const auto& d : impl_->devices) names.push_back(d.name);
  return gpupool::trace(backend(), std::move(names), impl_->lanes_per_device,
                        impl_->recorder.since(first_task));
}

void executor::clear_trace() {
  impl_->recorder.clear();
}

void executor::set_trace_capacity(std::size_t records) {
  impl_->recorder.set_capacity(records);
}

std::size_t executor::trace_capacity() const {
  return impl_->recorder.capacity();
}

std::size_t executor::trace_dropped() const {
  return impl_->recorder.dropped();
}

coalescing_stats executor::coalescing() const noexcept {
  return {impl_->coalescing.batches.load(std::memory_order_relaxed),
          impl_->coalescing.tasks.load(std::memory_order_relaxed)};
}

std::uint64_t executor::next_task_id() const noexcept {
  return impl_->next_id.load(std::memory_order_relaxed);
}

void executor::require_open() const {
  impl_->require_accepting();
}

void executor::check_device(int device) const {
  if (device < 0 || device >= static_cast<int>(impl_->devices.size()))
    throw std::out_of_range("gpupool: device " + std::to_string(device) +
                            " is not one of this executor's " +
                            std::to_string(impl_->devices.size()) + " devices");
}

void executor::require_arity(const builtin_kernel& k, int arity, const char* what) {
  if (k.arity() != arity)
    throw std::invalid_argument(std::string("gpupool::executor::") + what + ": kernel '" +
                                k.name() + "' takes " + std::to_string(k.arity()) +
                                " input(s), but " + std::to_string(arity) + " were given");
}

void executor::require_same_size(std::size_t a, std::size_t b) {
  if (a != b)
    throw std::invalid_argument("gpupool::executor::transform: input and output sizes differ (" +
                                std::to_string(a) + " vs " + std::to_string(b) + ")");
}

void executor::enqueue(detail::work_item_ptr item, std::optional<int> device) {
  require_open();
  impl_->stamp(*item);
  if (!impl_->queue.push(std::move(item), device)) impl_->refuse(device);
}

void executor::enqueue_elementwise_all(
    std::vector<std::shared_ptr<detail::elementwise_job>>& jobs) {
  if (jobs.empty()) return;
  std::vector<detail::work_item_ptr> items;
  items.reserve(jobs.size());
  std::size_t total = 0;
  for (const auto& job : jobs) total += job->count() * size_of(job->type());
  const std::size_t most_bytes = impl_->piece_bytes(total);
  for (auto& job : jobs) {
    const std::size_t per_piece = impl::per_piece(size_of(job->type()), most_bytes);
    const std::size_t pieces = (job->count() + per_piece - 1) / per_piece;
    job->set_piece_count(pieces);
    for (std::size_t p = 0; p < pieces; ++p) {
      const std::size_t offset = p * per_piece;
      // Pieces of built-in kernels learn the slot size: whole-job pieces coalesce up to it.
      items.push_back(std::make_unique<detail::elementwise_piece>(
          job, offset, std::min(per_piece, job->count() - offset), impl_->chunk_bytes));
      impl_->stamp(*items.back());
    }
  }
  jobs.clear();
  if (impl_->forked() || !impl_->accepting.load() || !impl_->queue.push_all(items)) {
    // Ended, so that their futures' callbacks give back the bytes they were admitted with.
    for (auto& item : items) (void)item->cancel();
    impl_->refuse(std::nullopt);  // a fork()ed child, shut down, or no device left
  }
}

void executor::enqueue_elementwise(std::shared_ptr<detail::elementwise_job> job) {
  require_open();
  // Pieces of built-in kernels learn the slot size: whole-job pieces coalesce up to it.
  impl_->enqueue_pieces<detail::elementwise_piece>(job, job->count(), size_of(job->type()),
                                                   impl_->chunk_bytes);
}

multi_future<void> executor::transform_each(const builtin_kernel& k, dtype t,
                                            std::span<const transform_call> calls) {
  return *queue_transforms(k, t, calls, /*may_wait=*/true);
}

std::optional<multi_future<void>> executor::try_transform_each(
    const builtin_kernel& k, dtype t, std::span<const transform_call> calls) {
  return queue_transforms(k, t, calls, /*may_wait=*/false);
}

std::optional<multi_future<void>> executor::queue_transforms(const builtin_kernel& k, dtype t,
                                                             std::span<const transform_call> calls,
                                                             bool may_wait) {
  for (std::size_t i = 0; i < calls.size(); ++i)
    if (calls[i].count > 0 && (calls[i].y != nullptr) != (k.arity() == 2))
      throw std::invalid_argument(
          "gpupool::executor::transform_each: call " + std::to_string(i) +
          (k.arity() == 2 ? " gives one input to" : " gives two inputs to") + " kernel '" +
          std::string(k.name()) + "', which takes " + std::to_string(k.arity()));
  detail::require_alpha_fits(k, t);
  require_open();
  const auto cost_of = [&](const transform_call& call) -> std::size_t {
    if (call.count == 0) return 0;  // nothing runs, nothing is counted
    return in_flight_cost(call.count * size_of(t) * (call.y == nullptr ? 2 : 3),
                          /*piecewise=*/true);
  };
  // Without waiting: the whole cost is taken at once, or nothing is queued. One push at most,
  // so that a failure never leaves a call running (nothing to wait for; the caller may hold a
  // lock that a lane needs, the GIL say).
  std::size_t taken_up_front = 0;
  if (!may_wait) {
    if (calls.size() > map_batch) return std::nullopt;
    for (const transform_call& call : calls) taken_up_front += cost_of(call);
    if (!try_admit(taken_up_front)) return std::nullopt;
  }
  std::size_t next = 0;
  try {
    return queue_each<void>(
        calls.size(), /*admit_each=*/may_wait, [&] { return calls[next++]; }, cost_of,
        [&](const transform_call& call, std::size_t cost,
            std::vector<std::shared_ptr<detail::elementwise_job>>& jobs) {
          if (call.count == 0) return impl::nothing_to_do();
          std::shared_ptr<detail::shared_state<void>> state;
          std::shared_ptr<detail::elementwise_job> job;
          try {
            state = std::make_shared<detail::shared_state<void>>();
            job = std::make_shared<detail::transform_job>(k, t, call.x, call.y, call.out,
                                                          call.count, state);
          } catch (...) {
            if (may_wait) release_in_flight(cost);  // else part of taken_up_front
            throw;
          }
          hold_until_done(state, cost);
          if (!may_wait) taken_up_front -= cost;  // now held by the call's future
          jobs.push_back(std::move(job));         // within the reserved batch: does not throw
          return future<void>(std::move(state));
        });
  } catch (...) {
    release_in_flight(taken_up_front);  // what no call's future holds yet
    throw;
  }
}

future<void> executor::transform_impl(const builtin_kernel& k, dtype t, const void* x,
                                      const void* y, void* out, std::size_t n) {
  if (n == 0) {
    require_open();
    return impl::nothing_to_do();
  }
  const std::size_t cost =
      in_flight_cost(n * size_of(t) * (y == nullptr ? 2 : 3), /*piecewise=*/true);
  admit(cost);
  auto state = impl_->state_holding(cost);
  try {
    enqueue_elementwise(std::make_shared<detail::transform_job>(k, t, x, y, out, n, state));
  } catch (...) {
    state->try_cancel();  // never queued: ending it gives the bytes back
    throw;
  }
  return future<void>(std::move(state));
}

template <class K>
future<void> executor::impl::launch_user(const K& k, const std::vector<kernel_argument>& inputs,
                                         dtype out_type, void* out, std::size_t count) {
  require_accepting();
  auto call = detail::prepare_call(k, inputs, out_type, count);
  // Pieces run on every device: compile for each one's architecture (devices of one kind share
  // the compiled image and its loaded library).
  std::vector<std::shared_ptr<const detail::compiled_kernel>> compiled;
  for (int ordinal : ordinals) compiled.push_back(detail::compile_for(*owner, k, call, ordinal));
  if (count == 0) return nothing_to_do();
  std::size_t bytes_per_element = size_of(out_type);
  for (const auto& op : call.operands)
    if (op.is_array) bytes_per_element += op.element_size;
  const std::size_t cost =
      in_flight_cost(count > no_limit / bytes_per_element ? no_limit : count * bytes_per_element,
                     /*piecewise=*/true);
  admit(cost);
  auto state = state_holding(cost);
  const std::size_t widest = call.widest;
  try {
    auto job = std::make_shared<detail::user_kernel_job>(
        k.name(), std::move(compiled), std::move(call), out, size_of(out_type), count, state);
    enqueue_pieces<detail::user_kernel_piece>(job, count, widest);
  } catch (...) {
    state->try_cancel();  // never queued: ending it gives the bytes back
    throw;
  }
  return future<void>(std::move(state));
}

template <class K>
future<void> executor::impl::map_user_on_device(int device, const K& k,
                                                const std::vector<device_call>& calls) {
  require_accepting();
  const dtype out_type = k.output().type;
  // Every call is checked into one prepared_call in turn (no allocation per call: a map from
  // Python brings thousands) and leaves its row in one table, in call order; the batches below
  // take consecutive rows of it. The first call's check is kept: its pattern of arrays and
  // scalars chooses the compiled kernel, and every later call must match it.
  const std::size_t row_size = k.inputs().size() + 2;  // see prepared_call::append_row
  std::vector<std::uint64_t> table;
  table.reserve(calls.size() * row_size);
  detail::prepared_call first, call;
  std::size_t array_bytes_per_element = 0;  // over the array inputs, the same for every call
  for (std::size_t i = 0; i < calls.size(); ++i) {
    detail::prepared_call& checked = i == 0 ? first : call;
    try {
      detail::prepare_call_into(checked, k, calls[i].inputs, out_type, calls[i].count);
    } catch (const std::invalid_argument& e) {
      std::throw_with_nested(call_error(i, e.what()));  // the check's own error, nested
    } catch (const std::overflow_error& e) {
      std::throw_with_nested(call_error(i, e.what()));  // a scalar out of its type's range
    }
    if (calls[i].out == nullptr && calls[i].count > 0)
      throw call_error(i, "gpupool: kernel '" + k.name() + "': the call has no output");
    if (i > 0 && call.is_array != first.is_array)
      throw call_error(i, "gpupool: kernel '" + k.name() +
                              "': the call mixes arrays and scalars differently from the first "
                              "call; pass each pattern in its own map");
    checked.append_row(table, calls[i].out, calls[i].count);
  }
  if (calls.empty()) return nothing_to_do();
  for (const auto& op : first.operands)
    if (op.is_array) array_bytes_per_element += op.element_size;
  auto state = std::make_shared<detail::shared_state<void>>();
  const int ordinal = ordinals[static_cast<std::size_t>(device)];
  auto job = std::make_shared<detail::device_calls_job>(
      k.name(), detail::compile_for(*owner, k, first, ordinal), state);

  // Two batches per lane of the device keep every lane busy while letting each launch cover
  // many calls (one launch per batch where the backend runs tables), but on a GPU none smaller
  // on average than fills it several times over (see device_map_batches.hpp). A raw kernel has
  // no table entry (each of its calls is a launch of its own, of the caller's grid), so its
  // calls are shared out among the lanes whatever their size.
  std::size_t least = 1;
  if constexpr (!std::is_same_v<K, raw_kernel>)
    least = detail::least_device_batch_elements(devices[static_cast<std::size_t>(device)]);
  std::size_t total_elements = 0;
  for (const auto& c : calls) total_elements = detail::saturating_add(total_elements, c.count);
  const std::size_t batches =
      detail::device_map_batches(calls.size(), total_elements, lanes_per_device, least);
  std::vector<detail::work_item_ptr> items;
  items.reserve(batches);
  for (std::size_t b = 0; b < batches; ++b) {
    const std::size_t begin = calls.size() * b / batches;
    const std::size_t end = calls.size() * (b + 1) / batches;
    std::size_t elements = 0;
    for (std::size_t i = begin; i < end; ++i) elements += calls[i].count;
    const auto rows = table.begin() + static_cast<std::ptrdiff_t>(begin * row_size);
    items.push_back(std::make_unique<detail::device_batch_piece>(
        job,
        std::vector<std::uint64_t>(rows,
                                   rows + static_cast<std::ptrdiff_t>((end - begin) * row_size)),
        end - begin, elements * array_bytes_per_element, elements * size_of(out_type)));
    stamp(*items.back());
  }
  job->set_piece_count(items.size());
  if (!queue.push_all(items, device)) {
    for (auto& item : items) (void)item->cancel();
    refuse(device);
  }
  return future<void>(std::move(state));
}

future<void> executor::launch_elementwise(const elementwise_kernel& k,
                                          const std::vector<kernel_argument>& inputs,
                                          dtype out_type, void* out, std::size_t count) {
  return impl_->launch_user(k, inputs, out_type, out, count);
}

future<void> executor::launch_raw(const raw_kernel& k, const std::vector<kernel_argument>& inputs,
                                  dtype out_type, void* out, std::size_t count) {
  return impl_->launch_user(k, inputs, out_type, out, count);
}

future<void> executor::map_on_device(int device, const elementwise_kernel& k,
                                     const std::vector<device_call>& calls) {
  check_device(device);
  return impl_->map_user_on_device(device, k, calls);
}

future<void> executor::map_on_device(int device, const raw_kernel& k,
                                     const std::vector<device_call>& calls) {
  check_device(device);
  return impl_->map_user_on_device(device, k, calls);
}

}  // namespace gpupool
