// The executor on each backend: every test runs on the CPU backend, and again on CUDA where a GPU
// is usable (skipping, with the reason, where it is not).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_support.hpp"

namespace gpupool {
namespace {

using namespace std::chrono_literals;
using testing::gate;
using testing::hold_every_lane;
using testing::matches_reference;
using testing::open_at_exit;
using testing::random_vector;

class ExecutorTest : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override { GPUPOOL_SKIP_UNLESS_USABLE(GetParam()); }

  executor_options options(int lanes = 2) const {
    executor_options o;
    o.backend = GetParam();
    o.lanes_per_device = lanes;
    o.quiet = true;
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, ExecutorTest,
                         ::testing::Values(backend_kind::cpu, backend_kind::cuda),
                         testing::backend_name);

TEST_P(ExecutorTest, ReportsItsBackendDevicesAndLanes) {
  executor ex(options(3));
  EXPECT_EQ(ex.backend(), GetParam());
  ASSERT_FALSE(ex.devices().empty());
  EXPECT_EQ(ex.lanes_per_device(), 3);
  EXPECT_EQ(ex.lane_count(), 3 * static_cast<int>(ex.devices().size()));
  for (std::size_t i = 0; i < ex.devices().size(); ++i) {
    EXPECT_EQ(ex.devices()[i].id, static_cast<int>(i));
    EXPECT_FALSE(ex.devices()[i].name.empty());
    EXPECT_GT(ex.devices()[i].total_memory, 0u);
  }
}

TEST_P(ExecutorTest, MapResultsLandInPinnedMemoryWithNoStageOut) {
  executor ex(options(1));
  ex.set_tracing(true);
  const auto x = random_vector<double>(16384, 4);  // 128 KiB: pinned storage
  const auto tiny = random_vector<double>(16, 5);  // 128 bytes: ordinary heap
  const std::uint64_t first = ex.next_task_id();
  auto big = ex.map(builtin_kernel::square(), std::vector<std::vector<double>>{x}).get();
  auto small = ex.map(builtin_kernel::square(), std::vector<std::vector<double>>{tiny}).get();
  EXPECT_TRUE(is_pinned(big[0].data()));
  EXPECT_FALSE(is_pinned(small[0].data()));
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(big[0][i], x[i] * x[i]);
  for (std::size_t i = 0; i < tiny.size(); ++i) ASSERT_EQ(small[0][i], tiny[i] * tiny[i]);
  const auto records = ex.trace(first).records();
  ASSERT_EQ(records.size(), 2u);
  // Downloaded straight into the result: no copy out of the staging slot.
  EXPECT_FALSE(records[0].stage_out.present());
  EXPECT_TRUE(records[1].stage_out.present());
}

TEST_P(ExecutorTest, SubmitRunsOnALaneAndReturnsTheValue) {
  executor ex(options());
  auto f = ex.submit([](lane& l) { return l.index() * 100 + 7; });
  const int v = f.get();
  EXPECT_EQ(v % 100, 7);
  EXPECT_LT(v / 100, ex.lane_count());
}

// A submitted callable is built by the public template in storage the library allocates (one
// block with the item a lane takes): it keeps its alignment, runs once, and is destroyed once,
// whether it ran or was moved from. Move-only callables and results work.
TEST_P(ExecutorTest, SubmittedCallablesKeepTheirAlignmentAndLiveOnce) {
  executor ex(options());
  struct alignas(128) over_aligned {
    unsigned char bytes[200] = {};
  };
  over_aligned big;
  big.bytes[199] = 42;
  auto aligned = ex.submit([big](lane&) {
    return reinterpret_cast<std::uintptr_t>(&big) % alignof(over_aligned) == 0 &&
           big.bytes[199] == 42;
  });
  EXPECT_TRUE(aligned.get()) << "the callable lost its alignment or its captures";

  static std::atomic<int> alive{0};
  struct counted {
    counted() { alive.fetch_add(1); }
    counted(const counted&) { alive.fetch_add(1); }
    counted(counted&&) noexcept { alive.fetch_add(1); }
    ~counted() { alive.fetch_sub(1); }
  };
  {
    auto moved = ex.submit([c = counted(), p = std::make_unique<int>(9)](lane&) {
      (void)c;
      return std::make_unique<int>(*p + 1);
    });
    EXPECT_EQ(*moved.get(), 10);
    ex.shutdown();  // every item is freed once the lanes stop
  }
  EXPECT_EQ(alive.load(), 0) << "a callable was leaked or destroyed twice";
}

// A callable whose copy throws is never queued, and the bytes it was admitted with go back.
TEST_P(ExecutorTest, ACallableThatCannotBeCopiedGivesItsBytesBack) {
  executor ex(options());
  struct throws_on_copy {
    throws_on_copy() = default;
    throws_on_copy(const throws_on_copy&) { throw std::runtime_error("no copy"); }
    void operator()(lane&) const {}
  };
  const throws_on_copy f;
  EXPECT_THROW((void)ex.submit_sized(4096, f), std::runtime_error);
  EXPECT_EQ(ex.in_flight().bytes, 0u);
  EXPECT_EQ(ex.submit([](lane&) { return 3; }).get(), 3);
}

TEST_P(ExecutorTest, LanesHaveDistinctStreamsOnCuda) {
  executor ex(options(4));
  std::mutex m;
  std::set<void*> streams;
  std::set<int> lanes;
  gate g;
  std::atomic<int> arrived{0};
  multi_future<void> fs;
  // Four tasks that all wait for each other must run on four different lanes.
  for (int i = 0; i < 4; ++i)
    fs.push_back(ex.submit([&](lane& l) {
      {
        std::lock_guard lock(m);
        streams.insert(l.native_stream());
        lanes.insert(l.index());
      }
      if (++arrived == 4) g.open();
      g.wait();
    }));
  fs.get();
  EXPECT_EQ(lanes.size(), 4u);
  if (GetParam() == backend_kind::cuda) {
    EXPECT_EQ(streams.size(), 4u);
    EXPECT_EQ(streams.count(nullptr), 0u) << "a lane used the legacy default stream";
  }
}

TEST_P(ExecutorTest, MapReturnsResultsInInputOrder) {
  executor ex(options(4));
  std::vector<std::vector<double>> inputs;
  for (int i = 0; i < 200; ++i) inputs.push_back(std::vector<double>(1000 + i, i + 0.5));
  auto results = ex.map(builtin_kernel::square(), inputs).get();
  ASSERT_EQ(results.size(), inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const double v = static_cast<double>(i) + 0.5;
    ASSERT_EQ(results[i].size(), inputs[i].size());
    EXPECT_EQ(results[i].front(), v * v);
    EXPECT_EQ(results[i].back(), v * v);
  }
}

template <class T>
void check_every_kernel(executor& ex, std::size_t n, std::uint64_t seed) {
  const auto x = random_vector<T>(n, seed);
  const auto y = random_vector<T>(n, seed + 1);
  const double alpha = 3.0;
  const T a = static_cast<T>(alpha);
  std::vector<T> square(n), scale(n), add(n), axpy(n);
  std::vector<double> terms(n);  // |a x| + |y|: the magnitude that rounding errors scale with
  for (std::size_t i = 0; i < n; ++i) {
    square[i] = x[i] * x[i];
    scale[i] = a * x[i];
    add[i] = x[i] + y[i];
    axpy[i] = a * x[i] + y[i];
    terms[i] = std::abs(alpha * static_cast<double>(x[i])) + std::abs(static_cast<double>(y[i]));
  }
  const std::vector<std::vector<T>> xs{x}, ys{y};
  EXPECT_TRUE(matches_reference(ex.map(builtin_kernel::square(), xs).get()[0], square)) << "square";
  EXPECT_TRUE(matches_reference(ex.map(builtin_kernel::scale(alpha), xs).get()[0], scale))
      << "scale";
  EXPECT_TRUE(matches_reference(ex.map(builtin_kernel::add(), xs, ys).get()[0], add, terms))
      << "add";
  EXPECT_TRUE(matches_reference(ex.map(builtin_kernel::axpy(alpha), xs, ys).get()[0], axpy, terms))
      << "axpy";

  std::vector<T> out(n, T{-1});
  ex.transform<T>(builtin_kernel::axpy(alpha), x, y, out).get();
  EXPECT_TRUE(matches_reference(out, axpy, terms)) << "transform axpy";
}

TEST_P(ExecutorTest, EveryKernelMatchesTheCpuReferenceOnRandomData) {
  executor_options o = options(3);
  o.chunk_bytes = 64 * 1024;  // several pieces per array, and a ragged last one
  executor ex(o);
  const std::size_t n = 100'003;
  check_every_kernel<float>(ex, n, 1);
  check_every_kernel<double>(ex, n, 2);
  check_every_kernel<std::int32_t>(ex, n, 3);
  check_every_kernel<std::int64_t>(ex, n, 4);
}

TEST_P(ExecutorTest, AnExceptionInATaskFailsOnlyThatTask) {
  executor ex(options());
  auto bad = ex.submit([](lane&) -> int { throw std::out_of_range("index 12 is past the end"); });
  auto good = ex.submit([](lane&) { return 5; });
  try {
    (void)bad.get();
    FAIL() << "the task's exception was lost";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "index 12 is past the end");
  }
  EXPECT_EQ(bad.status(), task_status::failed);
  EXPECT_EQ(good.get(), 5);
  EXPECT_EQ(ex.submit([](lane&) { return 6; }).get(), 6);
}

TEST_P(ExecutorTest, CancelStopsAQueuedTaskButNotARunningOne) {
  executor ex(options(1));
  gate g;
  auto blockers = hold_every_lane(ex, g);
  std::atomic<bool> ran{false};
  auto queued = ex.submit([&](lane&) { ran = true; });
  EXPECT_FALSE(blockers[0].cancel());
  EXPECT_EQ(blockers[0].status(), task_status::running);
  EXPECT_TRUE(queued.cancel());
  EXPECT_TRUE(queued.ready());
  g.open();
  blockers.get();
  EXPECT_THROW(queued.get(), cancelled_error);
  ex.shutdown();
  EXPECT_FALSE(ran.load());
}

TEST_P(ExecutorTest, CancelledMapInputNeverRuns) {
  executor ex(options(1));
  gate g;
  auto blockers = hold_every_lane(ex, g);
  const std::vector<std::vector<double>> inputs(3, std::vector<double>(100, 2.0));
  auto fs = ex.map(builtin_kernel::square(), inputs);
  EXPECT_TRUE(fs[1].cancel());
  g.open();
  blockers.get();
  EXPECT_EQ(fs[0].get()[0], 4.0);
  EXPECT_THROW(fs[1].get(), cancelled_error);
  EXPECT_EQ(fs[2].get()[99], 4.0);
}

TEST_P(ExecutorTest, ShutdownWithCancelResolvesThousandsOfPendingTasks) {
  executor ex(options(1));
  // One blocker per lane: with several devices (each with its lane) every lane must be held, or
  // the free ones run what the test expects to stay queued.
  gate g;
  auto blockers = hold_every_lane(ex, g);
  std::atomic<int> ran{0};
  multi_future<void> pending;
  for (int i = 0; i < 5000; ++i) pending.push_back(ex.submit([&](lane&) { ++ran; }));
  const std::vector<std::vector<float>> big(50, std::vector<float>(1000, 1.0f));
  auto maps = ex.map(builtin_kernel::square(), big);

  std::thread stopper([&] { ex.shutdown(/*cancel_pending=*/true); });
  while (ex.queued() != 0 || !ex.is_shutdown()) std::this_thread::sleep_for(1ms);
  g.open();
  stopper.join();

  blockers.get();  // the running ones finished normally
  EXPECT_EQ(ran.load(), 0);
  for (auto& f : pending) {
    ASSERT_TRUE(f.ready());
    EXPECT_EQ(f.status(), task_status::cancelled);
  }
  for (auto& f : maps) EXPECT_THROW(f.get(), cancelled_error);
  EXPECT_THROW(ex.submit([](lane&) {}), std::runtime_error);
}

TEST_P(ExecutorTest, DestructorDrainsThousandsOfPendingTasks) {
  std::atomic<int> ran{0};
  multi_future<int> results;
  {
    executor ex(options(2));
    for (int i = 0; i < 5000; ++i)
      results.push_back(ex.submit([&, i](lane&) {
        ++ran;
        return i;
      }));
  }
  EXPECT_EQ(ran.load(), 5000);
  for (int i = 0; i < 5000; ++i) {
    ASSERT_TRUE(results[i].ready());
    EXPECT_EQ(results[i].get(), i);
  }
}

TEST_P(ExecutorTest, ManyThreadsSubmittingAtOnce) {
  executor ex(options(4));
  constexpr int threads = 8;
  constexpr int per_thread = 400;  // also spelled out in the task below
  std::vector<std::thread> submitters;
  std::vector<std::int64_t> sums(threads, 0);
  for (int t = 0; t < threads; ++t) {
    submitters.emplace_back([&, t] {
      multi_future<int> fs;
      std::vector<std::vector<std::int32_t>> arrays;
      for (int i = 0; i < per_thread; ++i) {
        fs.push_back(ex.submit([t, i](lane&) { return t * 400 + i; }));
        arrays.push_back(std::vector<std::int32_t>(64, t + i));
      }
      auto squares = ex.map(builtin_kernel::square(), arrays);
      std::int64_t sum = 0;
      for (int v : fs.get()) sum += v;
      auto sq = squares.get();
      for (int i = 0; i < per_thread; ++i) EXPECT_EQ(sq[i][63], (t + i) * (t + i));
      sums[t] = sum;
    });
  }
  for (auto& s : submitters) s.join();
  for (int t = 0; t < threads; ++t) {
    const std::int64_t first = std::int64_t{t} * per_thread;
    EXPECT_EQ(sums[t], per_thread * first + per_thread * (per_thread - 1) / 2);
  }
}

TEST_P(ExecutorTest, ZeroLengthInputs) {
  executor ex(options());
  const std::vector<std::vector<double>> none;
  EXPECT_TRUE(ex.map(builtin_kernel::square(), none).get().empty());
  const std::vector<std::vector<double>> empties(3);
  auto results = ex.map(builtin_kernel::square(), empties).get();
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) EXPECT_TRUE(r.empty());
  std::vector<double> nothing;
  auto f = ex.transform<double>(builtin_kernel::square(), nothing, nothing);
  EXPECT_TRUE(f.ready());
  f.get();
}

