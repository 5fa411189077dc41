// A device fault takes one device out of service, not the pool: the work only that device could
// run fails with a device_fault naming the fault, its other queued work runs on the devices left,
// and with no device left everything queued fails and new work is refused. CPU backend with
// stand-in devices (a task throwing gpupool::device_fault is the fault); the CUDA case, a kernel
// writing to an illegal address, is tests/device_fault.cpp (its own process: the fault ends the
// device's context for the rest of the process).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace gpupool {
namespace {

using namespace std::chrono_literals;

executor_options stand_ins(int devices, int lanes) {
  executor_options o = testing::quiet_options(backend_kind::cpu, lanes);
  o.cpu_devices = devices;
  o.tuning = tuning::fixed;
  return o;
}

template <class T>
std::string failure_of(future<T>& f) {
  if (!f.wait_for(30s)) return "still pending after 30 s";
  try {
    (void)f.get();
    return "succeeded";
  } catch (const device_fault& e) {
    return std::string("device_fault: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other error: ") + e.what();
  }
}

// The failure of the first of `futures` that failed, or "succeeded".
template <class T>
std::string failure_of(multi_future<T>& futures) {
  for (auto& f : futures)
    if (std::string why = failure_of(f); why != "succeeded") return why;
  return "succeeded";
}

template <class T>
bool all_ready_within(multi_future<T>& futures, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (auto& f : futures)
    if (!f.wait_for(std::max(deadline - std::chrono::steady_clock::now(),
                             std::chrono::steady_clock::duration::zero())))
      return false;
  return true;
}

TEST(Quarantine, AFaultTakesItsDeviceOutAndTheOthersRunItsQueuedWork) {
  testing::gate fault_gate, rest_gate;
  executor ex(stand_ins(2, 2));
  // Every lane busy, so that what follows stays queued on both devices: device 1's lanes wait
  // to fault (one) and to finish normally (the other), device 0's to go on later.
  std::atomic<int> started{0};
  auto faulting = ex.submit_to(1, [&](lane&) {
    started.fetch_add(1);
    fault_gate.wait();
    throw device_fault("injected: device 1 lost its context");
  });
  auto in_flight = ex.submit_to(1, [&](lane&) {
    started.fetch_add(1);
    rest_gate.wait();
    return 7;
  });
  while (started.load() < 2) std::this_thread::sleep_for(1ms);
  auto held = testing::hold_lanes_of(ex, 0, rest_gate);

  // Queued now: tasks only device 1 may run, and work for any device (map deals it out over both
  // devices' queues).
  std::vector<future<int>> only_there;
  for (int i = 0; i < 3; ++i) only_there.push_back(ex.submit_to(1, [](lane&) { return 1; }));
  const std::vector<std::vector<double>> inputs(40, std::vector<double>(1000, 3.0));
  auto squares = ex.map(builtin_kernel::square(), inputs);
  std::vector<future<int>> anywhere;
  for (int i = 0; i < 20; ++i) anywhere.push_back(ex.submit([i](lane&) { return i; }));

  ::testing::internal::CaptureStderr();
  fault_gate.open();
  const std::string faulted = failure_of(faulting);
  EXPECT_NE(faulted.find("injected: device 1 lost its context"), std::string::npos) << faulted;
  for (auto& f : only_there) {
    const std::string why = failure_of(f);
    EXPECT_EQ(why.rfind("device_fault: ", 0), 0u) << why;
    EXPECT_NE(why.find("device 1"), std::string::npos) << why;
    EXPECT_NE(why.find("out of service"), std::string::npos) << why;
    EXPECT_NE(why.find("injected: device 1 lost its context"), std::string::npos) << why;
  }
  rest_gate.open();

  // Work already running on the faulted device ends as it would have; the rest ran on device 0.
  ASSERT_TRUE(in_flight.wait_for(30s));
  EXPECT_EQ(in_flight.get(), 7);
  ASSERT_TRUE(all_ready_within(squares, 30s))
      << "work queued on the faulted device was left behind";
  for (const auto& out : squares.get())
    for (double v : out) ASSERT_EQ(v, 9.0);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(anywhere[static_cast<std::size_t>(i)].wait_for(30s));
    EXPECT_EQ(anywhere[static_cast<std::size_t>(i)].get(), i);
  }
  for (auto& h : held) h.get();

