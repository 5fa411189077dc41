// The express slot (core/lanes/express_slot.hpp): a task more urgent than its executor's default,
// whose operands are small, runs at once in its lane's express slot, its kernel working on pinned
// host buffers in place, without the copies. On the CPU backend a stand-in's paced copies show
// that it skips them; on each backend its results are the ordinary path's, for every built-in
// kernel, batches, a compiled kernel with a scalar, and injected failures.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/lanes/express_slot.hpp"
#include "core/memory/host_memory.hpp"
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
  constexpr std::size_t most = express_slot::most_operand_bytes;
  constexpr bool reaches = true;
  EXPECT_TRUE(express_slot::takes(staged_item(1, 8192), 0, reaches));
  EXPECT_TRUE(express_slot::takes(staged_item(3, most), 2, reaches));
  EXPECT_TRUE(express_slot::takes(staged_item(-1, 1), -2, reaches));
  EXPECT_FALSE(express_slot::takes(staged_item(0, 8192), 0, reaches));   // the default
  EXPECT_FALSE(express_slot::takes(staged_item(1, 8192), 1, reaches));   // the executor's default
  EXPECT_FALSE(express_slot::takes(staged_item(-1, 8192), 0, reaches));  // below it
  EXPECT_FALSE(express_slot::takes(staged_item(1, most + 1), 0, reaches));
  EXPECT_FALSE(express_slot::takes(staged_item(1, 0), 0, reaches));  // not staged alone
  EXPECT_FALSE(express_slot::takes(staged_item(1, 8192), 0, /*reaches_pinned=*/false));
}

// Kernels on the host reach any host memory; CUDA's reach gpupool's pinned blocks where those are
// memory the driver itself calls pinned (not where GPUPOOL_BACKEND=cpu made them pageable).
TEST(ExpressSlot, RunsOnlyWhereTheBackendsKernelsReachThePinnedBlocks) {
  EXPECT_TRUE(detail::kernels_reach_pinned_blocks(backend_kind::cpu));
  if (!cuda_availability().usable) {
    EXPECT_FALSE(detail::kernels_reach_pinned_blocks(backend_kind::cuda));
    return;
  }
  void* block = allocate_pinned(4096);
  const bool driver_pinned =
      detail::cuda_backend_registration.host().describe(block).kind == memory_kind::pinned_host;
  deallocate_pinned(block, 4096);
  EXPECT_EQ(detail::kernels_reach_pinned_blocks(backend_kind::cuda), driver_pinned);
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
  EXPECT_TRUE(r.express);
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

// Every record of the tasks numbered `first` or later (at least one) ran express, or none did.
// `express` is what the call asks for; it runs express only where the executor's kernels reach
// gpupool's pinned blocks (not on CUDA under GPUPOOL_BACKEND=cpu).
void expect_express(executor& ex, std::uint64_t first, bool express, const std::string& what) {
  express = express && detail::kernels_reach_pinned_blocks(ex.backend());
  const auto records = ex.trace(first).records();
  ASSERT_FALSE(records.empty()) << what;
  for (const task_record& r : records) EXPECT_EQ(r.express, express) << what << ", task " << r.id;
}

template <class T>
void expect_urgent_as_ordinary(executor& ex, const builtin_kernel& k) {
  // Sizes up to the express slot's bound, which go express when urgent, and one element past it,
  // which goes the ordinary way. One call at a time: calls queued together could coalesce into
  // a batch past the bound.
  constexpr std::size_t most = express_slot::most_operand_bytes / sizeof(T);
  std::uint64_t seed = 1;
  ex.set_tracing(true);
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, most, most + 1}) {
    const std::vector<std::vector<T>> x{random_vector<T>(n, seed++)};
    const std::vector<std::vector<T>> y{random_vector<T>(n, seed++)};
    const std::string what = std::string(k.name()) + " over " + std::to_string(n) + " elements";
    const auto run = [&](const task_options& options) {
      const std::uint64_t first = ex.next_task_id();
      auto results = k.arity() == 2 ? ex.map(k, x, y, options).get() : ex.map(k, x, options).get();
      expect_express(ex, first, options.priority.has_value() && n <= most, what);
      return std::move(results[0]);
    };
    const auto ordinary = run({});
    const auto urgent = run({.priority = 2});
    ASSERT_EQ(urgent.size(), n) << what;
    for (std::size_t j = 0; j < n; ++j)
      ASSERT_EQ(urgent[j], ordinary[j]) << what << ", element " << j;
  }
  ex.set_tracing(false);
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
    ex.set_tracing(true);
    urgent = ex.map(builtin_kernel::square(), xs, task_options{.priority = 1});
    g.open();
    held.get();
  }
  const auto results = urgent->get();
  // Every task's record, those that ran coalesced with others included.
  auto records = ex.trace().records();
  std::erase_if(records, [](const task_record& r) { return r.name == "task"; });  // the holder
  EXPECT_EQ(records.size(), xs.size());
  for (const task_record& r : records)
    EXPECT_EQ(r.express, detail::kernels_reach_pinned_blocks(GetParam())) << "task " << r.id;
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
  ex.set_tracing(true);
  std::uint64_t first = ex.next_task_id();
  ex.launch_elementwise(k, {x, 0.5, n}, dtype::float64, ordinary.data(), x.size()).get();
  expect_express(ex, first, false, "the ordinary call");
  first = ex.next_task_id();
  ex.launch_elementwise(k, {x, 0.5, n}, dtype::float64, urgent.data(), x.size(),
                        task_options{.priority = 3})
      .get();
  expect_express(ex, first, true, "the urgent call");
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
  made->set_tracing(true);
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
  expect_express(*made, 0, true, "every try, failed or not");
}

