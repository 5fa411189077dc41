// Memory pressure is backpressure, not a crash: submitting past the in-flight budget waits for
// room (or raises), a task that can never fit is refused with the sizes, a task that runs in
// pieces fits however large it is, a task's own submits never wait, and an allocation that
// fails fails only its task and gives back what it held. CPU backend on one and two stand-in
// devices (the accounting is the same code on CUDA); the last test needs a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace gpupool {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t per_device_budget = std::size_t{64} << 10;

// True once `condition` holds, false if it does not within `limit` (never a hang).
template <class F>
bool eventually(F condition, std::chrono::seconds limit = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Parameter: the number of CPU stand-in devices.
class MemoryPressure : public ::testing::TestWithParam<int> {
 protected:
  executor_options options(int lanes = 2) const {
    executor_options o = testing::quiet_options(backend_kind::cpu, lanes);
    o.cpu_devices = GetParam();
    o.in_flight_budget = per_device_budget;
    o.chunk_bytes = 4096;
    return o;
  }
  std::size_t total_budget() const {
    return per_device_budget * static_cast<std::size_t>(GetParam());
  }
};

// A task that holds the whole budget until `open` is set; returned once a lane runs it (so the
// queue is empty).
future<void> hold_the_budget(executor& ex, const std::shared_future<void>& open) {
  auto holder = ex.submit_sized(ex.in_flight().budget, [open](lane&) { open.wait(); });
  EXPECT_TRUE(eventually([&] { return holder.status() == task_status::running; }));
  return holder;
}

TEST_P(MemoryPressure, TheBudgetIsPerDeviceAndDefaultsWhenUnset) {
  executor ex(options());
  EXPECT_EQ(ex.in_flight().budget, total_budget());
  executor_options defaults = testing::quiet_options(backend_kind::cpu, 1);
  defaults.cpu_devices = GetParam();
  executor with_defaults(defaults);
  EXPECT_EQ(with_defaults.in_flight().budget,
            (std::size_t{1} << 30) * static_cast<std::size_t>(GetParam()));
  for (const auto& d : with_defaults.devices()) {
    EXPECT_GT(d.free_memory, 0u);
    EXPECT_LE(d.free_memory, d.total_memory);
  }
}

// On a GPU the default budget is half of what each device had free when the executor was made:
// memory another process holds is not counted on.
TEST(MemoryPressureCuda, TheDefaultBudgetIsHalfOfTheFreeMemory) {
  GPUPOOL_SKIP_UNLESS_USABLE(backend_kind::cuda);
  executor ex(testing::quiet_options(backend_kind::cuda, 2));
  std::size_t expected = 0;
  for (const auto& d : ex.devices()) {
    EXPECT_GT(d.free_memory, 0u);
    EXPECT_LT(d.free_memory, d.total_memory);  // the context alone takes some
    expected += d.free_memory / 2;
  }
  EXPECT_EQ(ex.in_flight().budget, expected);
}

// Memory gpupool's pool keeps after a task freed it still counts as free: a later executor's
// default budget is not shrunk by an earlier one's big allocation (it once was, to a few
// megabytes after a test that filled the device).
TEST(MemoryPressureCuda, MemoryThePoolKeepsCountsAsFree) {
  GPUPOOL_SKIP_UNLESS_USABLE(backend_kind::cuda);
  executor first(testing::quiet_options(backend_kind::cuda, 1));
  const std::size_t before = first.devices()[0].free_memory;
  const std::size_t big = std::min<std::size_t>(before / 4, std::size_t{8} << 30);
  first
      .submit_to(0,
                 [big](lane& l) {
                   void* p = l.allocate_bytes(big);
                   l.deallocate_bytes(p, big);
                   l.synchronize();
                 })
      .get();
  first.shutdown();
  executor later(testing::quiet_options(backend_kind::cuda, 1));
  EXPECT_GT(later.devices()[0].free_memory, before - big / 2)
      << "the " << big << " bytes the pool kept were counted as used";
}

TEST_P(MemoryPressure, SubmittersWaitAtTheBudgetAndResumeAsTasksComplete) {
  executor ex(options());
  std::promise<void> open;
  auto holder = hold_the_budget(ex, open.get_future().share());
  EXPECT_EQ(ex.in_flight().bytes, total_budget());

  constexpr int submitters = 3;
  const std::vector<float> x(1024, 3.0f);
  std::vector<std::vector<float>> out(submitters, std::vector<float>(x.size()));
  std::atomic<int> returned{0};
  std::vector<std::thread> threads;
  std::vector<future<void>> results(submitters);
  for (int i = 0; i < submitters; ++i)
    threads.emplace_back([&, i] {
      results[static_cast<std::size_t>(i)] =
          ex.transform(builtin_kernel::square(), std::span<const float>(x),
                       std::span<float>(out[static_cast<std::size_t>(i)]));
      returned.fetch_add(1);
    });
  // Every submitter is counted as waiting, and none has returned while the budget is held.
  ASSERT_TRUE(eventually([&] { return ex.in_flight().waiting == submitters; }))
      << ex.in_flight().waiting << " submitters wait";
  EXPECT_EQ(returned.load(), 0);
  EXPECT_EQ(ex.queued(), 0u) << "a submit past the budget queued its task";

  open.set_value();
  const bool resumed = eventually([&] { return returned.load() == submitters; });
  for (auto& t : threads) t.join();  // after `open`, every submitter can finish
  ASSERT_TRUE(resumed) << "blocked submitters did not resume once the budget was freed";
  holder.get();
  for (int i = 0; i < submitters; ++i) {
    results[static_cast<std::size_t>(i)].get();
    EXPECT_EQ(out[static_cast<std::size_t>(i)][0], 9.0f);
  }
  EXPECT_GE(ex.in_flight().waits, static_cast<std::uint64_t>(submitters));
  EXPECT_LE(ex.in_flight().peak, total_budget());
  EXPECT_TRUE(eventually([&] { return ex.in_flight().bytes == 0; })) << ex.in_flight().bytes;
}

TEST_P(MemoryPressure, AMapWaitsBetweenInputsAndQueuesThoseBeforeTheWait) {
  executor ex(options());
  // Each input counts 2 x 16 KiB. A task holds all of the budget but room for one input, so the
  // map must wait before its second input for the first to finish: had it kept the first in its
  // batch, unqueued, while waiting, neither would ever finish.
  constexpr std::size_t input_cost = 2 * 4096 * sizeof(float);
  std::promise<void> open;
  auto holder = ex.submit_sized(total_budget() - input_cost,
                                [gate = open.get_future().share()](lane&) { gate.wait(); });
  const std::vector<std::vector<float>> xs(3, std::vector<float>(4096, 2.0f));
  auto mapping = std::async(std::launch::async, [&] {
    auto all = ex.map(builtin_kernel::square(), xs);
    for (auto& f : all) {
      const auto v = f.get();
      EXPECT_EQ(v.size(), 4096u);
      EXPECT_EQ(v[0], 4.0f);
    }
  });
  const bool finished = mapping.wait_for(20s) == std::future_status::ready;
  open.set_value();
  ASSERT_TRUE(finished) << "the map waited for room its own unqueued inputs held";
  mapping.get();
  holder.get();
  EXPECT_LE(ex.in_flight().peak, total_budget());
}

TEST_P(MemoryPressure, AMapOfMixedSizesStaysInTheBudgetAndGivesEveryByteBack) {
  executor ex(options());
  // Inputs of many sizes: the map takes a batch's bytes ahead where they fit, at the first
  // input's cost, and must give back what later, smaller inputs did not use.
  std::vector<std::vector<float>> xs;
  for (std::size_t i = 0; i < 1500; ++i)
    xs.emplace_back(1 + (i * 7919) % 6000, static_cast<float>(i % 13));
  auto all = ex.map(builtin_kernel::square(), xs);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const auto v = all[i].get();
    ASSERT_EQ(v.size(), xs[i].size());
    EXPECT_EQ(v.back(), xs[i].back() * xs[i].back());
  }
  EXPECT_LE(ex.in_flight().peak, total_budget());
  ASSERT_TRUE(eventually([&] { return ex.in_flight().bytes == 0; }))
      << ex.in_flight().bytes << " bytes still counted after every input ended";
}

