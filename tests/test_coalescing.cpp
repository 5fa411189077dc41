// Tiny tasks coalesced: consecutive queued whole-array tasks of one built-in kernel and type run
// as one batch (one staging copy, one launch, one download, or one per pinned run of outputs),
// each keeping its own future. The
// lane is held busy by a task that waits on a gate, so that the tasks queue up behind it.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/lanes/elementwise_piece.hpp"
#include "core/scheduling/task_queue.hpp"
#include "gpupool/gpupool.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

using testing::ran_or_hit_injected_fault;
using testing::random_vector;

// One device with one lane on the CPU backend, whatever GPUPOOL_CPU_DEVICES says, so that the
// held lane is the only one that could take the queued tasks.
executor_options one_lane(std::size_t chunk_bytes = std::size_t{8} << 20) {
  executor_options o = testing::quiet_options(backend_kind::cpu, 1);
  o.cpu_devices = 1;
  o.chunk_bytes = chunk_bytes;
  return o;
}

// Holds the executor's lane (each of its lanes, given `lanes`) until `release()`.
class lane_gate {
 public:
  lane_gate(executor& ex, int lanes = 1) {
    for (int i = 0; i < lanes; ++i) {
      held_.push_back(ex.submit([this](lane&) {
        taken_.fetch_add(1);
        opened_.wait();
      }));
    }
    // Wait until every lane is inside its gate: nothing queued after this point can be taken.
    while (taken_.load() < lanes) std::this_thread::yield();
  }
  void release() {
    if (!released_) open_.set_value();
    released_ = true;
    for (auto& h : held_) h.get();
  }
  ~lane_gate() {
    if (!released_) open_.set_value();
  }

 private:
  std::promise<void> open_;
  std::shared_future<void> opened_ = open_.get_future().share();
  std::atomic<int> taken_{0};
  bool released_ = false;
  std::vector<future<void>> held_;
};

template <class T>
std::vector<T> squared(const std::vector<T>& x) {
  std::vector<T> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = x[i] * x[i];
  return r;
}

TEST(Coalescing, MapOfTinyInputsRunsInBatchesWithEveryResultInOrder) {
  executor ex(one_lane());
  std::vector<std::vector<double>> inputs;
  for (int i = 0; i < 1000; ++i)
    inputs.push_back(random_vector<double>(1 + static_cast<std::size_t>(i % 97), 100 + i));
  lane_gate gate(ex);
  auto futures = ex.map(builtin_kernel::square(), inputs);
  gate.release();
  auto results = futures.get();
  ASSERT_EQ(results.size(), inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    ASSERT_TRUE(testing::matches_reference(results[i], squared(inputs[i]))) << "input " << i;
  const coalescing_stats s = ex.coalescing();
  // 1000 tasks queued behind the held lane: batches of at most 256 tasks, every task in one.
  EXPECT_EQ(s.tasks, 1000u);
  EXPECT_EQ(s.batches, 4u);
}

// The same on each backend (on CUDA the batch is one cudaMemcpyAsync each way and one launch over
// the concatenated elements: run under compute-sanitizer on the GPU machine).
class CoalescingTest : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override { GPUPOOL_SKIP_UNLESS_USABLE(GetParam()); }
  executor_options options() const {
    executor_options o = one_lane();
    o.backend = GetParam();
    if (GetParam() == backend_kind::cuda) o.devices = {0};  // one lane in all
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, CoalescingTest,
                         ::testing::Values(backend_kind::cpu, backend_kind::cuda),
                         testing::backend_name);

TEST_P(CoalescingTest, BatchesOfEveryKernelAndTypeGiveEachTaskItsResult) {
  executor ex(options());
  // Lengths that end anywhere in a cache line or a thread block, so that batch boundaries fall
  // at every offset.
  std::vector<std::vector<float>> xs, ys;
  std::vector<std::vector<std::int64_t>> ns;
  for (int i = 0; i < 300; ++i) {
    const auto n = static_cast<std::size_t>(1 + (i * 37) % 301);
    xs.push_back(random_vector<float>(n, 10 + i));
    ys.push_back(random_vector<float>(n, 1000 + i));
    ns.push_back(random_vector<std::int64_t>(n, 2000 + i));
  }
  std::optional<multi_future<host_vector<float>>> axpy, squares;
  std::optional<multi_future<host_vector<std::int64_t>>> scaled;
  {
    lane_gate gate(ex);
    axpy = ex.map(builtin_kernel::axpy(-1.5), xs, ys);
    squares = ex.map(builtin_kernel::square(), xs);
    scaled = ex.map(builtin_kernel::scale(3.0), ns);
    gate.release();
  }
  const auto a = axpy->get();
  const auto q = squares->get();
  const auto c = scaled->get();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    std::vector<float> want_axpy(xs[i].size()), want_square(xs[i].size());
    std::vector<double> magnitude(xs[i].size());
    std::vector<std::int64_t> want_scaled(ns[i].size());
    for (std::size_t j = 0; j < xs[i].size(); ++j) {
      want_axpy[j] = -1.5f * xs[i][j] + ys[i][j];
      magnitude[j] = std::abs(1.5 * xs[i][j]) + std::abs(static_cast<double>(ys[i][j]));
      want_square[j] = xs[i][j] * xs[i][j];
      want_scaled[j] = 3 * ns[i][j];
    }
    ASSERT_TRUE(testing::matches_reference(a[i], want_axpy, magnitude)) << "axpy " << i;
    ASSERT_TRUE(testing::matches_reference(q[i], want_square)) << "square " << i;
    ASSERT_TRUE(testing::matches_reference(c[i], want_scaled)) << "scale " << i;
  }
  // 300 tasks of each kernel: two batches each (256 + 44), none mixing kernels or types.
  EXPECT_EQ(ex.coalescing().batches, 6u);
  EXPECT_EQ(ex.coalescing().tasks, 900u);
}

