// Futures returned by the executor: result or exception of one task, waitable, pollable,
// cancellable while the task is still queued, with completion callbacks.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "gpupool/error.hpp"

namespace gpupool {

/// Where a task is in its life. The last three are final.
enum class task_status { pending, running, succeeded, failed, cancelled };
[[nodiscard]] const char* to_string(task_status s) noexcept;

template <class T>
class future;

namespace detail {

template <class T>
class shared_state;

/// Reports the exception being handled, thrown by a completion callback: it has nowhere else to
/// go (the task already ended). Call only from a catch block.
void report_callback_failure() noexcept;

/// Where the bytes a task was admitted with go back when it ends: the executor's in-flight
/// budget (see state_base::hold).
class budget_account {
 public:
  /// Gives `bytes` back. Must not throw; may be called from any thread.
  virtual void give_back(std::size_t bytes) noexcept = 0;

 protected:
  ~budget_account() = default;
};

/// A pass over finished tasks on one thread (a lane completing every ready item), during which
/// completion callbacks may put off work they share, to do it once for the whole pass: e.g. a
/// callback that needs Python's GIL queues its result and defers one function that takes the
/// GIL once and hands over every queued result. Callbacks themselves still run at once, on the
/// completing thread; only what they `defer` waits for the end of the pass.
///
/// Batches nest on a thread; deferred functions run, in the order deferred, when the outermost
/// one ends (on that thread). A function deferred while they run runs in the same end.
///
/// The outermost batch may name the budget its thread's tasks count against (a lane's: its
/// executor's in-flight budget): the bytes that tasks holding it (state_base::hold) release
/// during the batch then go back in one call as it ends, before the deferred functions run;
/// tasks those functions end give theirs back at once. Bytes held against any other budget go
/// back at once: that budget's executor may be gone, or waited on from this thread, before the
/// end. So a completion callback on a lane runs before its own task's bytes are back: it must
/// not wait for room in its own executor's budget (a submit from the lane itself never waits).
class completion_batch {
 public:
  completion_batch() noexcept;
  explicit completion_batch(budget_account* own) noexcept;
  ~completion_batch();
  completion_batch(const completion_batch&) = delete;
  completion_batch& operator=(const completion_batch&) = delete;

  /// Runs `fn(arg)` at the end of the outermost batch open on this thread. Returns false, and
  /// keeps nothing, when no batch is open here: the caller then does its work now. `fn` must not
  /// throw (an exception is reported on stderr and dropped).
  /// @throw std::bad_alloc if the function cannot be recorded.
  static bool defer(void (*fn)(void*), void* arg);
  /// True while a batch is open on this thread.
  [[nodiscard]] static bool open() noexcept;
};

/// The untyped part of a task's shared state: status, exception and waiting.
///
/// Thread-safe, and cheap when nobody waits: the status lives in one atomic word together with
/// two flags, "a thread waits" and "callbacks are registered". Starting, completing and
/// cancelling are single atomic operations; the mutex and condition variable are touched only
/// when a flag says a waiter or a callback is there. The value or exception is written by the
/// one thread that won the right to complete, before the final status is published (release),
/// and read only after a final status was seen (acquire).
class state_base {
 public:
  state_base() = default;
  state_base(const state_base&) = delete;
  state_base& operator=(const state_base&) = delete;
  virtual ~state_base() = default;

  /// pending -> running. False if the task was cancelled (or already started or ended).
  bool try_start() noexcept;
  /// pending -> cancelled, completing the state. False if the task already started or ended.
  bool try_cancel() noexcept;
  /// running|pending -> failed. Ignored if the state already ended (first result wins).
  void set_exception(std::exception_ptr e) noexcept;
  /// Counts `bytes` against `account` until the state ends, however it ends (a value, an
  /// exception, a cancellation): they are given back as it ends, before its waiters wake; on a
  /// lane, inside a completion pass that names `account` as its own (completion_batch), the
  /// bytes of every task the pass ends go back together, in one call, when the pass ends. Call
  /// at most once, before the task is queued or the future handed out; no callback or
  /// allocation is involved.
  void hold(budget_account& account, std::size_t bytes) noexcept {
    account_ = &account;
    held_ = bytes;
  }