TEST_P(MemoryPressure, BytesTakenAheadForCheaperInputsAreGivenBackAtTheMapsEnd) {
  executor ex(options());
  // The first input's cost, taken ahead for every input after it, is more than the four small
  // ones use: what is left must go back when the map has queued them.
  std::vector<std::vector<float>> xs{std::vector<float>(64, 2.0f)};
  for (int i = 0; i < 4; ++i) xs.emplace_back(1, 3.0f);
  auto all = ex.map(builtin_kernel::square(), xs);
  EXPECT_EQ(all[0].get()[0], 4.0f);
  for (std::size_t i = 1; i < xs.size(); ++i) EXPECT_EQ(all[i].get()[0], 9.0f);
  ASSERT_TRUE(eventually([&] { return ex.in_flight().bytes == 0; }))
      << ex.in_flight().bytes << " bytes still counted after every input ended";
}

TEST_P(MemoryPressure, AMapCountsNoMoreThanItsInputsAndASixteenthOfTheBudgetAhead) {
  executor ex(options());
  // A larger input first, then many tiny ones: bytes taken ahead at the first one's cost for a
  // whole batch would count far more than any work holds, refusing other submitters room (or
  // keeping them waiting) while the map runs. What the map may count at most: every input's own
  // bytes, and a sixteenth of the budget taken ahead.
  std::vector<std::vector<float>> xs{std::vector<float>(32, 1.0f)};
  for (int i = 0; i < 2000; ++i) xs.emplace_back(1, 2.0f);
  std::size_t inputs_cost = 0;
  for (const auto& x : xs) inputs_cost += 2 * x.size() * sizeof(float);
  auto all = ex.map(builtin_kernel::square(), xs);
  for (std::size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].get().size(), xs[i].size());
  EXPECT_LE(ex.in_flight().peak, inputs_cost + total_budget() / 16);
}