// Outputs laid end to end in pinned blocks of gpupool's (a map's results sharing a slab) take
// the batch's download in place, one download per block, when the runs are long enough: no
// staging copy out. The two-block layout sits on the bound (two runs of 32 KiB). Runs cut short
// (here by a cancelled task) go through the slot's buffer, and the cancelled task's output is
// left untouched. Nothing past the outputs is written.
TEST_P(CoalescingTest, OutputsEndToEndInPinnedBlocksAreDownloadedInPlace) {
  executor ex(options());
  ex.set_tracing(true);
  constexpr std::size_t n = 8, count = 1024;  // 8 KiB a task
  constexpr double untouched = -7.0;
  std::vector<std::vector<double>> xs;
  for (std::size_t i = 0; i < n; ++i) xs.push_back(random_vector<double>(count, 300 + i));
  enum class layout { one_block, two_blocks, cut_short };
  for (const layout l : {layout::one_block, layout::two_blocks, layout::cut_short}) {
    // A task's length more than the outputs need in each block: what must stay untouched.
    pinned_vector<double> first_block((n + 1) * count, untouched);
    pinned_vector<double> second_block((n + 1) * count, untouched);
    const auto out = [&](std::size_t i) {
      if (l == layout::two_blocks && i >= n / 2)
        return std::span<double>(second_block.data() + (i - n / 2) * count, count);
      return std::span<double>(first_block.data() + i * count, count);
    };
    lane_gate gate(ex);
    const std::uint64_t first = ex.next_task_id();
    std::vector<future<void>> done;
    for (std::size_t i = 0; i < n; ++i)
      done.push_back(ex.transform<double>(builtin_kernel::square(), xs[i], out(i)));
    const bool cut = l == layout::cut_short;
    if (cut) {
      EXPECT_TRUE(done[3].cancel());
    }
    gate.release();
    for (std::size_t i = 0; i < n; ++i) {
      const std::span<const double> got = out(i);
      if (cut && i == 3) {
        EXPECT_THROW(done[i].get(), cancelled_error);
        EXPECT_EQ(std::vector<double>(got.begin(), got.end()),
                  std::vector<double>(count, untouched));
        continue;
      }
      done[i].get();
      EXPECT_TRUE(testing::matches_reference(got, squared(xs[i]))) << "task " << i;
    }
    const std::size_t used = l == layout::two_blocks ? n / 2 : n;
    EXPECT_TRUE(std::all_of(first_block.begin() + static_cast<std::ptrdiff_t>(used * count),
                            first_block.end(), [&](double v) { return v == untouched; }));
    const std::size_t used_second = l == layout::two_blocks ? n / 2 : 0;
    EXPECT_TRUE(std::all_of(second_block.begin() + static_cast<std::ptrdiff_t>(used_second * count),
                            second_block.end(), [&](double v) { return v == untouched; }));
    const auto records = ex.trace(first).records();
    ASSERT_EQ(records.size(), cut ? n - 1 : n);
    for (const task_record& r : records)
      EXPECT_EQ(r.stage_out.present(), cut)
          << "layout " << static_cast<int>(l) << ", task " << r.id;
  }
  EXPECT_EQ(ex.coalescing().batches, 3u);
}