TEST_P(ExecutorTest, MismatchedSizesAreRejectedBeforeAnythingRuns) {
  executor ex(options());
  const std::vector<double> x(10, 2.0);
  std::vector<double> out(9, -1.0);
  EXPECT_THROW((void)ex.transform<double>(builtin_kernel::square(), x, out), std::invalid_argument);
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](double v) { return v == -1.0; }));

  const std::vector<std::vector<double>> xs{x, x}, ys{x, std::vector<double>(11, 1.0)};
  EXPECT_THROW((void)ex.map(builtin_kernel::add(), xs, ys), std::invalid_argument);
  const std::vector<std::vector<double>> one{x};
  EXPECT_THROW((void)ex.map(builtin_kernel::add(), xs, one), std::invalid_argument);
  EXPECT_THROW((void)ex.map(builtin_kernel::add(), xs), std::invalid_argument);
  EXPECT_THROW((void)ex.map(builtin_kernel::square(), xs, xs), std::invalid_argument);
  EXPECT_EQ(ex.queued(), 0u);
}

TEST_P(ExecutorTest, TenThousandTasksDoNotGrowPinnedOrDeviceMemory) {
  executor ex(options(2));
  const std::vector<std::vector<float>> inputs(100, random_vector<float>(4096, 9));
  auto run_batch = [&] {
    auto maps = ex.map(builtin_kernel::square(), inputs);
    multi_future<float> tasks;
    for (int i = 0; i < 100; ++i)
      tasks.push_back(ex.submit([&inputs, i](lane& l) {
        auto d = l.upload<float>(inputs[static_cast<std::size_t>(i)]);
        l.apply(builtin_kernel::scale(2.0), d);
        std::vector<float> back(d.size());
        l.download<float>(d, back);
        return back[0];
      }));
    auto squares = maps.get();
    auto scaled = tasks.get();
    EXPECT_EQ(squares[99][0], inputs[99][0] * inputs[99][0]);
    EXPECT_EQ(scaled[0], 2.0f * inputs[0][0]);
  };
  run_batch();  // warm-up: slots for two-input staging etc. are made on first use
  const std::size_t pinned_before = pinned_bytes_in_use();
  const auto device_before = ex.memory_stats();
  for (int batch = 0; batch < 50; ++batch) run_batch();  // 50 x 200 = 10,000 tasks
  EXPECT_EQ(pinned_bytes_in_use(), pinned_before);
  const auto device_after = ex.memory_stats();
  ASSERT_EQ(device_after.size(), device_before.size());
  // The peak may rise once if two lanes' task arrays happen to overlap later than in warm-up,
  // but never past the slots plus one task array per lane.
  const std::size_t task_array = 4096 * sizeof(float);
  for (std::size_t d = 0; d < device_after.size(); ++d) {
    EXPECT_EQ(device_after[d].in_use, device_before[d].in_use);
    EXPECT_LE(
        device_after[d].peak,
        device_before[d].in_use + static_cast<std::size_t>(ex.lanes_per_device()) * task_array);
  }
}

