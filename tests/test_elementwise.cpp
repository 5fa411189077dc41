// Run-time compiled kernels on each backend (the CPU backend everywhere, CUDA where a GPU is
// usable): elementwise kernels' results against a reference for every type, scalars mixed with
// arrays, compile errors with the compiler's log and the body's line, clear errors for bad calls,
// one compilation however many callers ask at once; kernels on device arrays inside tasks and
// over many device calls in batches; raw CUDA kernels (a clear error on the CPU backend).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/kernels/balanced_grid.hpp"
#include "core/scheduling/device_map_batches.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

class ElementwiseTest : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override { GPUPOOL_SKIP_UNLESS_USABLE(GetParam()); }
  static void SetUpTestSuite() {
    // A cache of this run's own, so compilations are counted from empty.
    char dir[] = "/tmp/gpupool-test-cache-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    ::setenv("GPUPOOL_CACHE_DIR", dir, 1);
  }
  executor_options options() const {
    executor_options o;
    o.backend = GetParam();
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
    // The GPU may fuse the multiply and add into one rounding.
    ASSERT_NEAR(
        static_cast<double>(out[i]), static_cast<double>(want),
        std::is_floating_point_v<T> ? 1e-5 * (std::abs(static_cast<double>(want)) + 7) : 0.0)
        << t << " element " << i;
  }
}

TEST_P(ElementwiseTest, EveryTypeMatchesTheReferenceWithScalarsBroadcast) {
  executor ex(options());
  check_polynomial<float>(ex, "float32");
  check_polynomial<double>(ex, "float64");
  check_polynomial<std::int32_t>(ex, "int32");
  check_polynomial<std::int64_t>(ex, "int64");
}

