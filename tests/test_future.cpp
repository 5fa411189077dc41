// Futures on their own: states, values, exceptions, waiting, callbacks, cancellation, and the
// cheap paths (callbacks on the completing thread, exactly once, without allocating).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/sanitizers.hpp"
#include "core/scheduling/lane_spin.hpp"
#include "gpupool/future.hpp"
#include "test_support.hpp"

// Counts the allocations of each thread, to show that the completion path makes none. Left out
// under sanitizers, which bring their own operator new.
#if !defined(GPUPOOL_UNDER_ADDRESS_SANITIZER) && !defined(GPUPOOL_UNDER_THREAD_SANITIZER)
#define GPUPOOL_TEST_COUNTS_ALLOCATIONS 1
namespace {
thread_local std::size_t allocations_here = 0;
thread_local std::size_t allocations_until_failure = 0;  // 0: none fails
}  // namespace

void* operator new(std::size_t bytes) {
  ++allocations_here;
  if (allocations_until_failure != 0 && --allocations_until_failure == 0) throw std::bad_alloc();
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
// The replacement pair allocates with malloc and frees with free; GCC sees only the free after
// a `new` and would call it a mismatch.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t /*bytes*/) noexcept {
  std::free(p);
}
#pragma GCC diagnostic pop

bool gpupool::testing::fail_allocation_on_this_thread(std::size_t n) {
  allocations_until_failure = n;
  return true;
}
#else
bool gpupool::testing::fail_allocation_on_this_thread(std::size_t /*n*/) {
  return false;
}
#endif

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