TEST_P(ExecutorTest, TransformLargerThanTheDeviceMemoryBudget) {
  executor_options o = options(2);
  o.device_memory_budget = std::size_t{1} << 20;  // 1 MiB of "device memory"
  executor ex(o);
  EXPECT_LE(ex.chunk_bytes() * 2 * 2 * 2, o.device_memory_budget);
  const std::size_t n = std::size_t{4} << 20;  // 32 MiB of float64: 32x the budget
  const auto x = random_vector<double>(n, 11);
  std::vector<double> out(n, 0.0);
  ex.transform<double>(builtin_kernel::scale(-0.5), x, out).get();
  for (std::size_t i = 0; i < n; i += 997) ASSERT_EQ(out[i], -0.5 * x[i]) << i;
  EXPECT_EQ(out[n - 1], -0.5 * x[n - 1]);
  for (const auto& m : ex.memory_stats()) EXPECT_LE(m.peak, o.device_memory_budget);
}

TEST_P(ExecutorTest, TransformEachRunsEveryCallIntoItsOwnOutput) {
  executor_options o = options(3);
  o.chunk_bytes = 64 << 10;  // the big call runs in many pieces
  executor ex(o);
  // Sizes from empty to many pieces, as a map over a mixed list gives them.
  std::vector<std::vector<float>> xs, ys, outs;
  for (std::size_t i = 0; i < 600; ++i) {
    const std::size_t n = i == 7 ? 200'000 : i % 53;
    xs.push_back(random_vector<float>(n, static_cast<unsigned>(i)));
    ys.push_back(random_vector<float>(n, static_cast<unsigned>(i + 1000)));
    outs.emplace_back(n, -1.0F);
  }
  std::vector<transform_call> calls;
  for (std::size_t i = 0; i < xs.size(); ++i)
    calls.push_back({xs[i].data(), ys[i].data(), outs[i].data(), xs[i].size()});
  const auto k = builtin_kernel::axpy(2.0);
  auto futures = ex.transform_each(k, dtype::float32, calls);
  ASSERT_EQ(futures.size(), calls.size());
  futures.get();
  for (std::size_t i = 0; i < xs.size(); ++i)
    for (std::size_t j = 0; j < xs[i].size(); ++j)
      ASSERT_EQ(outs[i][j], 2.0F * xs[i][j] + ys[i][j]) << "call " << i << ", element " << j;
}

