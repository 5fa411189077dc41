// The executor's priority reaches its lanes' CUDA streams: above 0 each step is one CUDA level
// above the device's least, 0 and below are the least, and a level the device lacks is refused
// when the executor is made. Needs a GPU (skipped without one).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpupool/executor.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

using namespace gpupool::testing;

struct priority_range {
  int least = 0;
  int greatest = 0;
};

priority_range device_range(int ordinal) {
  priority_range r;
  EXPECT_EQ(cudaSetDevice(ordinal), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetStreamPriorityRange(&r.least, &r.greatest), cudaSuccess);
  return r;
}

// The CUDA priority of the stream of every lane of `ex` (one task per lane, all held until
// every lane has one, so that no lane answers twice).
std::set<int> lane_stream_priorities(executor& ex) {
  const int lanes = ex.lane_count();
  std::atomic<int> arrived{0};
  std::vector<future<int>> asked;
  for (int i = 0; i < lanes; ++i)
    asked.push_back(ex.submit([&](lane& l) {
      arrived.fetch_add(1);
      while (arrived.load() < lanes) std::this_thread::yield();
      int priority = 1000;
      if (cudaStreamGetPriority(static_cast<cudaStream_t>(l.native_stream()), &priority) !=
          cudaSuccess)
        throw std::runtime_error("cudaStreamGetPriority failed");
      return priority;
    }));
  std::set<int> seen;
  for (auto& f : asked) seen.insert(f.get());
  return seen;
}

TEST(CudaStreamPriority, TheExecutorsPriorityIsItsLanesStreamPriority) {
  GPUPOOL_SKIP_UNLESS_USABLE(backend_kind::cuda);
  const priority_range range = device_range(0);
  for (int p = limits::lowest_priority; p <= limits::highest_priority; ++p) {
    const int expected = p <= 0 ? range.least : range.least - p;
    if (expected < range.greatest) continue;  // refused: the next test
    executor_options o = quiet_options(backend_kind::cuda, 3);
    o.devices = {0};
    o.priority = p;
    executor ex(o);
    EXPECT_EQ(lane_stream_priorities(ex), std::set<int>{expected}) << "priority " << p;
  }
}

TEST(CudaStreamPriority, APriorityBeyondTheDevicesRangeIsRefused) {
  GPUPOOL_SKIP_UNLESS_USABLE(backend_kind::cuda);
  const priority_range range = device_range(0);
  if (range.least - limits::highest_priority >= range.greatest)
    GTEST_SKIP() << "GPU 0 has every level gpupool asks for (" << range.least << " to "
                 << range.greatest << ")";
  executor_options o = quiet_options(backend_kind::cuda, 1);
  o.devices = {0};
  o.priority = limits::highest_priority;
  try {
    executor ex(o);
    FAIL() << "an executor was made at a priority GPU 0 lacks";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("beyond the range of GPU 0"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gpupool