TEST_P(MemoryPressure, RaiseModeThrowsWithTheSizesAndQueuesNothing) {
  executor_options o = options();
  o.when_full = when_full::raise;
  executor ex(o);
  std::promise<void> open;
  auto holder = hold_the_budget(ex, open.get_future().share());
  const std::vector<float> x(1024, 3.0f);
  std::vector<float> out(x.size(), 0.0f);
  try {
    (void)ex.transform(builtin_kernel::square(), std::span<const float>(x), std::span<float>(out));
    ADD_FAILURE() << "a transform past the budget was accepted in raise mode";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("submitting 8192 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("budget of " + std::to_string(total_budget())), std::string::npos) << what;
  }
  EXPECT_EQ(ex.queued(), 0u);
  EXPECT_EQ(ex.in_flight().bytes, total_budget());
  open.set_value();
  holder.get();
  ASSERT_TRUE(eventually([&] { return ex.in_flight().bytes == 0; }));
  ex.transform(builtin_kernel::square(), std::span<const float>(x), std::span<float>(out)).get();
  EXPECT_EQ(out[0], 9.0f);
}

TEST_P(MemoryPressure, ATaskThatCannotBeSplitAndPassesTheBudgetIsRefusedAtOnce) {
  for (const when_full mode : {when_full::block, when_full::raise}) {
    executor_options o = options();
    o.when_full = mode;
    executor ex(o);
    bool ran = false;
    try {
      (void)ex.submit_sized(total_budget() + 1, [&ran](lane&) { ran = true; });
      ADD_FAILURE() << "a task larger than the budget was accepted";
    } catch (const out_of_memory& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::to_string(total_budget() + 1) + " bytes"), std::string::npos)
          << what;
      EXPECT_NE(what.find(std::to_string(per_device_budget) + " per device x " +
                          std::to_string(GetParam()) + " devices"),
                std::string::npos)
          << what;
    }
    ex.shutdown();
    EXPECT_FALSE(ran);
    EXPECT_EQ(ex.in_flight().bytes, 0u);
  }
}