TEST_P(ExecutorTest, TransformEachRefusesABadCallBeforeQueueingAny) {
  executor ex(options());
  std::vector<double> x(100, 3.0), out(100, 0.0);
  std::vector<transform_call> calls(5, {x.data(), nullptr, out.data(), x.size()});
  calls[3].y = x.data();  // two inputs for a one-input kernel
  EXPECT_THROW(
      {
        try {
          (void)ex.transform_each(builtin_kernel::square(), dtype::float64, calls);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("call 3"), std::string::npos) << e.what();
          throw;
        }
      },
      std::invalid_argument);
  // An alpha the element type cannot hold, likewise.
  calls[3].y = nullptr;
  EXPECT_THROW((void)ex.transform_each(builtin_kernel::scale(0.5), dtype::int32, calls),
               std::invalid_argument);
  ex.shutdown();
  EXPECT_EQ(out, std::vector<double>(100, 0.0));  // nothing ran
}

// `count` calls squaring `n` doubles of `value` each into outputs of zeros. Declared before the
// gate of a test (and so destroyed after the lanes it holds are done).
struct square_calls {
  square_calls(std::size_t count, std::size_t n, double value)
      : xs(count, std::vector<double>(n, value)), outs(count, std::vector<double>(n, 0.0)) {
    for (std::size_t i = 0; i < count; ++i)
      calls.push_back({xs[i].data(), nullptr, outs[i].data(), n});
  }
  std::vector<std::vector<double>> xs, outs;
  std::vector<transform_call> calls;
};

TEST_P(ExecutorTest, TransformEachFailingPartWayLeavesNothingRunning) {
  executor_options o = options(2);
  o.in_flight_budget = 64 << 10;  // per device: room for 4 calls of 8 KiB in and 8 KiB out each
  o.when_full = when_full::raise;
  executor ex(o);
  const std::size_t n = 1024;  // doubles: 8 KiB
  const std::size_t room = ex.in_flight().budget / (2 * n * sizeof(double));
  ASSERT_GE(room, 4U);
  square_calls work(room + 2, n, 2.0);
  gate g;
  auto holders = hold_every_lane(ex, g);
  open_at_exit opener(g, holders);
  EXPECT_THROW((void)ex.transform_each(builtin_kernel::square(), dtype::float64, work.calls),
               out_of_memory);
  // The calls queued before the budget ran out were cancelled: none runs once the lanes are
  // free, and their budget came back.
  g.open();
  holders.get();
  ex.shutdown();
  for (const auto& out : work.outs) EXPECT_EQ(out, std::vector<double>(n, 0.0));
  EXPECT_EQ(ex.in_flight().bytes, 0U);
}

