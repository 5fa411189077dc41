// The untyped shared state behind every future.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "core/scheduling/lane_spin.hpp"
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

// The state word: the status in the low bits, then flags.
constexpr std::uint32_t status_bits = 0x7;
// Transient: one thread is storing the result (from pending or from running).
constexpr std::uint32_t completing_from_pending = 5;
constexpr std::uint32_t completing_from_running = 6;
constexpr std::uint32_t waiters_flag = 1u << 3;    // a thread waits (or waited) on cv_
constexpr std::uint32_t callbacks_flag = 1u << 4;  // callbacks are stored
constexpr std::uint32_t taken_flag = 1u << 5;      // the value was handed over

// How long a waiter looks for the outcome before it sleeps (set_waiter_spin), in microseconds.
std::atomic<std::int64_t> waiter_spin_us{default_lane_spin.count()};

constexpr std::uint32_t bits_of(task_status s) noexcept {
  return static_cast<std::uint32_t>(s);
}

bool is_final(std::uint32_t word) noexcept {
  const std::uint32_t s = word & status_bits;
  return s == bits_of(task_status::succeeded) || s == bits_of(task_status::failed) ||
         s == bits_of(task_status::cancelled);
}

}  // namespace

void report_callback_failure() noexcept {
  try {
    throw;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpupool: a completion callback threw: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "gpupool: a completion callback threw a non-standard exception\n");
  }
}

namespace {

struct deferred_call {
  void (*fn)(void*);
  void* arg;
};

// This thread's open batches and what they put off; the list keeps its capacity between passes.
thread_local int open_batches = 0;
thread_local std::vector<deferred_call> deferred_calls;
// The budget the outermost open batch named (a lane's executor's), and the bytes tasks ended in
// it released against that budget and not yet given back: a budget every lane shares is then
// touched once per pass, not once per task (a pass often ends a batch of hundreds of tasks).
thread_local budget_account* pass_account = nullptr;
thread_local std::size_t pass_bytes = 0;

void give_back_pass_bytes() noexcept {
  if (pass_bytes == 0) return;
  const std::size_t bytes = pass_bytes;
  pass_bytes = 0;
  pass_account->give_back(bytes);
}

void give_back(budget_account& account, std::size_t bytes) noexcept {
  if (bytes == 0) return;
  if (open_batches > 0 && &account == pass_account) {
    pass_bytes += bytes;
    return;
  }
  account.give_back(bytes);
}

}  // namespace

completion_batch::completion_batch() noexcept {
  ++open_batches;
}

completion_batch::completion_batch(budget_account* own) noexcept {
  if (open_batches++ == 0) pass_account = own;
}

completion_batch::~completion_batch() {
  if (open_batches > 1) {
    --open_batches;
    return;
  }
  // The pass's bytes first: whoever the deferred functions hand results to (Python) finds the
  // budget those tasks held free again, as it would outside a pass. Tasks the deferred functions
  // end give theirs back at once: a deferred function (a Python done-callback) may go on to wait
  // for room in that very budget.
  give_back_pass_bytes();
  pass_account = nullptr;
  // Still open while the deferred functions run, so that what they defer runs here too.
  for (std::size_t i = 0; i < deferred_calls.size(); ++i) {
    const deferred_call call = deferred_calls[i];  // a copy: the list may grow meanwhile
    try {
      call.fn(call.arg);
    } catch (...) {
      report_callback_failure();
    }
  }
  deferred_calls.clear();
  --open_batches;
}

bool completion_batch::defer(void (*fn)(void*), void* arg) {
  if (open_batches == 0) return false;
  deferred_calls.push_back({fn, arg});
  return true;
}

bool completion_batch::open() noexcept {
  return open_batches > 0;
}

std::uint32_t state_base::load() const noexcept {
  return word_.load(std::memory_order_acquire);
}

bool state_base::transition(std::uint32_t from, std::uint32_t to) noexcept {
  std::uint32_t word = word_.load(std::memory_order_relaxed);
  do {
    if ((word & status_bits) != from) return false;
  } while (!word_.compare_exchange_weak(word, (word & ~status_bits) | to, std::memory_order_acq_rel,
                                        std::memory_order_relaxed));
  return true;
}

bool state_base::try_start() noexcept {
  return transition(bits_of(task_status::pending), bits_of(task_status::running));
}

bool state_base::try_cancel() noexcept {
  // Nothing to store: straight from pending to its final status.
  std::uint32_t word = word_.load(std::memory_order_relaxed);
  do {
    if ((word & status_bits) != bits_of(task_status::pending)) return false;
  } while (!word_.compare_exchange_weak(word,
                                        (word & ~status_bits) | bits_of(task_status::cancelled),
                                        std::memory_order_acq_rel, std::memory_order_relaxed));
  wake_and_call(word);
  return true;
}

