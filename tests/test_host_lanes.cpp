// Host lanes (executor_options::host_lanes): small calls of built-in kernels shared between
// threads that compute on the host and the devices' lanes, as placement's model of each side says.
// Whatever the placement, every call's result is the kernel's; calls too large, or writing over
// their inputs part way, stay on the devices; the trace and placement() say where each ran.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpupool/gpupool.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

using testing::random_vector;

template <class T>
std::vector<T> squared(const std::vector<T>& x) {
  std::vector<T> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = x[i] * x[i];
  return r;
}

// Inputs of 1 to `most` elements, varied so that batches of several sizes form.
std::vector<std::vector<double>> small_inputs(std::size_t n, std::size_t most = 1000) {
  std::vector<std::vector<double>> inputs;
  for (std::size_t i = 0; i < n; ++i)
    inputs.push_back(random_vector<double>(1 + (i * 37) % most, 500 + i));
  return inputs;
}

// One CPU stand-in device with one lane, whatever GPUPOOL_CPU_DEVICES says, and `host_lanes`.
executor_options one_device(int host_lanes) {
  executor_options o = testing::quiet_options(backend_kind::cpu, 1);
  o.cpu_devices = 1;
  o.host_lanes = host_lanes;
  return o;
}

// Holds a lane of `ex` (its only one, on a one-lane executor) with a task until release().
class held_lane {
 public:
  explicit held_lane(executor& ex)
      : holder_(ex.submit([this](lane&) {
          held_ = true;
          opened_.wait();
        })) {
    while (!held_) std::this_thread::yield();
  }
  held_lane(const held_lane&) = delete;
  held_lane& operator=(const held_lane&) = delete;
  ~held_lane() { release(); }
  void release() {
    if (released_.exchange(true)) return;
    open_.set_value();
    holder_.get();
  }

 private:
  std::promise<void> open_;
  std::shared_future<void> opened_ = open_.get_future().share();
  std::atomic<bool> held_{false};
  std::atomic<bool> released_{false};
  future<void> holder_;
};

class HostLanesTest : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override { GPUPOOL_SKIP_UNLESS_USABLE(GetParam()); }
  executor_options options(int host_lanes) const {
    executor_options o = testing::quiet_options(GetParam(), 1);
    o.cpu_devices = 1;
    if (GetParam() == backend_kind::cuda) o.devices = {0};
    o.host_lanes = host_lanes;
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, HostLanesTest,
                         ::testing::Values(backend_kind::cpu, backend_kind::cuda),
                         testing::backend_name);

TEST_P(HostLanesTest, MapOfSmallInputsGivesEveryResultAndSaysWhereEachRan) {
  executor ex(options(2));
  EXPECT_EQ(ex.host_lanes(), 2);
  const auto inputs = small_inputs(2000);
  for (int round = 0; round < 3; ++round) {
    auto results = ex.map(builtin_kernel::square(), inputs).get();
    ASSERT_EQ(results.size(), inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i)
      ASSERT_TRUE(testing::matches_reference(results[i], squared(inputs[i])))
          << "round " << round << ", input " << i;
  }
  const placement_stats p = ex.placement();
  EXPECT_EQ(p.host_tasks + p.device_tasks, 3 * inputs.size());
  // Neither side's share falls below host_placement::least_share (1/64).
  EXPECT_GE(p.host_tasks, 3 * inputs.size() / 64);
  EXPECT_GE(p.device_tasks, 3 * inputs.size() / 64 - 1);
  EXPECT_GT(p.host_share, 0.0);
  EXPECT_LT(p.host_share, 1.0);
  EXPECT_GT(p.host_bytes_per_second, 0.0);
  EXPECT_GT(p.device_bytes_per_second, 0.0);
}

TEST_P(HostLanesTest, TwoInputKernelsAndAlphasComputeAsOnTheDevices) {
  executor ex(options(2));
  std::vector<std::vector<std::int32_t>> xs, ys;
  std::vector<std::vector<float>> fs;
  for (std::size_t i = 0; i < 300; ++i) {
    xs.push_back(random_vector<std::int32_t>(1 + i % 50, 10 + i));
    ys.push_back(random_vector<std::int32_t>(1 + i % 50, 9000 + i));
    fs.push_back(random_vector<float>(1 + i % 70, 20000 + i));
  }
  // Near the type's end, so that the integer kernel wraps as NumPy's does.
  xs[7][0] = std::numeric_limits<std::int32_t>::max();
  auto sums = ex.map(builtin_kernel::axpy(3.0), xs, ys).get();
  auto halves = ex.map(builtin_kernel::scale(0.5), fs).get();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    for (std::size_t j = 0; j < xs[i].size(); ++j) {
      const auto want = static_cast<std::int32_t>(static_cast<std::uint32_t>(xs[i][j]) * 3u +
                                                  static_cast<std::uint32_t>(ys[i][j]));
      ASSERT_EQ(sums[i][j], want) << "call " << i << " element " << j;
    }
    for (std::size_t j = 0; j < fs[i].size(); ++j) ASSERT_EQ(halves[i][j], fs[i][j] * 0.5f);
  }
  EXPECT_GT(ex.placement().host_tasks, 0u);
}

