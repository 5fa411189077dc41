// Lanes per device and chunk size: given values win, the CPU backend's automatic choice is the
// fixed default, a measured choice is the best of a checked sweep, cached per machine and
// devices, and a damaged or foreign cache entry is measured again.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.hpp"
#include "core/kernels/kernel_cache.hpp"
#include "core/tuning/tuning.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

namespace fs = std::filesystem;
using testing::scoped_cache_dir;
using testing::scoped_env;
using testing::temporary_folder;

executor_options cpu_options(tuning mode) {
  executor_options o;
  o.backend = backend_kind::cpu;
  o.cpu_devices = 1;
  o.quiet = true;
  o.tuning = mode;
  return o;
}

// Each test starts with nothing measured in this process, GPUPOOL_TUNING unset (whatever the
// environment running the suite says) and sweeps allowed a minute rather than a second (a
// sanitized build on a loaded machine measures slowly; the deadline has a test of its own).
class Tuning : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("GPUPOOL_TUNING")) saved_ = v;
    ::unsetenv("GPUPOOL_TUNING");
    seconds_ = detail::set_sweep_seconds(60);
    detail::forget_measurements();
  }
  void TearDown() override {
    detail::set_sweep_seconds(seconds_);
    if (saved_) ::setenv("GPUPOOL_TUNING", saved_->c_str(), 1);
  }

 private:
  std::optional<std::string> saved_;
  double seconds_ = 1;
};
using TuningCuda = Tuning;

std::vector<fs::path> entries_in(const std::string& folder) {
  std::vector<fs::path> found;
  if (!fs::exists(folder)) return found;
  for (const auto& e : fs::directory_iterator(folder)) found.push_back(e.path());
  return found;
}

TEST_F(Tuning, TheCpuBackendsAutomaticChoiceIsTheFixedDefaultAndMeasuresNothing) {
  const std::string dir = temporary_folder("tuning-auto");
  scoped_cache_dir cache(dir);
  executor ex(cpu_options(tuning::automatic));
  const executor_settings& s = ex.settings();
  EXPECT_EQ(s.lanes_from, setting_source::fixed);
  EXPECT_EQ(s.chunk_from, setting_source::fixed);
  EXPECT_EQ(s.lanes_per_device, detail::default_lanes(backend_kind::cpu, 1));
  EXPECT_EQ(s.chunk_bytes, detail::default_chunk_bytes);
  EXPECT_EQ(ex.chunk_bytes(), detail::default_chunk_bytes);
  EXPECT_TRUE(s.samples.empty());
  EXPECT_FALSE(fs::exists(dir + "/tuning"));
}

TEST_F(Tuning, GivenValuesWinAndAreNeverMeasured) {
  const std::string dir = temporary_folder("tuning-given");
  scoped_cache_dir cache(dir);
  executor_options o = cpu_options(tuning::remeasure);
  o.lanes_per_device = 3;
  o.chunk_bytes = std::size_t{1} << 20;
  executor ex(o);
  EXPECT_EQ(ex.lanes_per_device(), 3);
  EXPECT_EQ(ex.chunk_bytes(), o.chunk_bytes);
  EXPECT_EQ(ex.settings().lanes_from, setting_source::given);
  EXPECT_EQ(ex.settings().chunk_from, setting_source::given);
  EXPECT_TRUE(ex.settings().samples.empty());
  EXPECT_FALSE(fs::exists(dir + "/tuning"));
}

