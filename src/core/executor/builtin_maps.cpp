// Built-in kernels over host arrays: map (a new result per input), transform and transform_each
// (results into the caller's memory). Each input or call is one elementwise_job, cut into pieces
// that lanes pipeline; many are queued in batches, each counted against the in-flight budget.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/executor/executor_impl.hpp"
#include "core/lanes/elementwise_piece.hpp"

namespace gpupool {
namespace {

// Ends every task in `futures` that has not started and waits for the others to end.
void cancel_and_wait(multi_future<void>& futures) {
  for (auto& f : futures) (void)f.cancel();
  for (auto& f : futures) f.wait();
}
void cancel_and_wait(std::vector<std::shared_ptr<detail::state_base>>& states) {
  for (auto& s : states) (void)s->try_cancel();
  for (auto& s : states) s->wait();
}

// One map input's future state, its job appended to `jobs`: shared_state<host_vector<T>> and
// map_job<T> in one block (make_map_task), for the T of the map's dtype.
using make_map_fn = std::shared_ptr<detail::state_base> (*)(
    const builtin_kernel& k, const void* x, const void* y, std::size_t count,
    std::shared_ptr<detail::elementwise_job>& job);

template <class T>
std::shared_ptr<detail::state_base> make_map(const builtin_kernel& k, const void* x, const void* y,
                                             std::size_t count,
                                             std::shared_ptr<detail::elementwise_job>& job) {
  auto [state, made] =
      detail::make_map_task<T>(k, static_cast<const T*>(x), static_cast<const T*>(y), count);
  job = std::move(made);
  return state;
}

// The future state of a map input with no elements: already succeeded, with an empty vector.
using empty_map_fn = std::shared_ptr<detail::state_base> (*)();

template <class T>
std::shared_ptr<detail::state_base> empty_map() {
  auto state = std::make_shared<detail::shared_state<host_vector<T>>>();
  state->try_start();
  state->set_value({});
  return state;
}

}  // namespace

template <class Futures, class Next, class Cost, class Make>
Futures executor::impl::queue_each(std::size_t count, bool admit_each, Next next, Cost cost_of,
                                   Make make) {
  require_accepting();  // before anything is made for the calls
  Futures futures;
  futures.reserve(count);
  std::vector<std::shared_ptr<detail::elementwise_job>> jobs;
  jobs.reserve(std::min(count, map_batch));
  // Bytes taken ahead for the calls still to come in this batch: the budget's counter (written
  // by every lane as tasks end) is taken once per batch rather than once per call. At most a
  // sixteenth of the budget, so that other submitters are not kept waiting for bytes no work
  // holds; given back when the batch is queued (later calls may have cost less) and never held
  // while waiting for room.
  std::size_t credit = 0;
  const std::size_t most_ahead = gate->budget() / 16;
  const auto queue_batch = [&] {
    gate->release(credit);
    credit = 0;
    enqueue_elementwise_all(jobs);
  };
  try {
    for (std::size_t i = 0; i < count; ++i) {
      const auto call = next();
      const std::size_t cost = cost_of(call);
      if (admit_each && cost > credit) {
        gate->release(credit);
        credit = 0;
        // This call and, at the same cost each, the rest of its batch; one call's cost alone
        // where that is too much or does not fit now.
        const std::size_t calls_ahead = std::min(count - i, map_batch - jobs.size());
        const std::size_t ahead = cost <= most_ahead / calls_ahead ? cost * calls_ahead : cost;
        if (ahead > cost && gate->try_take(ahead)) {
          credit = ahead;
        } else if (gate->try_take(cost)) {
          credit = cost;
        } else {
          enqueue_elementwise_all(jobs);
          admit(cost);
          credit = cost;
        }
      }
      if (admit_each) credit -= cost;
      futures.push_back(make(call, cost, jobs));
      if (jobs.size() == map_batch) queue_batch();
    }
    queue_batch();
  } catch (...) {
    gate->release(credit);  // taken for calls that never came
    // Every call has its future here, those gathered but never queued too (cancelling them
    // gives their bytes back).
    cancel_and_wait(futures);
    throw;
  }
  return futures;
}

executor::impl::placed executor::impl::place_small_calls(
    const std::vector<std::shared_ptr<detail::elementwise_job>>& jobs) {
  placed split;
  split.to_host.assign(jobs.size(), 0);
  std::vector<std::size_t> bytes;  // per candidate: its bytes in and out
  split.candidates.reserve(jobs.size());
  bytes.reserve(jobs.size());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const detail::elementwise_job& job = *jobs[i];
    const std::size_t carried = job.bytes_in_and_out(limits::most_host_task_bytes);
    if (detail::host_placement::candidate(carried) && job.writable_in_one_pass()) {
      split.candidates.push_back(i);
      bytes.push_back(carried);
    }
  }
  if (split.candidates.empty()) return split;
  split.reserved = placement.place(
      split.candidates.size(), [&](std::size_t c) { return bytes[c]; },
      [&](std::size_t c, bool there) {
        split.to_host[split.candidates[c]] = there ? 1 : 0;
        split.host_calls += there ? 1 : 0;
      });
  return split;
}