// Inputs laid end to end in one pinned block are uploaded from where they are (no staging copy
// in), here each task squaring its input in place: every task gets its own result, for one
// operand and for two (axpy), and nothing past the inputs is written.
TEST_P(CoalescingTest, InputsEndToEndInOnePinnedBlockAreReadInPlace) {
  executor ex(options());
  constexpr std::size_t n = 8, count = 1024;
  constexpr double untouched = -7.0;
  pinned_vector<double> xs((n + 1) * count, untouched), ys((n + 1) * count, untouched);
  for (std::size_t i = 0; i < n * count; ++i) {
    xs[i] = static_cast<double>(i % 97) - 40.0;
    ys[i] = static_cast<double>(i % 31);
  }
  const std::vector<double> x0(xs.begin(), xs.end()), y0(ys.begin(), ys.end());
  const auto part = [&](pinned_vector<double>& v, std::size_t i) {
    return std::span<double>(v.data() + i * count, count);
  };
  {
    lane_gate gate(ex);
    std::vector<future<void>> done;
    for (std::size_t i = 0; i < n; ++i)
      done.push_back(
          ex.transform<double>(builtin_kernel::axpy(2.0), part(xs, i), part(ys, i), part(ys, i)));
    gate.release();
    for (auto& f : done) f.get();
  }
  {
    lane_gate gate(ex);
    std::vector<future<void>> done;
    for (std::size_t i = 0; i < n; ++i)
      done.push_back(ex.transform<double>(builtin_kernel::square(), part(xs, i), part(xs, i)));
    gate.release();
    for (auto& f : done) f.get();
  }
  for (std::size_t i = 0; i < n * count; ++i) {
    ASSERT_EQ(ys[i], 2.0 * x0[i] + y0[i]) << "element " << i;
    ASSERT_EQ(xs[i], x0[i] * x0[i]) << "element " << i;
  }
  for (std::size_t i = n * count; i < xs.size(); ++i) {
    ASSERT_EQ(xs[i], untouched);
    ASSERT_EQ(ys[i], untouched);
  }
  EXPECT_EQ(ex.coalescing().batches, 2u);
}

