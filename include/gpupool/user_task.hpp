// The type-erased form of a callable given to executor::submit: the submit templates (in
// executor.hpp) build one, and the library queues it without knowing the callable's type.
#pragma once

#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "gpupool/future.hpp"

namespace gpupool {

class lane;

namespace detail {

/// What `executor::submit` queues: a user callable `f(lane&) -> R` with its future's state, its
/// type erased so that the library queues it without knowing F or R. A lane calls `state()`
/// to claim, fail or cancel it, `run` on the lane, then `complete` once the lane's stream has
/// passed the work `f` enqueued (so asynchronous downloads are done when `get()` returns).
class user_task {
 public:
  virtual ~user_task() = default;
  [[nodiscard]] virtual state_base& state() noexcept = 0;
  /// Calls `f(l)`, keeping its value.
  virtual void run(lane& l) = 0;
  /// Hands the value kept by `run` over to the future (or the exception its move threw).
  virtual void complete() noexcept = 0;
};

template <class F, class R>
class callable_task final : public user_task {
 public:
  callable_task(F f, std::shared_ptr<shared_state<R>> state)
      : f_(std::move(f)), state_(std::move(state)) {}

  state_base& state() noexcept override { return *state_; }

  void run(lane& l) override {
    if constexpr (std::is_void_v<R>) {
      f_(l);
    } else {
      result_.emplace(f_(l));
    }
  }

  void complete() noexcept override {
    if constexpr (std::is_void_v<R>) {
      state_->set_value();
    } else {
      try {
        state_->set_value(std::move(*result_));
      } catch (...) {
        state_->set_exception(std::current_exception());  // the value's move threw
      }
    }
  }

 private:
  struct no_value {};
  F f_;
  std::shared_ptr<shared_state<R>> state_;
  std::conditional_t<std::is_void_v<R>, std::optional<no_value>, std::optional<R>> result_;
};

}  // namespace detail

}  // namespace gpupool