void executor::impl::enqueue_elementwise_all(
    std::vector<std::shared_ptr<detail::elementwise_job>>& jobs) {
  if (jobs.empty()) return;
  placed split;
  if (placement.enabled()) split = place_small_calls(jobs);
  const auto on_host = [&](std::size_t i) { return !split.to_host.empty() && split.to_host[i]; };
  // Until the calls' jobs know their group, an error gives back the bytes placement counted as
  // pending for them; from then on, each job gives back its own as it ends.
  struct withdraw_unless_placed {
    detail::host_placement& placement;
    const detail::host_placement::reservation& reserved;
    bool placed = false;
    ~withdraw_unless_placed() {
      if (!placed) placement.withdraw(reserved);
    }
  } pending{placement, split.reserved};
  std::vector<detail::work_item_ptr> items, host_items;
  items.reserve(jobs.size());
  host_items.reserve(split.host_calls);
  std::size_t total = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (!on_host(i)) total += jobs[i]->count() * size_of(jobs[i]->type());
  const std::size_t most_bytes = sizing.piece_bytes(total, queue);
  const double now_us = detail::clock_us(epoch);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const auto& job = jobs[i];
    if (on_host(i)) {
      // Whole: a host lane computes it in one pass. Pieces learn the slot size: whole-job pieces
      // coalesce up to it, on the host lanes as on the devices'.
      job->set_piece_count(1);
      host_items.push_back(std::make_unique<detail::elementwise_piece>(
          job, 0, job->count(), chunk_bytes, -1,
          detail::elementwise_piece::most_tasks_per_host_batch));
      stamp(*host_items.back(), now_us);
      continue;
    }
    const std::size_t per_piece = detail::piece_sizing::per_piece(size_of(job->type()), most_bytes);
    const std::size_t pieces = detail::piece_sizing::pieces(job->count(), per_piece);
    job->set_piece_count(pieces);
    for (std::size_t p = 0; p < pieces; ++p) {
      const std::size_t offset = p * per_piece;
      items.push_back(std::make_unique<detail::elementwise_piece>(
          job, offset, std::min(per_piece, job->count() - offset), chunk_bytes));
      stamp(*items.back(), now_us);
    }
  }
  if (!split.candidates.empty()) {
    // A push that also queues calls placement did not consider teaches the devices' side
    // nothing: their time would count those calls too.
    auto group = std::make_shared<detail::placement_group>(
        placement, split.host_calls, split.candidates.size() - split.host_calls, split.reserved,
        /*device_learns=*/split.candidates.size() == jobs.size());
    for (std::size_t i : split.candidates) jobs[i]->place(group, on_host(i));
  }
  pending.placed = true;
  jobs.clear();
  const auto cancel_all = [&] {
    // Ended, so that their futures give back the bytes they were admitted with (what was queued
    // already runs, or is cancelled by the shutdown that refused the rest).
    for (auto& item : host_items) (void)item->cancel();
    for (auto& item : items) (void)item->cancel();
  };
  bool queued = !forked() && accepting.load();
  try {
    if (queued && !host_items.empty()) queued = host->push_all(host_items);
    if (queued && !items.empty()) queued = queue.push_all(items);
  } catch (...) {
    cancel_all();  // what a push could not queue (a push that throws queues nothing)
    throw;
  }
  if (!queued) {
    cancel_all();
    refuse(std::nullopt);  // a fork()ed child, shut down, or no device left
  }
  if (!split.candidates.empty())
    placement.count(split.host_calls, split.candidates.size() - split.host_calls);
}

std::vector<std::shared_ptr<detail::state_base>> executor::queue_maps(
    const builtin_kernel& k, dtype t, std::size_t count, int operands, map_input (*next)(void*),
    void* source, const task_options& options) {
  const detail::call_priority_scope priority(options);
  const std::pair<make_map_fn, empty_map_fn> makers = visit_dtype(t, []<class T>() {
    return std::pair<make_map_fn, empty_map_fn>{&make_map<T>, &empty_map<T>};
  });
  const make_map_fn make_task = makers.first;
  const empty_map_fn make_empty = makers.second;
  const std::size_t element = size_of(t);
  impl& self = *impl_;
  return self.queue_each<std::vector<std::shared_ptr<detail::state_base>>>(
      count, /*admit_each=*/true, [&] { return next(source); },
      [&](const map_input& call) {
        return self.gate->cost(static_cast<std::size_t>(operands) * call.count * element,
                               /*piecewise=*/true);
      },
      [&](const map_input& call, std::size_t admitted,
          std::vector<std::shared_ptr<detail::elementwise_job>>& jobs)
          -> std::shared_ptr<detail::state_base> {
        if (call.count == 0) {
          self.gate->release(admitted);
          self.require_accepting();
          return make_empty();
        }
        std::shared_ptr<detail::state_base> state;
        std::shared_ptr<detail::elementwise_job> job;
        try {
          state = make_task(k, call.x, call.y, call.count, job);  // checks the arguments
        } catch (...) {
          self.gate->release(admitted);  // nothing holds the bytes yet
          throw;
        }
        if (admitted != 0) state->hold(*self.gate, admitted);
        jobs.push_back(std::move(job));  // within the reserved batch: does not throw
        return state;
      });
}