// Where a call runs must not change its result: on CUDA the devices' axpy rounds the product
// before the sum, as the host lanes (and NumPy) do, rather than fusing the two.
TEST_P(HostLanesTest, FloatingAxpyIsTheSameBitForBitOnEitherSide) {
  executor ex(options(2));
  std::vector<std::vector<double>> xs, ys;
  std::vector<std::vector<float>> fxs, fys;
  for (std::size_t i = 0; i < 400; ++i) {
    xs.push_back(random_vector<double>(256, 31 + i));
    ys.push_back(random_vector<double>(256, 7000 + i));
    fxs.push_back(random_vector<float>(256, 51 + i));
    fys.push_back(random_vector<float>(256, 9000 + i));
  }
  const double a = 1.0 / 3.0;
  const auto got = ex.map(builtin_kernel::axpy(a), xs, ys).get();
  const auto fgot = ex.map(builtin_kernel::axpy(a), fxs, fys).get();
  const auto fa = static_cast<float>(a);
  for (std::size_t i = 0; i < xs.size(); ++i)
    for (std::size_t j = 0; j < xs[i].size(); ++j) {
      const double product = a * xs[i][j];
      ASSERT_EQ(got[i][j], product + ys[i][j]) << "float64 call " << i << " element " << j;
      const float fproduct = fa * fxs[i][j];
      ASSERT_EQ(fgot[i][j], fproduct + fys[i][j]) << "float32 call " << i << " element " << j;
    }
  const placement_stats p = ex.placement();
  EXPECT_GT(p.host_tasks, 0u);
  EXPECT_GT(p.device_tasks, 0u);
}

TEST(HostLanes, CallsLargerThanTheHostsLimitStayOnTheDevices) {
  executor_options o = testing::quiet_options(backend_kind::cpu, 1);
  o.host_lanes = 2;
  executor ex(o);
  // In and out together just past the limit.
  const std::size_t n = limits::most_host_task_bytes / (2 * sizeof(double)) + 1;
  std::vector<std::vector<double>> inputs;
  for (std::size_t i = 0; i < 6; ++i) inputs.push_back(random_vector<double>(n, 70 + i));
  auto results = ex.map(builtin_kernel::square(), inputs).get();
  for (std::size_t i = 0; i < inputs.size(); ++i)
    ASSERT_TRUE(testing::matches_reference(results[i], squared(inputs[i])));
  const placement_stats p = ex.placement();
  EXPECT_EQ(p.host_tasks, 0u);
  EXPECT_EQ(p.device_tasks, 0u);
}

TEST(TransformCall, AnOutputInPlaceOrApartMayBeWrittenInOnePass) {
  alignas(8) double buffer[16] = {};
  const auto call = [&](int x, int y, int out, std::size_t count) {
    return transform_call{x < 0 ? nullptr : buffer + x, y < 0 ? nullptr : buffer + y,
                          out < 0 ? nullptr : buffer + out, count};
  };
  EXPECT_TRUE(call(0, -1, -1, 4).output_in_place_or_apart(sizeof(double)));  // a new output
  EXPECT_TRUE(call(0, -1, 0, 4).output_in_place_or_apart(sizeof(double)));   // in place
  EXPECT_TRUE(call(0, 4, 4, 4).output_in_place_or_apart(sizeof(double)));    // over y
  EXPECT_TRUE(call(0, 4, 8, 4).output_in_place_or_apart(sizeof(double)));    // apart, touching
  EXPECT_TRUE(call(4, -1, 0, 4).output_in_place_or_apart(sizeof(double)));   // apart, before
  EXPECT_FALSE(call(0, -1, 2, 4).output_in_place_or_apart(sizeof(double)));  // part way into x
  EXPECT_FALSE(call(2, -1, 0, 4).output_in_place_or_apart(sizeof(double)));  // x part way in
  EXPECT_FALSE(call(0, 8, 6, 4).output_in_place_or_apart(sizeof(double)));   // part way into y
  // The count bounds each array: two elements of x end where out begins; five run into it.
  EXPECT_TRUE(call(0, -1, 2, 2).output_in_place_or_apart(sizeof(double)));
  EXPECT_FALSE(call(0, -1, 2, 5).output_in_place_or_apart(sizeof(double)));
}

