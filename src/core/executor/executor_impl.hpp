// The executor's state behind its pimpl: one member per part, and what every part does the same
// way (stamping and queueing items, refusing work, futures with nothing to do). The parts' own
// code lives beside this file, one concern each:
//   configuration.*  devices chosen, lanes, slots and chunk size checked and fitted
//   admission.*      the in-flight budget (in_flight_gate) and what a task counts against it
//   lane_set.*       the lane threads: started together, joined at shutdown
//   (host lanes and the placement of small calls beside the devices: lanes/host_lanes.*,
//   scheduling/placement.*)
//   piece_sizing.*   how finely a call over host arrays is cut into pieces
//   user_tasks.cpp   submit: a user callable f(lane&) as a queued item
//   builtin_maps.cpp map, transform, transform_each of built-in kernels over host arrays
//   compiled_kernels.cpp  compiled kernels (elementwise, raw) over host arrays, in pieces
//   device_maps.cpp  map_on_device: compiled kernels over calls on one device's arrays, in batches
// and src/core/executor.cpp, the coordinator: it makes the parts, answers the accessors and
// shuts down.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/executor/admission.hpp"
#include "core/executor/lane_set.hpp"
#include "core/executor/piece_sizing.hpp"
#include "core/fault_injection.hpp"
#include "core/lanes/elementwise_job.hpp"
#include "core/lanes/host_lanes.hpp"
#include "core/lanes/lane_worker.hpp"
#include "core/scheduling/device_health.hpp"
#include "core/scheduling/lane_spin.hpp"
#include "core/scheduling/placement.hpp"
#include "core/scheduling/task_queue.hpp"
#include "core/scheduling/work_item.hpp"
#include "core/tracing/lane_tracer.hpp"
#include "gpupool/executor.hpp"
#include "gpupool/fork.hpp"

namespace gpupool {
namespace detail {

// The priority the calling thread's current call gave its work (task_options::priority), read
// by executor::impl::stamp; unset outside such a call.
inline thread_local std::optional<int> call_priority;

// Sets call_priority for one call that queues work, as `options` say (checked), and restores
// what was there before when the call ends.
class call_priority_scope {
 public:
  explicit call_priority_scope(const task_options& options) : saved_(call_priority) {
    if (options.priority) {
      check_priority(*options.priority, "task_options::priority");
      call_priority = options.priority;
    }
  }
  call_priority_scope(const call_priority_scope&) = delete;
  call_priority_scope& operator=(const call_priority_scope&) = delete;
  ~call_priority_scope() { call_priority = saved_; }

 private:
  std::optional<int> saved_;
};

}  // namespace detail

struct executor::impl {
  explicit impl(const executor_options& options);  // executor.cpp

  // --- the parts, in the order they are made (and destroyed in reverse) ---
  const unsigned generation;  // fork_generation() when made
  std::shared_ptr<detail::backend> owner;
  std::vector<int> ordinals;  // the backend's number of each device
  executor_settings settings;
  int lanes_per_device;
  int slots;
  std::size_t chunk_bytes;
  detail::piece_sizing sizing;
  // GPUPOOL_LANE_SPIN_US, read once: the devices' lanes, the host lanes and those waiting on
  // this executor's futures look as long as each other before they sleep.
  const std::chrono::microseconds lane_spin = detail::lane_spin_from_environment();
  detail::task_queue queue;
  std::vector<device_info> devices;
  std::vector<std::unique_ptr<detail::device_memory>> memory;
  std::unique_ptr<detail::in_flight_gate> gate;
  std::unique_ptr<detail::device_health> health;
  detail::host_placement placement;
  std::unique_ptr<detail::host_lanes> host;  // started before the devices' lanes, stopped after
  detail::lane_set lanes;
  std::atomic<bool> accepting{true};
  std::mutex shutdown_mutex;
  std::atomic<bool> tracing{false};
  detail::trace_recorder recorder;
  detail::coalescing_counters coalescing;
  const detail::fault_plan faults = detail::fault_plan::from_environment();
  std::atomic<std::uint64_t> next_id{0};
  const int default_priority;  // executor_options::priority (checked)
  const std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();

  // --- the coordinator (executor.cpp) ---

  // True in a child process forked after this executor was made: its lanes are not here.
  [[nodiscard]] bool forked() const noexcept { return generation != fork_generation(); }
  // Stops intake and, unless forked, the lanes (see executor::shutdown).
  void stop(bool cancel_pending);
  // Throws unless work may be queued: shut down, or made before fork().
  void require_accepting() const;
  // Throws why work for `device` (nullopt: any device) was not queued: shut down, forked, or no
  // device that may run it is in service.
  [[noreturn]] void refuse(std::optional<int> device) const;

  // --- what every part does the same way ---

  // Stamps an item as it is queued: its place in submission order, when, and its priority (the
  // calling thread's current call's, else the executor's).
  void stamp(detail::work_item& item) { stamp(item, detail::clock_us(epoch)); }
  // As stamp, for items made together and queued in one push: one reading of the clock serves
  // them all (a map of thousands of small calls would otherwise read it once a call).
  void stamp(detail::work_item& item, double submitted_us) {
    item.trace_id = next_id.fetch_add(1, std::memory_order_relaxed);
    item.submitted_us = submitted_us;
    item.priority = detail::call_priority.value_or(default_priority);
  }

