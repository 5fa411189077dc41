// NVRTC compiles the generated CUDA source on any machine with the toolkit (no GPU needed):
// a CUBIN image for the architecture asked for, a syntax error with NVRTC's log and the body's
// line, and a disk cache that a fresh process (a fresh cache key) loads without compiling.
// White-box: these call the CUDA backend's compiler directly.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include <stdlib.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/kernels/kernel_cache.hpp"
#include "cuda/nvrtc_compiler.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool {
namespace {

class NvrtcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (!detail::cuda::nvrtc_available(&reason)) GTEST_SKIP() << reason;
    char dir[] = "/tmp/gpupool-nvrtc-cache-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    cache_ = dir;
    ::setenv("GPUPOOL_CACHE_DIR", cache_.c_str(), 1);
  }
  std::string cache_;
};

TEST_F(NvrtcTest, CompilesACubinForTheArchitecture) {
  elementwise_kernel k("float64 x, float64 a", "float64 y", "y = a * x * x + sin(x);", "poly");
  const std::size_t before = kernels_compiled();
  auto cubin = detail::cuda::compile_cubin(k, {true, false}, 9, 0);
  ASSERT_GT(cubin->size(), 64u);
  EXPECT_EQ(cubin->substr(0, 4), std::string("\x7f"
                                             "ELF"));
  EXPECT_EQ(kernels_compiled(), before + 1);
  // Asked again in this process: no second compilation.
  auto again = detail::cuda::compile_cubin(k, {true, false}, 9, 0);
  EXPECT_EQ(*again, *cubin);
  EXPECT_EQ(kernels_compiled(), before + 1);
}

TEST_F(NvrtcTest, ASyntaxErrorCarriesTheLogAndTheLine) {
  elementwise_kernel k("float32 x", "float32 y", "float t = x;\ny = t +* ;", "broken");
  try {
    (void)detail::cuda::compile_cubin(k, {true}, 9, 0);
    FAIL() << "a broken kernel compiled";
  } catch (const compile_error& e) {
    EXPECT_EQ(e.line(), 2) << e.log();
    EXPECT_NE(e.log().find("error"), std::string::npos);
  }
}

TEST_F(NvrtcTest, AnotherCacheFolderWithTheImageLoadsWithoutCompiling) {
  elementwise_kernel k("int32 x", "int32 y", "y = x * 7 + 3;", "seven");
  const auto t0 = std::chrono::steady_clock::now();
  auto first = detail::cuda::compile_cubin(k, {true}, 9, 0);
  const auto t1 = std::chrono::steady_clock::now();
  // A copy of the cache elsewhere stands for a second process: nothing compiled there yet.
  char dir[] = "/tmp/gpupool-nvrtc-copy-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::filesystem::copy(cache_, dir, std::filesystem::copy_options::recursive);
  ::setenv("GPUPOOL_CACHE_DIR", dir, 1);
  const std::size_t before = kernels_compiled();
  const auto t2 = std::chrono::steady_clock::now();
  auto loaded = detail::cuda::compile_cubin(k, {true}, 9, 0);
  const auto t3 = std::chrono::steady_clock::now();
  EXPECT_EQ(kernels_compiled(), before);
  EXPECT_EQ(*loaded, *first);
  const double compile_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double load_ms = std::chrono::duration<double, std::milli>(t3 - t2).count();
  std::printf("NVRTC compile %.1f ms, load from the disk cache %.2f ms\n", compile_ms, load_ms);
  EXPECT_LT(load_ms, compile_ms);
}

TEST_F(NvrtcTest, TheImageHoldsTheBatchEntryPoint) {
  elementwise_kernel k("float32 x, int64 b", "float32 y", "y = x + b;", "with_batch");
  auto cubin = detail::cuda::compile_cubin(k, {true, false}, 9, 0);
  EXPECT_NE(cubin->find("gpupool_elementwise_batch"), std::string::npos);
  EXPECT_NE(cubin->find("gpupool_elementwise"), std::string::npos);
}