TEST(HostLanes, OutputsOverlappingTheirInputsPartWayStayOnTheDevices) {
  executor_options o = testing::quiet_options(backend_kind::cpu, 1);
  o.host_lanes = 2;
  executor ex(o);
  constexpr std::size_t n = 256, calls = 64;
  const auto original = random_vector<double>(calls * (n + 1), 3);
  // Each call squares its n elements in place, or writes them one element further on (over
  // its own input, part way): the latter must read every input before writing.
  std::vector<double> in_place(original), shifted(original);
  std::vector<transform_call> same, overlapping;
  for (std::size_t c = 0; c < calls; ++c) {
    double* a = in_place.data() + c * (n + 1);
    same.push_back({a, nullptr, a, n});
    double* b = shifted.data() + c * (n + 1);
    overlapping.push_back({b, nullptr, b + 1, n});
  }
  ex.transform_each(builtin_kernel::square(), dtype::float64, same).get();
  const placement_stats after_same = ex.placement();
  EXPECT_EQ(after_same.host_tasks + after_same.device_tasks, calls);
  ex.transform_each(builtin_kernel::square(), dtype::float64, overlapping).get();
  const placement_stats after_overlapping = ex.placement();
  EXPECT_EQ(after_overlapping.host_tasks, after_same.host_tasks);
  EXPECT_EQ(after_overlapping.device_tasks, after_same.device_tasks);
  for (std::size_t c = 0; c < calls; ++c)
    for (std::size_t i = 0; i < n; ++i) {
      const double x = original[c * (n + 1) + i];
      ASSERT_EQ(in_place[c * (n + 1) + i], x * x) << "in place, call " << c;
      ASSERT_EQ(shifted[c * (n + 1) + i + 1], x * x) << "shifted, call " << c;
    }
}

TEST(HostLanes, TheTraceShowsTasksRunOnTheHostLanes) {
  executor ex(one_device(2));
  ex.set_tracing(true);
  const auto inputs = small_inputs(500, 300);
  (void)ex.map(builtin_kernel::square(), inputs).get();
  const trace t = ex.trace();
  std::size_t on_host = 0, on_devices = 0;
  for (const task_record& r : t.records()) {
    if (r.device != host_device) {
      ++on_devices;
      continue;
    }
    ++on_host;
    EXPECT_GE(r.lane, ex.lane_count());
    EXPECT_LT(r.lane, ex.lane_count() + ex.host_lanes());
    EXPECT_STREQ(r.name.c_str(), "square");
    EXPECT_TRUE(r.kernel.present());
    EXPECT_FALSE(went_through_stream(r));
    EXPECT_GE(r.started, r.submitted);
    EXPECT_GE(r.done, r.kernel.end);
    EXPECT_FALSE(r.failed);
  }
  const placement_stats p = ex.placement();
  EXPECT_EQ(on_host, p.host_tasks);
  EXPECT_EQ(on_host + on_devices, inputs.size());
  ASSERT_GT(on_host, 0u);
  // Lanes, then totals per device: the host's after the devices', as its lane numbers are.
  const std::vector<lane_stats> stats = t.stats();
  ASSERT_FALSE(stats.empty());
  EXPECT_EQ(stats.front().device, 0);
  EXPECT_EQ(stats.back().device, host_device);
  EXPECT_EQ(stats.back().lane, -1);
  EXPECT_EQ(stats.back().tasks, on_host);
  std::ostringstream chrome, table;
  t.write_chrome_json(chrome);
  t.write_stats_table(table);
  EXPECT_NE(chrome.str().find("\"host lanes\""), std::string::npos);
  EXPECT_NE(table.str().find("\nhost "), std::string::npos) << table.str();
}

// With 8 MiB chunks a call is one piece on the device; with 4 KiB ones, four: either way the
// device's side of a group is measured once, as its last call ends.
class PlacementTest : public ::testing::TestWithParam<std::size_t> {};

INSTANTIATE_TEST_SUITE_P(Chunks, PlacementTest,
                         ::testing::Values(std::size_t{8} << 20, std::size_t{4} << 10));

