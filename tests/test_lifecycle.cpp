// The executor's life: shutting down with work in flight, constructors that cannot finish,
// absurd options, fork(), and the trace recorder's bounded memory. CPU backend (the parts tested
// here are the same on both backends); multi-device cases follow GPUPOOL_CPU_DEVICES.
#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace gpupool {
namespace {

using namespace std::chrono_literals;
using testing::expect_clean_exit;

executor_options cpu_options(int lanes) {
  return testing::quiet_options(backend_kind::cpu, lanes);
}

TEST(Lifecycle, ShutdownWithCancelLetsAStartedMapFinish) {
  executor_options o = cpu_options(1);
  o.chunk_bytes = 4096;  // many pieces: the map is still running when shutdown comes
  const std::vector<std::vector<float>> big(1, std::vector<float>(std::size_t{1} << 22, 3.0f));
  // On a loaded machine the polling thread may not run until the whole map is done; such an
  // attempt proves nothing, so another is made, until one sees the map running.
  bool caught_running = false;
  for (int attempt = 0; attempt < 20 && !caught_running; ++attempt) {
    executor ex(o);
    auto fs = ex.map(builtin_kernel::square(), big);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (fs[0].status() == task_status::pending && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    caught_running = fs[0].status() == task_status::running;
    ex.shutdown(/*cancel_pending=*/true);
    // Running (or finished) work ends normally: every piece ran, none was cancelled.
    const auto out = fs[0].get();
    ASSERT_EQ(out.size(), big[0].size());
    for (float v : out) ASSERT_EQ(v, 9.0f);
  }
  EXPECT_TRUE(caught_running) << "no attempt saw the map running when shutdown came";
}

// Runs `make` on another thread; fails the test (rather than hanging it) if it takes too long.
template <class F>
void finishes_within(std::chrono::seconds limit, F make) {
  auto done = std::async(std::launch::async, std::move(make));
  ASSERT_EQ(done.wait_for(limit), std::future_status::ready) << "the constructor hangs";
  done.get();
}

TEST(Lifecycle, ALaneThatCannotStartFailsTheConstructorWithoutHanging) {
  for (const char* failing : {"0", "1", "2"}) {
    ::setenv("GPUPOOL_TEST_FAIL_LANE_START", failing, 1);
    finishes_within(20s, [&] {
      try {
        executor ex(cpu_options(3));
        ADD_FAILURE() << "lane " << failing << " could not start, yet the constructor returned";
      } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(std::string("could not start lane ") + failing), std::string::npos)
            << what;
      }
    });
  }
  ::unsetenv("GPUPOOL_TEST_FAIL_LANE_START");
  executor ex(cpu_options(3));  // and the next one works
  EXPECT_EQ(ex.submit([](lane&) { return 7; }).get(), 7);
}

TEST(Lifecycle, AbsurdCountsAreRefusedWithTheLimit) {
  executor_options o = cpu_options(1);
  o.cpu_devices = 1'000'000;
  finishes_within(20s, [&] {
    try {
      executor ex(o);
      ADD_FAILURE() << "a million stand-in devices were accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("1024"), std::string::npos) << e.what();
    }
  });
  o.cpu_devices = 1024;
  o.lanes_per_device = 8;
  try {
    executor ex(o);
    FAIL() << "8192 lanes were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("limit of 4096"), std::string::npos) << e.what();
  }
}