// A batch's results are made end to end in shared pinned slabs (of at most 64 results), which
// one download writes in place; a slab goes back to the pinned cache with its last result, in
// whatever order the results are freed, resized or kept.
TEST_P(CoalescingTest, ABatchsResultsShareSlabsWrittenInPlaceAndEachSlabEndsWithItsLastResult) {
  executor ex(options());
  ex.set_tracing(true);
  constexpr std::size_t n = 200, count = 1024;  // 8 KiB a result: one batch of four slabs
  std::vector<std::vector<double>> xs;
  for (std::size_t i = 0; i < n; ++i) xs.push_back(random_vector<double>(count, 700 + i));
  const auto run = [&] {
    lane_gate gate(ex);
    auto futures = ex.map(builtin_kernel::square(), xs);
    gate.release();
    return futures.get();
  };
  (void)run();  // the slot buffers and the cache's first blocks, outside what is counted below
  const std::size_t held_before = pinned_memory_stats().in_use;
  const std::uint64_t first = ex.next_task_id();
  auto results = run();
  ASSERT_EQ(results.size(), n);
  std::size_t end_to_end = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(testing::matches_reference(results[i], squared(xs[i]))) << "result " << i;
    if (i > 0 && results[i].data() == results[i - 1].data() + count) ++end_to_end;
  }
  EXPECT_EQ(end_to_end, n - 4) << "200 results in four slabs of up to 64";
  const auto records = ex.trace(first).records();
  std::size_t squares = 0;
  for (const task_record& r : records) {
    if (r.name == "task") continue;  // the gate's
    ++squares;
    EXPECT_FALSE(r.stage_out.present()) << "task " << r.id;
  }
  EXPECT_EQ(squares, n);
  EXPECT_GT(pinned_memory_stats().in_use, held_before);

  // One result kept from each slab, one of them grown (moved out of its slab), the rest freed
  // from the middle outwards: the slabs stay until their kept results go.
  std::vector<host_vector<double>> kept;
  for (std::size_t i : {5, 70, 130, 199}) kept.push_back(std::move(results[i]));
  kept[1].push_back(1.0);
  EXPECT_EQ(kept[1][count], 1.0);
  EXPECT_TRUE(
      testing::matches_reference(std::span<const double>(kept[1].data(), count), squared(xs[70])));
  for (std::size_t i = n / 2; i-- > 0;) host_vector<double>().swap(results[i]);
  for (std::size_t i = n / 2; i < n; ++i) host_vector<double>().swap(results[i]);
  EXPECT_GT(pinned_memory_stats().in_use, held_before);
  for (std::size_t k = 0; k < kept.size(); ++k)
    EXPECT_TRUE(
        testing::matches_reference(std::span<const double>(kept[k].data(), count),
                                   squared(xs[std::vector<std::size_t>{5, 70, 130, 199}[k]])));
  kept.clear();
  EXPECT_EQ(pinned_memory_stats().in_use, held_before);
}

TEST(Coalescing, TransformsKeepTheirOwnOutputs) {
  executor ex(one_lane());
  constexpr int n = 50;
  std::vector<std::vector<float>> xs, ys, outs;
  for (int i = 0; i < n; ++i) {
    xs.push_back(random_vector<float>(33, 7 * i + 1));
    ys.push_back(random_vector<float>(33, 7 * i + 2));
    outs.emplace_back(33, -1.0f);
  }
  lane_gate gate(ex);
  std::vector<future<void>> done;
  for (int i = 0; i < n; ++i)
    done.push_back(ex.transform<float>(builtin_kernel::axpy(0.5), xs[i], ys[i], outs[i]));
  gate.release();
  for (auto& f : done) f.get();
  for (int i = 0; i < n; ++i) {
    std::vector<float> want(33);
    for (std::size_t j = 0; j < 33; ++j) want[j] = 0.5f * xs[i][j] + ys[i][j];
    ASSERT_TRUE(testing::matches_reference(outs[i], want)) << "task " << i;
  }
  EXPECT_EQ(ex.coalescing().tasks, static_cast<std::uint64_t>(n));
  EXPECT_EQ(ex.coalescing().batches, 1u);
}

