// A kernel cache folder that cannot be used (a path under a regular file, a file, another user's
// folder, one others can write to, one that refuses writes) never makes kernels unusable: they
// are compiled for the process alone, nothing is read from or written to that folder, and the
// process is told once on stderr. Also the bound of the in-memory compile cache. On the CPU
// backend (the CUDA backend's side is in test_kernel_cache_cuda.cpp).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/kernels/compile_once.hpp"
#include "core/kernels/kernel_cache.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

namespace fs = std::filesystem;
using testing::scoped_cache_dir;
using testing::scoped_env;
using testing::temporary_folder;

// y = x * `c` + 0.5 over 1,000 doubles (a kernel of its own per `c`) with the cache in `dir`;
// true if every result is right.
bool runs_with_cache_in(const std::string& dir, int c) {
  const std::vector<double> out = testing::run_with_cache_in(
      dir, "y = x * " + std::to_string(c) + " + 0.5;", "fallback_" + std::to_string(c));
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i] != static_cast<double>(i) * c + 0.5) return false;
  return true;
}

void write_file(const std::string& path) {
  std::ofstream(path) << "not a folder\n";
}

std::size_t files_under(const std::string& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (!e.is_directory()) ++n;
  return n;
}

// An unusable cache folder, what it is, and the folder to check is left untouched (empty if
// nothing can be made there at all).
struct unusable_folder {
  std::string what;
  std::string cache_dir;
  std::string untouched;
};

// The cases that are unusable for this process's user: root ignores permission bits, so a
// read-only folder counts only for others, while ownership and mode are checked for everyone.
std::vector<unusable_folder> unusable_folders() {
  std::vector<unusable_folder> cases;
  const std::string base = temporary_folder("fallback");
  write_file(base + "/file");
  cases.push_back({"a path under a regular file", base + "/file/cache", ""});
  cases.push_back({"a regular file", base + "/file", ""});
  const std::string open = base + "/open";
  fs::create_directory(open);
  ::chmod(open.c_str(), 0777);
  cases.push_back({"a folder others can write to", open, open});
  const std::string group = base + "/group";
  fs::create_directory(group);
  fs::create_directory(group + "/host");
  ::chmod(group.c_str(), 0700);
  ::chmod((group + "/host").c_str(), 0770);
  cases.push_back({"a kernel folder its group can write to", group, group});
  if (::geteuid() == 0) {
    const std::string foreign = base + "/foreign";
    fs::create_directory(foreign);
    ::chmod(foreign.c_str(), 0700);
    if (::chown(foreign.c_str(), 65534, 65534) == 0)
      cases.push_back({"a folder of another user", foreign, foreign});
  } else {
    const std::string read_only = base + "/read-only";
    fs::create_directory(read_only);
    ::chmod(read_only.c_str(), 0500);
    cases.push_back({"a folder that refuses writes", read_only, read_only});
  }
  return cases;
}

TEST(KernelCacheFallback, AnUnusableFolderCompilesForTheProcessAndTouchesNothingThere) {
  int c = 11;
  for (const unusable_folder& u : unusable_folders()) {
    SCOPED_TRACE(u.what);
    EXPECT_THROW(
        (void)[&] {
          scoped_cache_dir cache(u.cache_dir);
          return detail::persistent_cache_folder("host");
        }(),
        error);
    const std::size_t before = kernels_compiled();
    EXPECT_TRUE(runs_with_cache_in(u.cache_dir, ++c));
    EXPECT_EQ(kernels_compiled(), before + 1);
    // A second executor in this process finds the kernel compiled: no second compilation.
    EXPECT_TRUE(runs_with_cache_in(u.cache_dir, c));
    EXPECT_EQ(kernels_compiled(), before + 1);
    if (!u.untouched.empty()) {
      EXPECT_EQ(files_under(u.untouched), 0u) << u.untouched;
    }
  }
  EXPECT_TRUE(detail::cache_unusable_warned());
}