  [[nodiscard]] task_status status() const noexcept;
  [[nodiscard]] bool done() const noexcept;
  void wait() const;
  [[nodiscard]] bool wait_until(std::chrono::steady_clock::time_point deadline) const;
  /// Rethrows the stored exception (failed) or throws cancelled_error (cancelled).
  void rethrow_if_unsuccessful() const;

 protected:
  /// Claims the right to complete the state (pending|running -> completing). False if it already
  /// ended or another thread is completing it: the caller must then store nothing.
  bool begin_completion() noexcept;
  /// The claimed completion did not happen (storing the value threw): back to where it was.
  void abandon_completion() noexcept;
  /// Publishes `final_status` after the caller stored the value or exception; then wakes waiters
  /// and runs callbacks if there are any. The state may be destroyed by the time this returns
  /// (the last callback may drop the last reference): callers touch nothing afterwards.
  void end_completion(task_status final_status) noexcept;
  /// Sets the "callbacks registered" flag unless the state already ended (false then). Called
  /// with `mutex_` held, so that a completing thread reads the callbacks only after they are
  /// stored.
  bool mark_callbacks() noexcept;
  /// Claims the value for one taker; false if it was already taken.
  bool take_once() noexcept;
  /// Runs the callbacks of a state that just ended, on the completing thread.
  virtual void run_callbacks() noexcept = 0;

  // Under mutex_: callbacks of the typed state; waiters sleep on cv_.
  mutable std::mutex mutex_;

 private:
  std::uint32_t load() const noexcept;
  // Sleeps until the state is final, or until `*deadline` unless it is null; true if final.
  bool wait_final(const std::chrono::steady_clock::time_point* deadline) const;
  // Moves the status bits from `from` to `to`, keeping the flags. False if they were not `from`.
  bool transition(std::uint32_t from, std::uint32_t to) noexcept;
  void wake_and_call(std::uint32_t before) noexcept;

  mutable std::condition_variable cv_;
  mutable std::atomic<std::uint32_t> word_{0};  // status bits | flags (see future.cpp)
  std::exception_ptr exception_;
  budget_account* account_ = nullptr;  // see hold(); read once, by the thread that ends the state
  std::size_t held_ = 0;
};

/// The part of a state that knows the value's type: completion callbacks, which get a future.
template <class T>
class typed_state : public state_base {
 public:
  /// Runs `cb(f)`, where `f` refers to this state (held by `self`), once the state is final: now,
  /// on this thread, if it already is; otherwise on the thread that completes it. Stores `cb`
  /// itself (the first one in place, later ones in a list): no allocation of its own. An empty
  /// `cb` is ignored.
  void add_callback(std::function<void(future<T>&)> cb, std::shared_ptr<shared_state<T>> self);

 private:
  void run_callbacks() noexcept override;

  std::function<void(future<T>&)> first_callback_;
  std::vector<std::function<void(future<T>&)>> more_callbacks_;
  // The state itself while callbacks wait, to hand them a future; dropped once they ran.
  std::shared_ptr<shared_state<T>> self_;
};

template <class T>
class shared_state final : public typed_state<T> {
 public:
  void set_value(T value) {
    if (!this->begin_completion()) return;
    try {
      value_.emplace(std::move(value));
    } catch (...) {
      this->abandon_completion();
      throw;
    }
    this->end_completion(task_status::succeeded);
  }
  T take() {
    if (!this->take_once())
      throw std::logic_error("gpupool::future::get: the value was already taken");
    T v = std::move(*value_);
    value_.reset();
    return v;
  }

 private:
  std::optional<T> value_;
};

template <>
class shared_state<void> final : public typed_state<void> {
 public:
  void set_value() noexcept {
    if (!begin_completion()) return;
    end_completion(task_status::succeeded);
  }
  void take() {}
};

}  // namespace detail

/// The result of one task. Move-only; `get()` hands the value over once.
/// Every member may be called from any thread.
template <class T>
class [[nodiscard]] future {
 public:
  future() = default;
  explicit future(std::shared_ptr<detail::shared_state<T>> state) : state_(std::move(state)) {}