constexpr const char* raw_saxpy = R"(
extern "C" __global__ void saxpy(const double* x, double a, const double* y, double* out,
                                 unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    out[i] = a * x[i] + y[i];
}
)";

// The bound holds per call, however the call is split into pieces: an urgent call of few bytes
// in all goes express piece by piece, every piece of a larger one the ordinary way. A raw
// kernel, whose body is the user's, always goes the ordinary way.
TEST_P(ExpressTest, OnlyCallsOfFewBytesInAllGoExpressAndNoRawKernel) {
  executor_options o = options(/*lanes=*/1);
  o.chunk_bytes = std::size_t{64} << 10;
  executor ex(o);
  ex.set_tracing(true);
  for (const std::size_t bytes :
       {express_slot::most_operand_bytes / 2, express_slot::most_operand_bytes * 2}) {
    const std::vector<std::vector<double>> x{random_vector<double>(bytes / sizeof(double), 9)};
    const std::uint64_t first = ex.next_task_id();
    const auto r = ex.map(builtin_kernel::square(), x, task_options{.priority = 1}).get();
    for (std::size_t i = 0; i < x[0].size(); ++i) ASSERT_EQ(r[0][i], x[0][i] * x[0][i]) << i;
    EXPECT_GT(ex.trace(first).records().size(), 1U) << "a call of " << bytes << " bytes";
    expect_express(ex, first, bytes <= express_slot::most_operand_bytes,
                   "a call of " + std::to_string(bytes) + " bytes in pieces");
  }
  if (!detail::traits_of(GetParam()).runs_raw_kernels) return;
  const raw_kernel k(raw_saxpy, "saxpy", "float64* x, float64 a, float64* y", "float64* out");
  const auto x = random_vector<double>(1000, 10);
  const auto y = random_vector<double>(1000, 11);
  std::vector<double> out(x.size());
  const std::uint64_t first = ex.next_task_id();
  ex.launch_raw(k, {x, 2.0, y}, dtype::float64, out.data(), x.size(), task_options{.priority = 1})
      .get();
  // The GPU may fuse the multiply and the add, which rounds once where the host rounds twice.
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(out[i], 2.0 * x[i] + y[i], 1e-12 * (1 + std::abs(out[i]))) << i;
  expect_express(ex, first, false, "an urgent raw kernel");
}

}  // namespace
}  // namespace gpupool
