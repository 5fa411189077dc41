// A soak: mixed tasks from several submitting threads, with injected faults (GPUPOOL_FAULTS) and
// random cancellations. Every future must end exactly once, every value that comes back must be
// right, and the memory gpupool held must be back where it started. CI runs the short one
// (20,000 tasks from 4 threads on the CPU backend); the long one runs on a GPU machine:
//   GPUPOOL_SOAK_TASKS=1000000 GPUPOOL_SOAK_THREADS=8 GPUPOOL_SOAK_BACKEND=cuda
//   gpupool_tests --gtest_filter=Soak.*
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace gpupool {
namespace {

TEST(FaultInjection, BadSettingsAreRefused) {
  for (const char* bad : {"all", "all=2", "all=-0.1", "launch=x", "disk=0.1", "seed=-",
                          "seed=", "seed=+5", "seed= 5", "seed=-1", "seed=18446744073709551616"}) {
    testing::scoped_env env("GPUPOOL_FAULTS", bad);
    executor_options o;
    o.backend = backend_kind::cpu;
    o.quiet = true;
    EXPECT_THROW(executor{o}, std::invalid_argument) << bad;
  }
}

TEST(FaultInjection, EachKindFailsItsOperationOnly) {
  const std::vector<float> x(5000, 2.0f);
  struct expectation {
    const char* kind;
    bool transform_fails;  // a built-in kernel: copies and a launch, on slots made at start
    bool allocate_fails;   // a task allocating on its lane
  };
  for (const auto& e : {expectation{"alloc", false, true}, expectation{"copy", true, false},
                        expectation{"launch", true, false}, expectation{"call", true, true}}) {
    testing::scoped_env env("GPUPOOL_FAULTS", (std::string(e.kind) + "=1").c_str());
    executor_options o;
    o.backend = backend_kind::cpu;
    o.lanes_per_device = 1;
    o.quiet = true;
    executor ex(o);  // starting the lanes is never failed
    std::vector<float> out(x.size());
    auto f =
        ex.transform(builtin_kernel::square(), std::span<const float>(x), std::span<float>(out));
    if (e.transform_fails) {
      try {
        f.get();
        ADD_FAILURE() << e.kind << ": a transform ran with every " << e.kind << " failing";
      } catch (const error& failure) {
        EXPECT_NE(std::string(failure.what()).find("injected fault ("), std::string::npos)
            << failure.what();
      }
    } else {
      EXPECT_NO_THROW(f.get()) << e.kind;
      EXPECT_EQ(out[0], 4.0f);
    }
    auto allocated = ex.submit([](lane& l) { return l.allocate<float>(16).size(); });
    if (e.allocate_fails)
      EXPECT_THROW((void)allocated.get(), error) << e.kind;
    else
      EXPECT_EQ(allocated.get(), 16u) << e.kind;
  }
}

// A count from the environment variable `name` (at most `most`), or `fallback` where it is unset.
int count_from_environment(const char* name, int fallback, int most) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  const int n = std::atoi(value);
  if (n < 1 || n > most) throw std::invalid_argument(std::string(name) + " out of range");
  return n;
}

TEST(Soak, TwentyThousandMixedTasksWithFaultsAndCancellations) {
  testing::scoped_env env("GPUPOOL_FAULTS", "all=0.01,seed=20260");
  const std::size_t pinned_before = pinned_bytes_in_use();
  const int threads = count_from_environment("GPUPOOL_SOAK_THREADS", 4, 64);
  const int per_thread = count_from_environment("GPUPOOL_SOAK_TASKS", 20000, 10'000'000) / threads;
  const char* backend_name = std::getenv("GPUPOOL_SOAK_BACKEND");
  const backend_kind kind = backend_name != nullptr && std::string(backend_name) == "cuda"
                                ? backend_kind::cuda
                                : backend_kind::cpu;
  GPUPOOL_SKIP_UNLESS_USABLE(kind);
  const auto started = std::chrono::steady_clock::now();
  struct outcome {
    std::atomic<int> endings{0};
  };
  std::vector<std::unique_ptr<outcome>> outcomes;
  for (int i = 0; i < threads * per_thread; ++i) outcomes.push_back(std::make_unique<outcome>());
  std::atomic<int> succeeded{0}, failed{0}, cancelled{0}, wrong{0};
  {
    executor_options o;
    o.backend = kind;
    o.lanes_per_device = 3;
    o.chunk_bytes = 4096;  // larger arrays become several pieces
    o.quiet = true;
    executor ex(o);
    std::vector<std::thread> submitters;
    for (int t = 0; t < threads; ++t) {
      submitters.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t) + 1);
        for (int i = 0; i < per_thread; ++i) {
          const int n = t * per_thread + i;
          outcome& slot = *outcomes[static_cast<std::size_t>(n)];
          const bool cancel_it = rng() % 20 == 0;
          // Counts every ending and checks the value of those that succeed.
          auto observe = [&slot, &succeeded, &failed, &cancelled, &wrong](auto status, bool right) {
            slot.endings.fetch_add(1);
            if (status == task_status::succeeded) {
              ++succeeded;
              if (!right) ++wrong;
            } else if (status == task_status::failed) {
              ++failed;
            } else if (status == task_status::cancelled) {
              ++cancelled;
            } else {
              ++wrong;  // a callback for a task that has not ended
            }
          };
          if (rng() % 2 == 0) {
            auto f = ex.submit([n](lane&) { return n * 3; });
            f.on_complete([observe, n](future<int>& done) {
              const auto status = done.status();
              observe(status, status != task_status::succeeded || done.get() == n * 3);
            });
            if (cancel_it) f.cancel();
          } else {
            const std::size_t size = 1 + rng() % 3000;  // up to three pieces
            const float v = static_cast<float>(n % 100);
            // The input must outlive its task: the completion callback holds it until then.
            auto one =
                std::make_shared<std::vector<std::vector<float>>>(1, std::vector<float>(size, v));
            auto fs = ex.map(builtin_kernel::square(), *one);
            auto& f = fs[0];
            f.on_complete([observe, size, v, one](future<host_vector<float>>& done) {
              const auto status = done.status();
              bool right = true;
              if (status == task_status::succeeded) {
                const auto out = done.get();
                right = out.size() == size;
                for (float r : out) right = right && r == v * v;
              }
              observe(status, right);
            });
            if (cancel_it) f.cancel();
          }
        }
      });
    }
    for (auto& s : submitters) s.join();
    ex.shutdown();  // drains: every task has ended once this returns
    for (const auto& m : ex.memory_stats()) EXPECT_EQ(m.in_use, 0u);  // lanes released slots
  }
  int never = 0, twice = 0;
  for (const auto& o : outcomes) {
    never += o->endings.load() == 0 ? 1 : 0;
    twice += o->endings.load() > 1 ? 1 : 0;
  }
  EXPECT_EQ(never, 0) << "futures that never ended";
  EXPECT_EQ(twice, 0) << "futures that ended more than once";
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(succeeded + failed + cancelled, threads * per_thread);
  EXPECT_GT(failed.load(), 0) << "no injected fault reached a task";
  EXPECT_GT(cancelled.load(), 0);
  EXPECT_GT(succeeded.load(), threads * per_thread / 2);
  EXPECT_EQ(pinned_bytes_in_use(), pinned_before);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf(
      "soak: %d tasks from %d threads on %s in %.2f s: %d succeeded, %d failed, "
      "%d cancelled\n",
      threads * per_thread, threads, to_string(kind), seconds, succeeded.load(), failed.load(),
      cancelled.load());
}

}  // namespace
}  // namespace gpupool