TEST_P(PlacementTest, PlacementMovesCallsToTheFasterSide) {
  // A stand-in device whose copies run at 20 MB/s: a call of 16 KiB in and out takes about a
  // millisecond there and microseconds on the host.
  executor_options o = one_device(1);
  o.cpu_copy_rate = 20e6;
  o.chunk_bytes = GetParam();
  executor ex(o);
  const double first_share = ex.placement().host_share;
  EXPECT_DOUBLE_EQ(first_share, 0.5);  // one lane each side, nothing measured yet
  std::vector<std::vector<double>> inputs;
  for (std::size_t i = 0; i < 64; ++i) inputs.push_back(random_vector<double>(2048, i));
  for (int round = 0; round < 8; ++round) {
    auto results = ex.map(builtin_kernel::square(), inputs).get();
    for (std::size_t i = 0; i < inputs.size(); ++i)
      ASSERT_TRUE(testing::matches_reference(results[i], squared(inputs[i])));
  }
  const placement_stats p = ex.placement();
  EXPECT_GT(p.host_bytes_per_second, p.device_bytes_per_second);
  EXPECT_GT(p.host_share, 0.9);
  EXPECT_GT(p.host_tasks, 3 * p.device_tasks);
  EXPECT_GT(p.device_tasks, 0u);  // the slower side still gets its least share
}

TEST(HostLanes, ShutdownCancelsTheCallsQueuedForTheHostLanes) {
  executor ex(one_device(1));
  held_lane device(ex);
  // The host lane held too: the first callback it runs waits. The largest calls it takes, and
  // many, so that it is still at them as the callbacks are added (from the last call back).
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  std::atomic<bool> host_held{false};
  std::vector<std::vector<double>> first;
  for (std::size_t i = 0; i < 400; ++i)
    first.push_back(random_vector<double>(limits::most_host_task_bytes / 16, i));
  auto holding = ex.map(builtin_kernel::square(), first);
  for (std::size_t i = holding.size(); i-- > 0;)
    holding[i].on_complete([&](future<host_vector<double>>&) {
      if (ex.is_lane_thread() && !host_held.exchange(true)) opened.wait();
    });
  for (int i = 0; i < 10000 && !host_held; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!host_held) open.set_value();  // let the lanes go before failing
  ASSERT_TRUE(host_held) << "no callback ran on the host lane";
  // Calls queued now wait on both sides.
  const std::uint64_t host_before = ex.placement().host_tasks;
  const auto inputs = small_inputs(200, 100);
  auto futures = ex.map(builtin_kernel::square(), inputs);
  const std::uint64_t placed_on_host = ex.placement().host_tasks - host_before;
  ASSERT_GT(placed_on_host, 0u);
  std::thread stopper([&] { ex.shutdown(/*cancel_pending=*/true); });
  // Cancelling comes before waiting for the lanes: every queued call ends while both are held.
  for (auto& f : futures) f.wait();
  for (std::size_t i = 0; i < futures.size(); ++i)
    EXPECT_EQ(futures[i].status(), task_status::cancelled) << "call " << i;
  open.set_value();
  device.release();
  stopper.join();
  EXPECT_EQ(ex.in_flight().bytes, 0u);
}

TEST(HostLanes, ShutdownThatCancelsPendingWorkEndsEveryCall) {
  executor ex(one_device(1));
  // The device's lane held, so that the calls placed there wait; the host lane keeps running.
  held_lane device(ex);
  const auto inputs = small_inputs(3000, 200);
  auto futures = ex.map(builtin_kernel::square(), inputs);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    device.release();
  });
  ex.shutdown(/*cancel_pending=*/true);
  releaser.join();
  std::size_t succeeded = 0, cancelled = 0;
  for (std::size_t i = 0; i < futures.size(); ++i) {
    ASSERT_TRUE(futures[i].ready()) << "call " << i;
    const task_status s = futures[i].status();
    if (s == task_status::succeeded) {
      ++succeeded;
      ASSERT_TRUE(testing::matches_reference(futures[i].get(), squared(inputs[i])));
    } else {
      ASSERT_EQ(s, task_status::cancelled) << "call " << i;
      ++cancelled;
    }
  }
  EXPECT_EQ(succeeded + cancelled, inputs.size());
  EXPECT_GT(cancelled, 0u);  // at least those placed behind the held lane
  EXPECT_EQ(ex.in_flight().bytes, 0u);
}