TEST(Coalescing, DifferentKernelsTypesAndAlphasNeverShareABatch) {
  executor ex(one_lane());
  const auto x64 = random_vector<double>(16, 1);
  const auto x32 = random_vector<float>(16, 2);
  const auto y64 = random_vector<double>(16, 3);
  constexpr int per_group = 5;
  lane_gate gate(ex);
  // Five groups of five identical tasks, each group different from its neighbours in one way:
  // the kernel, the element type, alpha (2 vs 3, and 0.0 vs -0.0, which differ in sign of zero).
  std::vector<future<host_vector<double>>> sq64, scale2, scale3, scale_zero, scale_negative_zero;
  std::vector<future<host_vector<float>>> sq32;
  std::vector<future<host_vector<double>>> add64;
  const std::vector<std::vector<double>> one64{x64};
  const std::vector<std::vector<float>> one32{x32};
  for (int i = 0; i < per_group; ++i)
    sq64.push_back(std::move(ex.map(builtin_kernel::square(), one64)[0]));
  for (int i = 0; i < per_group; ++i)
    sq32.push_back(std::move(ex.map(builtin_kernel::square(), one32)[0]));
  for (int i = 0; i < per_group; ++i)
    scale2.push_back(std::move(ex.map(builtin_kernel::scale(2.0), one64)[0]));
  for (int i = 0; i < per_group; ++i)
    scale3.push_back(std::move(ex.map(builtin_kernel::scale(3.0), one64)[0]));
  for (int i = 0; i < per_group; ++i)
    scale_zero.push_back(std::move(ex.map(builtin_kernel::scale(0.0), one64)[0]));
  for (int i = 0; i < per_group; ++i)
    scale_negative_zero.push_back(std::move(ex.map(builtin_kernel::scale(-0.0), one64)[0]));
  const std::vector<std::vector<double>> other64{y64};
  for (int i = 0; i < per_group; ++i)
    add64.push_back(std::move(ex.map(builtin_kernel::add(), one64, other64)[0]));
  gate.release();

  for (int i = 0; i < per_group; ++i) {
    const auto a = sq64[i].get();
    const auto b = sq32[i].get();
    const auto c = scale2[i].get();
    const auto d = scale3[i].get();
    const auto e = scale_zero[i].get();
    const auto f = scale_negative_zero[i].get();
    const auto g = add64[i].get();
    for (std::size_t j = 0; j < 16; ++j) {
      ASSERT_EQ(a[j], x64[j] * x64[j]);
      ASSERT_EQ(b[j], x32[j] * x32[j]);
      ASSERT_EQ(c[j], 2.0 * x64[j]);
      ASSERT_EQ(d[j], 3.0 * x64[j]);
      ASSERT_EQ(std::signbit(e[j]), std::signbit(0.0 * x64[j]));
      ASSERT_EQ(std::signbit(f[j]), std::signbit(-0.0 * x64[j]));
      ASSERT_EQ(g[j], x64[j] + y64[j]);
    }
  }
  // One batch per group: each group coalesced, no two groups together.
  EXPECT_EQ(ex.coalescing().batches, 7u);
  EXPECT_EQ(ex.coalescing().tasks, 7u * per_group);
}

TEST(Coalescing, ACancelledTaskInsideABatchIsSkippedAndTheRestRun) {
  executor ex(one_lane());
  constexpr int n = 10;
  std::vector<std::vector<double>> xs, outs;
  for (int i = 0; i < n; ++i) {
    xs.push_back(random_vector<double>(20, 50 + i));
    outs.emplace_back(20, -7.0);
  }
  lane_gate gate(ex);
  std::vector<future<void>> done;
  for (int i = 0; i < n; ++i)
    done.push_back(ex.transform<double>(builtin_kernel::square(), xs[i], outs[i]));
  EXPECT_TRUE(done[0].cancel());  // the task the others were absorbed into
  EXPECT_TRUE(done[4].cancel());
  gate.release();
  for (int i = 0; i < n; ++i) {
    if (i == 0 || i == 4) {
      EXPECT_THROW(done[i].get(), cancelled_error);
      EXPECT_EQ(outs[i], std::vector<double>(20, -7.0)) << "a cancelled task wrote its output";
    } else {
      done[i].get();
      EXPECT_EQ(outs[i], squared(xs[i])) << "task " << i;
    }
  }
  EXPECT_EQ(ex.coalescing().batches, 1u);
  EXPECT_EQ(ex.coalescing().tasks, static_cast<std::uint64_t>(n - 2));
}

TEST(Coalescing, ShutdownCancellingPendingWorkCancelsEveryTaskOfAQueuedBatch) {
  executor ex(one_lane());
  const std::vector<std::vector<double>> inputs(20, std::vector<double>(8, 2.0));
  std::optional<multi_future<host_vector<double>>> futures;
  {
    lane_gate gate(ex);
    futures = ex.map(builtin_kernel::square(), inputs);
    std::thread stopper([&] { ex.shutdown(/*cancel_pending=*/true); });
    // shutdown cancels what is queued, then waits for the held lane.
    while (ex.queued() != 0) std::this_thread::yield();
    gate.release();
    stopper.join();
  }
  for (auto& f : *futures) EXPECT_THROW(f.get(), cancelled_error);
  EXPECT_EQ(ex.coalescing().tasks, 0u);
}

