// Python calls waiting for a lane, and the tasks that run them (see python_calls.hpp).
#include "python_calls.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "completions.hpp"
#include "futures.hpp"
#include "lane.hpp"

namespace gpupool_python {
namespace {

// Makes the lane's device current, holding the GIL: it asks the runtime only (a Python call that
// let the GIL go to ask it would wait for the GIL again). If the device cannot be made current,
// the lane's next operation on its stream reports the failure.
void make_lane_device_current(gpupool::lane& l) noexcept {
  try {
    l.make_device_current();
  } catch (...) {
  }
}

// One Python call queued for a lane, shared by the lane's task and its completion callback.
// Holds strong references, taken and dropped with the GIL; a call dropped unrun on a thread
// without the GIL takes it to let them go (or leaks them once the interpreter is finalizing).
class python_call {
 public:
  python_call(nb::handle fn, nb::handle args, nb::handle kwargs, nb::handle future,
              nb::handle runner)
      : fn_(fn.inc_ref().ptr()),
        args_(args.inc_ref().ptr()),
        kwargs_(kwargs.is_valid() && !kwargs.is_none() && PyDict_GET_SIZE(kwargs.ptr()) > 0
                    ? kwargs.inc_ref().ptr()
                    : nullptr),
        future_(future.inc_ref().ptr()),
        runner_(runner.is_valid() && !runner.is_none() ? runner.inc_ref().ptr() : nullptr) {}
  python_call(const python_call&) = delete;
  python_call& operator=(const python_call&) = delete;
  ~python_call() {
    if (future_ == nullptr || !interpreter_alive()) return;
    nb::gil_scoped_acquire gil;
    clear();
  }

  enum class ran { skipped, handed_over, later };

  // On lane `l`, with the GIL. Runs the call unless its future was cancelled (skipped, counted
  // in `ended`). Hands the outcome over in this same hold of the GIL when nothing the call
  // enqueued on the lane's stream is still running (always on the CPU backend; on CUDA when the
  // call waited for its work, as code that returns host results does), counting it in `ended`
  // first; else keeps it for finish(), once the stream is done (later).
  ran run(gpupool::lane& l, std::atomic<int>& ended) {
    if (!set_future_running(future_)) {
      ended.fetch_add(1, std::memory_order_relaxed);  // it ended when it was cancelled
      clear();
      return ran::skipped;
    }
    // The lane's device, also after code that ran on this thread since the last call (a done
    // callback handed an outcome over, say) switched devices.
    make_lane_device_current(l);
    PyObject* r = runner_ != nullptr
                      ? PyObject_CallFunctionObjArgs(
                            runner_, fn_, args_, kwargs_ != nullptr ? kwargs_ : Py_None, nullptr)
                      : PyObject_Call(fn_, args_, kwargs_);
    failed_ = r == nullptr;
    value_ = failed_ ? fetch_raised_exception().release().ptr() : r;
    // A call that switched devices (CuPy's or PyTorch's Device(n).use()) does not leave the
    // lane's next work elsewhere.
    make_lane_device_current(l);
    // Like the standard library's workers, let go of the call once it has run.
    Py_CLEAR(fn_);
    Py_CLEAR(args_);
    Py_CLEAR(kwargs_);
    Py_CLEAR(runner_);
    if (!l.stream_idle()) return ran::later;
    ended.fetch_add(1, std::memory_order_relaxed);  // before the future can say done
    hand_over();
    return ran::handed_over;
  }

  // With the GIL, once the task has ended: the outcome of the call, or the task's `failure`
  // after it (a CUDA error), or the cancellation of a call that never ran.
  void finish(bool cancelled, const std::exception_ptr& failure) {
    if (future_ == nullptr) return;
    if (cancelled && value_ == nullptr) {
      end_cancelled(future_);
    } else if (failure) {
      set_future_failure(future_, failure);
    } else {
      hand_over();
      return;
    }
    clear();
  }

 private:
  void hand_over() {
    set_future_outcome(future_, value_, failed_);
    clear();
  }
  void clear() {
    Py_CLEAR(fn_);
    Py_CLEAR(args_);
    Py_CLEAR(kwargs_);
    Py_CLEAR(runner_);
    Py_CLEAR(value_);
    Py_CLEAR(future_);
  }

  PyObject* fn_;
  PyObject* args_;
  PyObject* kwargs_;
  PyObject* future_;
  PyObject* runner_;
  PyObject* value_ = nullptr;
  bool failed_ = false;
};

}  // namespace

// The Python calls of one executor waiting for a lane (see submit_python_call).
class python_calls {
 public:
  // Calls one lane runs in one hold of the GIL at most: enough that a lane rarely lets the GIL go
  // between calls, few enough that other work queued for the lane is not held back for long.
  static constexpr int chain_length = 64;