// A map that fails part way (here: the budget full, in raise mode) leaves nothing queued to read
// the caller's inputs once the caller has the error: the inputs may be gone by then (the map's
// futures, which say when they may go, never reached the caller). `inputs` arrays per call (1
// or 2), each of 1,024 doubles; more calls than the budget holds while the lanes are held.
void expect_a_failing_map_to_leave_nothing_running(executor_options o, int inputs) {
  o.in_flight_budget = 64 << 10;  // per device
  o.when_full = when_full::raise;
  executor ex(o);
  const std::size_t n = 1024;  // doubles: 8 KiB
  const std::size_t room =
      ex.in_flight().budget / ((static_cast<std::size_t>(inputs) + 1) * n * sizeof(double));
  ASSERT_GE(room, 2U);
  const std::vector<std::vector<double>> xs(room + 2, std::vector<double>(n, 2.0));
  gate g;
  auto holders = hold_every_lane(ex, g);
  open_at_exit opener(g, holders);
  if (inputs == 1)
    EXPECT_THROW((void)ex.map(builtin_kernel::square(), xs), out_of_memory);
  else
    EXPECT_THROW((void)ex.map(builtin_kernel::add(), xs, xs), out_of_memory);
  // Every call queued before the budget ran out was cancelled (a cancelled call gives its
  // bytes back at once; a queued one holds them until it has run, here after the gate opens).
  EXPECT_EQ(ex.in_flight().bytes, 0U);
  g.open();
  holders.get();
  ex.shutdown();
  EXPECT_EQ(ex.in_flight().bytes, 0U);
}

TEST_P(ExecutorTest, MapFailingPartWayLeavesNothingRunning) {
  expect_a_failing_map_to_leave_nothing_running(options(2), 1);
}

TEST_P(ExecutorTest, TwoInputMapFailingPartWayLeavesNothingRunning) {
  expect_a_failing_map_to_leave_nothing_running(options(2), 2);
}

// A map waiting for room when the executor is shut down (queued work left to run) throws, and
// first cancels the calls it had queued: they would read the inputs after the caller's error.
TEST_P(ExecutorTest, MapWaitingForRoomWhenShutDownCancelsWhatItQueued) {
  executor_options o = options(2);
  o.in_flight_budget = 64 << 10;  // per device; when_full::block
  executor ex(o);
  const std::size_t n = 1024;
  const std::size_t room = ex.in_flight().budget / (2 * n * sizeof(double));
  const std::vector<std::vector<double>> xs(room + 2, std::vector<double>(n, 2.0));
  gate g;
  auto holders = hold_every_lane(ex, g);
  open_at_exit opener(g, holders);
  std::atomic<bool> refused{false};
  std::thread mapper([&] {
    try {
      (void)ex.map(builtin_kernel::square(), xs);
    } catch (const std::runtime_error&) {
      refused = true;
    }
  });
  while (ex.in_flight().waiting == 0) std::this_thread::sleep_for(1ms);
  std::thread stopper([&] { ex.shutdown(); });  // waits for the held lanes
  mapper.join();
  EXPECT_TRUE(refused.load());
  EXPECT_EQ(ex.in_flight().bytes, 0U);
  g.open();
  holders.get();
  stopper.join();
}

// Many small pairs through the two-input map: every result right, in order, whatever the batching.
TEST_P(ExecutorTest, TwoInputMapOfManySmallPairsKeepsOrder) {
  executor ex(options(3));
  std::vector<std::vector<float>> xs, ys;
  for (int i = 0; i < 1000; ++i) {
    xs.emplace_back(static_cast<std::size_t>(1 + i % 7), static_cast<float>(i));
    ys.emplace_back(static_cast<std::size_t>(1 + i % 7), 0.5f);
  }
  xs.emplace_back();  // an empty pair among them
  ys.emplace_back();
  auto futures = ex.map(builtin_kernel::add(), xs, ys);
  ASSERT_EQ(futures.size(), xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const auto out = futures[i].get();
    ASSERT_EQ(out.size(), xs[i].size()) << i;
    for (float v : out) ASSERT_EQ(v, static_cast<float>(i) + 0.5f) << i;
  }
}

TEST_P(ExecutorTest, TransformEachPastTheBudgetQueuesWhatItGatheredThenWaitsForRoom) {
  executor_options o = options(2);
  o.in_flight_budget = 64 << 10;  // per device; when_full::block
  executor ex(o);
  const std::size_t n = 1024;
  const std::size_t room = ex.in_flight().budget / (2 * n * sizeof(double));
  square_calls work(room * 3, n, 4.0);
  gate g;
  auto holders = hold_every_lane(ex, g);
  open_at_exit opener(g, holders);
  // While the lanes are held only `room` calls fit: the submitter queues them and waits.
  std::thread submitter(
      [&] { ex.transform_each(builtin_kernel::square(), dtype::float64, work.calls).get(); });
  while (ex.in_flight().waiting == 0) std::this_thread::sleep_for(1ms);
  // What it gathered before waiting is queued (possibly coalesced), not held back: held back,
  // it could never free the room it waits for.
  EXPECT_GE(ex.queued(), 1U);
  g.open();
  submitter.join();
  for (const auto& out : work.outs) EXPECT_EQ(out, std::vector<double>(n, 16.0));
  EXPECT_GE(ex.in_flight().waits, 1U);
  EXPECT_LE(ex.in_flight().peak, ex.in_flight().budget);
}