TEST_F(NvrtcTest, RawKernelsGetTheirEntrysLoweredName) {
  raw_kernel plain(
      "extern \"C\" __global__ void k1(float* out, unsigned long long n) {"
      " if (n) out[0] = 1; }",
      "k1", "", "float32* out");
  EXPECT_EQ(detail::cuda::compile_raw_cubin(plain, 9, 0)->entry, "k1");
  raw_kernel mangled(
      "namespace ns { __global__ void k2(float* out, unsigned long long n) {"
      " if (n) out[0] = 2; } }",
      "ns::k2", "", "float32* out");
  const auto compiled = detail::cuda::compile_raw_cubin(mangled, 9, 0);
  EXPECT_EQ(compiled->entry.rfind("_Z", 0), 0u) << compiled->entry;
  EXPECT_NE(compiled->image.find(compiled->entry), std::string::npos);
  // From the disk cache in "another process": the same name, no compilation.
  char dir[] = "/tmp/gpupool-nvrtc-raw-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::filesystem::copy(cache_, dir, std::filesystem::copy_options::recursive);
  ::setenv("GPUPOOL_CACHE_DIR", dir, 1);
  raw_kernel again(
      "namespace ns { __global__ void k2(float* out, unsigned long long n) {"
      " if (n) out[0] = 2; } }",
      "ns::k2", "", "float32* out");
  const std::size_t before = kernels_compiled();
  EXPECT_EQ(detail::cuda::compile_raw_cubin(again, 9, 0)->entry, compiled->entry);
  EXPECT_EQ(kernels_compiled(), before);
}

TEST_F(NvrtcTest, RawKernelErrorsPointAtTheUsersLine) {
  raw_kernel broken(
      "__global__ void k3(float* out, unsigned long long n) {\n"
      "  out[0] = nope;\n}\n",
      "k3", "", "float32* out");
  try {
    (void)detail::cuda::compile_raw_cubin(broken, 9, 0);
    FAIL() << "compiled";
  } catch (const compile_error& e) {
    EXPECT_EQ(e.line(), 2) << e.log();
  }
  raw_kernel missing("__global__ void k4(float* out, unsigned long long n) {}", "k5", "",
                     "float32* out");
  EXPECT_THROW((void)detail::cuda::compile_raw_cubin(missing, 9, 0), compile_error);
}

// The CUBIN cache trusts nothing it reads: an entry that is damaged, belongs to another key or
// is a bare image is a miss that compiles again and replaces the entry.
std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::filesystem::path only_file(const std::string& folder) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(folder)) files.push_back(e.path());
  EXPECT_EQ(files.size(), 1u) << folder;
  return files.empty() ? std::filesystem::path() : files[0];
}