TEST_F(Tuning, AMeasuredChoiceIsTheBestSampleAndIsCachedThenReadBack) {
  const std::string dir = temporary_folder("tuning-measured");
  scoped_cache_dir cache(dir);
  std::vector<tuning_sample> first;
  {
    executor ex(cpu_options(tuning::measured));
    const executor_settings& s = ex.settings();
    ASSERT_EQ(s.lanes_from, setting_source::measured) << s.note;
    EXPECT_EQ(s.chunk_from, setting_source::measured);
    ASSERT_FALSE(s.samples.empty());
    const tuning_sample& best = detail::best_of(s.samples);
    EXPECT_EQ(ex.lanes_per_device(), best.lanes_per_device);
    EXPECT_EQ(ex.chunk_bytes(), best.chunk_bytes);
    for (const auto& sample : s.samples) EXPECT_GT(sample.bytes_per_second, 0.0);
    EXPECT_TRUE(s.note.empty()) << s.note;
    ASSERT_FALSE(s.cache_file.empty());
    EXPECT_TRUE(fs::is_regular_file(s.cache_file));
    EXPECT_EQ(fs::status(s.cache_file).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
    first = s.samples;
  }
  // The next executor uses the same measurement: from this process's memory, then (as another
  // process would) from the cache file.
  for (int from_file = 0; from_file < 2; ++from_file) {
    if (from_file == 1) detail::forget_measurements();
    executor again(cpu_options(tuning::measured));
    EXPECT_EQ(again.settings().lanes_from, setting_source::cached);
    ASSERT_EQ(again.settings().samples.size(), first.size());
    for (std::size_t i = 0; i < first.size(); ++i)
      EXPECT_EQ(again.settings().samples[i].bytes_per_second, first[i].bytes_per_second);
  }
  // The entry, and the lock file processes measuring the same devices take turns on.
  const auto entries = entries_in(dir + "/tuning");
  EXPECT_EQ(entries.size(), 2u);
  EXPECT_EQ(std::count_if(entries.begin(), entries.end(),
                          [](const fs::path& p) { return p.extension() == ".lock"; }),
            1);
}

// One GPU as two devices is not two GPUs, and a stand-in paced at a copy rate is not one
// running free: each is measured for itself, under its own cache entry.
TEST_F(Tuning, OneDeviceAsTwoAndACopyRateHaveEntriesOfTheirOwn) {
  const std::string dir = temporary_folder("tuning-shared");
  scoped_cache_dir cache(dir);
  const auto file_for = [](std::vector<int> devices, double copy_rate) {
    executor_options o = cpu_options(tuning::measured);
    o.cpu_devices = 2;
    o.devices = std::move(devices);
    o.lanes_per_device = 1;  // only chunk sizes are swept: quick
    o.cpu_copy_rate = copy_rate;
    executor ex(o);
    EXPECT_EQ(ex.settings().chunk_from, setting_source::measured);
    return ex.settings().cache_file;
  };
  const std::string two_gpus = file_for({0, 1}, 0);
  const std::string one_as_two = file_for({0, 0}, 0);
  const std::string paced = file_for({0, 1}, 4e9);
  EXPECT_NE(two_gpus, one_as_two);
  EXPECT_NE(two_gpus, paced);
}

TEST_F(Tuning, RemeasuringReplacesTheCachedEntry) {
  const std::string dir = temporary_folder("tuning-remeasure");
  scoped_cache_dir cache(dir);
  std::string file;
  {
    executor ex(cpu_options(tuning::measured));
    file = ex.settings().cache_file;
  }
  ASSERT_FALSE(file.empty());
  std::ofstream(file, std::ios::app) << " ";  // marks the old entry (it no longer checks)
  detail::forget_measurements();              // as in another process
  executor ex(cpu_options(tuning::remeasure));
  EXPECT_EQ(ex.settings().lanes_from, setting_source::measured);
  EXPECT_EQ(ex.settings().cache_file, file);
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.back(), ' ');
  // Once per process: the next executor asking to remeasure uses that measurement.
  executor next(cpu_options(tuning::remeasure));
  EXPECT_EQ(next.settings().lanes_from, setting_source::cached);
  ASSERT_EQ(next.settings().samples.size(), ex.settings().samples.size());
  EXPECT_EQ(next.settings().samples[0].bytes_per_second, ex.settings().samples[0].bytes_per_second);
}

TEST_F(Tuning, ACachedEntryOutsideWhatASweepCouldMeasureIsMeasuredAgain) {
  const std::string dir = temporary_folder("tuning-foreign");
  scoped_cache_dir cache(dir);
  std::string file;
  std::string key;
  {
    executor ex(cpu_options(tuning::measured));
    file = ex.settings().cache_file;
  }
  ASSERT_FALSE(file.empty());
  // A well-formed, checksummed entry for the same key naming 200 lanes (inside the executor's
  // limits, outside any sweep's candidates): rewritten by the key read back from the entry.
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  // The entry: two header lines (format, checksum), the key's length on a line, the key, ...
  // (kernel_cache.cpp, make_entry).
  const std::size_t length_at = bytes.find('\n', bytes.find('\n') + 1) + 1;
  const std::size_t key_at = bytes.find('\n', length_at) + 1;
  key = bytes.substr(key_at, std::stoul(bytes.substr(length_at, key_at - 1 - length_at)));
  ASSERT_EQ(key.rfind(std::string(detail::tuning_entry_format) + "|", 0), 0u) << key;
  detail::store_entry(file, key, detail::tuning_entry_json({{200, std::size_t{1} << 20, 1e12}}));
  detail::forget_measurements();
  executor ex(cpu_options(tuning::measured));
  EXPECT_EQ(ex.settings().lanes_from, setting_source::measured);
  EXPECT_NE(ex.lanes_per_device(), 200);
}

