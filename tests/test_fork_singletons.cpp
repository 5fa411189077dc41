// The library's process-wide state that a forked child must not inherit half changed: the host
// compiler's (its compiler lookups and its in-memory compile cache) and the kernel cache's
// process folder. A child compiles elementwise kernels on the CPU backend, with right results,
// even when a thread of the parent was in the middle of compiling, holding the host compiler's
// lock or building the very kernel the child asks for, at the fork. Also the one reading of
// GPUPOOL_QUIET, and the cache folder's fallback as each caller asks for it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/environment.hpp"
#include "core/kernels/kernel_cache.hpp"
#include "core/sanitizers.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::expect_clean_exit;
using testing::temporary_folder;

// y = x * `c` + 0.25 over x = 0, 1, ..., 999 on one CPU lane, with the environment as it is (the
// threads here must not change it while another reads it); true if every result is right.
bool runs_kernel(int c, const std::string& name) {
  executor_options o;
  o.backend = backend_kind::cpu;
  o.lanes_per_device = 1;
  o.quiet = true;
  executor ex(o);
  elementwise_kernel k("float64 x", "float64 y", "y = x * " + std::to_string(c) + " + 0.25;", name);
  std::vector<double> x(1000), out(x.size(), -1.0);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i);
  ex.transform<double>(k, {x}, out).get();
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i] != static_cast<double>(i) * c + 0.25) return false;
  return true;
}

// In a forked child: runs the kernel and exits with 0 if its results are right, `failed` if not
// (or if it threw). An alarm ends a child that hangs.
[[noreturn]] void child_runs_kernel(int c, const std::string& name, int failed) {
  ::alarm(60);
  int code = failed;
  try {
    code = runs_kernel(c, name) ? 0 : failed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
  }
  ::_exit(code);
}

