// The untyped shared state behind every future.
#include <cstdio>
#include <exception>
#include <utility>

#include "gpupool/future.hpp"

namespace gpupool {

const char* to_string(task_status s) noexcept {
  switch (s) {
    case task_status::pending:
      return "pending";
    case task_status::running:
      return "running";
    case task_status::succeeded:
      return "succeeded";
    case task_status::failed:
      return "failed";
    case task_status::cancelled:
      return "cancelled";
  }
  return "unknown";
}

namespace detail {
namespace {

bool is_final(task_status s) noexcept {
  return s == task_status::succeeded || s == task_status::failed || s == task_status::cancelled;
}

// A callback's exception has nowhere to go (the task already ended); report it rather than lose it.
void run_callback(const std::function<void()>& cb) noexcept {
  try {
    cb();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpupool: a completion callback threw: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "gpupool: a completion callback threw a non-standard exception\n");
  }
}

}  // namespace

bool state_base::try_start() {
  std::lock_guard lock(mutex_);
  if (status_ != task_status::pending) return false;
  status_ = task_status::running;
  return true;
}

bool state_base::try_cancel() {
  std::unique_lock lock(mutex_);
  if (status_ != task_status::pending) return false;
  finish(std::move(lock), task_status::cancelled);
  return true;
}

void state_base::set_exception(std::exception_ptr e) {
  std::unique_lock lock(mutex_);
  if (is_final(status_)) return;
  exception_ = std::move(e);
  finish(std::move(lock), task_status::failed);
}

bool state_base::begin_success(std::unique_lock<std::mutex>& /*lock*/) {
  return !is_final(status_);
}

void state_base::finish(std::unique_lock<std::mutex> lock, task_status final_status) {
  status_ = final_status;
  auto callbacks = std::move(callbacks_);
  callbacks_.clear();
  lock.unlock();
  cv_.notify_all();
  for (const auto& cb : callbacks) run_callback(cb);
}

task_status state_base::status() const {
  std::lock_guard lock(mutex_);
  return status_;
}

bool state_base::done() const {
  return is_final(status());
}

void state_base::wait() const {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [this] { return is_final(status_); });
}

bool state_base::wait_until(std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock lock(mutex_);
  return cv_.wait_until(lock, deadline, [this] { return is_final(status_); });
}

void state_base::add_callback(std::function<void()> cb) {
  {
    std::lock_guard lock(mutex_);
    if (!is_final(status_)) {
      callbacks_.push_back(std::move(cb));
      return;
    }
  }
  run_callback(cb);
}

void state_base::rethrow_if_unsuccessful() const {
  std::lock_guard lock(mutex_);
  if (status_ == task_status::failed) std::rethrow_exception(exception_);
  if (status_ == task_status::cancelled)
    throw cancelled_error("gpupool: the task was cancelled before it started");
}

}  // namespace detail
}  // namespace gpupool
