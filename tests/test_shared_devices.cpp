// One GPU as several devices: an ordinal named more than once in executor_options::devices (or
// GPUPOOL_DEVICES) makes that many devices of the executor, each with its own lanes, budgets,
// statistics and quarantine, sharing the GPU's memory and copy engines. On both backends, so
// that every multi-device path runs on real CUDA with one GPU. Also the CPU stand-in devices'
// copy rate (executor_options::cpu_copy_rate), shared the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace gpupool {
namespace {

using namespace std::chrono_literals;

class SharedDevices : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override { GPUPOOL_SKIP_UNLESS_USABLE(GetParam()); }

  // Device 0 of the backend as `count` devices of `lanes` lanes each.
  executor_options one_as(int count, int lanes = 2) const {
    executor_options o = testing::quiet_options(GetParam(), lanes);
    o.devices.assign(static_cast<std::size_t>(count), 0);
    o.cpu_devices = 1;
    o.tuning = tuning::fixed;
    o.chunk_bytes = std::size_t{1} << 20;
    return o;
  }
};

TEST_P(SharedDevices, OneGpuIsTwoDevicesThatShareItsMemory) {
  // What one device alone is given, read before and after (other processes move it a little).
  const std::size_t before = executor(one_as(1)).devices().at(0).free_memory;
  executor ex(one_as(2));
  const std::size_t after = executor(one_as(1)).devices().at(0).free_memory;
  const std::size_t least = std::min(before, after), most = std::max(before, after);
  ASSERT_EQ(ex.devices().size(), 2u);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(ex.devices()[static_cast<std::size_t>(d)].id, d);
    EXPECT_EQ(ex.devices()[static_cast<std::size_t>(d)].ordinal, 0);
    // Each has half of what one device alone is given.
    EXPECT_LE(ex.devices()[static_cast<std::size_t>(d)].free_memory, most / 20 * 11);
    EXPECT_GE(ex.devices()[static_cast<std::size_t>(d)].free_memory, least / 20 * 9);
  }
  EXPECT_EQ(ex.devices()[0].name, ex.devices()[1].name);
  EXPECT_EQ(ex.lane_count(), 4);
  EXPECT_EQ(ex.memory_stats().size(), 2u);
}

