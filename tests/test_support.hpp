// Helpers shared by the test files: backend parameters that skip cleanly, random data.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpupool/gpupool.hpp"

namespace gpupool {
// Names parameters in test output ("cpu", not "4-byte object").
inline void PrintTo(backend_kind kind, std::ostream* os) {
  *os << to_string(kind);
}
}  // namespace gpupool

namespace gpupool::testing {

/// Makes the `n`-th allocation from now on by this thread (1: the next one) throw
/// std::bad_alloc, once; 0 takes that back. False where this test program keeps the standard
/// operator new (under sanitizers, which bring their own): the caller skips. Defined in
/// test_future.cpp, whose replacement operator new serves the whole program.
bool fail_allocation_on_this_thread(std::size_t n);

// Sets an environment variable for one scope.
class scoped_env {
 public:
  /// `value` null: the variable is unset for the scope.
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* before = std::getenv(name)) previous_ = before;
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
  /// Puts back what the environment held: a test run with the variable set (GPUPOOL_QUIET=1,
  /// say) keeps it for the tests after this one.
  ~scoped_env() {
    if (previous_)
      ::setenv(name_, previous_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

// Points GPUPOOL_CACHE_DIR at `dir` for the scope, then restores what was there.
class scoped_cache_dir {
 public:
  explicit scoped_cache_dir(const std::string& dir) : env_("GPUPOOL_CACHE_DIR", dir.c_str()) {}

 private:
  scoped_env env_;
};

// A new private folder under /tmp, named after `tag`, removed (with what it holds) when the
// test program exits.
inline std::string temporary_folder(const std::string& tag) {
  struct removed_at_exit {
    std::mutex mutex;
    std::vector<std::string> folders;
    ~removed_at_exit() {
      std::error_code ignored;
      for (const auto& f : folders) std::filesystem::remove_all(f, ignored);
    }
  };
  static removed_at_exit made;
  std::string pattern = "/tmp/gpupool-test-" + tag + "-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  std::lock_guard lock(made.mutex);
  made.folders.push_back(pattern);
  return pattern;
}

inline std::string backend_name(const ::testing::TestParamInfo<backend_kind>& info) {
  return to_string(info.param);
}

/// Options for an executor on `kind` with `lanes` lanes per device, without the CPU-backend
/// notice.
inline executor_options quiet_options(backend_kind kind, int lanes) {
  executor_options o;
  o.backend = kind;
  o.lanes_per_device = lanes;
  o.quiet = true;
  return o;
}

/// Skips the current test (with the reason) when `kind` cannot run here.
#define GPUPOOL_SKIP_UNLESS_USABLE(kind)                                                    \
  do {                                                                                      \
    if ((kind) == ::gpupool::backend_kind::cuda) {                                          \
      const auto availability_ = ::gpupool::cuda_availability();                            \
      if (!availability_.usable) GTEST_SKIP() << "no usable GPU: " << availability_.reason; \
    }                                                                                       \
  } while (0)

/// Waits for the forked `child`, which must exit with status 0: a child reports a failed check
/// by its exit code (and a hang is ended by an alarm the child sets).
inline void expect_clean_exit(pid_t child) {
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child hung or crashed (signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's own check failed (its exit code says which)";
}

/// Random values that are never all zero and whose results stay in range for every kernel.
template <class T>
std::vector<T> random_vector(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  if constexpr (std::is_floating_point_v<T>) {
    std::uniform_real_distribution<double> dist(-100.0, 100.0);
    for (auto& x : v) x = static_cast<T>(dist(rng));
  } else {
    std::uniform_int_distribution<std::int64_t> dist(-20000, 20000);
    for (auto& x : v) x = static_cast<T>(dist(rng));
  }
  return v;
}

/// Compares with a reference: exactly for integers; for floating point within a few ulps of
/// `magnitude[i]`, the size of the terms that made the result (the GPU may fuse a*x+y into one
/// rounding, and a sum of large terms that cancel keeps their absolute error).
template <class T>
::testing::AssertionResult matches_reference(const std::vector<T>& got, const std::vector<T>& want,
                                             const std::vector<double>& magnitude = {}) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    bool same = got[i] == want[i];
    if constexpr (std::is_floating_point_v<T>) {
      const double scale =
          magnitude.empty() ? std::abs(static_cast<double>(want[i])) : magnitude[i];
      const double tolerance = 4.0 * std::numeric_limits<T>::epsilon() * std::max(1.0, scale);
      same = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])) <= tolerance;
    }
    if (!same)
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
  return ::testing::AssertionSuccess();
}