// An executor as one_lane() makes, with the faults `plan` injects (GPUPOOL_FAULTS is read only
// while an executor starts, so it is set for that moment alone).
std::unique_ptr<executor> one_lane_with_faults(const char* plan) {
  const testing::scoped_env faults("GPUPOOL_FAULTS", plan);
  return std::make_unique<executor>(one_lane());
}

TEST(Coalescing, AFailedLaunchFailsEveryTaskOfItsBatchAndNoOther) {
  // Half the launches fail. Groups of tasks are kept apart by a task that is no kernel, so each
  // group is exactly one batch: a group's tasks must share one fate, and groups must differ.
  const auto made = one_lane_with_faults("launch=0.5,seed=11");
  executor& ex = *made;
  constexpr int groups = 24, per_group = 6;
  const std::vector<std::vector<double>> one{random_vector<double>(10, 9)};
  std::vector<std::vector<future<host_vector<double>>>> batches(groups);
  {
    lane_gate gate(ex);
    for (int g = 0; g < groups; ++g) {
      for (int i = 0; i < per_group; ++i)
        batches[g].push_back(std::move(ex.map(builtin_kernel::square(), one)[0]));
      (void)ex.submit([](lane&) {});  // not absorbable: ends the group
    }
    gate.release();
  }
  int failed_groups = 0;
  for (int g = 0; g < groups; ++g) {
    int failed = 0;
    for (auto& f : batches[g]) {
      if (!ran_or_hit_injected_fault([&] { EXPECT_EQ(f.get()[0], one[0][0] * one[0][0]); }))
        ++failed;
    }
    EXPECT_TRUE(failed == 0 || failed == per_group)
        << "group " << g << ": " << failed << " of " << per_group << " failed";
    failed_groups += failed == per_group ? 1 : 0;
  }
  EXPECT_GT(failed_groups, 0);
  EXPECT_LT(failed_groups, groups);
  EXPECT_EQ(ex.coalescing().batches, static_cast<std::uint64_t>(groups));
}

// transform_each's calls, each its future's state and job in one allocation: a failed launch
// fails its own calls only, a cancelled call never writes, and the futures outlive the executor.
TEST(Coalescing, TransformEachCallsFailOrAreCancelledOneByOneAndOutliveTheExecutor) {
  constexpr std::size_t calls = 24;
  const std::vector<double> x = random_vector<double>(10, 3);
  std::vector<std::vector<double>> outs(calls, std::vector<double>(x.size(), -1.0));
  std::vector<future<void>> futures;
  {
    const auto made = one_lane_with_faults("launch=0.5,seed=11");
    executor& ex = *made;
    lane_gate gate(ex);
    for (auto& out : outs) {
      const transform_call call{x.data(), nullptr, out.data(), x.size()};
      futures.push_back(std::move(
          ex.transform_each(builtin_kernel::square(), dtype::float64, std::span(&call, 1))[0]));
      (void)ex.submit([](lane&) {});  // not absorbable: each call is its own launch
    }
    for (std::size_t i = 0; i < calls; i += 3) EXPECT_TRUE(futures[i].cancel());
    gate.release();
    ex.shutdown();
  }
  int failed = 0, succeeded = 0;
  for (std::size_t i = 0; i < calls; ++i) {
    if (i % 3 == 0) {
      EXPECT_THROW(futures[i].get(), cancelled_error);
      EXPECT_EQ(outs[i], std::vector<double>(x.size(), -1.0)) << i;
      continue;
    }
    const bool ran = ran_or_hit_injected_fault([&] {
      futures[i].get();
      EXPECT_EQ(outs[i], squared(x)) << i;
    });
    ++(ran ? succeeded : failed);
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(succeeded, 0);
}

TEST(Coalescing, ABatchStaysWithinOneSlotBuffer) {
  // The smallest slot (4096 bytes) holds two tasks of 256 float64.
  executor ex(one_lane(4096));
  ASSERT_EQ(ex.chunk_bytes(), 4096u);
  const std::vector<std::vector<double>> inputs(9, random_vector<double>(256, 5));
  lane_gate gate(ex);
  auto futures = ex.map(builtin_kernel::square(), inputs);
  gate.release();
  for (auto& r : futures.get()) EXPECT_TRUE(testing::matches_reference(r, squared(inputs[0])));
  EXPECT_EQ(ex.coalescing().batches, 4u);  // 2+2+2+2, and the ninth alone
  EXPECT_EQ(ex.coalescing().tasks, 8u);
}

TEST(Coalescing, InputsSplitIntoPiecesAreNotCoalesced) {
  executor ex(one_lane(4096));
  // 1024 float64 = two pieces each: such inputs run piece by piece, as before.
  const std::vector<std::vector<double>> inputs(6, random_vector<double>(1024, 6));
  lane_gate gate(ex);
  auto futures = ex.map(builtin_kernel::square(), inputs);
  gate.release();
  for (auto& r : futures.get()) EXPECT_TRUE(testing::matches_reference(r, squared(inputs[0])));
  EXPECT_EQ(ex.coalescing().tasks, 0u);
}

TEST(Coalescing, EveryTaskOfABatchKeepsItsTraceRecord) {
  executor ex(one_lane());
  ex.set_tracing(true);
  const std::vector<std::vector<double>> inputs(12, std::vector<double>(100, 3.0));
  lane_gate gate(ex);
  const std::uint64_t first = ex.next_task_id();
  auto futures = ex.map(builtin_kernel::square(), inputs);
  gate.release();
  futures.get();
  ASSERT_EQ(ex.coalescing().tasks, 12u);
  const auto records = ex.trace(first).records();
  ASSERT_EQ(records.size(), 12u);
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].id, first + i);
    EXPECT_EQ(records[i].name, "square");
    EXPECT_EQ(records[i].bytes_in, 800u);
    EXPECT_EQ(records[i].bytes_out, 800u);
    EXPECT_FALSE(records[i].failed);
    // The batch's stages are every member's.
    EXPECT_EQ(records[i].kernel.begin, records[0].kernel.begin);
  }
}

