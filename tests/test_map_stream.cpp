// gpupool::stream_map: a map whose calls are queued only as far ahead of the consumer as its
// window allows, so that a map of any length runs in bounded memory.
#include <gtest/gtest.h>

#include <cstddef>
#include <stdexcept>
#include <vector>

#include "gpupool/gpupool.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

executor_options cpu_options() {
  return testing::quiet_options(backend_kind::cpu, 2);
}

TEST(MapStream, GivesEveryResultInOrderWithinTheWindow) {
  executor ex(cpu_options());
  std::vector<std::vector<double>> xs(200);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i].assign(1000, static_cast<double>(i));
  // Each call counts its input and its result: 16,000 bytes; the window holds five.
  const stream_window window{SIZE_MAX, 5 * 16000};
  auto results = stream_map(ex, builtin_kernel::square(), xs, window);
  EXPECT_EQ(results.queued_calls(), 5u);
  std::size_t i = 0;
  while (auto r = results.next()) {
    EXPECT_LE(results.queued_bytes(), window.bytes);
    EXPECT_LE(results.queued_calls(), 5u);
    ASSERT_EQ(r->size(), 1000u);
    EXPECT_EQ((*r)[0], static_cast<double>(i * i));
    EXPECT_EQ((*r)[999], static_cast<double>(i * i));
    ++i;
  }
  EXPECT_EQ(i, xs.size());
  EXPECT_FALSE(results.next().has_value());
}

TEST(MapStream, CountsCallsAndQueuesACallLargerThanTheWindowAlone) {
  executor ex(cpu_options());
  std::vector<std::vector<float>> xs(10, std::vector<float>(4096, 3.0f));
  auto by_count = stream_map(ex, builtin_kernel::square(), xs, stream_window{3, SIZE_MAX});
  EXPECT_EQ(by_count.queued_calls(), 3u);
  // A window smaller than one call still makes progress, one call at a time.
  auto tiny = stream_map(ex, builtin_kernel::square(), xs, stream_window{SIZE_MAX, 1});
  EXPECT_EQ(tiny.queued_calls(), 1u);
  std::size_t n = 0;
  for (auto& r : tiny) {
    EXPECT_EQ(r[4095], 9.0f);
    EXPECT_LE(tiny.queued_calls(), 1u);
    ++n;
  }
  EXPECT_EQ(n, xs.size());
}

TEST(MapStream, TwoInputKernelsAndTheirErrors) {
  executor ex(cpu_options());
  std::vector<std::vector<double>> xs(20, std::vector<double>(100, 2.0));
  std::vector<std::vector<double>> ys(20, std::vector<double>(100, 5.0));
  auto sums = stream_map(ex, builtin_kernel::add(), xs, ys, stream_window{4, SIZE_MAX});
  std::size_t n = 0;
  for (auto& r : sums) {
    EXPECT_EQ(r[0], 7.0);
    ++n;
  }
  EXPECT_EQ(n, 20u);
  EXPECT_THROW((void)stream_map(ex, builtin_kernel::add(), xs), std::invalid_argument);
  EXPECT_THROW((void)stream_map(ex, builtin_kernel::square(), xs, ys), std::invalid_argument);
  std::vector<std::vector<double>> short_ys(19, std::vector<double>(100, 1.0));
  EXPECT_THROW((void)stream_map(ex, builtin_kernel::add(), xs, short_ys), std::invalid_argument);
  EXPECT_THROW((void)stream_map(ex, builtin_kernel::square(), xs, stream_window{0, 1}),
               std::invalid_argument);
  // A pair of different sizes is found when it is queued: the stream ends with the error.
  ys[6].resize(50);
  auto bad = stream_map(ex, builtin_kernel::add(), xs, ys, stream_window{2, SIZE_MAX});
  std::size_t good = 0;
  EXPECT_THROW(
      {
        while (bad.next()) ++good;
      },
      std::invalid_argument);
  EXPECT_LE(good, 6u);
  EXPECT_FALSE(bad.next().has_value());
}

TEST(MapStream, DroppedEarlyLeavesNothingRunningAndQueuesNoMore) {
  executor ex(cpu_options());
  ex.set_tracing(true);
  std::vector<std::vector<double>> xs(1000, std::vector<double>(10000, 1.0));
  {
    auto results = stream_map(ex, builtin_kernel::square(), xs, stream_window{8, SIZE_MAX});
    ASSERT_TRUE(results.next().has_value());
  }  // cancels what no lane started and waits for the rest
  // A lane gives the bytes of the tasks it ends back when its completion pass ends, which may
  // be just after their futures are ready: after shutdown every pass has ended.
  ex.shutdown();
  EXPECT_EQ(ex.in_flight().bytes, 0u);
  // What lanes ran: the first window and the call queued when its first result was taken (a
  // cancelled call may still sit in a queue until a lane drops it, but no lane runs it).
  EXPECT_LE(ex.trace().records().size(), 9u);
}

TEST(MapStream, AfterShutdownTheNextTopUpThrows) {
  executor ex(cpu_options());
  std::vector<std::vector<double>> xs(50, std::vector<double>(10, 1.0));
  auto results = stream_map(ex, builtin_kernel::square(), xs, stream_window{2, SIZE_MAX});
  ex.shutdown();
  // Taking the first result makes room in the window, and queueing the next call, before the
  // result is handed on, fails: the stream ends with the error.
  EXPECT_THROW((void)results.next(), std::runtime_error);
  EXPECT_FALSE(results.next().has_value());
}

}  // namespace
}  // namespace gpupool