TEST_P(ElementwiseTest, MathFunctionsAndMixedTypes) {
  executor ex(options());
  elementwise_kernel k("float32 x, float64 w", "float64 y", "y = w * x * x + sin(x);", "mixed");
  const auto x = testing::random_vector<float>(10'000, 8);
  const auto w = testing::random_vector<double>(10'000, 9);
  std::vector<double> out(x.size());
  ex.transform<double>(k, {x, w}, out).get();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    // As in C++ (and CuPy): sin of a float32 parameter is computed in float32 (to within a few
    // float32 ulps on the GPU).
    ASSERT_NEAR(out[i], w[i] * xi * xi + std::sin(x[i]), 1e-6 + 1e-9 * std::abs(out[i])) << i;
  }
}

TEST_P(ElementwiseTest, ASyntaxErrorIsACompileErrorWithTheLogAndTheLine) {
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

TEST_P(ElementwiseTest, BadCallsAreClearErrorsBeforeAnythingRuns) {
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

TEST_P(ElementwiseTest, ManyCallersAtOnceCompileTheKernelOnce) {
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

TEST_P(ElementwiseTest, TracedLikeTheBuiltInKernels) {
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

TEST_P(ElementwiseTest, PiecesRunOnEveryDevice) {
  executor_options o = options();
  o.cpu_devices = 3;  // the CPU backend stands in for three devices; a GPU machine uses its own
  o.chunk_bytes = 16 << 10;
  executor ex(o);
  ex.set_tracing(true);
  ASSERT_EQ(ex.devices().size(), GetParam() == backend_kind::cpu ? 3u : ex.devices().size());
  elementwise_kernel k("int32 x", "int32 y", "y = 3 * x - 1;", "everywhere");
  std::vector<std::int32_t> x(200'000), out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int32_t>(i % 1000);
  ex.transform<std::int32_t>(k, {x}, out).get();
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(out[i], 3 * x[i] - 1) << i;
  // Which lanes take the pieces is up to the scheduler; every piece, wherever it ran, used the
  // kernel compiled for its device.
  const auto t = ex.trace();
  for (const auto& r : t.records()) {
    EXPECT_GE(r.device, 0);
    EXPECT_LT(r.device, static_cast<int>(ex.devices().size()));
  }
}

TEST_P(ElementwiseTest, RunsOnDeviceArraysInsideATask) {
  executor ex(options());
  elementwise_kernel k("float32 x, float32 a", "float32 y", "y = a * x + 1.0f;", "on_device");
  const auto x = testing::random_vector<float>(30'000, 11);
  std::vector<float> out(x.size());
  ex.submit([&](lane& l) {
      auto dx = l.upload(std::span<const float>(x));
      auto dy = l.allocate<float>(x.size());
      l.run(k, {dx, 0.5}, dy);
      l.download(dy, std::span<float>(out));
    }).get();
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_FLOAT_EQ(out[i], 0.5f * x[i] + 1.0f) << i;
}

// Many small calls on device arrays: checked first, run in batches, every result right.
TEST_P(ElementwiseTest, MapOnDeviceRunsManySmallCallsInBatches) {
  executor ex(options());
  elementwise_kernel k("float64 x, float64 a, int64 b", "float64 y",
                       "double v = x;\nfor (int i = 0; i < 16; ++i) v = v * a + b;\ny = v;",
                       "repeat_fma");
  constexpr std::size_t calls = 300;
  std::vector<std::vector<double>> xs, outs(calls);
  std::vector<std::size_t> sizes;
  for (std::size_t c = 0; c < calls; ++c) {
    sizes.push_back(1 + (c * 37) % 900);  // uneven, some tiny
    xs.push_back(testing::random_vector<double>(sizes.back(), 100 + c));
  }
  // The arrays go to device memory (host memory on the CPU backend) from a task, then the map
  // runs on them, then another task brings the results back.
  std::vector<device_array<double>> dx(calls), dy(calls);
  ex.submit_to(0, [&](lane& l) {
      for (std::size_t c = 0; c < calls; ++c) {
        dx[c] = l.upload(std::span<const double>(xs[c]));
        dy[c] = l.allocate<double>(sizes[c]);
      }
    }).get();
  std::vector<device_call> work;
  for (std::size_t c = 0; c < calls; ++c)
    work.push_back({{dx[c], 0.5, std::int64_t{1}}, dy[c].data(), sizes[c]});
  ex.map_on_device(0, k, work).get();
  ex.submit_to(0, [&](lane& l) {
      for (std::size_t c = 0; c < calls; ++c) {
        outs[c].resize(sizes[c]);
        l.download(dy[c], std::span<double>(outs[c]));
      }
      dx.clear();
      dy.clear();
    }).get();
  for (std::size_t c = 0; c < calls; ++c)
    for (std::size_t i = 0; i < sizes[c]; ++i) {
      double v = xs[c][i];
      for (int r = 0; r < 16; ++r) v = v * 0.5 + 1.0;
      ASSERT_NEAR(outs[c][i], v, 1e-12 * (1 + std::abs(v))) << "call " << c << " element " << i;
    }
}

// A batch's table of calls goes to the device from its slot's pinned buffer where it fits and
// from the batch's own memory where not (slots of 4 KiB: 125 rows of 40 bytes need 5,000), and
// several batches of several maps queued at once pass through each lane's slots in turn. On the
// CPU backend a map makes two batches per lane; on a GPU none smaller than fills the device
// several times over, so the calls are sized from the device there (with 132 multiprocessors:
// 792 calls of 8,192 elements, three batches of 2.16 million or more).
TEST_P(ElementwiseTest, MapOnDeviceTablesInAndBeyondTheSlotsAcrossManyBatches) {
  elementwise_kernel k("float64 x, float64 a, int64 b", "float64 y",
                       "double v = x;\nfor (int i = 0; i < 4; ++i) v = v * a + b;\ny = v;",
                       "repeat_fma4");
  constexpr std::size_t size = 8192;
  constexpr int maps = 2;
  std::size_t calls = 500;
  {
    executor probe(options());
    const std::size_t least = detail::least_device_batch_elements(probe.devices().at(0));
    calls = std::max(calls, (3 * least + size - 1) / size);
    ASSERT_GE(detail::device_map_batches(calls, calls * size, probe.lanes_per_device(), least), 2u)
        << "the test's premise: each map is cut into several batches";
  }
  const auto xs = testing::random_vector<double>(calls * size, 41);
  for (const std::size_t chunk : {std::size_t{4096}, std::size_t{64} << 10}) {
    executor_options o = options();
    o.chunk_bytes = chunk;
    executor ex(o);
    std::vector<double> outs(maps * calls * size, -1.0);
    device_array<double> dx;
    std::vector<device_array<double>> dy(maps);
    ex.submit_to(0, [&](lane& l) {
        dx = l.upload(std::span<const double>(xs));
        for (auto& y : dy) y = l.allocate<double>(calls * size);
      }).get();
    std::vector<future<void>> queued;
    for (int m = 0; m < maps; ++m) {
      std::vector<device_call> work;
      for (std::size_t c = 0; c < calls; ++c)
        work.push_back(
            {{std::span<const double>(dx.data() + c * size, size), 0.5 + m, std::int64_t{1}},
             dy[m].data() + c * size,
             size});
      queued.push_back(ex.map_on_device(0, k, work));  // not waited for before the next
    }
    for (auto& f : queued) f.get();
    ex.submit_to(0, [&](lane& l) {
        for (int m = 0; m < maps; ++m)
          l.download(dy[m], std::span<double>(outs.data() + m * calls * size, calls * size));
        dx = {};
        dy.clear();
      }).get();
    for (int m = 0; m < maps; ++m)
      for (std::size_t i = 0; i < calls * size; ++i) {
        double v = xs[i];
        for (int r = 0; r < 4; ++r) v = v * (0.5 + m) + 1.0;
        ASSERT_NEAR(outs[m * calls * size + i], v, 1e-12 * (1 + std::abs(v)))
            << "chunk " << chunk << " map " << m << " element " << i;
      }
  }
}

// `map` must refuse call `index` with call_error, whose reason (without the call's number)
// says `why`.
template <class Map>
void expect_call_error(Map&& map, std::size_t index, const std::string& why) {
  try {
    (void)map();
    ADD_FAILURE() << "call " << index << " was accepted (" << why << ")";
  } catch (const call_error& e) {
    EXPECT_EQ(e.call(), index) << e.what();
    EXPECT_NE(std::string(e.what()).find("(call " + std::to_string(index) + ")"), std::string::npos)
        << e.what();
    EXPECT_NE(e.reason().find(why), std::string::npos) << e.reason();
    EXPECT_EQ(e.reason().find("(call"), std::string::npos) << e.reason();
  }
}

TEST_P(ElementwiseTest, MapOnDeviceChecksEveryCallFirst) {
  executor ex(options());
  elementwise_kernel k("float64 x", "float64 y", "y = x;", "copy");
  std::vector<double> a(10), b(9), out(10);
  std::vector<device_call> work{{{std::span<const double>(a)}, out.data(), 10},
                                {{std::span<const double>(b)}, out.data(), 10}};
  expect_call_error([&] { return ex.map_on_device(0, k, work); }, 1, "has 9 elements");
  std::vector<device_call> no_output{{{std::span<const double>(a)}, out.data(), 10},
                                     {{std::span<const double>(a)}, out.data(), 10},
                                     {{std::span<const double>(a)}, nullptr, 10}};
  expect_call_error([&] { return ex.map_on_device(0, k, no_output); }, 2, "no output");
  // The pattern of arrays and numbers must match the first call's.
  elementwise_kernel scale("float64 x, float64 a", "float64 y", "y = x * a;", "scale_mixed");
  std::vector<device_call> patterns{
      {{std::span<const double>(a), 2.0}, out.data(), 10},
      {{std::span<const double>(a), std::span<const double>(a)}, out.data(), 10}};
  expect_call_error([&] { return ex.map_on_device(0, scale, patterns); }, 1,
                    "mixes arrays and scalars");
  // The check's own error is nested: a number out of its parameter's range stays one.
  elementwise_kernel by_int("float64 x, int32 n", "float64 y", "y = x * n;", "scale_int");
  std::vector<device_call> too_big{
      {{std::span<const double>(a), std::int64_t{2}}, out.data(), 10},
      {{std::span<const double>(a), std::int64_t{1} << 40}, out.data(), 10}};
  expect_call_error([&] { return ex.map_on_device(0, by_int, too_big); }, 1, "out of the range");
  try {
    (void)ex.map_on_device(0, by_int, too_big);
  } catch (const call_error& e) {
    EXPECT_THROW(std::rethrow_if_nested(e), argument_range_error);
  }
  EXPECT_THROW((void)ex.map_on_device(5, k, work), std::out_of_range);
  ex.map_on_device(0, k, {}).get();  // nothing to do is fine
}

constexpr const char* saxpy_source = R"(
extern "C" __global__ void saxpy(const float* x, float a, const float* y, float* out,
                                 unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    out[i] = a * x[i] + y[i];
}
)";

TEST_P(ElementwiseTest, RawKernelsRunOnTheGpuAndSayWhyNotOnTheCpu) {
  executor ex(options());
  raw_kernel k(saxpy_source, "saxpy", "float32* x, float32 a, float32* y", "float32* out");
  const auto x = testing::random_vector<float>(70'000, 21);
  const auto y = testing::random_vector<float>(70'000, 22);
  std::vector<float> out(x.size(), -1.0f);
  if (GetParam() == backend_kind::cpu) {
    try {
      (void)ex.transform<float>(k, {x, 2.0, y}, out);
      FAIL() << "a raw CUDA kernel ran on the CPU backend";
    } catch (const backend_unavailable& e) {
      EXPECT_NE(std::string(e.what()).find("needs a GPU"), std::string::npos) << e.what();
    }
    return;
  }
  ex.transform<float>(k, {x, 2.0, y}, out).get();
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(out[i], 2.0f * x[i] + y[i], 1e-4f * (1 + std::abs(out[i]))) << i;
  // A scalar where an array is declared is refused at the call.
  EXPECT_THROW((void)ex.transform<float>(k, {x, 2.0, 3.0}, out), std::invalid_argument);
  EXPECT_THROW((void)ex.transform<float>(k, {x, y, y}, out), std::invalid_argument);
}

TEST_P(ElementwiseTest, RawKernelsWithACppNameAndAFixedGridInsideATask) {
  executor ex(options());
  // A C++ (mangled) name and a fixed grid smaller than the data: the kernel's own loop covers it.
  raw_kernel k(R"(
namespace user {
__global__ void twice(const long long* x, long long* out, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x)
    out[i] = 2 * x[i];
}
}
)",
               "user::twice", "int64* x", "int64* out", launch_shape{128, 3});
  std::vector<std::int64_t> x(10'000), out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int64_t>(i) - 77;
  if (GetParam() == backend_kind::cpu) {
    // Inside a task the refusal reaches the task's future.
    auto f = ex.submit([&](lane& l) {
      auto dx = l.upload(std::span<const std::int64_t>(x));
      auto dy = l.allocate<std::int64_t>(x.size());
      l.run(k, {dx}, dy);
    });
    EXPECT_THROW(f.get(), backend_unavailable);
    return;
  }
  ex.submit([&](lane& l) {
      auto dx = l.upload(std::span<const std::int64_t>(x));
      auto dy = l.allocate<std::int64_t>(x.size());
      l.run(k, {dx}, dy);
      l.download(dy, std::span<std::int64_t>(out));
    }).get();
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(out[i], 2 * x[i]) << i;
}

TEST_P(ElementwiseTest, RawKernelsOfOneSourceKeepTheirOwnLaunchShapes) {
  if (GetParam() == backend_kind::cpu) GTEST_SKIP() << "raw kernels need a GPU";
  executor ex(options());
  // One source and entry, so one compiled image; each kernel must still launch with its own
  // shape (every element records the threads its launch had).
  const char* source = R"(
extern "C" __global__ void threads(const long long* x, long long* out, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x)
    out[i] = x[i] + (long long)gridDim.x * blockDim.x;
}
)";
  const raw_kernel wide(source, "threads", "int64* x", "int64* out", launch_shape{128, 4});
  const raw_kernel narrow(source, "threads", "int64* x", "int64* out", launch_shape{32, 1});
  std::vector<std::int64_t> x(5'000, 0), wide_out(x.size()), narrow_out(x.size());
  ex.submit([&](lane& l) {
      auto dx = l.upload(std::span<const std::int64_t>(x));
      auto dy = l.allocate<std::int64_t>(x.size());
      l.run(wide, {dx}, dy);
      l.download(dy, std::span<std::int64_t>(wide_out));
      l.run(narrow, {dx}, dy);
      l.download(dy, std::span<std::int64_t>(narrow_out));
    }).get();
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(wide_out[i], 128 * 4) << i;
    ASSERT_EQ(narrow_out[i], 32) << i;
  }
}

TEST_P(ElementwiseTest, RawKernelCompileErrorsCarryTheSourceLine) {
  executor ex(options());
  raw_kernel k(
      "extern \"C\" __global__ void bad(float* out, unsigned long long n) {\n"
      "  out[0] = undefined_name;\n}\n",
      "bad", "", "float32* out");
  std::vector<float> out(4);
  try {
    (void)ex.transform<float>(k, {}, out);
    FAIL() << "a broken raw kernel compiled";
  } catch (const compile_error& e) {
    EXPECT_EQ(GetParam(), backend_kind::cuda);
    EXPECT_EQ(e.line(), 2) << e.log();
  } catch (const backend_unavailable&) {
    EXPECT_EQ(GetParam(), backend_kind::cpu);  // the CPU backend refuses before compiling
  }
}

// On every backend: built-in integer kernels wrap as NumPy does (unsigned arithmetic, no
// undefined behaviour), an alpha or scalar the type cannot hold is refused, and a kernel whose
// scalar crosses to the device keeps its exact value.
TEST_P(ElementwiseTest, IntegerKernelsWrapAndScalarsFollowSameKind) {
  executor ex(options());
  constexpr auto max32 = std::numeric_limits<std::int32_t>::max();
  const std::vector<std::int32_t> x{max32, std::numeric_limits<std::int32_t>::min(), 46341};
  std::vector<std::int32_t> out(x.size());
  ex.transform<std::int32_t>(builtin_kernel::square(), x, out).get();
  EXPECT_EQ(out, (std::vector<std::int32_t>{1, 0, -2147479015}));
  ex.transform<std::int32_t>(builtin_kernel::axpy(2.0), x, x, out).get();
  EXPECT_EQ(out[0], max32 - 2);  // 3 * (2^31 - 1) mod 2^32
  const std::vector<std::int64_t> x64{std::numeric_limits<std::int64_t>::max()};
  std::vector<std::int64_t> out64(1);
  ex.transform<std::int64_t>(builtin_kernel::square(), x64, out64).get();
  EXPECT_EQ(out64[0], 1);
  EXPECT_THROW((void)ex.transform<std::int32_t>(builtin_kernel::scale(0.5), x, out),
               argument_kind_error);

  elementwise_kernel k("int64 x, int64 a, int32 b", "int64 y", "y = x + a + b;", "exact");
  const std::vector<std::int64_t> xs{1};
  ex.transform<std::int64_t>(k, {xs, (1LL << 62) + 1, -7}, out64).get();
  EXPECT_EQ(out64[0], (1LL << 62) + 1 + 1 - 7);
  EXPECT_THROW((void)ex.transform<std::int64_t>(k, {xs, 0.5, 1}, out64), argument_kind_error);
  EXPECT_THROW((void)ex.transform<std::int64_t>(k, {xs, 1, 1L << 33}, out64), argument_range_error);
}

INSTANTIATE_TEST_SUITE_P(Backends, ElementwiseTest,
                         ::testing::Values(backend_kind::cpu, backend_kind::cuda),
                         testing::backend_name);

}  // namespace
}  // namespace gpupool

namespace gpupool {
namespace {

// The dtype table drives the signature parser and the generated source: every dtype, by its
// name and by its alias, declares a parameter of that type, and a kernel over it runs.
TEST_P(ElementwiseTest, EveryDtypeOfTheTableDeclaresAndRuns) {
  executor ex(options());
  for (const dtype_info& t : dtypes) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(size_of(t.type), t.size);
    EXPECT_STREQ(to_string(t.type), t.name);
    for (const std::string& name : {std::string(t.name), std::string(t.alias)}) {
      if (name.empty()) continue;
      const elementwise_kernel k(name + " x", name + " y", "y = x + x;", "twice");
      EXPECT_EQ(k.inputs()[0].type, t.type);
      visit_dtype(t.type, [&]<class T>() {
        EXPECT_EQ(dtype_of<T>(), t.type);
        const std::vector<T> x{1, 2, 3};
        std::vector<T> out(3);
        ex.transform<T>(k, {x}, out).get();
        EXPECT_EQ(out, (std::vector<T>{2, 4, 6}));
      });
    }
  }
}

// One declaration per built-in: the table's name, arity and alpha are the kernel's, and its
// formula, compiled as an elementwise kernel's body, computes what the built-in computes, for
// every dtype of the table.
TEST_P(ElementwiseTest, EveryBuiltInComputesItsDeclaredFormula) {
  executor ex(options());
  std::vector<std::string> names;
  for (const builtin_kernel_info& info : builtin_kernels()) {
    SCOPED_TRACE(info.name);
    const builtin_kernel k = builtin_kernel::of(info.operation, 3.0);
    EXPECT_STREQ(k.name(), info.name);
    EXPECT_EQ(k.arity(), info.arity);
    EXPECT_EQ(k.alpha(), info.takes_alpha ? 3.0 : 0.0);
    EXPECT_EQ(&info_of(info.operation), &info);
    EXPECT_EQ(std::count(names.begin(), names.end(), info.name), 0) << "two built-ins share a name";
    names.emplace_back(info.name);
    for (const dtype_info& t : dtypes) {
      SCOPED_TRACE(t.name);
      const std::string type = t.name;
      const elementwise_kernel formula(type + " x, " + type + " y, " + type + " alpha",
                                       type + " out", std::string("out = ") + info.formula + ";",
                                       std::string("formula_") + info.name);
      visit_dtype(t.type, [&]<class T>() {
        const std::vector<T> x{1, -2, 5, 7}, y{4, 3, -6, 0};
        std::vector<T> built_in(x.size()), declared(x.size());
        if (info.arity == 2)
          ex.transform<T>(k, std::span<const T>(x), std::span<const T>(y), std::span<T>(built_in))
              .get();
        else
          ex.transform<T>(k, std::span<const T>(x), std::span<T>(built_in)).get();
        ex.transform<T>(formula, {x, y, 3}, declared).get();
        EXPECT_EQ(built_in, declared);
      });
    }
  }
}

// The grid of a compiled kernel's loop when its work is capped (CUDA: one wave of the device):
// the fewest blocks whose longest thread takes no more turns than with the cap itself.
TEST(BalancedGrid, FewestBlocksForTheLongestThreadsTurns) {
  using detail::balanced_blocks;
  EXPECT_EQ(balanced_blocks(0, 17), 0u);
  EXPECT_EQ(balanced_blocks(64, 100), 64u);  // fits: a block per block's worth
  EXPECT_EQ(balanced_blocks(64, 64), 64u);
  EXPECT_EQ(balanced_blocks(64, 17), 16u);  // 4 turns each, not 3 or 4 over 17 blocks
  EXPECT_EQ(balanced_blocks(64, 33), 32u);
  EXPECT_EQ(balanced_blocks(64, 16), 16u);
  EXPECT_EQ(balanced_blocks(64, 0), 1u);            // at least one block
  EXPECT_EQ(balanced_blocks(131072, 1056), 1049u);  // at most 125 turns, as with 1056
  for (unsigned long long wanted = 1; wanted < 600; ++wanted)
    for (unsigned long long most = 1; most < 80; ++most) {
      const unsigned long long blocks = balanced_blocks(wanted, most);
      const unsigned long long turns = (wanted + most - 1) / most;
      ASSERT_LE(blocks, most) << wanted << " " << most;
      ASSERT_GE(blocks * turns, wanted) << wanted << " " << most;  // the loop covers everything
      // No thread is left a turn short by more blocks than needed: one fewer block would not do.
      ASSERT_LT((blocks - 1) * turns, wanted) << wanted << " " << most;
    }
}

// How a map over device arrays is cut: two batches per lane, none smaller than fills a GPU
// several times over, and on the CPU backend (where a lane runs its batch on one core) as many as
// the lanes take.
TEST(DeviceMapBatches, TwoPerLaneButNoneSmallerThanFillsTheGpu) {
  using detail::device_map_batches;
  device_info h200;
  h200.backend = backend_kind::cuda;
  h200.multiprocessors = 132;
  const std::size_t least = detail::least_device_batch_elements(h200);
  EXPECT_EQ(least, 132u * 2048u * 8u);
  // 2,000 calls of 16,384 elements (32,768,000 in all) on 16 lanes: 15 batches of about
  // 2.18M elements, not 32; on 4 lanes, 8.
  EXPECT_EQ(device_map_batches(2000, 2000 * 16384, 16, least), 15u);
  EXPECT_EQ(device_map_batches(2000, 2000 * 16384, 4, least), 8u);
  // The first block of a map from Python (64 such calls, about 1M elements): one batch.
  EXPECT_EQ(device_map_batches(64, 64 * 16384, 16, least), 1u);
  EXPECT_EQ(device_map_batches(512, 512 * 16384, 16, least), 3u);
  // Never more batches than calls, never none for some calls, none for no calls.
  EXPECT_EQ(device_map_batches(3, std::size_t{1} << 40, 16, least), 3u);
  EXPECT_EQ(device_map_batches(5, 0, 16, least), 1u);
  EXPECT_EQ(device_map_batches(0, 0, 16, least), 0u);
  EXPECT_EQ(device_map_batches(7, 100, 0, 1), 2u);  // lanes below one count as one

  device_info cpu;  // the CPU backend: every batch counts
  cpu.backend = backend_kind::cpu;
  cpu.multiprocessors = 2;
  EXPECT_EQ(detail::least_device_batch_elements(cpu), 1u);
  EXPECT_EQ(device_map_batches(64, 64 * 16, 8, detail::least_device_batch_elements(cpu)), 16u);
  // A GPU that reports no multiprocessors still has a floor of one multiprocessor's worth.
  device_info unknown;
  unknown.backend = backend_kind::cuda;
  EXPECT_EQ(detail::least_device_batch_elements(unknown), 2048u * 8u);
}
}  // namespace
}  // namespace gpupool