TEST_P(ExecutorTest, TryTransformEachQueuesAllOrNothingAndNeverWaits) {
  executor_options o = options(2);
  o.in_flight_budget = 64 << 10;  // per device
  executor ex(o);
  const std::size_t n = 1024;
  const std::size_t per_call = 2 * n * sizeof(double);  // 8 KiB in, 8 KiB out
  const std::size_t room = ex.in_flight().budget / per_call;
  ASSERT_GE(room, 4U);
  square_calls work(room + 2, n, 3.0);
  gate g;
  auto holders = hold_every_lane(ex, g);
  open_at_exit opener(g, holders);
  const auto square = builtin_kernel::square();
  const std::span<const transform_call> all(work.calls);
  // More than the budget holds at once: nothing is queued, nothing taken, nothing waited for.
  EXPECT_FALSE(ex.try_transform_each(square, dtype::float64, all).has_value());
  EXPECT_EQ(ex.in_flight().bytes, 0U);
  auto first = ex.try_transform_each(square, dtype::float64, all.first(room - 1));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(ex.in_flight().bytes, (room - 1) * per_call);
  // One more fits, two more do not (while the lanes are held, nothing frees room).
  EXPECT_FALSE(ex.try_transform_each(square, dtype::float64, all.subspan(room - 1, 2)).has_value());
  auto second = ex.try_transform_each(square, dtype::float64, all.subspan(room - 1, 1));
  ASSERT_TRUE(second.has_value());
  // More calls than one batch of map never go through here.
  std::vector<transform_call> many(300, {work.xs[0].data(), nullptr, work.outs[0].data(), 1});
  EXPECT_FALSE(ex.try_transform_each(square, dtype::float64, many).has_value());
  g.open();
  holders.get();
  first->get();
  second->get();
  for (std::size_t i = 0; i < room; ++i) EXPECT_EQ(work.outs[i], std::vector<double>(n, 9.0)) << i;
  for (std::size_t i = room; i < work.outs.size(); ++i)
    EXPECT_EQ(work.outs[i], std::vector<double>(n, 0.0)) << i;
  ex.shutdown();
  EXPECT_EQ(ex.in_flight().bytes, 0U);
}

TEST_P(ExecutorTest, ALaneSaysWhetherItsStreamIsIdle) {
  executor ex(options(1));
  auto seen = ex.submit([](lane& l) {
                  const bool before = l.stream_idle();  // nothing enqueued yet
                  auto x = l.allocate<double>(std::size_t{1} << 24);
                  for (int i = 0; i < 20; ++i) l.apply(builtin_kernel::scale(1.0), x);
                  const bool running = l.stream_idle();
                  l.synchronize();
                  return std::vector<bool>{before, running, l.stream_idle()};
                }).get();
  EXPECT_TRUE(seen[0]);
  // The CPU backend runs each operation as it is enqueued; on CUDA the kernels are still queued.
  EXPECT_EQ(seen[1], GetParam() == backend_kind::cpu);
  EXPECT_TRUE(seen[2]);
}

TEST_P(ExecutorTest, InPlaceTransform) {
  executor ex(options());
  auto v = random_vector<std::int64_t>(50'000, 5);
  const auto original = v;
  ex.transform<std::int64_t>(builtin_kernel::square(), v, v).get();
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], original[i] * original[i]);
}

TEST_P(ExecutorTest, AllocationsPastTheBudgetFailTheTask) {
  executor_options o = options(1);
  o.device_memory_budget = std::size_t{1} << 20;
  executor ex(o);
  auto f = ex.submit([](lane& l) { return l.allocate<double>(std::size_t{1} << 20).size(); });
  EXPECT_THROW((void)f.get(), out_of_memory);
  EXPECT_EQ(ex.submit([](lane& l) { return l.allocate<double>(16).size(); }).get(), 16u);
}

TEST_P(ExecutorTest, PinnedBuffersSkipStagingAndGiveTheSameResults) {
  executor ex(options());
  const std::size_t n = 300'000;
  pinned_vector<float> x(n), out(n);
  const auto values = random_vector<float>(n, 21);
  std::copy(values.begin(), values.end(), x.begin());
  EXPECT_TRUE(is_pinned(x.data()));
  EXPECT_TRUE(is_pinned(x.data() + n - 1));
  EXPECT_FALSE(is_pinned(values.data()));
  ex.transform<float>(builtin_kernel::square(), std::span<const float>(x.data(), n), out).get();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], x[i] * x[i]);
}

