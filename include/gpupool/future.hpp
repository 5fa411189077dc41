// Futures returned by the executor: result or exception of one task, waitable, pollable,
// cancellable while the task is still queued, with completion callbacks.
#pragma once

#include <chrono>
#include <condition_variable>
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

namespace detail {

/// The untyped part of a task's shared state: status, exception, waiting and callbacks.
/// Thread-safe; every transition happens under one mutex.
class state_base {
 public:
  state_base() = default;
  state_base(const state_base&) = delete;
  state_base& operator=(const state_base&) = delete;
  virtual ~state_base() = default;

  /// pending -> running. False if the task was cancelled (or already started).
  bool try_start();
  /// pending -> cancelled, completing the state. False if the task already started or ended.
  bool try_cancel();
  /// running|pending -> failed. Ignored if the state already ended (first failure wins).
  void set_exception(std::exception_ptr e);

  [[nodiscard]] task_status status() const;
  [[nodiscard]] bool done() const;
  void wait() const;
  [[nodiscard]] bool wait_until(std::chrono::steady_clock::time_point deadline) const;
  /// Runs `cb` once the state is final: now, on this thread, if it already is; otherwise on the
  /// thread that completes it.
  void add_callback(std::function<void()> cb);
  /// Rethrows the stored exception (failed) or throws cancelled_error (cancelled).
  void rethrow_if_unsuccessful() const;

 protected:
  /// Ends the state as succeeded; the caller has stored the value. Returns false (and the caller
  /// must discard the value) if the state had already ended.
  bool begin_success(std::unique_lock<std::mutex>& lock);
  void finish(std::unique_lock<std::mutex> lock, task_status final_status);
  mutable std::mutex mutex_;

 private:
  mutable std::condition_variable cv_;
  task_status status_ = task_status::pending;
  std::exception_ptr exception_;
  std::vector<std::function<void()>> callbacks_;
};

template <class T>
class shared_state final : public state_base {
 public:
  void set_value(T value) {
    std::unique_lock lock(mutex_);
    if (!begin_success(lock)) return;
    value_.emplace(std::move(value));
    finish(std::move(lock), task_status::succeeded);
  }
  T take() {
    std::lock_guard lock(mutex_);
    if (!value_) throw std::logic_error("gpupool::future::get: the value was already taken");
    T v = std::move(*value_);
    value_.reset();
    return v;
  }

 private:
  std::optional<T> value_;
};

template <>
class shared_state<void> final : public state_base {
 public:
  void set_value() {
    std::unique_lock lock(mutex_);
    if (!begin_success(lock)) return;
    finish(std::move(lock), task_status::succeeded);
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
  /// `cb` must not throw; it should be short, as it runs on a lane.
  void on_complete(std::function<void(future&)> cb) {
    checked().add_callback([state = state_, cb = std::move(cb)]() mutable {
      future alias(state);
      cb(alias);
    });
  }

 private:
  detail::shared_state<T>& checked() const {
    if (!state_) throw std::logic_error("gpupool::future: no task (default-constructed or moved)");
    return *state_;
  }
  std::shared_ptr<detail::shared_state<T>> state_;
};

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