TEST_F(Tuning, ADamagedCacheEntryIsMeasuredAgainNotTrusted) {
  const std::string dir = temporary_folder("tuning-damaged");
  std::string file;
  {
    scoped_cache_dir cache(dir);
    executor ex(cpu_options(tuning::measured));
    file = ex.settings().cache_file;
  }
  ASSERT_FALSE(file.empty());
  // Another folder, then this one again: the memo of this process is per folder, so the entry
  // on disk is what the next executor reads.
  const std::string copy = temporary_folder("tuning-damaged-copy");
  fs::create_directories(copy + "/tuning");
  fs::permissions(copy + "/tuning", fs::perms::owner_all);
  const std::string moved = copy + "/tuning/" + fs::path(file).filename().string();
  fs::copy_file(file, moved);
  {
    std::ofstream out(moved, std::ios::binary | std::ios::trunc);
    out << "gpupool cache entry, but not one";
  }
  scoped_cache_dir cache(copy);
  executor ex(cpu_options(tuning::measured));
  EXPECT_EQ(ex.settings().lanes_from, setting_source::measured);
  EXPECT_EQ(ex.settings().cache_file, moved);
  EXPECT_FALSE(ex.settings().samples.empty());
}

TEST_F(Tuning, AnUnusableCacheFolderStillMeasuresAndSaysWhy) {
  const std::string dir = temporary_folder("tuning-open");
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_all | fs::perms::others_all);
  scoped_cache_dir cache(dir);
  executor ex(cpu_options(tuning::measured));
  EXPECT_EQ(ex.settings().lanes_from, setting_source::measured);
  EXPECT_TRUE(ex.settings().cache_file.empty());
  EXPECT_NE(ex.settings().note.find("not cached"), std::string::npos) << ex.settings().note;
}

TEST_F(Tuning, AGivenLaneCountIsKeptAndOnlyTheChunkSizeIsMeasured) {
  const std::string dir = temporary_folder("tuning-lanes");
  scoped_cache_dir cache(dir);
  executor_options o = cpu_options(tuning::measured);
  o.lanes_per_device = 2;
  executor ex(o);
  EXPECT_EQ(ex.lanes_per_device(), 2);
  EXPECT_EQ(ex.settings().lanes_from, setting_source::given);
  EXPECT_EQ(ex.settings().chunk_from, setting_source::measured);
  ASSERT_GE(ex.settings().samples.size(), 2u);
  for (const auto& s : ex.settings().samples) EXPECT_EQ(s.lanes_per_device, 2);
}

TEST_F(Tuning, TheEnvironmentOverridesTheOptionAndABadValueIsRefused) {
  const std::string dir = temporary_folder("tuning-env");
  scoped_cache_dir cache(dir);
  {
    scoped_env fixed("GPUPOOL_TUNING", "fixed");
    executor ex(cpu_options(tuning::remeasure));
    EXPECT_EQ(ex.settings().lanes_from, setting_source::fixed);
  }
  {
    scoped_env bogus("GPUPOOL_TUNING", "fastest");
    try {
      executor ex(cpu_options(tuning::automatic));
      FAIL() << "GPUPOOL_TUNING=fastest was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("fastest"), std::string::npos) << e.what();
    }
  }
  {
    // A lane count out of range is refused before anything is measured.
    scoped_env measure("GPUPOOL_TUNING", "remeasure");
    executor_options o = cpu_options(tuning::automatic);
    o.lanes_per_device = 300;
    EXPECT_THROW(executor{o}, std::invalid_argument);
    EXPECT_FALSE(fs::exists(dir + "/tuning"));
  }
}