TEST(Coalescing, TasksForDifferentDevicesNeverShareABatch) {
  // White box: pieces queued for devices 0 and 1 alternately, and pieces marked for different
  // devices offered to each other directly.
  detail::task_queue queue(2);
  const std::vector<double> x(4, 1.5);
  std::vector<std::vector<double>> outs(40, std::vector<double>(4));
  std::vector<future<void>> done;
  auto piece = [&](int i, int device) {
    auto state = std::make_shared<detail::shared_state<void>>();
    done.emplace_back(state);
    auto job = std::make_shared<detail::transform_job>(builtin_kernel::square(), dtype::float64,
                                                       x.data(), nullptr, outs[i].data(), 4, state);
    job->set_piece_count(1);
    return std::make_unique<detail::elementwise_piece>(job, 0, 4, 4096, device);
  };
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(queue.push(piece(i, i % 2), i % 2));
  for (int device = 0; device < 2; ++device) {
    auto item = queue.pop(device, /*block=*/false);
    ASSERT_TRUE(item);
    EXPECT_EQ(static_cast<detail::elementwise_piece&>(*item).tasks(), 10u);
    EXPECT_FALSE(queue.pop(device, /*block=*/false));
  }
  auto on_zero = piece(20, 0);
  detail::work_item_ptr on_one = piece(21, 1);
  EXPECT_FALSE(on_zero->absorb(on_one));
  EXPECT_TRUE(on_one);  // still its own
  detail::work_item_ptr also_zero = piece(22, 0);
  EXPECT_TRUE(on_zero->absorb(also_zero));
  EXPECT_FALSE(also_zero);
}

TEST(Coalescing, TwoStandInDevicesGetEveryResultRight) {
  executor_options o = testing::quiet_options(backend_kind::cpu, 1);
  o.cpu_devices = 2;
  executor ex(o);
  std::vector<std::vector<float>> inputs;
  for (int i = 0; i < 3000; ++i) inputs.push_back(random_vector<float>(64, 1000 + i));
  auto results = ex.map(builtin_kernel::square(), inputs).get();
  for (std::size_t i = 0; i < inputs.size(); ++i)
    ASSERT_TRUE(testing::matches_reference(results[i], squared(inputs[i]))) << "input " << i;
}

}  // namespace
}  // namespace gpupool
