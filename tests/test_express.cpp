// The express slot (core/lanes/express_slot.hpp): a task more urgent than its executor's default,
// whose operands are small, runs at once in its lane's express slot, its kernel working on pinned
// host buffers in place, without the copies. On the CPU backend a stand-in's paced copies show
// that it skips them; on each backend its results are the ordinary path's, for every built-in
// kernel, batches, a compiled kernel with a scalar, and injected failures.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/lanes/express_slot.hpp"
#include "gpupool/gpupool.hpp"
#include "inert_item.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

using detail::express_slot;
using testing::random_vector;

// An item of a given priority that stages `bytes` per operand (0: does other work on its lane).
class staged_item final : public testing::inert_item {
 public:
  staged_item(int p, std::size_t bytes) : inert_item(p), bytes_(bytes) {}
  std::size_t staged_operand_bytes() const noexcept override { return bytes_; }

 private:
  std::size_t bytes_;
};

TEST(ExpressSlot, TakesOnlyItemsMoreUrgentThanTheDefaultWithFewStagedBytes) {
  const detail::backend_traits& cpu = detail::traits_of(backend_kind::cpu);
  constexpr std::size_t most = express_slot::most_operand_bytes;
  EXPECT_TRUE(express_slot::takes(staged_item(1, 8192), 0, cpu));
  EXPECT_TRUE(express_slot::takes(staged_item(3, most), 2, cpu));
  EXPECT_TRUE(express_slot::takes(staged_item(-1, 1), -2, cpu));
  EXPECT_FALSE(express_slot::takes(staged_item(0, 8192), 0, cpu));   // the default
  EXPECT_FALSE(express_slot::takes(staged_item(1, 8192), 1, cpu));   // the executor's default
  EXPECT_FALSE(express_slot::takes(staged_item(-1, 8192), 0, cpu));  // below it
  EXPECT_FALSE(express_slot::takes(staged_item(1, most + 1), 0, cpu));
  EXPECT_FALSE(express_slot::takes(staged_item(1, 0), 0, cpu));  // not staged alone
  detail::backend_traits unreachable = cpu;
  unreachable.kernels_reach_pinned_host = false;
  EXPECT_FALSE(express_slot::takes(staged_item(1, 8192), 0, unreachable));
}

TEST(ExpressSlot, AnUrgentTaskSkipsAStandInsPacedCopies) {
  // One copy of 8 KiB each way takes `paced` seconds on this stand-in: an ordinary task pays
  // both, an urgent one neither.
  executor_options o = testing::quiet_options(backend_kind::cpu, 1);
  o.cpu_devices = 1;
  constexpr double rate = 1e5;  // bytes per second, each way
  o.cpu_copy_rate = rate;
  executor ex(o);
  ex.set_tracing(true);
  const std::vector<std::vector<double>> xs{random_vector<double>(1024, 7)};
  const double paced = 1024 * sizeof(double) / rate;
  const auto seconds_of = [&](const task_options& options) {
    const auto start = std::chrono::steady_clock::now();
    auto results = ex.map(builtin_kernel::square(), xs, options).get();
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(results[0][5], xs[0][5] * xs[0][5]);
    return took;
  };
  const double ordinary = seconds_of({});
  const std::uint64_t first_urgent = ex.next_task_id();
  const double urgent = seconds_of({.priority = 1});
  EXPECT_GE(ordinary, 2 * paced * 0.99);
  EXPECT_LT(urgent, paced / 2);
  const auto records = ex.trace(first_urgent).records();
  ASSERT_EQ(records.size(), 1U);
  const task_record& r = records[0];
  EXPECT_EQ(r.priority, 1);
  EXPECT_FALSE(r.failed);
  // Stamped around the kernel: the trace shows copies that took no time.
  EXPECT_LT(r.upload.end - r.upload.begin, paced * 1e6 / 2);
  EXPECT_LT(r.download.end - r.download.begin, paced * 1e6 / 2);
  EXPECT_LE(r.upload.end, r.kernel.begin + 1e-3);
  EXPECT_EQ(r.bytes_in, 8192U);
}

// --- on each backend: the results of the express path are those of the ordinary one ---

class ExpressTest : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override { GPUPOOL_SKIP_UNLESS_USABLE(GetParam()); }
  executor_options options(int lanes = 2) const {
    executor_options o = testing::quiet_options(GetParam(), lanes);
    o.cpu_devices = 1;
    if (GetParam() == backend_kind::cuda) o.devices = {0};
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, ExpressTest,
                         ::testing::Values(backend_kind::cpu, backend_kind::cuda),
                         testing::backend_name);