TEST_P(MemoryPressure, APiecewiseTaskLargerThanTheBudgetStillCompletes) {
  executor ex(options());
  // 4 x the whole budget in one array: it streams through the slots in pieces of 4 KiB.
  const std::size_t n = 4 * total_budget() / sizeof(float);
  std::vector<float> x(n, 3.0f), y(n, 2.0f), out(n, 0.0f);
  ex.transform(builtin_kernel::square(), std::span<const float>(x), std::span<float>(out)).get();
  for (float v : out) ASSERT_EQ(v, 9.0f);
  ex.transform(builtin_kernel::add(), std::span<const float>(x), std::span<const float>(y),
               std::span<float>(out))
      .get();
  for (float v : out) ASSERT_EQ(v, 5.0f);
  const std::vector<std::vector<float>> inputs{x, y};  // read in place: alive until done
  auto mapped = ex.map(builtin_kernel::square(), inputs);
  EXPECT_EQ(mapped[0].get()[n - 1], 9.0f);
  EXPECT_EQ(mapped[1].get()[n - 1], 4.0f);
  // It counted as the whole budget, no more.
  EXPECT_EQ(ex.in_flight().peak, total_budget());
  EXPECT_TRUE(eventually([&] { return ex.in_flight().bytes == 0; }));
}

TEST_P(MemoryPressure, ASubmitFromInsideATaskIsAdmittedOverTheBudget) {
  executor ex(options(/*lanes=*/2));
  const std::vector<float> x(1024, 3.0f);
  std::vector<float> out(x.size(), 0.0f);
  // The task holds the whole budget and waits for work it submits: were that submit to wait for
  // room, only the task's own end could make it, and neither would ever finish.
  auto outer = ex.submit_sized(total_budget(), [&](lane&) {
    auto inner =
        ex.transform(builtin_kernel::square(), std::span<const float>(x), std::span<float>(out));
    return inner.wait_for(20s);
  });
  ASSERT_TRUE(outer.wait_for(30s)) << "a submit from inside a task never returned";
  EXPECT_TRUE(outer.get()) << "the inner task did not run";
  EXPECT_EQ(out[0], 9.0f);
  EXPECT_GT(ex.in_flight().peak, total_budget());
  EXPECT_TRUE(eventually([&] { return ex.in_flight().bytes == 0; }));
}

TEST_P(MemoryPressure, ShutdownWakesAWaitingSubmitter) {
  executor ex(options());
  std::promise<void> open;
  auto holder = hold_the_budget(ex, open.get_future().share());
  const std::vector<float> x(1024, 3.0f);
  std::vector<float> out(x.size());
  auto submitted = std::async(std::launch::async, [&] {
    (void)ex.transform(builtin_kernel::square(), std::span<const float>(x), std::span<float>(out));
  });
  ASSERT_TRUE(eventually([&] { return ex.in_flight().waiting == 1; }));
  // shutdown() waits for the holder, so the budget is opened from another thread, once intake
  // has stopped: the waiting submit fails whether it wakes to the shutdown or to the room.
  std::thread opener([&] {
    (void)eventually([&] { return ex.is_shutdown(); });
    open.set_value();
  });
  ex.shutdown();
  opener.join();
  ASSERT_EQ(submitted.wait_for(20s), std::future_status::ready);
  EXPECT_THROW(submitted.get(), std::runtime_error);
  holder.get();
}

TEST_P(MemoryPressure, SubmitsRacingShutdownGiveEveryByteBack) {
  executor ex(options());
  // Read in place by every map until shutdown has resolved every future.
  const std::vector<std::vector<float>> xs(8, std::vector<float>(2048, 3.0f));
  constexpr int submitters = 4;
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < submitters; ++i)
    threads.emplace_back([&] {
      try {
        for (;;) (void)ex.map(builtin_kernel::square(), xs);
      } catch (const std::runtime_error&) {
        refused.fetch_add(1);  // shut down, while submitting or waiting for room
      }
    });
  ASSERT_TRUE(eventually([&] { return ex.in_flight().waits > 0; }));
  ex.shutdown();
  for (auto& t : threads) t.join();
  EXPECT_EQ(refused.load(), submitters);
  // Every task ended (ran, or was cancelled as it could not be queued): nothing is left counted.
  EXPECT_TRUE(eventually([&] { return ex.in_flight().bytes == 0; })) << ex.in_flight().bytes;
}