TEST_P(SharedDevices, WorkSpreadsOverBothAndSubmitToPinsIt) {
  executor ex(one_as(2));
  EXPECT_TRUE(ex.in_service(0) && ex.in_service(1));
  // Four tasks that each wait for all four to run: only every lane of both devices at once can
  // run them (a deadline ends the wait, and the check below then fails, if that never happens).
  std::atomic<int> arrived{0};
  multi_future<int> meeting;
  for (int i = 0; i < 4; ++i)
    meeting.push_back(ex.submit([&arrived](lane& l) {
      arrived.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + 30s;
      while (arrived.load() < 4 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
      return l.device();
    }));
  auto used = meeting.get();
  std::sort(used.begin(), used.end());
  EXPECT_EQ(used, (std::vector<int>{0, 0, 1, 1}));
  multi_future<int> pinned;
  for (int i = 0; i < 20; ++i)
    pinned.push_back(ex.submit_to(1, [](lane& l) { return l.device(); }));
  for (int d : pinned.get()) EXPECT_EQ(d, 1);
  // A map's pieces, with every result right (where they run is the scheduler's choice: quick
  // pieces may all go to the lanes that happen to be awake).
  std::vector<std::vector<float>> xs;
  for (int i = 0; i < 64; ++i) xs.push_back(std::vector<float>(50'000, static_cast<float>(i)));
  auto results = ex.map(builtin_kernel::square(), xs).get();
  for (std::size_t i = 0; i < xs.size(); ++i)
    ASSERT_EQ(results[i][49'999], static_cast<float>(i * i)) << "input " << i;
}

TEST_P(SharedDevices, EachHasItsOwnDeviceMemoryBudget) {
  executor_options o = one_as(2, 1);
  o.device_memory_budget = std::size_t{16} << 20;  // each device's
  executor ex(o);
  for (const auto& m : ex.memory_stats()) EXPECT_EQ(m.budget, o.device_memory_budget);
  // Ten MiB held on device 0 leave device 1's budget whole, and device 0's short of ten more.
  testing::gate second_try;
  std::atomic<bool> holding{false};
  auto on_zero = ex.submit_to(0, [&](lane& l) {
    auto held = l.allocate<char>(std::size_t{10} << 20);
    holding = true;
    second_try.wait();
    (void)l.allocate<char>(std::size_t{10} << 20);
  });
  while (!holding.load() && !on_zero.wait_for(1ms)) {
  }
  ASSERT_TRUE(holding.load()) << "device 0 could not allocate ten MiB of its sixteen";
  EXPECT_NO_THROW(
      ex.submit_to(1, [](lane& l) { (void)l.allocate<char>(std::size_t{10} << 20); }).get());
  second_try.open();
  EXPECT_THROW(on_zero.get(), out_of_memory);
}

TEST_P(SharedDevices, AMapOverDeviceArraysRunsOnEitherDevice) {
  executor ex(one_as(2));
  elementwise_kernel k("float64 x, float64 a", "float64 y", "y = x * a + 1.0", "shared_fma");
  constexpr std::size_t calls = 40, n = 1000;
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i);
  // Arrays on the GPU, made by a lane of device 0; the maps run on device 1 and on device 0.
  std::vector<device_array<double>> dx(calls), dy(calls);
  ex.submit_to(0, [&](lane& l) {
      for (std::size_t c = 0; c < calls; ++c) {
        dx[c] = l.upload(std::span<const double>(x));
        dy[c] = l.allocate<double>(n);
      }
    }).get();
  for (int device : {1, 0}) {
    std::vector<device_call> work;
    for (std::size_t c = 0; c < calls; ++c)
      work.push_back({{dx[c], static_cast<double>(c + 1)}, dy[c].data(), n});
    ex.map_on_device(device, k, work).get();
    std::vector<std::vector<double>> out(calls, std::vector<double>(n));
    ex.submit_to(device, [&](lane& l) {
        for (std::size_t c = 0; c < calls; ++c) l.download(dy[c], std::span<double>(out[c]));
      }).get();
    for (std::size_t c = 0; c < calls; ++c)
      ASSERT_EQ(out[c][n - 1], x[n - 1] * static_cast<double>(c + 1) + 1.0)
          << "device " << device << ", call " << c;
  }
  ex.submit_to(0, [&](lane&) {
      dx.clear();
      dy.clear();
    }).get();
}

TEST_P(SharedDevices, AFaultTakesOneOutAndTheOtherRunsItsQueuedWork) {
  executor ex(one_as(2, 1));
  testing::gate fault_gate, hold_gate;
  std::atomic<bool> started{false};
  auto faulting = ex.submit_to(1, [&](lane&) {
    started = true;
    fault_gate.wait();
    throw device_fault("injected: device 1 lost its context");
  });
  while (!started.load()) std::this_thread::sleep_for(1ms);
  auto held = testing::hold_lanes_of(ex, 0, hold_gate);
  testing::open_at_exit open_hold(hold_gate, held);
  // Queued behind both: work for either device, and work only device 1 may run.
  multi_future<int> anywhere;
  for (int i = 0; i < 10; ++i) anywhere.push_back(ex.submit([](lane& l) { return l.device(); }));
  auto only_one = ex.submit_to(1, [](lane&) { return 1; });
  fault_gate.open();
  EXPECT_THROW(faulting.get(), device_fault);
  EXPECT_THROW(only_one.get(), device_fault);
  hold_gate.open();
  for (int d : anywhere.get()) EXPECT_EQ(d, 0);
  EXPECT_THROW((void)ex.submit_to(1, [](lane&) {}), device_fault);
  EXPECT_EQ(ex.submit([](lane& l) { return l.device(); }).get(), 0);
  EXPECT_TRUE(ex.in_service(0));
  EXPECT_FALSE(ex.in_service(1));
  EXPECT_FALSE(ex.in_service(2));  // no such device
}

TEST_P(SharedDevices, ShutdownCancellingPendingWorkCancelsItOnBoth) {
  executor ex(one_as(2, 1));
  testing::gate g;
  auto held = testing::hold_every_lane(ex, g);
  multi_future<int> queued;
  for (int i = 0; i < 20; ++i) queued.push_back(ex.submit_to(i % 2, [](lane&) { return 1; }));
  std::thread stopper([&] { ex.shutdown(/*cancel_pending=*/true); });
  // The queued tasks are cancelled while the held ones still run.
  for (auto& f : queued) {
    ASSERT_TRUE(f.wait_for(30s));
    EXPECT_THROW((void)f.get(), cancelled_error);
  }
  g.open();
  stopper.join();
  held.get();
}

INSTANTIATE_TEST_SUITE_P(Backends, SharedDevices,
                         ::testing::Values(backend_kind::cpu, backend_kind::cuda),
                         testing::backend_name);

// GPUPOOL_DEVICES names the devices where the options name none.
TEST(DevicesVariable, NamesTheDevicesWhereTheOptionsNameNone) {
  executor_options o = testing::quiet_options(backend_kind::cpu, 1);
  o.cpu_devices = 2;
  {
    const testing::scoped_env devices("GPUPOOL_DEVICES", "1,0,1");
    executor ex(o);
    ASSERT_EQ(ex.devices().size(), 3u);
    EXPECT_EQ(ex.devices()[0].ordinal, 1);
    EXPECT_EQ(ex.devices()[1].ordinal, 0);
    EXPECT_EQ(ex.devices()[2].ordinal, 1);
    o.devices = {0};  // the options win
    EXPECT_EQ(executor(o).devices().size(), 1u);
    o.devices.clear();
  }
  for (const char* bad : {"0,,1", ",0", "0,", "a", " 0", "0 ,1", "-1", "0x1", "70000"}) {
    const testing::scoped_env devices("GPUPOOL_DEVICES", bad);
    try {
      executor ex(o);
      ADD_FAILURE() << "GPUPOOL_DEVICES='" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("GPUPOOL_DEVICES"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  const testing::scoped_env missing("GPUPOOL_DEVICES", "0,2");
  try {
    executor ex(o);
    ADD_FAILURE() << "device 2 of 2 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("device 2 does not exist"), std::string::npos) << e.what();
  }
}

// A stand-in device's copy rate: every copy to or from its memory takes its bytes at that rate,
// one copy at a time per direction, whichever of its lanes (or of the executor's devices of it)
// makes them; separate stand-in devices copy at the same time.
class CopyRate : public ::testing::Test {
 protected:
  // Little data at a low rate: the pacing, not the host's copies and squares, sets the time
  // even on a loaded machine under a sanitizer.
  static constexpr double rate = 4.0 * (1 << 20);                // bytes per second each way
  static constexpr std::size_t elements = std::size_t{1} << 18;  // 1 MiB of float32 each way
  static constexpr std::size_t inputs = 64;

  // Seconds `devices` take to square 1 MiB of float32 in `inputs` inputs. Slots hold one input
  // each, so that no batch carries more than one: however late a loaded machine wakes the lanes,
  // inputs cannot pile into one device's batch while the other device waits.
  static double seconds_for(std::vector<int> devices, int stand_ins) {
    executor_options o = testing::quiet_options(backend_kind::cpu, 4);
    o.cpu_devices = stand_ins;
    o.devices = std::move(devices);
    o.tuning = tuning::fixed;
    o.chunk_bytes = elements / inputs * sizeof(float);
    o.cpu_copy_rate = rate;
    executor ex(o);
    std::vector<std::vector<float>> xs(inputs, std::vector<float>(elements / inputs, 3.0f));
    const auto start = std::chrono::steady_clock::now();
    auto results = ex.map(builtin_kernel::square(), xs).get();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& r : results)
      for (float v : r) EXPECT_EQ(v, 9.0f);
    return seconds;
  }
};

TEST_F(CopyRate, CopiesTakeTheirBytesAtTheRateSharedByTheDevicesOfOneStandIn) {
  const double bound = static_cast<double>(elements * sizeof(float)) / rate;  // each direction
  const double one = seconds_for({0}, 1);
  EXPECT_GE(one, bound);
  // Two devices of one stand-in share its copies: no faster.
  EXPECT_GE(seconds_for({0, 0}, 1), bound);
  // Two stand-ins copy side by side: about half the time.
  const double two = seconds_for({0, 1}, 2);
  EXPECT_GE(two, bound / 2);
  EXPECT_LT(two, one * 0.8);
}

TEST(CopyRateOption, NegativeOrNotFiniteIsRefused) {
  executor_options o = testing::quiet_options(backend_kind::cpu, 1);
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(), 41.3,
                     std::numeric_limits<double>::denorm_min()}) {
    o.cpu_copy_rate = bad;
    try {
      executor ex(o);
      ADD_FAILURE() << "cpu_copy_rate " << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("cpu_copy_rate"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace gpupool