  // Queues `items` (stamped) for `device` in one push; if they cannot be queued (shut down
  // meanwhile, no device left), each is ended, so that its future gives back its bytes, and the
  // reason thrown.
  void push_all_or_refuse(std::vector<detail::work_item_ptr>& items,
                          std::optional<int> device = std::nullopt) {
    if (!queue.push_all(items, device)) {
      for (auto& item : items) (void)item->cancel();
      refuse(device);
    }
  }

  // Takes `cost` of the in-flight budget: waiting for room or throwing as when_full says, never
  // waiting on a lane thread.
  void admit(std::size_t cost) {
    require_accepting();
    gate->take(cost, on_own_thread());
  }

  // True on one of this executor's lanes, the host lanes included: a thread that must not wait
  // for lanes, nor stop them.
  [[nodiscard]] bool on_own_thread() const noexcept {
    return detail::is_lane_thread_of(queue) || (host && host->is_own_thread());
  }

  // A new state holding `cost` (taken by admit()) until it ends, however it ends; the bytes go
  // back at once if it cannot be made.
  std::shared_ptr<detail::shared_state<void>> state_holding(std::size_t cost) {
    std::shared_ptr<detail::shared_state<void>> state;
    try {
      state = std::make_shared<detail::shared_state<void>>();
    } catch (...) {
      gate->release(cost);  // nothing holds the bytes yet
      throw;
    }
    if (cost != 0) state->hold(*gate, cost);
    return state;
  }

  // The future of work with nothing to do: already succeeded.
  static future<void> nothing_to_do() {
    auto state = std::make_shared<detail::shared_state<void>>();
    state->try_start();
    state->set_value();
    return future<void>(std::move(state));
  }

  // Splits `job` over `count` elements into pieces of at most piece_bytes of its widest array
  // and queues them for every lane.
  template <class Piece, class Job, class... Extra>
  void enqueue_pieces(const std::shared_ptr<Job>& job, std::size_t count,
                      std::size_t widest_element, Extra... extra) {
    const std::size_t per_piece = detail::piece_sizing::per_piece(
        widest_element, sizing.piece_bytes(count * widest_element, queue));
    const std::size_t pieces = detail::piece_sizing::pieces(count, per_piece);
    job->set_piece_count(pieces);
    std::vector<detail::work_item_ptr> items;
    items.reserve(pieces);
    for (std::size_t p = 0; p < pieces; ++p) {
      const std::size_t offset = p * per_piece;
      items.push_back(
          std::make_unique<Piece>(job, offset, std::min(per_piece, count - offset), extra...));
      stamp(*items.back());
    }
    push_all_or_refuse(items);
  }

  // --- built-in kernels over host arrays (builtin_maps.cpp) ---

  // The loop of map and transform_each: `count` calls, each given by next() in order, costing
  // cost_of(call) bytes of the in-flight budget and made by make(call, cost, jobs), which returns
  // its future (or state) and appends its job to `jobs` (reserved: no throw), or only returns a
  // ready one. Jobs are queued map_batch at a time. With `admit_each`, each call's bytes are
  // admitted here: past the budget, what is gathered is queued before waiting for room (that
  // only its completion may free), or the wait throws (when_full::raise); without it, the caller
  // took them all before. If anything throws part way, nothing of it is left reading or writing
  // the caller's memory when the caller gets the error: what is queued is cancelled and what
  // already runs is waited for.
  template <class Futures, class Next, class Cost, class Make>
  Futures queue_each(std::size_t count, bool admit_each, Next next, Cost cost_of, Make make);

  // Cuts every job into pieces (one piece_bytes for all of them) and queues them in one push;
  // with host lanes, first moves the small calls placement gives them to their queue. Empties
  // `jobs`.
  void enqueue_elementwise_all(std::vector<std::shared_ptr<detail::elementwise_job>>& jobs);

  // How placement split one push's calls between the host lanes and the devices.
  struct placed {
    std::vector<char> to_host;                     // per job: to the host lanes
    std::vector<std::size_t> candidates;           // the jobs placement considered, by index
    std::size_t host_calls = 0;                    // of those, how many go to the host lanes
    detail::host_placement::reservation reserved;  // their bytes, pending from now on
  };
  // Splits the calls among `jobs` that the host lanes may take as placement shares them; the
  // others go to the devices. Their bytes count as pending (see host_placement::place).
  placed place_small_calls(const std::vector<std::shared_ptr<detail::elementwise_job>>& jobs);

  // Inputs queued together by map: one push (one lock per device, one wake-up pass) per batch,
  // small enough that lanes start while the rest is being prepared.
  static constexpr std::size_t map_batch = 256;

  // --- compiled kernels (compiled_kernels.cpp, device_maps.cpp) ---

  template <class K>
  future<void> launch_user(const K& k, const std::vector<kernel_argument>& inputs, dtype out_type,
                           void* out, std::size_t count);
  template <class K>
  future<void> map_user_on_device(int device, const K& k, const std::vector<device_call>& calls);
};

}  // namespace gpupool