  explicit python_calls(std::size_t devices) {
    for (std::size_t d = 0; d < devices; ++d) per_device_.push_back(std::make_unique<fifo>());
  }

  // A FIFO of calls per priority, safe from any thread with or without the GIL (it only moves
  // pointers). pop() orders calls as gpupool's queue orders tasks: the oldest call of the highest
  // priority, with the same aging (gpupool::oldest_is_due): a lane that took an urgent call's
  // task runs the urgent call, not an older one queued before it, and low-priority calls still
  // progress.
  class fifo {
   public:
    // `priority` within gpupool::limits (checked by the caller).
    void push(std::shared_ptr<python_call> call, int priority) {
      std::lock_guard lock(mutex_);
      level(priority).push_back({next_++, std::move(call)});
      ++size_;
    }
    std::shared_ptr<python_call> pop() {
      std::lock_guard lock(mutex_);
      const std::optional<std::size_t> from = next_level_locked(passed_);
      if (!from) return nullptr;
      auto call = std::move(calls_[*from].front().second);
      calls_[*from].pop_front();
      --size_;
      return call;
    }
    [[nodiscard]] bool empty() {
      std::lock_guard lock(mutex_);
      return size_ == 0;
    }
    // The priority of the call pop() would take now (aging included), or nothing if none is
    // queued.
    [[nodiscard]] std::optional<int> next_priority() {
      std::lock_guard lock(mutex_);
      unsigned passed = passed_;  // looked at, not taken: the count stays as it is
      const std::optional<std::size_t> from = next_level_locked(passed);
      if (!from) return std::nullopt;
      return static_cast<int>(*from) + gpupool::limits::lowest_priority;
    }
    // Takes `call` out if it is still queued.
    bool remove(const std::shared_ptr<python_call>& call) {
      std::lock_guard lock(mutex_);
      for (auto& calls : calls_) {
        const auto it = std::find_if(calls.begin(), calls.end(),
                                     [&](const entry& e) { return e.second == call; });
        if (it == calls.end()) continue;
        calls.erase(it);
        --size_;
        return true;
      }
      return false;
    }

   private:
    static constexpr std::size_t levels = static_cast<std::size_t>(
        gpupool::limits::highest_priority - gpupool::limits::lowest_priority + 1);
    using entry = std::pair<std::uint64_t, std::shared_ptr<python_call>>;  // arrival, call
    // Under mutex_: the level of the call to take next (the highest priority's oldest, aging
    // applied with the count `passed`, which it updates), or nothing if none is queued.
    std::optional<std::size_t> next_level_locked(unsigned& passed) const {
      if (size_ == 0) return std::nullopt;
      std::size_t top = 0, oldest = 0, levels_queued = 0;
      for (std::size_t l = 0; l < levels; ++l) {
        if (calls_[l].empty()) continue;
        if (levels_queued++ == 0 || calls_[l].front().first < calls_[oldest].front().first)
          oldest = l;
        top = l;
      }
      return gpupool::oldest_is_due(levels_queued == 1 || oldest == top, passed) ? oldest : top;
    }

    std::deque<entry>& level(int priority) {
      return calls_[static_cast<std::size_t>(priority - gpupool::limits::lowest_priority)];
    }
    std::mutex mutex_;
    std::array<std::deque<entry>, levels> calls_;  // lowest priority first
    std::size_t size_ = 0;
    std::uint64_t next_ = 0;
    unsigned passed_ = 0;  // pops in a row that passed over the oldest call
  };

  fifo& of(std::optional<int> device) {
    return device ? *per_device_.at(static_cast<std::size_t>(*device)) : any_;
  }
  // Tasks still to end beyond the calls still to end (tasks whose call another lane ran): each
  // task counts -1 as it ends, each call +1 as it ends (counted before its future can say so).
  std::atomic<int>& surplus() noexcept { return surplus_; }
  // Set before a shutdown that cancels what has not started: a task then runs only the first
  // call it takes (each call still queued ends with a task of its own: cancelled in the queue,
  // or run by a task that had started).
  void stop_chaining() noexcept { stopped_.store(true); }
  // Off while tracing, so that each task's record is one call's.
  void set_chaining(bool on) noexcept { chaining_.store(on); }
  // Whether a task goes on to the calls queued behind the one it took.
  [[nodiscard]] bool chaining() const noexcept { return chaining_.load() && !stopped_.load(); }

