// CUDA failures become exceptions that fail the task that caused them, not the process.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_support.hpp"

namespace gpupool {
namespace {

class CudaErrorTest : public ::testing::Test {
 protected:
  void SetUp() override { GPUPOOL_SKIP_UNLESS_USABLE(backend_kind::cuda); }
};

TEST_F(CudaErrorTest, ABadCopyFailsItsTaskWithTheCudaErrorName) {
  executor ex({.backend = backend_kind::cuda, .lanes_per_device = 1});
  pinned_vector<double> host(1024, 1.0);
  auto bad = ex.submit([&](lane& l) {
    // A copy from an address that is no device memory: the runtime refuses it.
    l.download_bytes(host.data(), reinterpret_cast<const void*>(0x10), 4096);
    l.synchronize();
  });
  try {
    bad.get();
    FAIL() << "the failing copy raised nothing";
  } catch (const cuda_error& e) {
    EXPECT_EQ(e.name().rfind("cudaError", 0), 0u) << e.what();
    EXPECT_FALSE(e.call().empty());
    EXPECT_NE(std::string(e.what()).find(e.name()), std::string::npos);
  }
  // The lane and the executor carry on.
  const std::vector<std::vector<double>> xs{std::vector<double>(10, 3.0)};
  EXPECT_EQ(ex.map(builtin_kernel::square(), xs).get()[0][9], 9.0);
}

TEST_F(CudaErrorTest, DeviceInfoDescribesARealGpu) {
  executor ex({.backend = backend_kind::cuda, .lanes_per_device = 1});
  for (const auto& d : ex.devices()) {
    EXPECT_GE(d.compute_major, 5);
    EXPECT_GT(d.multiprocessors, 0);
    EXPECT_GT(d.total_memory, std::size_t{1} << 30);
  }
}

}  // namespace
}  // namespace gpupool