TEST_F(Tuning, ASweepRunsLanesFirstThenChunkSizesAndStopsAtItsDeadline) {
  executor_options o = cpu_options(tuning::fixed);
  detail::sweep_plan plan;
  plan.lanes = {1, 2};
  plan.chunks = {64 * 1024, 128 * 1024, 256 * 1024};
  plan.bytes_per_device = 1 << 20;
  plan.repeats = 1;
  plan.seconds = 60;
  const auto whole = detail::run_sweep(o, plan, detail::executor_sweep_runner());
  const auto& samples = whole.samples;
  EXPECT_EQ(whole.planned, 4u);
  EXPECT_TRUE(whole.failure.empty()) << whole.failure;
  ASSERT_EQ(samples.size(), 4u);  // 2 lane counts at the middle chunk, then 2 more chunks
  EXPECT_EQ(samples[0].lanes_per_device, 1);
  EXPECT_EQ(samples[1].lanes_per_device, 2);
  EXPECT_EQ(samples[0].chunk_bytes, plan.chunks[1]);
  EXPECT_EQ(samples[1].chunk_bytes, plan.chunks[1]);
  // The faster lane count, or the fewer lanes where they are within 5% (best_of).
  const double fastest = std::max(samples[0].bytes_per_second, samples[1].bytes_per_second);
  const int best = samples[0].bytes_per_second >= 0.95 * fastest ? 1 : 2;
  EXPECT_EQ(samples[2].lanes_per_device, best);
  EXPECT_EQ(samples[2].chunk_bytes, plan.chunks[0]);
  EXPECT_EQ(samples[3].chunk_bytes, plan.chunks[2]);

  // A configuration that cannot be made is left out (and named); the others run.
  plan.lanes = {300, 1};
  const auto without = detail::run_sweep(o, plan, detail::executor_sweep_runner());
  ASSERT_EQ(without.samples.size(), 3u);
  for (const auto& s : without.samples) EXPECT_EQ(s.lanes_per_device, 1);
  EXPECT_NE(without.failure.find("300"), std::string::npos) << without.failure;
  plan.lanes = {300};
  try {
    (void)detail::run_sweep(o, plan, detail::executor_sweep_runner());
    ADD_FAILURE() << "a sweep where nothing could run returned";
  } catch (const gpupool::error& e) {
    EXPECT_NE(std::string(e.what()).find("300"), std::string::npos) << e.what();
  }

  plan.lanes = {1, 2};
  plan.seconds = 0;  // past its deadline once the first configuration ran: nothing else starts
  EXPECT_EQ(detail::run_sweep(o, plan, detail::executor_sweep_runner()).samples.size(), 1u);
  plan.lanes.clear();
  EXPECT_THROW((void)detail::run_sweep(o, plan, detail::executor_sweep_runner()),
               std::invalid_argument);
}

// The sweep runs through the runner it is given, knowing nothing of executors: a runner of its
// own sees every configuration the plan asks for, and a wrong result voids the sweep.
TEST_F(Tuning, ASweepMeasuresWhatItsRunnerMakes) {
  struct fake final : detail::sweep_configuration {
    fake(const executor_options& o, bool wrong) : options(o), wrong_(wrong) {}
    int lanes_per_device() const override { return options.lanes_per_device; }
    std::size_t chunk_bytes() const override { return options.chunk_bytes; }
    void square(std::span<const double> in, std::span<double> out) override {
      for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * in[i] + (wrong_ ? 1 : 0);
    }
    executor_options options;
    bool wrong_;
  };
  std::vector<std::pair<int, std::size_t>> made;
  bool wrong = false;
  const detail::sweep_runner runner = [&](const executor_options& o) {
    EXPECT_EQ(o.tuning, tuning::fixed);
    made.emplace_back(o.lanes_per_device, o.chunk_bytes);
    return std::make_unique<fake>(o, wrong);
  };
  detail::sweep_plan plan;
  plan.lanes = {1, 2};
  plan.chunks = {64 * 1024, 128 * 1024};
  plan.bytes_per_device = 1 << 16;
  plan.repeats = 1;
  plan.seconds = 60;
  const auto result = detail::run_sweep(cpu_options(tuning::fixed), plan, runner);
  EXPECT_EQ(result.samples.size(), 3u);
  ASSERT_EQ(made.size(), 3u);
  EXPECT_EQ(made[0], std::make_pair(1, plan.chunks[1]));
  EXPECT_EQ(made[1], std::make_pair(2, plan.chunks[1]));
  EXPECT_EQ(made[2].second, plan.chunks[0]);
  wrong = true;
  EXPECT_THROW((void)detail::run_sweep(cpu_options(tuning::fixed), plan, runner), gpupool::error);
}

