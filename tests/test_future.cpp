// Futures on their own: states, values, exceptions, waiting, callbacks, cancellation.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>

#include "gpupool/future.hpp"

namespace gpupool {
namespace {

using namespace std::chrono_literals;

TEST(Future, GetReturnsTheValueOnceAndThenRefuses) {
  auto state = std::make_shared<detail::shared_state<int>>();
  future<int> f(state);
  EXPECT_EQ(f.status(), task_status::pending);
  EXPECT_TRUE(state->try_start());
  state->set_value(42);
  EXPECT_TRUE(f.ready());
  EXPECT_EQ(f.get(), 42);
  EXPECT_THROW(f.get(), std::logic_error);
}

TEST(Future, GetRethrowsTheTasksException) {
  auto state = std::make_shared<detail::shared_state<int>>();
  future<int> f(state);
  state->try_start();
  state->set_exception(std::make_exception_ptr(std::domain_error("bad input")));
  EXPECT_EQ(f.status(), task_status::failed);
  try {
    (void)f.get();
    FAIL() << "get() did not throw";
  } catch (const std::domain_error& e) {
    EXPECT_STREQ(e.what(), "bad input");
  }
}

TEST(Future, FirstResultWinsAndLaterOnesAreIgnored) {
  auto state = std::make_shared<detail::shared_state<int>>();
  future<int> f(state);
  state->try_start();
  state->set_exception(std::make_exception_ptr(std::runtime_error("first")));
  state->set_value(7);
  EXPECT_EQ(f.status(), task_status::failed);
}

TEST(Future, CancelOnlyWhilePending) {
  auto pending = std::make_shared<detail::shared_state<void>>();
  future<void> a(pending);
  EXPECT_TRUE(a.cancel());
  EXPECT_FALSE(pending->try_start());
  EXPECT_THROW(a.get(), cancelled_error);

  auto running = std::make_shared<detail::shared_state<void>>();
  future<void> b(running);
  running->try_start();
  EXPECT_FALSE(b.cancel());
  running->set_value();
  EXPECT_NO_THROW(b.get());
}

TEST(Future, WaitForTimesOutThenSucceeds) {
  auto state = std::make_shared<detail::shared_state<int>>();
  future<int> f(state);
  EXPECT_FALSE(f.wait_for(5ms));
  std::thread t([state] {
    std::this_thread::sleep_for(10ms);
    state->try_start();
    state->set_value(3);
  });
  EXPECT_TRUE(f.wait_for(10s));
  t.join();
  EXPECT_EQ(f.get(), 3);
}

TEST(Future, CallbackRunsOnceWhetherAddedBeforeOrAfterCompletion) {
  auto state = std::make_shared<detail::shared_state<int>>();
  future<int> f(state);
  std::atomic<int> calls{0};
  int seen = 0;
  f.on_complete([&](future<int>& done) {
    ++calls;
    seen = done.get();
  });
  EXPECT_EQ(calls.load(), 0);
  state->try_start();
  state->set_value(9);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(seen, 9);
  // The callback took the value; a late callback still runs, right away.
  f.on_complete([&](future<int>& done) {
    ++calls;
    EXPECT_EQ(done.status(), task_status::succeeded);
  });
  EXPECT_EQ(calls.load(), 2);
}

TEST(Future, DefaultConstructedFutureIsInvalid) {
  future<int> f;
  EXPECT_FALSE(f.valid());
  EXPECT_THROW(f.wait(), std::logic_error);
}

TEST(MultiFuture, GetReturnsValuesInOrderAndRethrowsTheFirstFailure) {
  multi_future<int> all;
  std::vector<std::shared_ptr<detail::shared_state<int>>> states;
  for (int i = 0; i < 3; ++i) {
    states.push_back(std::make_shared<detail::shared_state<int>>());
    all.emplace_back(states.back());
  }
  for (int i = 2; i >= 0; --i) {
    states[i]->try_start();
    states[i]->set_value(i * 10);
  }
  EXPECT_EQ(all.get(), (std::vector<int>{0, 10, 20}));

  multi_future<int> failing;
  auto ok = std::make_shared<detail::shared_state<int>>();
  auto bad = std::make_shared<detail::shared_state<int>>();
  failing.emplace_back(ok);
  failing.emplace_back(bad);
  ok->try_start();
  ok->set_value(1);
  bad->try_start();
  bad->set_exception(std::make_exception_ptr(std::runtime_error("second failed")));
  EXPECT_THROW(failing.get(), std::runtime_error);
}

}  // namespace
}  // namespace gpupool