TEST_P(ExecutorTest, LaneHelpersUploadComputeAndDownload) {
  executor ex(options());
  const auto x = random_vector<double>(70'000, 31);
  const auto y = random_vector<double>(70'000, 32);
  const auto before = ex.memory_stats();
  auto result = ex.submit([&](lane& l) {
    auto dx = l.upload<double>(x);
    auto dy = l.upload<double>(y);
    l.apply(builtin_kernel::axpy(2.0), dx, dy);
    std::vector<double> out(dy.size());
    l.download<double>(dy, out);
    return out;
  });
  std::vector<double> want(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) want[i] = 2.0 * x[i] + y[i];
  EXPECT_TRUE(matches_reference(result.get(), want));
  EXPECT_EQ(ex.memory_stats()[0].in_use, before[0].in_use) << "device arrays were not freed";
}

// Uploads and downloads of many pieces go through the lane's two staging buffers in turn; the
// next piece is staged while the one before is still being copied. Every byte must arrive, in
// order, for arrays whose last piece is partial, one after the other and with work between.
TEST_P(ExecutorTest, LaneCopiesOfManyPiecesArriveWhole) {
  executor_options o = options();
  o.chunk_bytes = 4096;  // 512 doubles a piece
  executor ex(o);
  const auto x = random_vector<double>(512 * 9 + 100, 33);
  const auto y = random_vector<double>(512 * 4 + 1, 34);
  auto result = ex.submit([&](lane& l) {
    auto dx = l.upload<double>(x);
    auto dy = l.upload<double>(y);
    std::vector<double> back_y(y.size());
    l.download<double>(dy, back_y);
    l.apply(builtin_kernel::square(), dx);
    std::vector<double> back_x(x.size());
    l.download<double>(dx, back_x);
    return std::pair{back_x, back_y};
  });
  auto [back_x, back_y] = result.get();
  std::vector<double> want(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) want[i] = x[i] * x[i];
  EXPECT_TRUE(matches_reference(back_x, want));
  EXPECT_EQ(back_y, y);
}

TEST_P(ExecutorTest, BadOptionsAreClearErrors) {
  executor_options o = options();
  o.lanes_per_device = -1;
  EXPECT_THROW(executor{o}, std::invalid_argument);
  o = options();
  o.devices = {999};
  EXPECT_THROW(executor{o}, std::invalid_argument);
  o = options();
  o.slots_per_lane = 0;
  EXPECT_THROW(executor{o}, std::invalid_argument);
  o = options();
  o.device_memory_budget = 1000;
  EXPECT_THROW(executor{o}, std::invalid_argument);
}

// Each variable that has a value is checked when an executor is made, on every backend, even
// where the feature that reads it (GPUPOOL_EVENT_WAIT: CUDA events) is not used.
TEST_P(ExecutorTest, BadEnvironmentValuesAreRefused) {
  for (const char* name : {"GPUPOOL_EVENT_WAIT", "GPUPOOL_PINNED_CACHE_BYTES", "GPUPOOL_QUIET",
                           "GPUPOOL_CPU_DEVICES", "GPUPOOL_TUNING", "GPUPOOL_LANE_SPIN_US"}) {
    ::setenv(name, "bogus", 1);
    try {
      executor ex(options());
      ADD_FAILURE() << name << "=bogus was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bogus"), std::string::npos) << e.what();
    }
    ::unsetenv(name);
  }
  // Numbers are digits only: what strtol would also take (a sign, spaces) is refused too.
  for (const auto& [name, bad] :
       {std::pair{"GPUPOOL_CPU_DEVICES", "+2"}, std::pair{"GPUPOOL_CPU_DEVICES", " 2"},
        std::pair{"GPUPOOL_PINNED_CACHE_BYTES", "-1"}, std::pair{"GPUPOOL_LANE_SPIN_US", "5us"}}) {
    ::setenv(name, bad, 1);
    try {
      executor ex(options());
      ADD_FAILURE() << name << "='" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(name) + " must be "), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
    }
    ::unsetenv(name);
  }
  for (const char* accepted : {"spin", "block", ""}) {
    ::setenv("GPUPOOL_EVENT_WAIT", accepted, 1);
    EXPECT_NO_THROW(executor{options()}) << "GPUPOOL_EVENT_WAIT=" << accepted;
  }
  ::unsetenv("GPUPOOL_EVENT_WAIT");
  for (const char* accepted : {"0", "200", ""}) {
    ::setenv("GPUPOOL_LANE_SPIN_US", accepted, 1);
    executor ex(options());
    EXPECT_EQ(ex.submit([](lane&) { return 5; }).get(), 5) << "GPUPOOL_LANE_SPIN_US=" << accepted;
  }
  ::unsetenv("GPUPOOL_LANE_SPIN_US");
}

TEST_P(ExecutorTest, CompletionCallbacksSeeTheResult) {
  executor ex(options());
  std::atomic<int> seen{0};
  gate done;
  auto f = ex.submit([](lane&) { return 11; });
  f.on_complete([&](future<int>& self) {
    seen = self.get();
    done.open();
  });
  done.wait();
  EXPECT_EQ(seen.load(), 11);
}

TEST_P(ExecutorTest, ATaskCannotShutDownItsOwnExecutor) {
  executor ex(options());
  auto f = ex.submit([&ex](lane&) {
    EXPECT_TRUE(ex.is_lane_thread());
    ex.shutdown();
  });
  EXPECT_THROW(f.get(), std::logic_error);
  EXPECT_FALSE(ex.is_lane_thread());
  EXPECT_EQ(ex.submit([](lane&) { return 1; }).get(), 1);
}

// The CPU backend standing in for several devices, so that multi-device scheduling is tested
// without GPUs.
class MultiDeviceTest : public ::testing::Test {
 protected:
  static executor_options options() {
    executor_options o;
    o.backend = backend_kind::cpu;
    o.cpu_devices = 3;
    o.lanes_per_device = 2;
    o.quiet = true;
    return o;
  }
};

TEST_F(MultiDeviceTest, WorkSpreadsOverEveryDevice) {
  executor ex(options());
  ASSERT_EQ(ex.devices().size(), 3u);
  multi_future<int> fs;
  for (int i = 0; i < 120; ++i)
    fs.push_back(ex.submit([](lane& l) {
      std::this_thread::sleep_for(2ms);
      return l.device();
    }));
  const auto devices = fs.get();
  const std::set<int> used(devices.begin(), devices.end());
  EXPECT_EQ(used, (std::set<int>{0, 1, 2}));
}

TEST_F(MultiDeviceTest, SubmitToPinsATaskToItsDevice) {
  executor ex(options());
  multi_future<int> fs;
  for (int i = 0; i < 60; ++i) fs.push_back(ex.submit_to(2, [](lane& l) { return l.device(); }));
  for (int d : fs.get()) EXPECT_EQ(d, 2);
  EXPECT_THROW((void)ex.submit_to(3, [](lane&) {}), std::out_of_range);
  EXPECT_THROW((void)ex.submit_to(-1, [](lane&) {}), std::out_of_range);
}