 private:
  std::atomic<bool> stopped_{false};
  std::atomic<bool> chaining_{true};
  fifo any_;
  std::vector<std::unique_ptr<fifo>> per_device_;
  std::atomic<int> surplus_{0};
};

std::shared_ptr<python_calls> make_python_calls(std::size_t devices) {
  return std::make_shared<python_calls>(devices);
}

void stop_running_python_calls(python_calls& calls) noexcept {
  calls.stop_chaining();
}

void chain_python_calls(python_calls& calls, bool on) noexcept {
  calls.set_chaining(on);
}

namespace {

// What one task in gpupool's queue did with the calls of its FIFO. Written by the task on its
// lane and read by its completion callback, which runs after it.
struct python_task {
  bool started = false;
  // The call it ran last if that one's outcome waits for the stream (a chain stops after it):
  // handed over once the task has ended.
  std::shared_ptr<python_call> later;
};

}  // namespace

void submit_python_call(gpupool::executor& exec, std::optional<int> device, nb::handle fn,
                        nb::handle args, nb::handle kwargs, nb::handle future, nb::handle runner,
                        const std::shared_ptr<python_calls>& calls,
                        const gpupool::task_options& options) {
  python_calls::fifo& fifo = calls->of(device);  // checks the device first
  const int priority = options.priority.value_or(exec.priority());
  gpupool::check_priority(priority, "priority");
  // Queued before its task, which may start at once.
  auto submitted = std::make_shared<python_call>(fn, args, kwargs, future, runner);
  fifo.push(submitted, priority);
  auto state = std::make_shared<python_task>();
  auto task = [calls, &fifo, state, &exec](gpupool::lane& l) {
    state->started = true;
    if (!interpreter_alive() || fifo.empty()) return;  // the call already ran on another lane
    keep_python_thread_state();
    nb::gil_scoped_acquire gil;
    lane_scope scope(&l);
    for (int n = 0; n < python_calls::chain_length; ++n) {
      // Looked at before each further call: a chain stops at once when tracing starts or a
      // cancelling shutdown begins, and when work of a higher priority than the next call's (a
      // kernel task, say) waits for this lane, which then takes it; the calls left run in their
      // own tasks.
      if (n > 0) {
        if (!calls->chaining()) break;
        const std::optional<int> next = fifo.next_priority();
        if (!next || exec.work_waits_above(l.device(), *next)) break;
      }
      std::shared_ptr<python_call> call = fifo.pop();
      if (!call) break;
      if (call->run(l, calls->surplus()) == python_call::ran::later) {
        // Its outcome waits for this task's end: a call chained behind it might wait for that
        // outcome, and never let the task end. The calls behind it go to other tasks.
        state->later = std::move(call);
        break;
      }
    }
  };
  std::optional<gpupool::future<void>> queued;
  try {
    const gpupool::task_options task_options{priority};
    queued.emplace(device ? exec.submit_to(*device, task_options, std::move(task))
                          : exec.submit(task_options, std::move(task)));
  } catch (...) {
    // The task was refused (a device out of service, say): the call must not wait in the FIFO
    // for a task that never comes, and the caller gets the error. Unless a lane running the
    // task of an earlier call took it meanwhile: then it runs, and its future is the outcome.
    if (fifo.remove(submitted)) throw;
    calls->surplus().fetch_sub(1, std::memory_order_relaxed);  // the task it will not have
    return;
  }
  submitted.reset();
  queued->on_complete([calls, &fifo, state](gpupool::future<void>& done) {
    auto [cancelled, failure] = ending_of(done);
    std::shared_ptr<python_call> unstarted;
    // Never ran (cancelled in the queue, or failed before it started): one call of the FIFO
    // ends as the task did.
    if (!state->started) unstarted = fifo.pop();
    const int ending = (state->later ? 1 : 0) + (unstarted ? 1 : 0);
    calls->surplus().fetch_add(ending - 1, std::memory_order_acq_rel);
    if (unstarted)
      post_handover([unstarted, cancelled, failure] { unstarted->finish(cancelled, failure); });
    if (state->later)
      post_handover([later = std::move(state->later), failure] { later->finish(false, failure); });
  });
}

void wait_for_surplus_python_tasks(python_calls& calls) {
  // Such a task ends at once (it finds its FIFO empty), once a lane takes it; a lane may first
  // run what it already holds (a long call, say): after a short spin, sleep between looks
  // rather than keep a core busy. Bounded: a lane held by a call that never returns would
  // otherwise hold the caller too; a trace taken then may miss those tasks' records.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (int spins = 0; calls.surplus().load(std::memory_order_acquire) > 0 &&
                      std::chrono::steady_clock::now() < deadline;
       ++spins) {
    if (spins < 1000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace gpupool_python
