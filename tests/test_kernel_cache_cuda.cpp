// The CUDA backend's side of the kernel cache's fallback (NVRTC compiles in memory where the
// cache folder cannot be used; needs the toolkit, not a GPU), and the lifetime of loaded kernels
// (executors made and dropped let their libraries go; needs a GPU, skipped without one).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/kernels/kernel_cache.hpp"
#include "cuda/nvrtc_compiler.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

namespace fs = std::filesystem;
using testing::scoped_cache_dir;
using testing::temporary_folder;

class NvrtcFallback : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (!detail::cuda::nvrtc_available(&reason)) GTEST_SKIP() << reason;
  }
};

TEST_F(NvrtcFallback, AnUnusableCacheFolderCompilesInMemoryAndWritesNothing) {
  const std::string base = temporary_folder("nvrtc-fallback");
  std::ofstream(base + "/file") << "not a folder\n";
  const std::string open = base + "/open";
  fs::create_directory(open);
  ::chmod(open.c_str(), 0777);
  int n = 0;
  for (const std::string& dir : {base + "/file/cache", open}) {
    SCOPED_TRACE(dir);
    scoped_cache_dir cache(dir);
    ++n;
    elementwise_kernel k("float32 x", "float32 y", "y = x * " + std::to_string(n) + ";",
                         "in_memory_" + std::to_string(n));
    const std::size_t before = kernels_compiled();
    auto cubin = detail::cuda::compile_cubin(k, {true}, 9, 0);
    ASSERT_GT(cubin->size(), 64u);
    EXPECT_EQ(cubin->substr(0, 4), std::string("\x7f"
                                               "ELF"));
    EXPECT_EQ(kernels_compiled(), before + 1);
    // Asked again: the image kept in memory, not compiled again.
    EXPECT_EQ(*detail::cuda::compile_cubin(k, {true}, 9, 0), *cubin);
    EXPECT_EQ(kernels_compiled(), before + 1);
    // Raw kernels too.
    raw_kernel raw("extern \"C\" __global__ void fill" + std::to_string(n) +
                       "(float* out, unsigned long long count) { if (count) out[0] = 1; }",
                   "fill" + std::to_string(n), "", "float32* out");
    EXPECT_EQ(detail::cuda::compile_raw_cubin(raw, 9, 0)->entry, "fill" + std::to_string(n));
  }
  // The folder others can write to was left as it was: nothing made, nothing stored there.
  EXPECT_TRUE(fs::is_empty(open));
  EXPECT_TRUE(detail::cache_unusable_warned());
}

// Executors on the GPU, each running a compiled kernel, then dropped: the libraries they loaded
// go with them. Two executors alive at once share one.
TEST(CudaKernelLifetime, ExecutorsMadeAndDroppedLetTheirKernelsGo) {
  if (!cuda_availability().usable) GTEST_SKIP() << "no usable GPU: " << cuda_availability().reason;
  const std::string dir = temporary_folder("cuda-lifetime");
  scoped_cache_dir cache(dir);
  executor_options o;
  o.backend = backend_kind::cuda;
  o.lanes_per_device = 2;
  o.chunk_bytes = std::size_t{1} << 20;  // nothing measured
  o.quiet = true;
  elementwise_kernel k("float64 x", "float64 y", "y = 2 * x + 1;", "lifetime");
  std::vector<double> x(4096), out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i);
  const auto run = [&](executor& ex) {
    std::fill(out.begin(), out.end(), -1.0);
    ex.transform<double>(k, {x}, out).get();
    for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(out[i], 2 * x[i] + 1) << i;
  };
  const std::size_t baseline = detail::cuda::loaded_libraries_alive();
  for (int round = 0; round < 20; ++round) {
    executor ex(o);
    run(ex);
    EXPECT_EQ(detail::cuda::loaded_libraries_alive(), baseline + 1) << round;
  }
  EXPECT_EQ(detail::cuda::loaded_libraries_alive(), baseline);
  {
    executor a(o), b(o);
    run(a);
    run(b);
    EXPECT_EQ(detail::cuda::loaded_libraries_alive(), baseline + 1);
  }
  EXPECT_EQ(detail::cuda::loaded_libraries_alive(), baseline);
}

}  // namespace
}  // namespace gpupool
