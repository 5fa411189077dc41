// Run-time compiled elementwise kernels on the CPU backend: results against a reference for every
// type, scalars mixed with arrays, compile errors with the compiler's log and the body's line,
// clear errors for bad calls, one compilation however many callers ask at once.
// (The CUDA backend compiles these with NVRTC in a later step; these tests pin the CPU backend.)
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace gpupool {
namespace {

class ElementwiseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A cache of this run's own, so compilations are counted from empty.
    char dir[] = "/tmp/gpupool-test-cache-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    ::setenv("GPUPOOL_CACHE_DIR", dir, 1);
  }
  executor_options options() const {
    executor_options o;
    o.backend = backend_kind::cpu;
    o.lanes_per_device = 2;
    o.chunk_bytes = 64 << 10;  // several pieces per array
    o.quiet = true;
    return o;
  }
};

template <class T>
void check_polynomial(executor& ex, const char* type) {
  const std::string t = type;
  elementwise_kernel k(t + " x, " + t + " a, " + t + " b", t + " y", "y = a * x * x + b;",
                       "poly_" + t);
  const auto x = testing::random_vector<T>(50'001, 3);
  std::vector<T> out(x.size(), T{-1});
  ex.transform<T>(k, {x, 3, 7}, out).get();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const T want = static_cast<T>(3) * x[i] * x[i] + static_cast<T>(7);
    ASSERT_NEAR(static_cast<double>(out[i]), static_cast<double>(want),
                std::is_floating_point_v<T> ? 1e-5 * std::abs(static_cast<double>(want)) : 0.0)
        << t << " element " << i;
  }
}

TEST_F(ElementwiseTest, EveryTypeMatchesTheReferenceWithScalarsBroadcast) {
  executor ex(options());
  check_polynomial<float>(ex, "float32");
  check_polynomial<double>(ex, "float64");
  check_polynomial<std::int32_t>(ex, "int32");
  check_polynomial<std::int64_t>(ex, "int64");
}

TEST_F(ElementwiseTest, MathFunctionsAndMixedTypes) {
  executor ex(options());
  elementwise_kernel k("float32 x, float64 w", "float64 y", "y = w * x * x + sin(x);", "mixed");
  const auto x = testing::random_vector<float>(10'000, 8);
  const auto w = testing::random_vector<double>(10'000, 9);
  std::vector<double> out(x.size());
  ex.transform<double>(k, {x, w}, out).get();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    // As in C++ (and CuPy): sin of a float32 parameter is computed in float32.
    ASSERT_NEAR(out[i], w[i] * xi * xi + std::sin(x[i]), 1e-9 * (1 + std::abs(out[i]))) << i;
  }
}

TEST_F(ElementwiseTest, ASyntaxErrorIsACompileErrorWithTheLogAndTheLine) {
  executor ex(options());
  elementwise_kernel k("float64 x", "float64 y", "double t = x;\ny = t +* ;", "broken");
  std::vector<double> x(10, 1.0), out(10, 0.0);
  try {
    (void)ex.transform<double>(k, {x}, out);
    FAIL() << "a broken kernel compiled";
  } catch (const compile_error& e) {
    EXPECT_EQ(e.line(), 2) << e.log();
    EXPECT_NE(e.log().find("error"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("broken"), std::string::npos);
  }
  EXPECT_EQ(out[0], 0.0) << "something ran";
}

TEST_F(ElementwiseTest, BadCallsAreClearErrorsBeforeAnythingRuns) {
  executor ex(options());
  elementwise_kernel k("float64 x, float64 a", "float64 y", "y = a * x;", "scale");
  std::vector<double> x(8, 1.0), short_x(7, 1.0), out(8, -1.0);
  std::vector<float> wrong_type(8, 1.0f);
  std::vector<float> float_out(8);
  EXPECT_THROW((void)ex.transform<double>(k, {x}, out), std::invalid_argument);
  EXPECT_THROW((void)ex.transform<double>(k, {short_x, 2.0}, out), std::invalid_argument);
  EXPECT_THROW((void)ex.transform<double>(k, {wrong_type, 2.0}, out), std::invalid_argument);
  EXPECT_THROW((void)ex.transform<float>(k, {x, 2.0}, float_out), std::invalid_argument);
  EXPECT_EQ(out[0], -1.0);
  EXPECT_THROW(elementwise_kernel("float16 x", "float64 y", "y = x;"), std::invalid_argument);
  EXPECT_THROW(elementwise_kernel("float64 x", "float64 x", "x = x;"), std::invalid_argument);
  EXPECT_THROW(elementwise_kernel("float64 x", "float64 y, float64 z", "y = x;"),
               std::invalid_argument);
  EXPECT_THROW(elementwise_kernel("float64 1x", "float64 y", "y = 1;"), std::invalid_argument);
}

TEST_F(ElementwiseTest, ManyCallersAtOnceCompileTheKernelOnce) {
  executor ex(options());
  // A body no other test uses, so the first call compiles it.
  elementwise_kernel k("int64 x", "int64 y", "y = x * 12345 + 678;", "once");
  const std::size_t before = kernels_compiled();
  std::vector<std::thread> callers;
  std::vector<std::vector<std::int64_t>> outs(8, std::vector<std::int64_t>(1000));
  const std::vector<std::int64_t> x(1000, 2);
  for (int t = 0; t < 8; ++t)
    callers.emplace_back(
        [&, t] { ex.transform<std::int64_t>(k, {x}, outs[static_cast<std::size_t>(t)]).get(); });
  for (auto& c : callers) c.join();
  EXPECT_EQ(kernels_compiled(), before + 1);
  for (const auto& out : outs) EXPECT_EQ(out[999], 2 * 12345 + 678);
}

TEST_F(ElementwiseTest, TracedLikeTheBuiltInKernels) {
  executor ex(options());
  ex.set_tracing(true);
  elementwise_kernel k("float64 x", "float64 y", "y = x + 1;", "plus_one");
  std::vector<double> x(20'000, 1.0), out(20'000);
  ex.transform<double>(k, {x}, out).get();
  const auto t = ex.trace();
  ASSERT_FALSE(t.records().empty());
  std::size_t bytes = 0;
  for (const auto& r : t.records()) {
    EXPECT_EQ(r.name, "plus_one");
    EXPECT_TRUE(r.kernel.present());
    bytes += r.bytes_in;
  }
  EXPECT_EQ(bytes, x.size() * sizeof(double));
  EXPECT_EQ(out[19'999], 2.0);
}

}  // namespace
}  // namespace gpupool