// A new cache folder (standing for another process) whose cuda/ folder holds `bytes` as `name`.
std::string cache_holding(const std::string& name, const std::string& bytes) {
  char dir[] = "/tmp/gpupool-nvrtc-planted-XXXXXX";
  if (::mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::string folder = std::string(dir) + "/cuda";
  ::mkdir(folder.c_str(), 0700);
  std::ofstream(folder + "/" + name, std::ios::binary) << bytes;
  ::chmod((folder + "/" + name).c_str(), 0600);
  return dir;
}

TEST_F(NvrtcTest, DamagedForeignOrBareCubinEntriesAreCompiledAgainAndReplaced) {
  elementwise_kernel k("float32 x", "float32 y", "y = x * 5;", "five");
  elementwise_kernel other("float32 x", "float32 y", "y = x * 6;", "six");
  const auto image = detail::cuda::compile_cubin(k, {true}, 9, 0);
  const auto entry = only_file(cache_ + "/cuda");
  const std::string bytes = read_all(entry);
  EXPECT_NE(bytes.find("y = x * 5;"), std::string::npos) << "the entry holds its full key";
  ASSERT_EQ(bytes.rfind(*image), bytes.size() - image->size()) << "and the image";
  std::string flipped = bytes;
  flipped[flipped.size() - 100] = static_cast<char>(flipped[flipped.size() - 100] ^ 1);
  (void)detail::cuda::compile_cubin(other, {true}, 9, 0);
  std::string other_bytes;
  for (const auto& e : std::filesystem::directory_iterator(cache_ + "/cuda"))
    if (e.path() != entry) other_bytes = read_all(e.path());
  ASSERT_FALSE(other_bytes.empty());
  const std::vector<std::pair<const char*, std::string>> damages{
      {"truncated", bytes.substr(0, bytes.size() / 2)},
      {"zeroed", std::string(bytes.size(), '\0')},
      {"one bit flipped", flipped},
      {"another kernel's entry", other_bytes},
      {"a bare CUBIN", *image}};
  for (const auto& [what, damaged] : damages) {
    SCOPED_TRACE(what);
    const std::string dir = cache_holding(entry.filename().string(), damaged);
    ::setenv("GPUPOOL_CACHE_DIR", dir.c_str(), 1);
    const std::size_t before = kernels_compiled();
    const auto again = detail::cuda::compile_cubin(k, {true}, 9, 0);
    EXPECT_EQ(kernels_compiled(), before + 1);
    EXPECT_EQ(again->substr(0, 4), std::string("\x7f"
                                               "ELF"));
    EXPECT_EQ(read_all(std::string(dir) + "/cuda/" + entry.filename().string()).size(),
              bytes.size())
        << "the entry was replaced";
  }
}

TEST_F(NvrtcTest, ARawKernelsNameAndImageAreOneCheckedEntry) {
  const char* source =
      "namespace ns { __global__ void k7(float* out, unsigned long long n) {"
      " if (n) out[0] = 7; } }";
  raw_kernel k(source, "ns::k7", "", "float32* out");
  const auto compiled = detail::cuda::compile_raw_cubin(k, 9, 0);
  const auto entry = only_file(cache_ + "/cuda");  // one file: no separate ".entry" beside it
  const std::string bytes = read_all(entry);
  const std::string dir =
      cache_holding(entry.filename().string(), bytes.substr(0, bytes.size() - 1));
  ::setenv("GPUPOOL_CACHE_DIR", dir.c_str(), 1);
  raw_kernel again(source, "ns::k7", "", "float32* out");
  const std::size_t before = kernels_compiled();
  EXPECT_EQ(detail::cuda::compile_raw_cubin(again, 9, 0)->entry, compiled->entry);
  EXPECT_EQ(kernels_compiled(), before + 1);
}

// The folder is refused with a message naming what is wrong; the kernel is compiled in memory
// and nothing is written there.
void expect_refused_and_compiled_in_memory(const std::string& cache, const elementwise_kernel& k,
                                           const std::string& why) {
  try {
    (void)detail::persistent_cache_folder("cuda");
    ADD_FAILURE() << "the cache folder " << cache << " was accepted";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  const std::size_t before = kernels_compiled();
  const auto cubin = detail::cuda::compile_cubin(k, {true}, 9, 0);
  EXPECT_EQ(cubin->substr(0, 4), std::string("\x7f"
                                             "ELF"));
  EXPECT_EQ(kernels_compiled(), before + 1);
  EXPECT_TRUE(std::filesystem::is_empty(cache)) << "something was written to " << cache;
}

TEST_F(NvrtcTest, ACacheFolderOthersCanWriteIsRefused) {
  ::chmod(cache_.c_str(), 0777);
  expect_refused_and_compiled_in_memory(
      cache_, elementwise_kernel("float32 x", "float32 y", "y = x * 8;", "eight"), "mode 0777");
  if (::geteuid() != 0) return;  // giving the folder to another user needs root (CI runs as root)
  ::chmod(cache_.c_str(), 0700);
  ASSERT_EQ(::chown(cache_.c_str(), 65534, 65534), 0);
  expect_refused_and_compiled_in_memory(
      cache_, elementwise_kernel("float32 x", "float32 y", "y = x * 9;", "nine"),
      "owned by uid 65534");
}

TEST(RawKernelSignature, ArraysAreMarkedAndBadDeclarationsRefused) {
  raw_kernel k("x", "f", "float32* x, float64 a, int64 *b", "float32 * y");
  ASSERT_EQ(k.inputs().size(), 3u);
  EXPECT_TRUE(k.inputs()[0].array);
  EXPECT_FALSE(k.inputs()[1].array);
  EXPECT_TRUE(k.inputs()[2].array);
  EXPECT_TRUE(k.output().array);
  EXPECT_THROW(raw_kernel("x", "f", "float32* x", "float32* x"), std::invalid_argument);
  EXPECT_THROW(raw_kernel("", "f", "", "float32* y"), std::invalid_argument);
  EXPECT_THROW(raw_kernel("x", "f", "", "float32* y", launch_shape{0, 0}), std::invalid_argument);
  EXPECT_THROW(elementwise_kernel("float32* x", "float32 y", "y = x;"), std::invalid_argument);
}

}  // namespace
}  // namespace gpupool