// A waiter looks for the outcome before it sleeps (detail::set_waiter_spin), never past its
// deadline, whether it looks at all or sleeps at once; an outcome set while it looks or while it
// sleeps is seen either way.
TEST(Future, AWaiterLooksBeforeItSleepsWithinItsDeadlineAndSeesTheOutcomeEitherWay) {
  for (const auto spin : {0us, 50us, 100us}) {
    detail::set_waiter_spin(spin);
    auto state = std::make_shared<detail::shared_state<int>>();
    future<int> f(state);
    EXPECT_FALSE(f.wait_for(0ms)) << spin.count();
    EXPECT_FALSE(f.wait_for(-1ms)) << spin.count();
    const auto began = std::chrono::steady_clock::now();
    EXPECT_FALSE(f.wait_for(20us)) << spin.count();
    EXPECT_FALSE(f.wait_for(3ms)) << spin.count();
    EXPECT_GE(std::chrono::steady_clock::now() - began, 3ms) << spin.count();
    for (const auto after : {0us, 30us, 2000us}) {
      auto s = std::make_shared<detail::shared_state<int>>();
      future<int> g(s);
      std::thread t([s, after] {
        std::this_thread::sleep_for(after);
        s->try_start();
        s->set_value(7);
      });
      EXPECT_TRUE(g.wait_for(10s)) << spin.count() << " " << after.count();
      t.join();
      EXPECT_EQ(g.get(), 7);
    }
  }
  detail::set_waiter_spin(detail::default_lane_spin);
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

TEST(Future, CallbacksRunOnceEachInOrderOnTheCompletingThread) {
  auto state = std::make_shared<detail::shared_state<int>>();
  future<int> f(state);
  std::vector<int> order;
  std::vector<std::thread::id> ran_on;
  for (int i = 0; i < 3; ++i)
    f.on_complete([&, i](future<int>& done) {
      order.push_back(i);
      ran_on.push_back(std::this_thread::get_id());
      EXPECT_EQ(done.status(), task_status::succeeded);
    });
  std::thread::id completer;
  std::thread t([&] {
    completer = std::this_thread::get_id();
    state->try_start();
    state->set_value(1);
  });
  t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  ASSERT_EQ(ran_on.size(), 3u);
  for (const auto& id : ran_on) EXPECT_EQ(id, completer);
  EXPECT_EQ(f.get(), 1);
}

TEST(Future, CallbacksRegisteredWhileTheTaskCompletesRunExactlyOnce) {
  for (int round = 0; round < 500; ++round) {
    auto state = std::make_shared<detail::shared_state<int>>();
    future<int> f(state);
    std::atomic<int> calls{0};
    std::atomic<int> wrong{0};
    std::atomic<bool> go{false};
    std::thread registrar([&] {
      while (!go.load()) {
      }
      for (int i = 0; i < 4; ++i)
        f.on_complete([&](future<int>& done) {
          ++calls;
          if (done.status() != task_status::succeeded) ++wrong;
        });
    });
    std::thread completer([&] {
      while (!go.load()) {
      }
      state->try_start();
      state->set_value(round);
    });
    go.store(true);
    registrar.join();
    completer.join();
    ASSERT_EQ(calls.load(), 4) << "round " << round;
    ASSERT_EQ(wrong.load(), 0);
  }
}

TEST(Future, EveryWaiterIsWoken) {
  for (int round = 0; round < 50; ++round) {
    auto state = std::make_shared<detail::shared_state<void>>();
    std::atomic<int> woken{0};
    std::vector<std::thread> waiters;
    for (int i = 0; i < 4; ++i)
      waiters.emplace_back([&, i] {
        future<void> f(state);
        if (i % 2 == 0) {
          f.wait();
          ++woken;
        } else if (f.wait_for(60s)) {
          ++woken;
        }
      });
    if (round % 2 == 0) std::this_thread::sleep_for(1ms);  // some rounds: waiters asleep first
    state->try_start();
    state->set_value();
    for (auto& t : waiters) t.join();
    ASSERT_EQ(woken.load(), 4) << "round " << round;
  }
}

TEST(Future, CancellingWakesWaitersAndRunsCallbacks) {
  auto state = std::make_shared<detail::shared_state<int>>();
  future<int> f(state);
  std::atomic<int> callbacks{0};
  f.on_complete([&](future<int>& done) {
    EXPECT_EQ(done.status(), task_status::cancelled);
    ++callbacks;
  });
  std::thread waiter([state] { future<int>(state).wait(); });
  std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(f.cancel());
  waiter.join();
  EXPECT_EQ(callbacks.load(), 1);
  EXPECT_FALSE(state->try_start());
  EXPECT_THROW((void)f.get(), cancelled_error);
}

TEST(Future, TheValueIsHandedOverToOneTakerOnly) {
  for (int round = 0; round < 200; ++round) {
    auto state = std::make_shared<detail::shared_state<int>>();
    state->try_start();
    state->set_value(5);
    std::atomic<int> got{0}, refused{0};
    std::vector<std::thread> takers;
    for (int i = 0; i < 3; ++i)
      takers.emplace_back([&] {
        future<int> f(state);
        try {
          if (f.get() == 5) ++got;
        } catch (const std::logic_error&) {
          ++refused;
        }
      });
    for (auto& t : takers) t.join();
    ASSERT_EQ(got.load(), 1);
    ASSERT_EQ(refused.load(), 2);
  }
}

// A value whose move throws, the first time only.
struct fragile {
  static inline int moves_left_to_fail = 0;
  int v = 0;
  explicit fragile(int x) : v(x) {}
  fragile(fragile&& other) : v(other.v) {
    if (moves_left_to_fail > 0) {
      --moves_left_to_fail;
      throw std::runtime_error("move failed");
    }
  }
  fragile& operator=(fragile&&) = default;
};

TEST(Future, AValueThatCannotBeStoredLeavesTheTaskToFailNormally) {
  auto state = std::make_shared<detail::shared_state<fragile>>();
  future<fragile> f(state);
  state->try_start();
  fragile::moves_left_to_fail = 1;
  EXPECT_THROW(state->set_value(fragile(3)), std::runtime_error);
  EXPECT_EQ(f.status(), task_status::running);
  EXPECT_FALSE(f.ready());
  state->set_exception(std::make_exception_ptr(std::runtime_error("stored instead")));
  EXPECT_EQ(f.status(), task_status::failed);
  EXPECT_THROW((void)f.get(), std::runtime_error);
}

TEST(CompletionBatch, DeferredWorkRunsOnceAtTheEndOfTheOutermostBatch) {
  std::vector<int> log;
  auto note = [](void* arg) {
    auto* l = static_cast<std::vector<int>*>(arg);
    l->push_back(static_cast<int>(l->size()));
  };
  // No batch open: nothing is kept; the caller does its work itself.
  EXPECT_FALSE(detail::completion_batch::open());
  EXPECT_FALSE(detail::completion_batch::defer(note, &log));
  EXPECT_TRUE(log.empty());
  {
    detail::completion_batch outer;
    auto state = std::make_shared<detail::shared_state<int>>();
    future<int> f(state);
    bool callback_ran = false;
    f.on_complete([&](future<int>&) {
      callback_ran = true;  // callbacks themselves run at once
      EXPECT_TRUE(detail::completion_batch::defer(note, &log));
    });
    {
      detail::completion_batch inner;
      state->try_start();
      state->set_value(1);
      EXPECT_TRUE(callback_ran);
    }
    EXPECT_TRUE(log.empty());  // the inner batch's end is not the outermost
    EXPECT_TRUE(detail::completion_batch::defer(note, &log));
    EXPECT_TRUE(log.empty());
  }
  EXPECT_EQ(log, (std::vector<int>{0, 1}));
  EXPECT_FALSE(detail::completion_batch::open());
}

TEST(CompletionBatch, WorkDeferredWhileTheBatchEndsRunsInTheSameEndAndBatchesArePerThread) {
  struct chain {
    int runs = 0;
    static void step(void* arg) {
      auto* c = static_cast<chain*>(arg);
      if (++c->runs < 3) {
        EXPECT_TRUE(detail::completion_batch::defer(step, c));
      }
    }
  } c;
  {
    detail::completion_batch batch;
    EXPECT_TRUE(detail::completion_batch::defer(chain::step, &c));
    std::thread other([] { EXPECT_FALSE(detail::completion_batch::open()); });
    other.join();
  }
  EXPECT_EQ(c.runs, 3);
}

// What a task's admitted bytes go back to (the executor's in-flight budget): counts its calls.
class counting_account final : public detail::budget_account {
 public:
  void give_back(std::size_t given) noexcept override {
    ++calls;
    bytes += given;
  }
  int calls = 0;
  std::size_t bytes = 0;
};

TEST(BudgetHold, HeldBytesComeBackAsTheStateEndsHoweverItEnds) {
  counting_account account;
  auto succeeds = std::make_shared<detail::shared_state<int>>();
  auto fails = std::make_shared<detail::shared_state<int>>();
  auto cancelled = std::make_shared<detail::shared_state<int>>();
  auto unheld = std::make_shared<detail::shared_state<int>>();
  succeeds->hold(account, 100);
  fails->hold(account, 20);
  cancelled->hold(account, 3);
  succeeds->try_start();
  EXPECT_EQ(account.calls, 0);
  succeeds->set_value(1);
  EXPECT_EQ(account.bytes, 100u);
  fails->set_exception(std::make_exception_ptr(std::runtime_error("x")));
  EXPECT_EQ(account.bytes, 120u);
  EXPECT_TRUE(cancelled->try_cancel());
  EXPECT_EQ(account.bytes, 123u);
  unheld->set_value(2);
  // Once each: a second ending is ignored, and so are its bytes.
  succeeds->set_value(5);
  EXPECT_FALSE(cancelled->try_cancel());
  EXPECT_EQ(account.calls, 3);
  EXPECT_EQ(account.bytes, 123u);
}

TEST(BudgetHold, APassGivesItsOwnAccountsBytesBackOnceAtItsEndAndOthersAtOnce) {
  counting_account own, other;
  std::vector<std::shared_ptr<detail::shared_state<int>>> states;
  for (int i = 0; i < 6; ++i) {
    states.push_back(std::make_shared<detail::shared_state<int>>());
    states.back()->hold(i < 4 ? own : other, 10);
  }
  {
    detail::completion_batch pass(&own);
    {
      detail::completion_batch inner;  // a nested batch keeps the outer one's account
      for (int i = 0; i < 4; ++i) states[static_cast<std::size_t>(i)]->set_value(i);
    }
    EXPECT_EQ(own.calls, 0) << "given back before the pass ended";
    // Another account's bytes (another executor's: it may be gone, or waited on here, before
    // the pass ends) go back at once.
    states[4]->set_value(4);
    EXPECT_TRUE(states[5]->try_cancel());
    EXPECT_EQ(other.calls, 2);
    EXPECT_EQ(other.bytes, 20u);
  }
  EXPECT_EQ(own.calls, 1);
  EXPECT_EQ(own.bytes, 40u);
  // Outside any pass, at once.
  auto later = std::make_shared<detail::shared_state<int>>();
  later->hold(own, 5);
  later->set_value(0);
  EXPECT_EQ(own.calls, 2);
  EXPECT_EQ(own.bytes, 45u);
}

TEST(BudgetHold, APassesBytesAreBackBeforeItsDeferredWorkRunsAndWhatThatWorkEndsAtOnce) {
  static counting_account own;
  own = {};
  auto first = std::make_shared<detail::shared_state<int>>();
  static std::shared_ptr<detail::shared_state<int>> ended_by_deferred_work;
  ended_by_deferred_work = std::make_shared<detail::shared_state<int>>();
  first->hold(own, 100);
  ended_by_deferred_work->hold(own, 7);
  static std::size_t bytes_back_when_deferred_work_ran = 0;
  static std::size_t bytes_back_after_the_deferred_end = 0;
  {
    detail::completion_batch pass(&own);
    // Deferred before the task ends, as a hand-over of an earlier result would be. A task it
    // ends gives its bytes back at once (the deferred work may go on to wait for room).
    EXPECT_TRUE(detail::completion_batch::defer(
        [](void*) {
          bytes_back_when_deferred_work_ran = own.bytes;
          ended_by_deferred_work->set_value(1);
          bytes_back_after_the_deferred_end = own.bytes;
        },
        nullptr));
    first->set_value(1);
  }
  EXPECT_EQ(bytes_back_when_deferred_work_ran, 100u);
  EXPECT_EQ(own.bytes, 107u);
  EXPECT_EQ(own.calls, 2);
  EXPECT_EQ(bytes_back_after_the_deferred_end, 107u);
  ended_by_deferred_work.reset();
}

#ifdef GPUPOOL_TEST_COUNTS_ALLOCATIONS
TEST(Future, NeitherACallbackNorTheCompletionAllocates) {
  auto state = std::make_shared<detail::shared_state<int>>();
  future<int> f(state);
  int seen = 0;
  std::function<void(future<int>&)> cb = [&seen](future<int>& done) { seen = done.get(); };
  const std::size_t before = allocations_here;
  f.on_complete(std::move(cb));  // stored as it is: no wrapper, no list for the first one
  state->try_start();
  state->set_value(7);  // no waiter: no lock, no notification
  EXPECT_EQ(allocations_here - before, 0u);
  EXPECT_EQ(seen, 7);
}
#endif

}  // namespace
}  // namespace gpupool