multi_future<void> executor::transform_each(const builtin_kernel& k, dtype t,
                                            std::span<const transform_call> calls) {
  return transform_each(k, t, calls, task_options{});
}

std::optional<multi_future<void>> executor::try_transform_each(
    const builtin_kernel& k, dtype t, std::span<const transform_call> calls) {
  return try_transform_each(k, t, calls, task_options{});
}

multi_future<void> executor::transform_each(const builtin_kernel& k, dtype t,
                                            std::span<const transform_call> calls,
                                            const task_options& options) {
  const detail::call_priority_scope priority(options);
  return *queue_transforms(k, t, calls, /*may_wait=*/true);
}

std::optional<multi_future<void>> executor::try_transform_each(
    const builtin_kernel& k, dtype t, std::span<const transform_call> calls,
    const task_options& options) {
  const detail::call_priority_scope priority(options);
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
  impl& self = *impl_;
  self.require_accepting();
  const auto cost_of = [&](const transform_call& call) -> std::size_t {
    if (call.count == 0) return 0;  // nothing runs, nothing is counted
    return self.gate->cost(call.count * size_of(t) * (call.y == nullptr ? 2 : 3),
                           /*piecewise=*/true);
  };
  // Without waiting: the whole cost is taken at once, or nothing is queued. One push per side at
  // most (the host lanes', then the devices'), so that a failure leaves nothing running to wait
  // for (the caller may hold a lock that a lane needs, the GIL say), except the host lanes'
  // calls when a shutdown comes between the two pushes: waiting for those needs no lock of the
  // caller's (a future is done before its callbacks run, and lanes run them after).
  std::size_t taken_up_front = 0;
  if (!may_wait) {
    if (calls.size() > impl::map_batch) return std::nullopt;
    for (const transform_call& call : calls) taken_up_front += cost_of(call);
    if (!self.gate->try_take(taken_up_front)) return std::nullopt;
  }
  std::size_t next = 0;
  try {
    return self.queue_each<multi_future<void>>(
        calls.size(), /*admit_each=*/may_wait, [&] { return calls[next++]; }, cost_of,
        [&](const transform_call& call, std::size_t cost,
            std::vector<std::shared_ptr<detail::elementwise_job>>& jobs) {
          if (call.count == 0) return impl::nothing_to_do();
          std::shared_ptr<detail::shared_state<void>> state;
          std::shared_ptr<detail::elementwise_job> job;
          try {
            std::tie(state, job) =
                detail::make_transform_task(k, t, call.x, call.y, call.out, call.count);
          } catch (...) {
            if (may_wait) self.gate->release(cost);  // else part of taken_up_front
            throw;
          }
          if (cost != 0) state->hold(*self.gate, cost);
          if (!may_wait) taken_up_front -= cost;  // now held by the call's future
          jobs.push_back(std::move(job));         // within the reserved batch: does not throw
          return future<void>(std::move(state));
        });
  } catch (...) {
    self.gate->release(taken_up_front);  // what no call's future holds yet
    throw;
  }
}

future<void> executor::transform_impl(const builtin_kernel& k, dtype t, const void* x,
                                      const void* y, void* out, std::size_t n) {
  impl& self = *impl_;
  if (n == 0) {
    self.require_accepting();
    return impl::nothing_to_do();
  }
  const std::size_t cost =
      self.gate->cost(n * size_of(t) * (y == nullptr ? 2 : 3), /*piecewise=*/true);
  self.admit(cost);
  auto state = self.state_holding(cost);
  try {
    auto job = std::make_shared<detail::transform_job>(k, t, x, y, out, n, state);
    self.require_accepting();
    // Pieces of built-in kernels learn the slot size: whole-job pieces coalesce up to it.
    self.enqueue_pieces<detail::elementwise_piece>(job, job->count(), size_of(job->type()),
                                                   self.chunk_bytes);
  } catch (...) {
    state->try_cancel();  // never queued: ending it gives the bytes back
    throw;
  }
  return future<void>(std::move(state));
}

}  // namespace gpupool