// Every lane runs several pieces in each configuration, so a big chunk is measured in its steady
// state, not in the ramp of a lane's first piece or two (which once made the sweep choose chunks
// slower than the best).
TEST_F(Tuning, TheLargestConfigurationStillGivesEveryLaneSeveralPieces) {
  for (std::size_t devices : {1, 2}) {
    const auto plan = detail::plan_for(executor_options{}, backend_kind::cuda, devices);
    const std::size_t largest = *std::max_element(plan.chunks.begin(), plan.chunks.end());
    const auto most_lanes =
        static_cast<std::size_t>(*std::max_element(plan.lanes.begin(), plan.lanes.end()));
    EXPECT_GE(plan.pieces_per_lane, 8u);
    // Per device: every lane of the largest configuration runs at least four pieces, and the
    // one of the lane sweep (the middle chunk) its eight.
    EXPECT_GE(plan.most_bytes_per_device, most_lanes * largest * 4) << devices << " device(s)";
    EXPECT_GE(plan.most_bytes_per_device,
              most_lanes * plan.chunks[plan.chunks.size() / 2] * plan.pieces_per_lane)
        << devices << " device(s)";
    // The input and the output array each hold this much host memory at most.
    EXPECT_LE(plan.most_bytes_per_device * devices, std::size_t{2} << 30) << "host memory";
  }
}

// The sweep's rates for lane counts within a few percent of each other are noise; every lane more
// is a thread more on the host's cores.
TEST_F(Tuning, NearTiesGoToTheFewestLanesThenTheFastestOfThose) {
  constexpr std::size_t mib = std::size_t{1} << 20;
  const std::vector<tuning_sample> close = {
      {4, 4 * mib, 27e9}, {8, 4 * mib, 39.5e9}, {16, 4 * mib, 41e9}, {8, 2 * mib, 40e9}};
  EXPECT_EQ(detail::best_of(close).lanes_per_device, 8);
  EXPECT_EQ(detail::best_of(close).chunk_bytes, 2 * mib);  // the faster of the 8-lane samples
  const std::vector<tuning_sample> apart = {{8, 4 * mib, 38e9}, {16, 4 * mib, 41e9}};
  EXPECT_EQ(detail::best_of(apart).lanes_per_device, 16);  // 7% slower is no tie
  const std::vector<tuning_sample> equal = {{8, 4 * mib, 4e10}, {8, 2 * mib, 4e10}};
  EXPECT_EQ(detail::best_of(equal).chunk_bytes, 4 * mib);  // the first of equals
}

TEST_F(Tuning, TheGpuSweepTriesOnlyLaneCountsThatLeaveTheCallerACore) {
  const auto sweep = detail::traits_of(backend_kind::cuda).sweep_lanes;
  EXPECT_EQ(sweep(1, 2), (std::vector<int>{4}));
  EXPECT_EQ(sweep(1, 16), (std::vector<int>{4, 8}));
  EXPECT_EQ(sweep(1, 17), (std::vector<int>{4, 8, 16}));
  EXPECT_EQ(sweep(2, 32), (std::vector<int>{4, 8}));
  EXPECT_EQ(sweep(2, 33), (std::vector<int>{4, 8, 16}));
  EXPECT_EQ(sweep(8, 128), (std::vector<int>{4, 8}));
}

TEST_F(Tuning, ASweepCutShortIsUsedButNotCached) {
  const std::string dir = temporary_folder("tuning-short");
  scoped_cache_dir cache(dir);
  detail::set_sweep_seconds(0);  // the fixture restores it
  executor ex(cpu_options(tuning::measured));
  EXPECT_EQ(ex.settings().lanes_from, setting_source::measured);
  EXPECT_EQ(ex.settings().samples.size(), 1u);
  EXPECT_TRUE(ex.settings().cache_file.empty());
  EXPECT_NE(ex.settings().note.find("not cached: 1 of"), std::string::npos) << ex.settings().note;
  // Remembered for the process (not measured again), not written for others.
  executor again(cpu_options(tuning::measured));
  EXPECT_EQ(again.settings().lanes_from, setting_source::cached);
  for (const auto& e : entries_in(dir + "/tuning")) EXPECT_EQ(e.extension(), ".lock") << e;
}