TEST_P(MemoryPressure, WorkRefusedAtSubmitGivesItsBytesBack) {
  executor ex(options());
  const std::vector<std::vector<std::int32_t>> xs(3, std::vector<std::int32_t>(1024, 1));
  // The alpha does not fit int32: refused as the map builds its first input.
  EXPECT_THROW((void)ex.map(builtin_kernel::scale(2147483648.0), xs), argument_range_error);
  std::vector<std::int32_t> out(1024);
  EXPECT_THROW((void)ex.transform<std::int32_t>(builtin_kernel::scale(0.5), xs[0], out),
               argument_kind_error);
  EXPECT_EQ(ex.in_flight().bytes, 0u);
  auto fs = ex.map(builtin_kernel::scale(2.0), xs);
  for (auto& f : fs) EXPECT_EQ(f.get()[0], 2);  // every input read before `xs` goes
}

// A callback on one executor's lane that cancels another executor's queued task gives that
// task's bytes back at once, not at the end of the lane's completion pass: by then the other
// executor may be gone, or the callback itself may wait on it for room.
TEST_P(MemoryPressure, ABudgetOfAnotherExecutorGetsItsBytesBackAtOnceFromALanesPass) {
  executor a(options(1)), b(options(1));
  testing::gate g;
  auto holders = testing::hold_every_lane(b, g);
  testing::open_at_exit opener(g, holders);
  auto queued = b.submit_sized(b.in_flight().budget, [](lane&) {});
  ASSERT_EQ(b.in_flight().bytes, b.in_flight().budget);
  std::atomic<bool> cancelled{false};
  std::atomic<std::size_t> left_in_b{1};
  testing::gate a_runs;  // holds a's task until its callback is registered: then the callback
                         // runs where the task ends, on a's lane, inside its completion pass
  auto on_a = a.submit([&a_runs](lane&) { a_runs.wait(); });
  on_a.on_complete([&](future<void>&) {
    cancelled = queued.cancel();
    left_in_b = b.in_flight().bytes;
  });
  a_runs.open();
  a.shutdown();  // every pass of a's lanes has ended, the callback's too
  EXPECT_TRUE(cancelled.load());
  EXPECT_EQ(left_in_b.load(), 0u) << "b's bytes waited for the end of a's lane's pass";
}

// A map input that fails lets go of its output block when it fails, not when its future goes:
// the job lives on with the future's state.
TEST_P(MemoryPressure, AFailedMapInputGivesItsOutputBackWhileItsFutureLives) {
  testing::scoped_env env("GPUPOOL_FAULTS", "launch=1,seed=3");  // every launch fails
  executor ex(options());
  const std::size_t before = pinned_bytes_in_use();
  constexpr std::size_t n = std::size_t{64} << 10;  // 512 KiB of float64: pinned result blocks
  const std::vector<std::vector<double>> xs(4, std::vector<double>(n, 2.0));
  auto futures = ex.map(builtin_kernel::square(), xs);
  for (auto& f : futures) {
    f.wait();
    EXPECT_EQ(f.status(), task_status::failed);
  }
  EXPECT_TRUE(eventually([&] { return ex.in_flight().bytes == 0; }));
  // Lanes may have made staging buffers meanwhile (chunk_bytes, 4 KiB each), not a result.
  EXPECT_LT(pinned_bytes_in_use(), before + n * sizeof(double))
      << "failed inputs still hold their output blocks";
}