bool state_base::begin_completion() noexcept {
  std::uint32_t word = word_.load(std::memory_order_relaxed);
  std::uint32_t next = 0;
  do {
    const std::uint32_t s = word & status_bits;
    if (s == bits_of(task_status::pending))
      next = completing_from_pending;
    else if (s == bits_of(task_status::running))
      next = completing_from_running;
    else
      return false;  // ended, or another thread is completing it
  } while (!word_.compare_exchange_weak(word, (word & ~status_bits) | next,
                                        std::memory_order_acquire, std::memory_order_relaxed));
  return true;
}

void state_base::abandon_completion() noexcept {
  if (!transition(completing_from_pending, bits_of(task_status::pending)))
    (void)transition(completing_from_running, bits_of(task_status::running));
}

void state_base::end_completion(task_status final_status) noexcept {
  std::uint32_t word = word_.load(std::memory_order_relaxed);
  // Release: whoever sees the final status sees the value or exception stored before it.
  while (!word_.compare_exchange_weak(word, (word & ~status_bits) | bits_of(final_status),
                                      std::memory_order_acq_rel, std::memory_order_relaxed)) {
  }
  wake_and_call(word);
}

void state_base::wake_and_call(std::uint32_t before) noexcept {
  // Read by the one thread that ended the state, which holds a reference to it throughout.
  if (account_ != nullptr) give_back(*account_, held_);
  if ((before & waiters_flag) != 0) {
    // Under the lock: a waiter sets its flag and checks the status holding it, so it is either
    // asleep on cv_ now or will see the final status.
    std::lock_guard lock(mutex_);
    cv_.notify_all();
  }
  if ((before & callbacks_flag) != 0) run_callbacks();  // last: the state may go with it
}

void state_base::set_exception(std::exception_ptr e) noexcept {
  if (!begin_completion()) return;
  exception_ = std::move(e);
  end_completion(task_status::failed);
}

bool state_base::mark_callbacks() noexcept {
  std::uint32_t word = word_.load(std::memory_order_acquire);
  do {
    if (is_final(word)) return false;
    if ((word & callbacks_flag) != 0) return true;
  } while (!word_.compare_exchange_weak(word, word | callbacks_flag, std::memory_order_acq_rel,
                                        std::memory_order_acquire));
  return true;
}

bool state_base::take_once() noexcept {
  return (word_.fetch_or(taken_flag, std::memory_order_acq_rel) & taken_flag) == 0;
}

task_status state_base::status() const noexcept {
  const std::uint32_t s = load() & status_bits;
  if (s == completing_from_pending) return task_status::pending;
  if (s == completing_from_running) return task_status::running;
  return static_cast<task_status>(s);
}

bool state_base::done() const noexcept {
  return is_final(load());
}

void state_base::wait() const {
  (void)wait_final(nullptr);
}

bool state_base::wait_until(std::chrono::steady_clock::time_point deadline) const {
  return wait_final(&deadline);
}

void set_waiter_spin(std::chrono::microseconds spin) noexcept {
  waiter_spin_us.store(std::min(spin, longest_waiter_spin).count(), std::memory_order_relaxed);
}

bool state_base::wait_final(const std::chrono::steady_clock::time_point* deadline) const {
  if (is_final(load())) return true;
  // Results of small tasks come back within microseconds of each other, and a waiter asleep by
  // then is woken through the kernel, which on an idle core (above all a virtual machine's) costs
  // more than the task: a consumer that slept once fell behind and slept on every result after.
  // So it looks first, as a lane does for work, yielding its core to any thread that wants it.
  const auto spin = std::chrono::microseconds(waiter_spin_us.load(std::memory_order_relaxed));
  if (spin.count() > 0) {
    auto now = std::chrono::steady_clock::now();
    auto until = now + spin;
    if (deadline != nullptr && *deadline < until) until = *deadline;
    while (now < until) {
      std::this_thread::yield();
      if (is_final(load())) return true;
      now = std::chrono::steady_clock::now();
    }
    // Out of time: no waiter flag set, so the completing thread takes no lock to wake nobody.
    if (deadline != nullptr && now >= *deadline) return is_final(load());
  }
  std::unique_lock lock(mutex_);
  std::uint32_t word = load();
  while (!is_final(word)) {
    // The flag tells a completing thread to notify; set under the lock, so that it either sees
    // the flag or completed before this look.
    if ((word & waiters_flag) == 0 &&
        !word_.compare_exchange_weak(word, word | waiters_flag, std::memory_order_acq_rel,
                                     std::memory_order_acquire))
      continue;  // the word changed: look again
    if (deadline == nullptr)
      cv_.wait(lock);
    else if (cv_.wait_until(lock, *deadline) == std::cv_status::timeout)
      return is_final(load());
    word = load();
  }
  return true;
}

void state_base::rethrow_if_unsuccessful() const {
  const std::uint32_t s = load() & status_bits;
  if (s == bits_of(task_status::failed)) std::rethrow_exception(exception_);
  if (s == bits_of(task_status::cancelled))
    throw cancelled_error("gpupool: the task was cancelled before it started");
}

}  // namespace detail
}  // namespace gpupool