TEST_F(MultiDeviceTest, ChosenDevicesAreRenumbered) {
  executor_options o = options();
  o.devices = {2, 0};
  executor ex(o);
  ASSERT_EQ(ex.devices().size(), 2u);
  EXPECT_EQ(ex.devices()[0].ordinal, 2);
  EXPECT_EQ(ex.devices()[1].ordinal, 0);
  EXPECT_EQ(ex.devices()[1].id, 1);
  o.devices = {3};
  EXPECT_THROW(executor{o}, std::invalid_argument);
  o.devices = {1, 1};  // device 1 as two devices
  executor shared(o);
  ASSERT_EQ(shared.devices().size(), 2u);
  EXPECT_EQ(shared.devices()[1].ordinal, 1);
}

TEST(BackendSelection, CudaRequestedWithoutAGpuIsAClearError) {
  const auto cuda = cuda_availability();
  if (cuda.usable) GTEST_SKIP() << "a GPU is usable here, so CUDA cannot be refused";
  EXPECT_FALSE(cuda.reason.empty());
  executor_options o;
  o.backend = backend_kind::cuda;
  try {
    executor ex(o);
    FAIL() << "CUDA was requested without a GPU and no error was raised";
  } catch (const backend_unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
}

TEST(PieceFailure, AFailedTransformReportsOnlyOnceNoPieceTouchesTheOutputAnyMore) {
  // Launches fail now and then (GPUPOOL_FAULTS, read while the executor starts): a 64 MiB
  // transform in 1,024 pieces over four lanes fails part-way while other lanes still run pieces.
  // Once its future reports the failure, the caller may free or reuse the output: no piece may
  // write it after that.
  executor_options o;
  o.backend = backend_kind::cpu;
  o.lanes_per_device = 4;
  o.chunk_bytes = 64 << 10;
  const auto made = [&] {
    const testing::scoped_env faults("GPUPOOL_FAULTS", "launch=0.004,seed=5");
    return std::make_unique<executor>(o);
  }();
  const std::vector<double> x(std::size_t{8} << 20, 1.5);
  std::vector<double> out(x.size());
  int failures = 0;
  for (int round = 0; round < 20 && failures < 3; ++round) {
    auto f = made->transform(builtin_kernel::square(), std::span<const double>(x),
                             std::span<double>(out));
    try {
      f.get();
    } catch (const error&) {
      ++failures;
      std::fill(out.begin(), out.end(), 0.0);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const auto touched = std::count_if(out.begin(), out.end(), [](double v) { return v != 0.0; });
      EXPECT_EQ(touched, 0) << "elements written after the failure was reported";
    }
  }
  EXPECT_GT(failures, 0) << "no injected launch failure in 20 transforms of 1,024 pieces";
}

TEST(ShutdownCancelling, WorkALaneWasWokenForRunsAndTheRestIsCancelled) {
  // As concurrent.futures promises: shutdown(cancel) right after a burst of submits cancels what
  // no lane has taken, but work a lane was already dispatched to runs (before, a lane woken for
  // the first task but not yet running could find all of them cancelled).
  for (int round = 0; round < 20; ++round) {
    executor_options o;
    o.backend = backend_kind::cpu;
    o.lanes_per_device = 2;
    executor ex(o);
    // Lanes that have started and wait for work (a lane still starting is not yet dispatched).
    ex.submit([](lane&) {}).get();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::vector<future<void>> futures;
    for (int i = 0; i < 50; ++i)
      futures.push_back(
          ex.submit([](lane&) { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }));
    ex.shutdown(/*cancel_pending=*/true);
    int ran = 0, cancelled = 0;
    for (auto& f : futures) {
      ASSERT_TRUE(f.ready());
      if (f.status() == task_status::cancelled) {
        ++cancelled;
      } else {
        EXPECT_NO_THROW(f.get());
        ++ran;
      }
    }
    EXPECT_GT(ran, 0) << "round " << round;
    EXPECT_GT(cancelled, 20) << "round " << round;
  }
}

TEST(BackendSelection, EveryBackendIsNamedOnceAndFoundByItsName) {
  std::set<std::string> names;
  for (const auto& b : gpupool::backend_names) {
    EXPECT_TRUE(names.insert(b.name).second) << b.name;
    EXPECT_STREQ(gpupool::to_string(b.kind), b.name);
    EXPECT_EQ(gpupool::backend_from_name(b.name), b.kind);
    EXPECT_NE(gpupool::backend_name_list().find(std::string("'") + b.name + "'"),
              std::string::npos);
  }
  EXPECT_EQ(gpupool::backend_from_name("CUDA"), std::nullopt);  // names are exact
  EXPECT_EQ(gpupool::backend_from_name(""), std::nullopt);
  EXPECT_EQ(gpupool::backend_name_list(), "'cpu' or 'cuda'");
}

TEST(BackendSelection, EnvironmentVariableChoosesTheBackend) {
  ::setenv("GPUPOOL_BACKEND", "cpu", 1);
  {
    executor_options o;
    o.quiet = true;
    executor ex(o);
    EXPECT_EQ(ex.backend(), backend_kind::cpu);
  }
  ::setenv("GPUPOOL_BACKEND", "tpu", 1);
  EXPECT_THROW(executor{}, std::invalid_argument);
  ::unsetenv("GPUPOOL_BACKEND");
}

}  // namespace
}  // namespace gpupool