TEST_P(MemoryPressure, AllocationFailuresFailOnlyTheirTasksAndGiveMemoryBack) {
  testing::scoped_env env("GPUPOOL_FAULTS", "alloc=0.2,seed=14");
  // Pinned memory is counted from before the executor to after it: its lanes make staging
  // buffers on first use, and give them back when they stop.
  const std::size_t pinned_baseline = pinned_bytes_in_use();
  std::optional<executor> pool(std::in_place, options());
  executor& ex = *pool;
  std::vector<std::size_t> baseline;
  for (const auto& m : ex.memory_stats()) baseline.push_back(m.in_use);

  constexpr int tasks = 200;
  constexpr std::size_t n = 1024;
  const std::vector<float> x(n, 3.0f);
  std::vector<future<float>> results;
  for (int i = 0; i < tasks; ++i)
    // Three allocations per task: a failure may come after others succeeded, which the task
    // must then give back as it fails.
    results.push_back(ex.submit_sized(3 * n * sizeof(float), [&x](lane& l) {
      auto a = l.upload(std::span<const float>(x));
      auto b = l.allocate<float>(n);
      auto c = l.allocate<float>(n);
      l.apply(builtin_kernel::square(), a);
      std::vector<float> back(n);
      l.download(a, std::span<float>(back));
      return back[0];
    }));
  int succeeded = 0, failed = 0, succeeded_after_a_failure = 0;
  for (auto& f : results) {
    try {
      EXPECT_EQ(f.get(), 9.0f);
      ++succeeded;
      if (failed > 0) ++succeeded_after_a_failure;
    } catch (const out_of_memory& e) {
      EXPECT_NE(std::string(e.what()).find("injected fault (alloc)"), std::string::npos)
          << e.what();
      ++failed;
    }
  }
  EXPECT_EQ(succeeded + failed, tasks);
  EXPECT_GT(failed, 0) << "no allocation failed";
  EXPECT_GT(succeeded_after_a_failure, 0) << "the pool did not go on after a failure";
  // Built-in kernels on the slots made at start run on.
  std::vector<float> out(n);
  ex.transform(builtin_kernel::square(), std::span<const float>(x), std::span<float>(out)).get();
  EXPECT_EQ(out[0], 9.0f);
  EXPECT_TRUE(eventually([&] { return ex.in_flight().bytes == 0; })) << ex.in_flight().bytes;
  const auto stats = ex.memory_stats();
  for (std::size_t d = 0; d < stats.size(); ++d)
    EXPECT_EQ(stats[d].in_use, baseline[d]) << "device " << d << " holds memory of failed tasks";
  pool.reset();
  EXPECT_EQ(pinned_bytes_in_use(), pinned_baseline);
}

INSTANTIATE_TEST_SUITE_P(StandInDevices, MemoryPressure, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& devices) {
                           return std::to_string(devices.param) + "_devices";
                         });

// A real cudaErrorMemoryAllocation: a task asks for more than the device has. It fails with
// out_of_memory, gives back what it held, and the next tasks run.
TEST(MemoryPressureCuda, ARealAllocationFailureFailsOnlyItsTask) {
  GPUPOOL_SKIP_UNLESS_USABLE(backend_kind::cuda);
  executor ex(testing::quiet_options(backend_kind::cuda, 2));
  const std::size_t baseline = ex.memory_stats()[0].in_use;
  const std::size_t too_much = ex.devices()[0].total_memory + (std::size_t{1} << 30);
  auto failing = ex.submit_to(0, [too_much](lane& l) {
    auto held = l.allocate<char>(std::size_t{64} << 20);  // given back as the task fails
    auto huge = l.allocate<char>(too_much);
    return huge.size() + held.size();
  });
  try {
    (void)failing.get();
    ADD_FAILURE() << "allocating " << too_much << " bytes succeeded";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("cudaErrorMemoryAllocation"), std::string::npos)
        << e.what();
  }
  const std::vector<float> x(1 << 20, 3.0f);
  std::vector<float> out(x.size());
  ex.transform(builtin_kernel::square(), std::span<const float>(x), std::span<float>(out)).get();
  EXPECT_EQ(out.back(), 9.0f);
  ex.submit_to(0, [](lane& l) { l.synchronize(); }).get();
  EXPECT_EQ(ex.memory_stats()[0].in_use, baseline);
}

}  // namespace
}  // namespace gpupool