// The compiler the test run would use, as a command line for a shell: GPUPOOL_CXX, else CXX,
// else the first of c++, g++, clang++ found.
std::string real_compiler() {
  for (const char* name : {"GPUPOOL_CXX", "CXX"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return v;
  return "$(command -v c++ || command -v g++ || command -v clang++)";
}

// A compiler wrapper, in `folder`, that runs the real compiler, except that the first call of
// the kind asked for (`--version`, which the host compiler runs under its lock, or a compile)
// first marks `folder`/started and then waits until `folder`/released exists. Later calls of
// either kind, from any process, pass straight through.
std::string blocking_compiler(const std::string& folder, bool block_version) {
  const std::string path = folder + "/blocking-cxx";
  std::ofstream script(path);
  script << "#!/bin/sh\n"
         << "case \"$1\" in --version) call=version ;; *) call=compile ;; esac\n"
         << "if [ \"$call\" = " << (block_version ? "version" : "compile") << " ] && mkdir '"
         << folder << "/started' 2>/dev/null; then\n"
         << "  while [ ! -e '" << folder << "/released' ]; do sleep 0.01; done\n"
         << "fi\n"
         << "exec " << real_compiler() << " \"$@\"\n";
  script.close();
  ::chmod(path.c_str(), 0700);
  return path;
}

// Whether `path` appeared within a minute.
bool appears(const std::string& path) {
  for (auto give_up = std::chrono::steady_clock::now() + 60s; !fs::exists(path);) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Lets the stopped compiler go on and waits for the thread that ran it, at the latest when the
// test leaves, however it leaves.
class releaser {
 public:
  releaser(std::string folder, std::thread& thread) : folder_(std::move(folder)), thread_(thread) {}
  releaser(const releaser&) = delete;
  releaser& operator=(const releaser&) = delete;
  ~releaser() { release(); }
  void release() {
    if (!thread_.joinable()) return;
    std::ofstream(folder_ + "/released").close();
    thread_.join();
  }

 private:
  std::string folder_;
  std::thread& thread_;
};

// A parent thread compiles kernel `c` through a compiler that stops at `block_version`'s call
// (so that the thread holds the host compiler's lock, or has the kernel's build in flight); the
// parent forks then, and the child compiles the same kernel and must finish while the parent's
// thread is still stopped.
void child_compiles_while_a_parent_thread_is_stopped(bool block_version, int c) {
#ifdef GPUPOOL_UNDER_THREAD_SANITIZER
  GTEST_SKIP() << "ThreadSanitizer ends a child forked from a process with other threads "
                  "running as soon as the child starts one (its lanes)";
#endif
  const std::string folder = temporary_folder("fork-compiler");
  const std::string cache = temporary_folder("fork-compiler-cache");
  const testing::scoped_cache_dir cache_dir(cache);
  // Restored afterwards: the test run may have set it (to a compiler of its choice, say).
  const testing::scoped_env cxx("GPUPOOL_CXX", blocking_compiler(folder, block_version).c_str());
  const std::string name = block_version ? "fork_held_lock" : "fork_in_flight";

  bool parent_right = false;
  std::thread compiling([&] {
    try {
      parent_right = runs_kernel(c, name);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the parent's thread: " << e.what();
    }
  });
  releaser release(folder, compiling);
  ASSERT_TRUE(appears(folder + "/started")) << "the parent's thread never ran the compiler";

  const pid_t child = ::fork();
  ASSERT_NE(child, -1);
  if (child == 0) child_runs_kernel(c, name, 40);
  // The parent's thread stays stopped until the child has exited: the child cannot have used
  // anything that thread was to finish.
  expect_clean_exit(child);
  EXPECT_FALSE(fs::exists(folder + "/released"));
  release.release();
  EXPECT_TRUE(parent_right) << "the parent's thread finished its kernel with wrong results";
}

}  // namespace

TEST(ForkSingletons, AChildCompilesWhileAParentThreadHoldsTheCompilerLock) {
  child_compiles_while_a_parent_thread_is_stopped(/*block_version=*/true, 71);
}

TEST(ForkSingletons, AChildCompilesAKernelAParentThreadWasStillCompiling) {
  child_compiles_while_a_parent_thread_is_stopped(/*block_version=*/false, 72);
}

TEST(ForkSingletons, AChildRunsAKernelItsParentCompiledFromTheCache) {
  const testing::scoped_cache_dir cache(temporary_folder("fork-cached"));
  ASSERT_TRUE(runs_kernel(73, "fork_cached"));
  const std::size_t compiled = kernels_compiled();
  const pid_t child = ::fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    ::alarm(60);
    // The child's in-memory cache is its own (empty), but the parent's entry is on disk.
    int code = 50;
    try {
      if (!runs_kernel(73, "fork_cached"))
        code = 51;
      else
        code = kernels_compiled() == compiled ? 0 : 52;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    ::_exit(code);
  }
  expect_clean_exit(child);
  EXPECT_TRUE(runs_kernel(73, "fork_cached"));
  EXPECT_EQ(kernels_compiled(), compiled) << "compiled once, in the parent";
}

TEST(ForkSingletons, AChildWithoutACacheCompilesInAFolderOfItsOwn) {
  const std::string base = temporary_folder("fork-scratch");
  std::ofstream(base + "/file") << "not a folder\n";
  const testing::scoped_cache_dir cache(base + "/file/cache");  // unusable
  ASSERT_TRUE(runs_kernel(74, "fork_scratch"));
  const std::string parents = detail::cache_folder("host", detail::if_cache_unusable::use_scratch);
  const pid_t child = ::fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    ::alarm(60);
    int code = 60;
    try {
      const std::string mine = detail::cache_folder("host", detail::if_cache_unusable::use_scratch);
      struct stat st {};
      if (fs::path(mine).parent_path() == fs::path(parents).parent_path())
        code = 61;  // the parent's folder, which the parent removes when it exits
      else if (::stat(fs::path(mine).parent_path().c_str(), &st) != 0 ||
               (st.st_mode & 07777) != 0700 || st.st_uid != ::geteuid())
        code = 62;
      else if (!runs_kernel(74, "fork_scratch"))
        code = 63;
      else
        code = 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    ::_exit(code);
  }
  expect_clean_exit(child);
  EXPECT_EQ(detail::cache_folder("host", detail::if_cache_unusable::use_scratch), parents);
  EXPECT_TRUE(fs::is_directory(parents));
}

TEST(CacheFolder, EachCallerSaysWhetherAFolderOfTheProcessWillDo) {
  const std::string base = temporary_folder("cache-folder-fallback");
  std::ofstream(base + "/file") << "not a folder\n";
  {
    const testing::scoped_cache_dir unusable(base + "/file/cache");
    // Any kind: what happens is the caller's choice, not the kind's.
    for (const char* kind : {"host", "tuning", "anything"}) {
      SCOPED_TRACE(kind);
      const std::string scratch =
          detail::cache_folder(kind, detail::if_cache_unusable::use_scratch);
      EXPECT_EQ(fs::path(scratch).filename(), kind);
      EXPECT_TRUE(fs::is_directory(scratch));
      EXPECT_THROW((void)detail::cache_folder(kind, detail::if_cache_unusable::fail), error);
    }
  }
  const std::string usable = temporary_folder("cache-folder-usable");
  const testing::scoped_cache_dir cache(usable);
  for (const auto fallback :
       {detail::if_cache_unusable::use_scratch, detail::if_cache_unusable::fail})
    EXPECT_EQ(detail::cache_folder("tuning", fallback), usable + "/tuning");
}

TEST(QuietFromEnvironment, OneIsQuietZeroOrNothingIsNotAndAnythingElseIsRefused) {
  {
    const testing::scoped_env quiet("GPUPOOL_QUIET", "1");
    EXPECT_TRUE(detail::quiet_from_environment());
  }
  for (const char* not_quiet : {"0", ""}) {
    const testing::scoped_env quiet("GPUPOOL_QUIET", not_quiet);
    EXPECT_FALSE(detail::quiet_from_environment()) << "'" << not_quiet << "'";
  }
  {
    const testing::scoped_env quiet("GPUPOOL_QUIET", nullptr);
    EXPECT_FALSE(detail::quiet_from_environment());
  }
  for (const char* bad : {"yes", "true", " 1", "2"}) {
    const testing::scoped_env quiet("GPUPOOL_QUIET", bad);
    try {
      (void)detail::quiet_from_environment();
      ADD_FAILURE() << "GPUPOOL_QUIET='" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("GPUPOOL_QUIET must be 0 or 1, not '") +
                                           bad + "'"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(CpuDevices, TheRefusalSaysZeroIsAcceptedAndNamesTheLimit) {
  for (const int bad : {-3, limits::most_cpu_devices + 1}) {
    executor_options o;
    o.backend = backend_kind::cpu;
    o.quiet = true;
    o.cpu_devices = bad;
    try {
      executor ex(o);
      ADD_FAILURE() << "cpu_devices = " << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("cpu_devices must be from 0 (GPUPOOL_CPU_DEVICES, "
                                           "else 1) to " +
                                           std::to_string(limits::most_cpu_devices) + ", not " +
                                           std::to_string(bad)),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace gpupool