template <class T>
void expect_urgent_as_ordinary(executor& ex, const builtin_kernel& k) {
  // Sizes up to the express slot's bound and one element past it (which goes the ordinary way).
  constexpr std::size_t most = express_slot::most_operand_bytes / sizeof(T);
  std::vector<std::vector<T>> xs, ys;
  std::uint64_t seed = 1;
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, most, most + 1}) {
    xs.push_back(random_vector<T>(n, seed++));
    ys.push_back(random_vector<T>(n, seed++));
  }
  const bool two = k.arity() == 2;
  auto ordinary = two ? ex.map(k, xs, ys).get() : ex.map(k, xs).get();
  auto urgent = two ? ex.map(k, xs, ys, task_options{.priority = 2}).get()
                    : ex.map(k, xs, task_options{.priority = 2}).get();
  ASSERT_EQ(urgent.size(), ordinary.size());
  for (std::size_t i = 0; i < urgent.size(); ++i) {
    ASSERT_EQ(urgent[i].size(), xs[i].size());
    for (std::size_t j = 0; j < xs[i].size(); ++j)
      ASSERT_EQ(urgent[i][j], ordinary[i][j])
          << k.name() << ", input " << i << " (" << xs[i].size() << " elements), element " << j;
  }
}

TEST_P(ExpressTest, UrgentBuiltInKernelsGiveTheOrdinaryResults) {
  executor ex(options());
  for (const builtin_kernel& k : {builtin_kernel::square(), builtin_kernel::scale(3.0),
                                  builtin_kernel::add(), builtin_kernel::axpy(-2.0)}) {
    expect_urgent_as_ordinary<double>(ex, k);
    expect_urgent_as_ordinary<float>(ex, k);
    expect_urgent_as_ordinary<std::int32_t>(ex, k);
  }
}

TEST_P(ExpressTest, AnUrgentBatchGivesEachTaskItsResult) {
  executor ex(options(/*lanes=*/1));
  std::vector<std::vector<double>> xs;
  for (int i = 0; i < 40; ++i)
    xs.push_back(random_vector<double>(1 + static_cast<std::size_t>(i * 37 % 500), 50 + i));
  const std::uint64_t batches_before = ex.coalescing().batches;
  std::optional<multi_future<host_vector<double>>> urgent;
  {
    // The one lane is held while the tasks queue, so that they coalesce.
    testing::gate g;
    std::atomic<bool> holding{false};
    auto held = ex.submit([&](lane&) {
      holding = true;
      g.wait();
    });
    while (!holding) std::this_thread::yield();
    urgent = ex.map(builtin_kernel::square(), xs, task_options{.priority = 1});
    g.open();
    held.get();
  }
  const auto results = urgent->get();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(results[i].size(), xs[i].size());
    for (std::size_t j = 0; j < xs[i].size(); ++j)
      ASSERT_EQ(results[i][j], xs[i][j] * xs[i][j]) << "task " << i << ", element " << j;
  }
  EXPECT_GT(ex.coalescing().batches, batches_before);
}

TEST_P(ExpressTest, AnUrgentCompiledKernelWithAScalarGivesTheOrdinaryResult) {
  executor ex(options());
  const elementwise_kernel k("float64 x, float64 a, int32 n", "float64 y", "y = a * x + n;");
  const auto x = random_vector<double>(3000, 3);
  const auto n = random_vector<std::int32_t>(3000, 4);
  std::vector<double> ordinary(x.size()), urgent(x.size());
  ex.launch_elementwise(k, {x, 0.5, n}, dtype::float64, ordinary.data(), x.size()).get();
  ex.launch_elementwise(k, {x, 0.5, n}, dtype::float64, urgent.data(), x.size(),
                        task_options{.priority = 3})
      .get();
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(urgent[i], ordinary[i]) << "element " << i;
    ASSERT_EQ(urgent[i], 0.5 * x[i] + n[i]) << "element " << i;
  }
}

TEST_P(ExpressTest, AFailedExpressTaskFailsAloneAndTheSlotServesTheNext) {
  std::unique_ptr<executor> made;
  {
    const testing::scoped_env faults("GPUPOOL_FAULTS", "launch=0.5,seed=21");
    made = std::make_unique<executor>(options(/*lanes=*/1));
  }
  const std::vector<std::vector<double>> one{random_vector<double>(100, 5)};
  int failed = 0, succeeded = 0;
  for (int i = 0; i < 40; ++i) {
    const bool ran = testing::ran_or_hit_injected_fault([&] {
      const auto r = made->map(builtin_kernel::square(), one, task_options{.priority = 1}).get();
      ASSERT_EQ(r[0][7], one[0][7] * one[0][7]);
    });
    ++(ran ? succeeded : failed);
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(succeeded, 0);
}

}  // namespace
}  // namespace gpupool