TEST(HostLanes, CancelledCallsAreCountedOutAndTheRestRun) {
  executor_options o = testing::quiet_options(backend_kind::cpu, 1);
  o.host_lanes = 2;
  executor ex(o);
  const auto inputs = small_inputs(4000, 100);
  auto futures = ex.map(builtin_kernel::square(), inputs);
  for (std::size_t i = 0; i < futures.size(); i += 2) (void)futures[i].cancel();
  for (std::size_t i = 0; i < futures.size(); ++i) {
    futures[i].wait();
    if (futures[i].status() == task_status::succeeded)
      ASSERT_TRUE(testing::matches_reference(futures[i].get(), squared(inputs[i])));
    else
      ASSERT_EQ(futures[i].status(), task_status::cancelled);
  }
  ex.shutdown(false);
  EXPECT_EQ(ex.in_flight().bytes, 0u);
}

TEST(HostLanes, ACallbackOnAHostLaneIsOnTheExecutorsOwnThread) {
  executor ex(one_device(1));
  // The device's lane held: until it is let go, only the host lane completes calls.
  held_lane device(ex);
  const auto inputs = small_inputs(400, 2000);
  auto futures = ex.map(builtin_kernel::square(), inputs);
  std::atomic<int> on_lanes{0}, refused{0}, nested_ok{0};
  std::atomic<std::size_t> callbacks{0};
  const std::vector<std::vector<double>> nested_input{{2.0, 3.0}};
  std::mutex nested_mutex;
  std::vector<decltype(ex.map(builtin_kernel::square(), nested_input))> nested;
  for (auto& f : futures)
    f.on_complete([&](future<host_vector<double>>&) {
      struct count_at_end {
        std::atomic<std::size_t>& n;
        ~count_at_end() { ++n; }
      } counted{callbacks};
      if (!ex.is_lane_thread()) return;  // completed before the callback was added
      ++on_lanes;
      try {
        ex.shutdown(false);
      } catch (const std::logic_error&) {
        ++refused;
      }
      // Work queued from a lane is admitted without waiting, and runs (its input outlives it).
      auto more = ex.map(builtin_kernel::square(), nested_input);
      std::lock_guard lock(nested_mutex);
      nested.push_back(std::move(more));
      ++nested_ok;
    });
  // Wait until the host lane has completed something with its callback, then let the device go.
  for (int i = 0; i < 2000 && on_lanes.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  device.release();
  // A future is ready before its callbacks have run: wait for them too.
  while (callbacks.load() < futures.size()) std::this_thread::yield();
  ex.shutdown(false);
  for (auto& more : nested) {
    const auto results = more.get();
    ASSERT_EQ(results.size(), 1u);
    EXPECT_TRUE(testing::matches_reference(results[0], std::vector<double>{4.0, 9.0}));
  }
  EXPECT_GT(on_lanes.load(), 0);
  EXPECT_EQ(refused.load(), on_lanes.load());
  EXPECT_EQ(nested_ok.load(), on_lanes.load());
}

TEST(HostLanes, ValuesOutsideTheLimitsAreRefused) {
  for (int bad : {-1, limits::most_host_lanes + 1}) {
    executor_options o = testing::quiet_options(backend_kind::cpu, 1);
    o.host_lanes = bad;
    EXPECT_THROW(executor{o}, std::invalid_argument) << bad;
  }
}

TEST(HostLanes, WithoutHostLanesNothingIsPlaced) {
  executor ex(testing::quiet_options(backend_kind::cpu, 1));
  EXPECT_EQ(ex.host_lanes(), 0);
  (void)ex.map(builtin_kernel::square(), small_inputs(100)).get();
  const placement_stats p = ex.placement();
  EXPECT_EQ(p.host_tasks, 0u);
  EXPECT_EQ(p.device_tasks, 0u);
  EXPECT_EQ(p.host_share, 0.0);
}

// The names of this process's threads, as Linux keeps them (15 characters at most).
std::vector<std::string> thread_names() {
  std::vector<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.push_back(name);
  }
  return names;
}

TEST(LaneThreads, EveryLaneIsNamedForItsDeviceAndIndexAndEveryHostLaneForItsIndex) {
  executor_options o = testing::quiet_options(backend_kind::cpu, 3);
  o.cpu_devices = 2;
  o.host_lanes = 2;
  executor ex(o);
  const std::vector<std::string> names = thread_names();
  const auto count = [&](const std::string& name) {
    return std::count(names.begin(), names.end(), name);
  };
  for (const char* name : {"gpupool d0.0", "gpupool d0.1", "gpupool d0.2", "gpupool d1.0",
                           "gpupool d1.1", "gpupool d1.2", "gpupool host.0", "gpupool host.1"})
    EXPECT_EQ(count(name), 1) << name;
  EXPECT_EQ(count("gpupool d0.3"), 0);
  EXPECT_EQ(count("gpupool host.2"), 0);
}

}  // namespace
}  // namespace gpupool