TEST(KernelCacheFallback, TheProcessFolderIsPrivateAndOnlyKernelsFallBack) {
  const std::string base = temporary_folder("fallback-kinds");
  write_file(base + "/file");
  scoped_cache_dir cache(base + "/file/cache");
  const std::string host = detail::cache_folder("host", detail::if_cache_unusable::use_scratch);
  struct stat st {};
  ASSERT_EQ(::stat(fs::path(host).parent_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(detail::cache_folder("host", detail::if_cache_unusable::use_scratch), host)
      << "one folder per process";
  EXPECT_FALSE(detail::kernel_cache_folder("cuda"));
  // Tuning results are not kernels: their caller is told why nothing is kept.
  EXPECT_THROW((void)detail::cache_folder("tuning", detail::if_cache_unusable::fail), error);
}

TEST(KernelCacheFallback, AUsableFolderIsStillTheCache) {
  const std::string dir = temporary_folder("fallback-usable");
  EXPECT_TRUE(runs_with_cache_in(dir, 5));
  scoped_cache_dir cache(dir);
  EXPECT_EQ(detail::kernel_cache_folder("host"), std::optional<std::string>(dir + "/host"));
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir + "/host"))
    entries += e.path().string().ends_with(".so.entry") ? 1 : 0;
  EXPECT_EQ(entries, 1u);
}

// In a child process of its own (a new one, not this one's fork: the warning is once per
// process): compiles two kernels with unusable caches, then prints how many warnings it saw.
void count_warnings_in_a_fresh_process() {
  ::testing::internal::CaptureStderr();
  const std::string base = temporary_folder("fallback-once");
  write_file(base + "/file");
  const bool first = runs_with_cache_in(base + "/file/a", 101);
  const bool second = runs_with_cache_in(base + "/file/b", 102);
  const std::string err = ::testing::internal::GetCapturedStderr();
  std::size_t warnings = 0;
  for (std::size_t at = err.find("not using the kernel cache"); at != std::string::npos;
       at = err.find("not using the kernel cache", at + 1))
    ++warnings;
  std::fprintf(stderr, "results %s, warnings printed: %zu, warned: %d.\n",
               first && second ? "right" : "WRONG", warnings,
               detail::cache_unusable_warned() ? 1 : 0);
  if (warnings > 0) std::fprintf(stderr, "%s", err.c_str());
  std::exit(0);
}

TEST(KernelCacheFallbackDeathTest, TheWarningIsPrintedOncePerProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Unset for the fresh process, even where the suite runs with GPUPOOL_QUIET=1.
  const scoped_env loud("GPUPOOL_QUIET", nullptr);
  EXPECT_EXIT(count_warnings_in_a_fresh_process(), ::testing::ExitedWithCode(0),
              "results right, warnings printed: 1, warned: 1\\.");
}

TEST(KernelCacheFallbackDeathTest, GpupoolQuietSilencesTheWarning) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  scoped_env quiet("GPUPOOL_QUIET", "1");
  EXPECT_EXIT(count_warnings_in_a_fresh_process(), ::testing::ExitedWithCode(0),
              "results right, warnings printed: 0, warned: 1\\.");
}

TEST(CompileOnce, KeepsAtMostItsBoundAndBuildsADroppedResultAgain) {
  detail::compile_once<int> memo(2);
  int builds = 0;
  const auto build = [&](int v) {
    return [&builds, v] {
      ++builds;
      return v;
    };
  };
  EXPECT_EQ(memo.get("a", build(1)), 1);
  EXPECT_EQ(memo.get("b", build(2)), 2);
  EXPECT_EQ(memo.get("a", build(-1)), 1);  // kept; now the most recent
  EXPECT_EQ(builds, 2);
  EXPECT_EQ(memo.get("c", build(3)), 3);  // drops "b", the least recently asked for
  EXPECT_EQ(memo.size(), 2u);
  EXPECT_EQ(memo.get("a", build(-1)), 1);
  EXPECT_EQ(builds, 3);
  EXPECT_EQ(memo.get("b", build(20)), 20);  // built again
  EXPECT_EQ(builds, 4);
  EXPECT_EQ(memo.size(), 2u);
  // A failed build is not kept, and does not count against the bound.
  EXPECT_THROW(memo.get("d", []() -> int { throw std::runtime_error("no"); }), std::runtime_error);
  EXPECT_EQ(memo.size(), 2u);
  EXPECT_EQ(memo.get("d", build(4)), 4);
}

}  // namespace
}  // namespace gpupool