// On a GPU the default is measured: once (within its second, plus making the executors), then
// read back; the chosen settings compute right.
TEST_F(TuningCuda, TheDefaultIsMeasuredOnceOnTheGpuThenReadBack) {
  GPUPOOL_SKIP_UNLESS_USABLE(backend_kind::cuda);
  const std::string dir = temporary_folder("tuning-cuda");
  scoped_cache_dir cache(dir);
  executor_options o;
  o.backend = backend_kind::cuda;
  const auto start = std::chrono::steady_clock::now();
  executor ex(o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const executor_settings& s = ex.settings();
  ASSERT_EQ(s.lanes_from, setting_source::measured) << s.note;
  EXPECT_EQ(s.chunk_from, setting_source::measured);
  EXPECT_GE(s.samples.size(), 3u);
  EXPECT_LT(seconds, 10.0) << "the sweep and its executors took " << seconds << " s";
  std::printf("tuning on %s: %d lanes x %zu-byte chunks after %.2f s; sweep:",
              ex.devices()[0].name.c_str(), ex.lanes_per_device(), ex.chunk_bytes(), seconds);
  for (const auto& sample : s.samples)
    std::printf(" %dx%zu=%.1fGB/s", sample.lanes_per_device, sample.chunk_bytes,
                sample.bytes_per_second / 1e9);
  std::printf("\n");
  std::vector<std::vector<double>> chunks(8, std::vector<double>(1 << 20, 1.5));
  for (const auto& squares : ex.map(builtin_kernel::square(), chunks).get())
    for (double v : squares) ASSERT_EQ(v, 2.25);
  executor again(o);
  EXPECT_EQ(again.settings().lanes_from, setting_source::cached);
  EXPECT_EQ(again.lanes_per_device(), ex.lanes_per_device());
  EXPECT_EQ(again.chunk_bytes(), ex.chunk_bytes());
}

TEST_F(Tuning, CacheEntriesOutsideTheLimitsOrMalformedAreRefused) {
  const std::vector<tuning_sample> good = {{4, 1 << 20, 1e9}, {8, 1 << 21, 2e9}};
  EXPECT_STREQ(to_string(tuning::automatic), "auto");
  for (tuning t : {tuning::automatic, tuning::measured, tuning::remeasure, tuning::fixed})
    EXPECT_EQ(tuning_from_name(to_string(t)), t);
  EXPECT_FALSE(tuning_from_name("measure").has_value());
  const auto back = detail::parse_tuning_entry(detail::tuning_entry_json(good));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].lanes_per_device, 8);
  EXPECT_EQ(back[1].chunk_bytes, std::size_t{1} << 21);
  EXPECT_EQ(back[1].bytes_per_second, 2e9);
  EXPECT_EQ(detail::best_of(back).lanes_per_device, 8);

  const std::string sample_of =
      std::string(R"({"format":")") + detail::tuning_entry_format + R"(","samples":[%]})";
  auto with = [&](const std::string& sample) {
    std::string text = sample_of;
    text.replace(text.find('%'), 1, sample);
    return detail::parse_tuning_entry(text);
  };
  EXPECT_EQ(with(R"({"lanes_per_device":4,"chunk_bytes":1048576,"bytes_per_second":1})").size(),
            1u);
  for (const std::string bad : {
           R"({"lanes_per_device":0,"chunk_bytes":1048576,"bytes_per_second":1})",
           R"({"lanes_per_device":257,"chunk_bytes":1048576,"bytes_per_second":1})",
           R"({"lanes_per_device":-4,"chunk_bytes":1048576,"bytes_per_second":1})",
           R"({"lanes_per_device":4.5,"chunk_bytes":1048576,"bytes_per_second":1})",
           R"({"lanes_per_device":4,"chunk_bytes":100,"bytes_per_second":1})",
           R"({"lanes_per_device":4,"chunk_bytes":1048576,"bytes_per_second":0})",
           R"({"lanes_per_device":4,"chunk_bytes":1048576,"bytes_per_second":"fast"})",
           R"({"lanes_per_device":4,"chunk_bytes":1048576})",
           R"([4, 1048576, 1])",
       })
    EXPECT_TRUE(with(bad).empty()) << bad;
  // An entry of another format is a miss, even with samples that would do (format 1 sized its
  // configurations differently).
  const std::string good_sample =
      R"({"lanes_per_device":4,"chunk_bytes":1048576,"bytes_per_second":1})";
  for (const std::string& bad :
       {std::string(""), std::string("{"), std::string("null"),
        std::string(R"({"format":")") + detail::tuning_entry_format + R"(","samples":[]})",
        std::string(R"({"format":"gpupool-tuning 1","samples":[)") + good_sample + "]}",
        std::string(R"({"format":"gpupool-tuning 1"})")})
    EXPECT_TRUE(detail::parse_tuning_entry(bad).empty()) << bad;
}

}  // namespace
}  // namespace gpupool