  /// True while this future refers to a task.
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }

  /// Waits for the task and returns its value.
  /// @throw the task's own exception if it failed; cancelled_error if it was cancelled;
  ///        std::logic_error if the value was already taken (e.g. by a callback).
  T get() {
    auto& state = checked();
    state.wait();
    state.rethrow_if_unsuccessful();
    return state.take();
  }

  void wait() const { checked().wait(); }

  /// Waits at most `timeout`; true if the task has ended.
  template <class Rep, class Period>
  bool wait_for(const std::chrono::duration<Rep, Period>& timeout) const {
    return checked().wait_until(
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout));
  }

  /// True once the task has ended (succeeded, failed or cancelled).
  [[nodiscard]] bool ready() const { return checked().done(); }

  [[nodiscard]] task_status status() const { return checked().status(); }

  /// Cancels the task if it has not started. Returns true if it was cancelled by this call.
  bool cancel() { return checked().try_cancel(); }

  /// Calls `cb(f)` once the task has ended, where `f` refers to the same task as this future.
  /// Runs on the lane thread that completes the task, or right away if it already ended.
  /// `cb` must not throw; it should be short, as it runs on a lane, and must not wait for
  /// another thread's submit to its executor: the task's own in-flight bytes come back only once
  /// the lane's completion pass ends (see completion_batch).
  void on_complete(std::function<void(future&)> cb) {
    checked().add_callback(std::move(cb), state_);
  }

 private:
  detail::shared_state<T>& checked() const {
    if (!state_) throw std::logic_error("gpupool::future: no task (default-constructed or moved)");
    return *state_;
  }
  std::shared_ptr<detail::shared_state<T>> state_;
};

namespace detail {

// Calls one stored callback with a future of its own (a callback may move from it).
template <class T>
void invoke_callback(std::function<void(future<T>&)>& cb,
                     const std::shared_ptr<shared_state<T>>& self) noexcept {
  if (!cb) return;
  try {
    future<T> alias(self);
    cb(alias);
  } catch (...) {
    report_callback_failure();
  }
}

template <class T>
void typed_state<T>::add_callback(std::function<void(future<T>&)> cb,
                                  std::shared_ptr<shared_state<T>> self) {
  if (!cb) return;
  {
    std::lock_guard lock(mutex_);
    if (mark_callbacks()) {
      if (!first_callback_)
        first_callback_ = std::move(cb);
      else
        more_callbacks_.push_back(std::move(cb));
      if (!self_) self_ = std::move(self);
      return;
    }
  }
  invoke_callback(cb, self);
}

template <class T>
void typed_state<T>::run_callbacks() noexcept {
  std::shared_ptr<shared_state<T>> self;  // destroyed last: it may hold the last reference
  std::function<void(future<T>&)> first;
  std::vector<std::function<void(future<T>&)>> more;
  {
    std::lock_guard lock(mutex_);
    first.swap(first_callback_);
    more.swap(more_callbacks_);
    self.swap(self_);
  }
  invoke_callback(first, self);
  for (auto& cb : more) invoke_callback(cb, self);
}

}  // namespace detail

/// The futures of a batch of tasks, in submission order. `get()` returns all values in order and
/// rethrows the first failure (in order) after every task has ended.
template <class T>
class [[nodiscard]] multi_future : public std::vector<future<T>> {
 public:
  using std::vector<future<T>>::vector;

  void wait() const {
    for (const auto& f : *this) f.wait();
  }

  auto get() {
    wait();
    if constexpr (std::is_void_v<T>) {
      for (auto& f : *this) f.get();
    } else {
      std::vector<T> values;
      values.reserve(this->size());
      for (auto& f : *this) values.push_back(f.get());
      return values;
    }
  }

  /// Cancels every task that has not started; returns how many were cancelled.
  std::size_t cancel() {
    std::size_t n = 0;
    for (auto& f : *this) n += f.cancel() ? 1 : 0;
    return n;
  }
};

}  // namespace gpupool
