// Tracing: every task's journey recorded in order, with consistent times, stats that add up,
// and the exports.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace gpupool {
namespace {

class TraceTest : public ::testing::TestWithParam<backend_kind> {
 protected:
  void SetUp() override { GPUPOOL_SKIP_UNLESS_USABLE(GetParam()); }
  executor_options options() const {
    executor_options o;
    o.backend = GetParam();
    o.lanes_per_device = 3;
    o.chunk_bytes = 64 << 10;
    o.quiet = true;
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, TraceTest,
                         ::testing::Values(backend_kind::cpu, backend_kind::cuda),
                         testing::backend_name);

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_P(TraceTest, OffByDefaultAndRecordsOnlyWhileOn) {
  executor ex(options());
  EXPECT_FALSE(ex.tracing());
  ex.submit([](lane&) {}).get();
  EXPECT_TRUE(ex.trace().records().empty());
  ex.set_tracing(true);
  ex.submit([](lane&) {}).get();
  ex.set_tracing(false);
  ex.submit([](lane&) {}).get();
  EXPECT_EQ(ex.trace().records().size(), 1u);
  ex.clear_trace();
  EXPECT_TRUE(ex.trace().records().empty());
}

// A call too small to give every lane two pieces of chunk_bytes is cut finer when the chunk size
// was left to the executor (down to 1 MiB pieces), and never when it was given.
TEST_P(TraceTest, ASmallCallIsCutSoThatEveryLaneWorksUnlessTheChunkSizeWasGiven) {
  const auto x = testing::random_vector<double>(std::size_t{1} << 20, 3);  // 8 MiB
  const std::vector<std::vector<double>> inputs(2, x);                     // 16 MiB in all
  auto pieces_of = [&](executor_options o) {
    executor ex(o);
    ex.set_tracing(true);
    auto results = ex.map(builtin_kernel::square(), inputs).get();
    EXPECT_EQ(results[1][12345], x[12345] * x[12345]);
    return ex.trace().records().size();
  };
  executor_options o = options();
  o.lanes_per_device = 2;
  o.chunk_bytes = 0;  // left to the executor: 8 MiB with fixed tuning
  o.tuning = tuning::fixed;
  const auto lanes = static_cast<std::size_t>(executor(o).lane_count());  // over every device
  // 16 MiB over 2 pieces per lane, 8 MiB at most and 1 MiB at least per piece.
  const std::size_t piece = std::clamp<std::size_t>(
      ((16u << 20) / (2 * lanes) + (64u << 10) - 1) / (64u << 10) * (64u << 10), 1u << 20,
      8u << 20);
  EXPECT_EQ(pieces_of(o), 2 * (((8u << 20) + piece - 1) / piece)) << lanes << " lanes";
  EXPECT_GT(pieces_of(o), 2u);
  o.chunk_bytes = 8 << 20;  // given: pieces of exactly that
  EXPECT_EQ(pieces_of(o), 2u);
}

TEST_P(TraceTest, EveryPieceHasAConsistentJourney) {
  executor ex(options());
  ex.set_tracing(true);
  const auto x = testing::random_vector<double>(100'000, 5);  // 13 pieces of 64 KiB
  const std::vector<std::vector<double>> inputs(4, x);
  auto results = ex.map(builtin_kernel::square(), inputs).get();
  ASSERT_EQ(results[3][99'999], x[99'999] * x[99'999]);
  ex.submit([](lane&) { return 1; }).get();

  const auto t = ex.trace();
  const std::size_t pieces = 4 * ((100'000 * 8 + (64 << 10) - 1) / (64 << 10));
  ASSERT_EQ(t.records().size(), pieces + 1);
  std::size_t bytes_in = 0;
  for (std::size_t i = 0; i < t.records().size(); ++i) {
    const task_record& r = t.records()[i];
    if (i > 0) {
      EXPECT_LT(t.records()[i - 1].id, r.id) << "not in submission order";
    }
    EXPECT_LE(r.submitted, r.started) << r.id;
    EXPECT_LE(r.started, r.done) << r.id;
    EXPECT_FALSE(r.failed);
    EXPECT_GE(r.lane, 0);
    EXPECT_LT(r.lane, ex.lane_count());
    bytes_in += r.bytes_in;
    if (r.name == "task") {
      EXPECT_TRUE(r.kernel.present());
      continue;
    }
    EXPECT_EQ(r.name, "square");
    // No stage-out: map results are pinned, downloaded straight into.
    EXPECT_FALSE(r.stage_out.present()) << r.id;
    for (const span_us* s : {&r.upload, &r.kernel, &r.download, &r.stage_in}) {
      ASSERT_TRUE(s->present()) << "a stage of piece " << r.id << " is missing";
      EXPECT_LE(s->begin, s->end);
    }
    // Stream order: upload, then kernel, then download; host copies around them. GPU clocks
    // are aligned to the host clock within a few microseconds.
    const double slack = 50.0;
    EXPECT_LE(r.upload.end, r.kernel.begin + slack);
    EXPECT_LE(r.kernel.end, r.download.begin + slack);
    EXPECT_LE(r.stage_in.end, r.upload.begin + slack);
    EXPECT_LE(r.download.end, r.done + slack);
  }
  EXPECT_EQ(bytes_in, 4 * x.size() * sizeof(double));
}

TEST_P(TraceTest, StatsAddUpToWhatWasMoved) {
  executor ex(options());
  ex.set_tracing(true);
  const std::vector<std::vector<float>> xs(10, std::vector<float>(30'000, 2.0f));
  const std::vector<std::vector<float>> ys(10, std::vector<float>(30'000, 1.0f));
  ex.map(builtin_kernel::add(), xs, ys).get();
  const auto stats = ex.trace().stats();
  // One total per device (several devices share the work): each adds up its own lanes, and the
  // totals together add up to what was moved.
  std::vector<std::size_t> lane_in(ex.devices().size()), lane_out(ex.devices().size()),
      lane_tasks(ex.devices().size());
  std::size_t total_in = 0, total_out = 0, totals = 0;
  std::vector<const lane_stats*> total(ex.devices().size(), nullptr);
  for (const auto& s : stats) {
    const auto d = static_cast<std::size_t>(s.device);
    ASSERT_LT(d, ex.devices().size());
    if (s.lane < 0) {
      total[d] = &s;
      total_in += s.bytes_in;
      total_out += s.bytes_out;
      ++totals;
      continue;
    }
    lane_in[d] += s.bytes_in;
    lane_out[d] += s.bytes_out;
    lane_tasks[d] += s.tasks;
    EXPECT_LE(s.busy_us, s.wall_us + 1e-6);
    EXPECT_LE(s.queue_wait_p50_us, s.queue_wait_p99_us);
  }
  EXPECT_EQ(total_in, 2 * 10 * 30'000 * sizeof(float));  // two inputs
  EXPECT_EQ(total_out, 10 * 30'000 * sizeof(float));
  EXPECT_LE(totals, ex.devices().size());
  for (std::size_t d = 0; d < total.size(); ++d) {
    if (total[d] == nullptr) {  // a device that took no piece has no total
      EXPECT_EQ(lane_tasks[d], 0u);
      continue;
    }
    EXPECT_EQ(lane_in[d], total[d]->bytes_in);
    EXPECT_EQ(lane_out[d], total[d]->bytes_out);
    EXPECT_EQ(lane_tasks[d], total[d]->tasks);
    EXPECT_GT(total[d]->input_gb_per_s(), 0.0);
  }
}

TEST_P(TraceTest, ExportsNameEveryTaskAndStage) {
  executor ex(options());
  ex.set_tracing(true);
  const std::vector<std::vector<double>> xs(3, std::vector<double>(1000, 3.0));
  ex.map(builtin_kernel::square(), xs).get();
  const auto t = ex.trace();
  ASSERT_EQ(t.records().size(), 3u);

  std::ostringstream json;
  t.write_chrome_json(json);
  const std::string j = json.str();
  EXPECT_EQ(j.front(), '{');
  EXPECT_EQ(count(j, "\"cat\":\"task\""), 3u);
  EXPECT_EQ(count(j, "\"name\":\"upload\""), 3u);
  EXPECT_EQ(count(j, "\"name\":\"kernel\""), 3u);
  EXPECT_EQ(count(j, "\"name\":\"download\""), 3u);
  EXPECT_EQ(count(j, "\"ph\":\"b\""), count(j, "\"ph\":\"e\""));
  EXPECT_EQ(count(j, "{"), count(j, "}"));

  std::ostringstream records;
  t.write_records_json(records);
  const auto parsed = nlohmann::json::parse(records.str());
  EXPECT_EQ(parsed.at("records").size(), 3u);
  EXPECT_EQ(parsed.at("records")[0].at("upload").size(), 2u);

  std::ostringstream table;
  t.write_stats_table(table);
  EXPECT_NE(table.str().find("all"), std::string::npos);
}

// Names come from users (kernel names): quotes, backslashes, control characters, markup and
// bytes that are not UTF-8 must leave both JSON exports parseable and the names intact.
TEST(TraceExport, UserNamesAreEscaped) {
  task_record r;
  r.name = "k\"1\\ <b>&\n\x01";
  r.started = 1.0;
  r.done = 2.0;
  r.upload = {1.0, 1.5};
  task_record bad = r;
  bad.id = 1;
  bad.name = "bad \xff byte";
  const trace t(backend_kind::cpu, {"dev \"0\""}, 1, {r, bad});
  std::ostringstream chrome, records;
  t.write_chrome_json(chrome);
  t.write_records_json(records);
  const auto c = nlohmann::json::parse(chrome.str());
  const auto j = nlohmann::json::parse(records.str());
  EXPECT_EQ(j.at("records")[0].at("name").get<std::string>(), r.name);
  EXPECT_EQ(j.at("records")[1].at("name").get<std::string>(), "bad \xef\xbf\xbd byte");
  bool found = false;
  for (const auto& e : c.at("traceEvents"))
    found = found || (e.at("name") == "process_name" &&
                      e.at("args").at("name").get<std::string>() == "device 0: dev \"0\"");
  EXPECT_TRUE(found);
}

// The stage table is what every writer uses: each stage of `trace_stages` appears, under the
// table's names, in the Chrome trace (an event named by its label, on its track; its engine's
// track), in the records JSON (a field named by its key, and the table itself) and in the stats
// (time per stage, a column per stage).
TEST(TraceExport, EveryWriterFollowsTheStageTable) {
  task_record piece;
  piece.name = "square";
  piece.started = 10.0;
  piece.done = 20.0;
  double at = 10.0;
  for (const trace_stage& stage : trace_stages) {  // stages one after another, 1 us each
    piece.*stage.span = {at, at + 1.0};
    at += 1.5;
  }
  task_record task;  // a submit() task: no copies, its run as the kernel span
  task.id = 1;
  task.name = "task";
  task.started = 30.0;
  task.done = 34.0;
  task.kernel = {30.0, 34.0};
  const trace t(backend_kind::cpu, {"dev"}, 1, {piece, task});

  std::ostringstream chrome_text, records_text, table;
  t.write_chrome_json(chrome_text);
  t.write_records_json(records_text);
  t.write_stats_table(table);
  const auto chrome = nlohmann::json::parse(chrome_text.str());
  const auto records = nlohmann::json::parse(records_text.str());

  ASSERT_EQ(records.at("stages").size(), trace_stage_count);
  for (std::size_t i = 0; i < trace_stage_count; ++i) {
    const trace_stage& stage = trace_stages[i];
    SCOPED_TRACE(stage.key);
    // Chrome: one complete event per stage of the piece, named by the label, on its track.
    std::size_t events = 0;
    for (const auto& e : chrome.at("traceEvents"))
      if (e.at("ph") == "X" && e.at("name") == stage.label) {
        ++events;
        EXPECT_EQ(e.at("cat"), stage.track == stage_track::host ? "host" : "stream");
        EXPECT_EQ(e.at("args").at("task"), 0u) << "a submit() task's run is not stream work";
      }
    EXPECT_EQ(events, 1u);
    if (stage.engine != nullptr) {
      std::size_t named = 0, async = 0;
      for (const auto& e : chrome.at("traceEvents")) {
        named += e.at("name") == "thread_name" && e.at("args").at("name") == stage.engine;
        async += e.at("ph") == "b" && e.at("cat") == stage.engine;
      }
      EXPECT_EQ(named, 1u);
      EXPECT_EQ(async, 1u);
    }
    // Records: a field per stage, named by the key; the table itself beside them.
    const auto& row = records.at("stages")[i];
    EXPECT_EQ(row.at("key"), stage.key);
    EXPECT_EQ(row.at("label"), stage.label);
    EXPECT_EQ(row.at("colour"), stage.colour);
    const auto& span = records.at("records")[0].at(stage.key);
    ASSERT_EQ(span.size(), 2u);
    EXPECT_DOUBLE_EQ(span[1].get<double>() - span[0].get<double>(), 1.0);
    // Stats: the time in each stage, and its column.
    const double expected = std::string(stage.key) == "kernel" ? 1.0 + 4.0 : 1.0;
    EXPECT_DOUBLE_EQ(t.stats().back().stage_us[i], expected);
    EXPECT_NE(table.str().find(std::string(stage.label) + " ms"), std::string::npos);
  }
  EXPECT_TRUE(records.at("records")[0].at("on_stream").get<bool>());
  EXPECT_FALSE(records.at("records")[1].at("on_stream").get<bool>());
  EXPECT_TRUE(records.at("records")[1].at("upload").is_null());
  EXPECT_EQ(records.at("records")[1].at("kernel").size(), 2u);
}

executor_options cuda_options(int lanes) {
  return testing::quiet_options(backend_kind::cuda, lanes);
}

// The GPU's stage times measure the work itself: a kernel that holds the GPU for 2 ms shows a
// kernel stage of 2 ms, which the host clock around the task confirms.
TEST(CudaTrace, TheKernelStageLastsAsLongAsTheKernel) {
  GPUPOOL_SKIP_UNLESS_USABLE(backend_kind::cuda);
  executor ex(cuda_options(1));
  raw_kernel hold(R"(
extern "C" __global__ void hold(const float* x, float* out, unsigned long long n) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < 2000000ull);
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x)
    out[i] = x[i];
}
)",
                  "hold", "float32* x", "float32* out");
  const std::vector<float> x(1'000, 3.0f);
  std::vector<float> out(x.size());
  ex.transform<float>(hold, {x}, out).get();  // compiled and loaded outside the trace
  ex.set_tracing(true);
  ex.transform<float>(hold, {x}, out).get();
  ASSERT_EQ(out[999], 3.0f);
  const auto t = ex.trace();
  ASSERT_EQ(t.records().size(), 1u);
  const task_record& r = t.records()[0];
  ASSERT_TRUE(r.kernel.present());
  const double kernel_us = r.kernel.end - r.kernel.begin;
  EXPECT_GE(r.done - r.started, 2000.0) << "the host saw the task take less than the kernel";
  EXPECT_GE(kernel_us, 1990.0);
  EXPECT_LE(kernel_us, r.done - r.started + 50.0);
  EXPECT_LE(r.upload.end - r.upload.begin, 1000.0) << "4 KB took a millisecond to upload";
}

// The built-in kernels stamp their own start and finish (the last block to finish stamps it and
// resets a counter for the next launch): every piece of a long traced run, and of a second run
// after an untraced one, has a kernel stage that starts after its upload, lasts longer than
// nothing and ends before its download.
TEST(CudaTrace, BuiltInKernelsStampTheirOwnStartAndFinish) {
  GPUPOOL_SKIP_UNLESS_USABLE(backend_kind::cuda);
  executor ex(cuda_options(2));
  const auto x = testing::random_vector<double>(std::size_t{1} << 23, 9);  // 8 pieces of 8 MiB
  std::vector<double> out(x.size());
  for (int round = 0; round < 3; ++round) {
    ex.set_tracing(round != 1);
    ex.clear_trace();
    ex.transform(builtin_kernel::square(), std::span<const double>(x), std::span<double>(out))
        .get();
    ASSERT_EQ(out.back(), x.back() * x.back());
    if (round == 1) continue;
    const auto t = ex.trace();
    ASSERT_EQ(t.records().size(), 8u);
    for (const task_record& r : t.records()) {
      ASSERT_TRUE(r.kernel.present()) << r.id;
      EXPECT_GT(r.kernel.end, r.kernel.begin) << "piece " << r.id << " round " << round;
      EXPECT_LE(r.upload.end, r.kernel.begin) << r.id;
      EXPECT_LE(r.kernel.end, r.download.begin + 1.0) << r.id;
      EXPECT_LT(r.kernel.end - r.kernel.begin, r.done - r.started) << r.id;
    }
  }
}

}  // namespace
}  // namespace gpupool