  // From now on device 1 refuses work and the pool goes on with device 0. A quiet executor says
  // nothing of the fault on stderr.
  try {
    (void)ex.submit_to(1, [](lane&) { return 0; });
    ADD_FAILURE() << "the faulted device took new work";
  } catch (const device_fault& e) {
    EXPECT_NE(std::string(e.what()).find("device 1"), std::string::npos) << e.what();
  }
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(ex.submit([i](lane& l) { return l.device() + i; }).get(), i);
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("out of service"), std::string::npos);
  ex.shutdown();
}

TEST(Quarantine, TheFaultIsSaidOnceOnStderrUnlessQuiet) {
  executor_options o = stand_ins(2, 2);
  o.quiet = false;
  testing::gate gate;
  executor ex(o);
  ::testing::internal::CaptureStderr();
  // Both lanes of device 1 fault, after both have started (else the second could be refused).
  std::atomic<int> started{0};
  std::vector<future<void>> faults;
  for (int i = 0; i < 2; ++i)
    faults.push_back(ex.submit_to(1, [&](lane&) {
      started.fetch_add(1);
      gate.wait();
      throw device_fault("injected twice");
    }));
  while (started.load() < 2) std::this_thread::sleep_for(1ms);
  gate.open();
  for (auto& f : faults) EXPECT_EQ(failure_of(f).rfind("device_fault: ", 0), 0u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(ex.submit([i](lane&) { return i; }).get(), i);
  const std::string said = ::testing::internal::GetCapturedStderr();
  std::size_t lines = 0;
  for (auto at = said.find("out of service"); at != std::string::npos;
       at = said.find("out of service", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << said;
  EXPECT_NE(said.find("the other devices take its queued work"), std::string::npos) << said;
}

TEST(Quarantine, WithNoDeviceLeftQueuedWorkFailsAndNewWorkIsRefused) {
  testing::gate gate;
  executor ex(stand_ins(1, 1));
  std::atomic<bool> started{false};
  auto faulting = ex.submit([&](lane&) {
    started.store(true);
    gate.wait();
    throw device_fault("injected: the only device broke");
  });
  while (!started.load()) std::this_thread::sleep_for(1ms);
  std::vector<future<int>> queued;
  for (int i = 0; i < 5; ++i) queued.push_back(ex.submit([](lane&) { return 1; }));
  const std::vector<std::vector<float>> inputs(8, std::vector<float>(100, 2.0f));
  auto squares = ex.map(builtin_kernel::square(), inputs);
  gate.open();

  EXPECT_EQ(failure_of(faulting).rfind("device_fault: ", 0), 0u);
  for (auto& f : queued) {
    const std::string why = failure_of(f);
    EXPECT_EQ(why.rfind("device_fault: ", 0), 0u) << why;
    EXPECT_NE(why.find("injected: the only device broke"), std::string::npos) << why;
  }
  EXPECT_EQ(failure_of(squares).rfind("device_fault: ", 0), 0u);
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      (void)ex.submit([](lane&) { return 0; });
      ADD_FAILURE() << "a pool with no device left took new work";
    } catch (const device_fault& e) {
      EXPECT_NE(std::string(e.what()).find("every device is out of service"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW((void)ex.map(builtin_kernel::square(), inputs), device_fault);
  ex.shutdown();  // returns: the lanes of the faulted device have left
}

// Failures that are not device faults leave the device in service.
TEST(Quarantine, OrdinaryFailuresLeaveTheDeviceInService) {
  executor ex(stand_ins(1, 2));
  for (int i = 0; i < 20; ++i)
    EXPECT_THROW(ex.submit([](lane&) -> int { throw std::runtime_error("ordinary"); }).get(),
                 std::runtime_error);
  EXPECT_THROW(ex.submit([](lane&) -> int { throw out_of_memory("not a fault"); }).get(),
               out_of_memory);
  EXPECT_EQ(ex.submit([](lane&) { return 5; }).get(), 5);
}

}  // namespace
}  // namespace gpupool