TEST(Lifecycle, AForkedChildIsRefusedClearly) {
  executor ex(cpu_options(2));
  EXPECT_EQ(ex.submit([](lane&) { return 1; }).get(), 1);
  const pid_t child = ::fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    ::alarm(20);  // a hang ends the child with SIGALRM, which the parent reports
    int code = 0;
    try {
      (void)ex.submit([](lane&) { return 2; });
      code = 10;  // accepted: it would never run
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find("fork()") == std::string::npos) code = 11;
    }
    try {
      const std::vector<std::vector<float>> xs(1, std::vector<float>(10, 1.0f));
      (void)ex.map(builtin_kernel::square(), xs);
      code = code ? code : 12;
    } catch (const std::runtime_error&) {
    }
    ex.shutdown();  // returns at once: nothing of the parent's lanes to wait for
    ::_exit(code);
  }
  expect_clean_exit(child);
  EXPECT_EQ(ex.submit([](lane&) { return 3; }).get(), 3);  // the parent's executor is untouched
}

// The child starts a pinned cache of its own: the parent's blocks may come from a backend that
// cannot run there (CUDA's pinned memory, after fork()), so they are neither reused nor given
// back in the child, and a fresh executor there stages through new blocks.
TEST(Lifecycle, AForkedChildHasPinnedMemoryOfItsOwn) {
  void* held = allocate_pinned(1 << 20);
  ASSERT_GE(pinned_bytes_in_use(), std::size_t{1} << 20);
  const pid_t child = ::fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    ::alarm(20);
    int code = 0;
    try {
      if (pinned_bytes_in_use() != 0) code = 20;  // the parent's cache was carried over
      deallocate_pinned(held, 1 << 20);           // the parent's block: left alone here
      executor fresh(cpu_options(1));
      const std::vector<std::vector<double>> xs(4, std::vector<double>(1000, 3.0));
      for (auto& result : fresh.map(builtin_kernel::square(), xs))
        for (double v : result.get())
          if (v != 9.0) code = code ? code : 21;
      fresh.shutdown();
    } catch (...) {
      code = code ? code : 22;
    }
    ::_exit(code);
  }
  expect_clean_exit(child);
  deallocate_pinned(held, 1 << 20);
}

TEST(Lifecycle, LanesLeaveAsynchronousSignalsToTheApplication) {
  executor ex(cpu_options(1));
  const bool lane_blocks_sigint = ex.submit([](lane&) {
                                      sigset_t mask;
                                      pthread_sigmask(SIG_BLOCK, nullptr, &mask);
                                      return sigismember(&mask, SIGINT) == 1;
                                    }).get();
  EXPECT_TRUE(lane_blocks_sigint);  // so Ctrl-C reaches the application's threads
  sigset_t mine;
  pthread_sigmask(SIG_BLOCK, nullptr, &mine);
  EXPECT_EQ(sigismember(&mine, SIGINT), 0);  // the creating thread's mask is as it was
}

TEST(Lifecycle, TraceRecordsAreARingWithADroppedCount) {
  executor ex(cpu_options(2));
  EXPECT_EQ(ex.trace_capacity(), std::size_t{1} << 18);
  ex.set_trace_capacity(100);
  ex.set_tracing(true);
  multi_future<void> fs;
  for (int i = 0; i < 300; ++i) fs.push_back(ex.submit([](lane&) {}));
  fs.get();
  const auto kept = ex.trace().records();
  ASSERT_EQ(kept.size(), 100u);
  EXPECT_EQ(ex.trace_dropped(), 200u);
  for (std::size_t i = 1; i < kept.size(); ++i) EXPECT_LT(kept[i - 1].id, kept[i].id);

  // A later block sees only its own tasks, and the earlier records stay for the outer one.
  const auto first = ex.next_task_id();
  multi_future<void> more;
  for (int i = 0; i < 5; ++i) more.push_back(ex.submit([](lane&) {}));
  more.get();
  const auto inner = ex.trace(first).records();
  ASSERT_EQ(inner.size(), 5u);
  for (const auto& r : inner) EXPECT_GE(r.id, first);
  EXPECT_EQ(ex.trace().records().size(), 100u);

  ex.clear_trace();
  EXPECT_EQ(ex.trace().records().size(), 0u);
  EXPECT_EQ(ex.trace_dropped(), 0u);
}

}  // namespace
}  // namespace gpupool