/// Runs `check` (which gets a result and checks it): true where it ran through, false where it
/// threw gpupool's error for a fault injected by GPUPOOL_FAULTS; any other error fails the test.
template <class Check>
bool ran_or_hit_injected_fault(Check&& check) {
  try {
    check();
    return true;
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("injected fault"), std::string::npos) << e.what();
    return false;
  }
}

/// Same, for any contiguous result (e.g. host_vector) against a std::vector reference.
template <class Range, class T>
::testing::AssertionResult matches_reference(const Range& got, const std::vector<T>& want,
                                             const std::vector<double>& magnitude = {}) {
  return matches_reference(std::vector<T>(got.begin(), got.end()), want, magnitude);
}

// A gate that holds tasks until the test opens it, so queues can be filled deterministically.
class gate {
 public:
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return open_; });
  }
  // Notifies under the lock: a waiter may destroy the gate as soon as it wakes, so open() must
  // not touch the condition variable after the waiter can run.
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Occupies `lanes` lanes with tasks that wait for `g` (submitted by `submit_one`, which takes
// the task); returns once all of them run.
template <class Submit>
multi_future<void> hold_lanes(int lanes, gate& g, Submit submit_one) {
  std::atomic<int> started{0};
  multi_future<void> holders;
  for (int i = 0; i < lanes; ++i)
    holders.push_back(submit_one([&](lane&) {
      ++started;
      g.wait();
    }));
  while (started.load() < lanes) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return holders;
}

// Occupies every lane of `ex` (of every device) until `g` opens, so whatever is submitted next
// stays queued.
inline multi_future<void> hold_every_lane(executor& ex, gate& g) {
  return hold_lanes(ex.lane_count(), g, [&](auto task) { return ex.submit(std::move(task)); });
}

// Occupies every lane of `device` until `g` opens.
inline multi_future<void> hold_lanes_of(executor& ex, int device, gate& g) {
  return hold_lanes(ex.lanes_per_device(), g,
                    [&](auto task) { return ex.submit_to(device, std::move(task)); });
}

// Opens a gate and waits for the lanes it held when the test leaves, however it leaves: a failed
// ASSERT must not leave lanes waiting on a gate that is gone.
class open_at_exit {
 public:
  open_at_exit(gate& g, const multi_future<void>& holders) : g_(g), holders_(holders) {}
  open_at_exit(const open_at_exit&) = delete;
  open_at_exit& operator=(const open_at_exit&) = delete;
  ~open_at_exit() {
    g_.open();
    holders_.wait();
  }

 private:
  gate& g_;
  const multi_future<void>& holders_;
};

// Runs the elementwise kernel `body` (y from x, named `name`) over x = 0, 1, ..., 999 on one
// CPU lane with the kernel cache in `dir`; returns y.
inline std::vector<double> run_with_cache_in(const std::string& dir, const std::string& body,
                                             const std::string& name) {
  scoped_cache_dir cache(dir);
  executor_options o;
  o.backend = backend_kind::cpu;
  o.lanes_per_device = 1;
  o.quiet = true;
  executor ex(o);
  elementwise_kernel k("float64 x", "float64 y", body, name);
  std::vector<double> x(1000), out(x.size(), -1.0);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i);
  ex.transform<double>(k, {x}, out).get();
  return out;
}

}  // namespace gpupool::testing
