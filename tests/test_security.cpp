// What gpupool does not trust, on the CPU backend: kernel, entry and parameter names and type
// strings (checked before any source is generated), paths (no shell ever reads them), the kernel
// cache folder (private, or not used at all) and its contents (checked before use, a miss
// otherwise), scalar arguments (NumPy's same_kind rule, never converted out of range), integer
// overflow in the built-in kernels (wraps, as in NumPy) and sizes (checked before any rounding).
// docs/security.md lists these tests beside what each one checks.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "core/kernels/kernel_cache.hpp"
#include "core/kernels/kernel_source.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

namespace fs = std::filesystem;
using testing::scoped_cache_dir;
using testing::temporary_folder;

// ---- names and types -------------------------------------------------------------------------

// What a refusal says: std::invalid_argument whose message names the bad text, escaped (no raw
// newline or control character reaches a log).
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return {};
}

bool printable(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c >= 0x7f) return false;
  return true;
}

TEST(KernelNames, AKernelNameCarryingCodeIsRefusedBeforeAnySourceIsGenerated) {
  // A name that would end the generated source's first comment and add a static initializer.
  const std::string injected =
      "k\n#include <cstdlib>\nstatic int pwned = std::system(\"touch PWNED\");\n//";
  const std::string message =
      refusal([&] { elementwise_kernel("float64 x", "float64 y", "y = x;", injected); });
  EXPECT_NE(message.find("kernel name"), std::string::npos) << message;
  EXPECT_NE(message.find("\\x0a"), std::string::npos) << message;  // the newline, escaped
  EXPECT_TRUE(printable(message)) << message;
  for (const std::string& bad :
       std::vector<std::string>{"", "1k", "a b", "a;b", "a*/b", "a-b", "k\r", "caf\xc3\xa9",
                                std::string("a\0b", 3), std::string(129, 'a')})
    EXPECT_THROW(elementwise_kernel("float64 x", "float64 y", "y = x;", bad), std::invalid_argument)
        << bad;
  EXPECT_NO_THROW(elementwise_kernel("float64 x", "float64 y", "y = x;", std::string(128, 'a')));
  EXPECT_NO_THROW(elementwise_kernel("float64 x", "float64 y", "y = x;", "_poly_2"));
}

TEST(KernelNames, ParameterNamesAndTypesAreIdentifiersAndKnownTypes) {
  for (const std::string& inputs : std::vector<std::string>{
           "float64 x;system", "float64 return", "float64 gpupool_i", "float64 x\"",
           "float64 x/**/", "float64 " + std::string(129, 'x'), "float64);system(\"x\") x",
           "double* x", "float64 x y", "float64 \xce\xb1"}) {
    const std::string message =
        refusal([&] { elementwise_kernel(inputs, "float64 y", "y = 1;", "k"); });
    EXPECT_TRUE(printable(message)) << message;
  }
  EXPECT_NE(refusal([] { elementwise_kernel("float64 for", "float64 y", "y = 1;"); }).find("'for'"),
            std::string::npos);
  EXPECT_NE(
      refusal([] { elementwise_kernel("float64) x", "float64 y", "y = 1;"); }).find("'float64)'"),
      std::string::npos);
  // The output is checked the same way.
  EXPECT_THROW(elementwise_kernel("float64 x", "float64 y;z", "y = x;"), std::invalid_argument);
  // A declaration is bounded in length and in parameters.
  std::string many;
  for (int i = 0; i < 300; ++i) many += (i ? ", float64 p" : "float64 p") + std::to_string(i);
  EXPECT_THROW(elementwise_kernel(many, "float64 y", "y = 1;"), std::invalid_argument);
  EXPECT_THROW(elementwise_kernel("float64 x" + std::string(20000, ' '), "float64 y", "y = x;"),
               std::invalid_argument);
  EXPECT_NO_THROW(elementwise_kernel("float64 x, int32 n_2, float32 _a", "int64 y", "y = n_2;"));
}

TEST(KernelNames, RawKernelEntriesAreCppNames) {
  const char* source = "__global__ void k(float* y, unsigned long long n) {}";
  for (const std::string& bad :
       std::vector<std::string>{"k\n}", "k()", "::k", "k::", "a:::b", "a::::b", "operator",
                                "k<float>", "a::return", "k;int", std::string(129, 'k')}) {
    const std::string message = refusal([&] { raw_kernel(source, bad, "", "float32* y"); });
    EXPECT_TRUE(printable(message)) << message;
  }
  EXPECT_NO_THROW(raw_kernel(source, "k", "", "float32* y"));
  EXPECT_NO_THROW(raw_kernel(source, "ns::inner::k", "", "float32* y"));
}

// ---- the kernel cache and the compiler's process ---------------------------------------------

// Runs y = x + `c` (a kernel of its own per `c`) over 1,000 doubles with the cache in `dir`.
std::vector<double> run_plus(const std::string& dir, int c) {
  return testing::run_with_cache_in(dir, "y = x + " + std::to_string(c) + ";",
                                    "plus_" + std::to_string(c));
}

bool adds(const std::vector<double>& out, int c) {
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i] != static_cast<double>(i) + c) return false;
  return true;
}

std::vector<fs::path> entries_in(const std::string& folder) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(folder)) out.push_back(e.path());
  return out;
}

fs::path only_entry(const std::string& folder) {
  const auto all = entries_in(folder);
  EXPECT_EQ(all.size(), 1u) << folder;
  return all.empty() ? fs::path() : all[0];
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// A cache folder with an empty, private host/ folder, as a process that compiled nothing sees.
std::string fresh_cache(const std::string& tag) {
  const std::string dir = temporary_folder(tag);
  fs::create_directory(dir + "/host");
  fs::permissions(dir + "/host", fs::perms::owner_all, fs::perm_options::replace);
  return dir;
}

TEST(KernelCache, FoldersAreCreatedPrivateAndEntriesCarryTheirKeyAndChecksum) {
  const std::string dir = temporary_folder("create") + "/new/cache";
  ASSERT_TRUE(adds(run_plus(dir, 1), 1));
  EXPECT_EQ(mode_of(dir), 0700u);
  EXPECT_EQ(mode_of(dir + "/host"), 0700u);
  const fs::path entry = only_entry(dir + "/host");
  EXPECT_EQ(mode_of(entry), 0600u);
  const std::string bytes = read_bytes(entry);
  EXPECT_EQ(bytes.rfind(std::string("gpupool-kernel-cache 1\n") + detail::checksum_name() + " ", 0),
            0u);
  EXPECT_NE(bytes.find("y = x + 1;"), std::string::npos) << "the full key (the source) is stored";
  // A second "process" (another folder holding a copy of the entry) loads it without compiling.
  const std::string copy = fresh_cache("copy");
  fs::copy_file(entry, copy + "/host/" + entry.filename().string());
  const std::size_t before = kernels_compiled();
  EXPECT_TRUE(adds(run_plus(copy, 1), 1));
  EXPECT_EQ(kernels_compiled(), before);
}

TEST(KernelCache, DamagedEntriesAreMissesThatRecompileAndReplaceThem) {
  const std::string good_dir = temporary_folder("good");
  ASSERT_TRUE(adds(run_plus(good_dir, 2), 2));
  const fs::path good = only_entry(good_dir + "/host");
  const std::string bytes = read_bytes(good);
  std::string flipped = bytes;
  flipped.back() = static_cast<char>(flipped.back() ^ 0x40);  // one bit of the image
  const std::vector<std::pair<const char*, std::string>> damages{
      {"truncated to half", bytes.substr(0, bytes.size() / 2)},
      {"truncated to its header", bytes.substr(0, 30)},
      {"empty", ""},
      {"zeroed", std::string(bytes.size(), '\0')},
      {"one bit flipped", flipped},
      {"a bare ELF shared object",
       "\x7f"
       "ELF" +
           std::string(4096, '\x01')}};
  for (const auto& [what, damaged] : damages) {
    SCOPED_TRACE(what);
    const std::string dir = fresh_cache("damaged");
    const fs::path planted = dir + "/host/" + good.filename().string();
    write_bytes(planted, damaged);
    fs::permissions(planted, fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::replace);
    const std::size_t before = kernels_compiled();
    EXPECT_TRUE(adds(run_plus(dir, 2), 2));
    EXPECT_EQ(kernels_compiled(), before + 1) << "a damaged entry must be compiled again";
    // ... and replaced by a good one, which a later process loads without compiling.
    const std::string later = fresh_cache("later");
    fs::copy_file(planted, later + "/host/" + good.filename().string());
    EXPECT_TRUE(adds(run_plus(later, 2), 2));
    EXPECT_EQ(kernels_compiled(), before + 1);
  }
}

TEST(KernelCache, AnEntryForAnotherKeyIsNeverLoaded) {
  // The entry kernel 4 left, put where kernel 3's entry belongs (as a planted file or a name
  // collision would): kernel 3 must not run kernel 4's code.
  const std::string three = temporary_folder("three"), four = temporary_folder("four");
  ASSERT_TRUE(adds(run_plus(three, 3), 3));
  ASSERT_TRUE(adds(run_plus(four, 4), 4));
  const std::string name_of_three = only_entry(three + "/host").filename().string();
  const std::string dir = fresh_cache("planted");
  fs::copy_file(only_entry(four + "/host"), dir + "/host/" + name_of_three);
  const std::size_t before = kernels_compiled();
  EXPECT_TRUE(adds(run_plus(dir, 3), 3));
  EXPECT_EQ(kernels_compiled(), before + 1);
}

// Regular files under `dir` (none if it does not exist).
std::size_t files_under(const std::string& dir) {
  std::size_t n = 0;
  std::error_code ignored;
  for (fs::recursive_directory_iterator it(dir, ignored), end; it != end; it.increment(ignored))
    if (!it->is_directory()) ++n;
  return n;
}

// The folder is refused, with a message naming it and what is wrong: nothing is read from it or
// written to it, and the kernel is compiled for this process alone and runs.
void expect_refused(const std::string& dir, const std::string& why) {
  {
    scoped_cache_dir cache(dir);
    try {
      (void)detail::persistent_cache_folder("host");
      ADD_FAILURE() << "the kernel cache folder " << dir << " was accepted";
    } catch (const error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("refusing the kernel cache folder"), std::string::npos) << message;
      EXPECT_NE(message.find(why), std::string::npos) << message;
    }
  }
  const std::size_t files = files_under(dir);
  EXPECT_TRUE(adds(run_plus(dir, 5), 5));
  EXPECT_EQ(files_under(dir), files) << "something was written to " << dir;
}

TEST(KernelCache, AFolderOthersCanWriteIsRefused) {
  const std::string dir = temporary_folder("mode");
  ::chmod(dir.c_str(), 0777);
  expect_refused(dir, "mode 0777");
  ::chmod(dir.c_str(), 0770);
  expect_refused(dir, "mode 0770");
  ::chmod(dir.c_str(), 0700);
  fs::create_directory(dir + "/host");
  ::chmod((dir + "/host").c_str(), 0722);
  expect_refused(dir, "mode 0722");
  ::chmod((dir + "/host").c_str(), 0755);  // readable by others is fine (as ssh allows)
  EXPECT_TRUE(adds(run_plus(dir, 5), 5));
}

TEST(KernelCache, AFolderOfAnotherUserIsRefused) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "giving a folder to another user needs root (CI runs as root)";
  const uid_t nobody = 65534;
  const std::string dir = temporary_folder("owner");
  ASSERT_EQ(::chown(dir.c_str(), nobody, nobody), 0);
  expect_refused(dir, "owned by uid 65534");
  ASSERT_EQ(::chown(dir.c_str(), 0, 0), 0);
  fs::create_directory(dir + "/host");
  ::chmod((dir + "/host").c_str(), 0700);
  ASSERT_EQ(::chown((dir + "/host").c_str(), nobody, nobody), 0);
  expect_refused(dir, "owned by uid 65534");

  // In a private folder, an entry file of another user is not loaded either: a miss.
  ASSERT_EQ(::chown((dir + "/host").c_str(), 0, 0), 0);
  const std::string good_dir = temporary_folder("owner-good");
  ASSERT_TRUE(adds(run_plus(good_dir, 6), 6));
  const fs::path good = only_entry(good_dir + "/host");
  const std::string planted = dir + "/host/" + good.filename().string();
  fs::copy_file(good, planted);
  ASSERT_EQ(::chown(planted.c_str(), nobody, nobody), 0);
  const std::size_t before = kernels_compiled();
  EXPECT_TRUE(adds(run_plus(dir, 6), 6));
  EXPECT_EQ(kernels_compiled(), before + 1);
}

TEST(KernelCache, ShellSyntaxInTheCachePathCompilesAndRunsNothing) {
  const std::string parent = temporary_folder("shell");
  const std::string dir =
      parent + "/it's $(touch PWNED1) `touch PWNED2`; touch PWNED3 \"q\" \\ $HOME\nline two";
  const fs::path cwd = fs::current_path();
  fs::current_path(parent);  // where the commands above would create their files
  std::vector<double> out;
  EXPECT_NO_THROW(out = run_plus(dir, 7));
  fs::current_path(cwd);
  EXPECT_TRUE(adds(out, 7));
  EXPECT_EQ(entries_in(dir + "/host").size(), 1u);
  for (const char* name : {"PWNED1", "PWNED2", "PWNED3"}) {
    EXPECT_FALSE(fs::exists(fs::path(parent) / name)) << name;
    EXPECT_FALSE(fs::exists(cwd / name)) << name;
  }
  // Only the cache folder itself is in the parent: nothing was created beside it.
  EXPECT_EQ(entries_in(parent).size(), 1u);
}

TEST(KernelCache, EntryParsingRefusesEveryMalformedEntry) {
  const std::string key = "the key\nwith lines";
  const std::string entry = detail::make_entry(key, "IMAGE");
  ASSERT_EQ(detail::parse_entry(entry, key), std::optional<std::string>("IMAGE"));
  EXPECT_FALSE(detail::parse_entry(entry, "the key"));
  EXPECT_FALSE(detail::parse_entry(entry, key + "x"));
  for (std::size_t cut = 0; cut < entry.size(); ++cut)
    EXPECT_FALSE(detail::parse_entry(entry.substr(0, cut), key)) << cut;
  EXPECT_FALSE(detail::parse_entry(entry + "x", key));
  for (std::size_t i = 0; i < entry.size(); ++i) {
    std::string damaged = entry;
    damaged[i] = static_cast<char>(damaged[i] ^ 1);
    EXPECT_FALSE(detail::parse_entry(damaged, key)) << i;
  }
  EXPECT_FALSE(detail::parse_entry(detail::make_entry(key, ""), key));
}

TEST(CompilerLogs, ALineNumberLongerThanAnySourceIsNotALine) {
  // Found by the fuzzer: the digits after "k.cu(" were summed into an int that overflowed.
  EXPECT_EQ(detail::body_line_of_first_error("k.cu(99999999999999999999): error: x", "k.cu(", 3),
            0);
  EXPECT_EQ(detail::body_line_of_first_error("k.cu(2147483647): error: x", "k.cu(", 3), 0);
  EXPECT_EQ(detail::body_line_of_first_error("k.cu(12): error: x", "k.cu(", 3), 10);
}

// ---- numbers ---------------------------------------------------------------------------------

executor_options cpu_executor() {
  executor_options o;
  o.backend = backend_kind::cpu;
  o.lanes_per_device = 1;
  o.quiet = true;
  return o;
}

TEST(Scalars, FollowNumPysSameKindRuleAndAreNeverConvertedOutOfRange) {
  static_assert(std::is_base_of_v<std::invalid_argument, argument_kind_error>);
  static_assert(std::is_base_of_v<std::overflow_error, argument_range_error>);
  const std::string dir = temporary_folder("scalars");
  scoped_cache_dir cache(dir);
  executor ex(cpu_executor());
  elementwise_kernel ints("int32 x, int32 a", "int32 y", "y = x * a;", "times_a");
  const std::vector<std::int32_t> x{1, 2, 3};
  std::vector<std::int32_t> out(x.size());
  auto call = [&](kernel_argument a) { ex.transform<std::int32_t>(ints, {x, a}, out).get(); };
  try {
    call(0.5);
    ADD_FAILURE() << "0.5 became an int32";
  } catch (const argument_kind_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'times_a'"), std::string::npos) << message;
    EXPECT_NE(message.find("argument 'a'"), std::string::npos) << message;
    EXPECT_NE(message.find("int32"), std::string::npos) << message;
  }
  EXPECT_THROW(call(std::nan("")), argument_kind_error);  // was undefined behaviour
  EXPECT_THROW(call(1e20), argument_kind_error);
  EXPECT_THROW(call(2.0), argument_kind_error);  // NumPy casts no float to int, whole or not
  try {
    call((1L << 40) + 5);  // became 5
    ADD_FAILURE() << "2**40 + 5 became an int32";
  } catch (const argument_range_error& e) {
    EXPECT_NE(std::string(e.what()).find("out of the range of int32"), std::string::npos);
  }
  EXPECT_THROW(call(2147483648L), argument_range_error);
  call(-2147483647L - 1);  // the smallest int32 is one
  EXPECT_EQ(out[0], std::numeric_limits<std::int32_t>::min());
  call(3);
  EXPECT_EQ(out, (std::vector<std::int32_t>{3, 6, 9}));

  elementwise_kernel floats("float32 x, float32 a", "float32 y", "y = x + a;", "plus_a");
  const std::vector<float> xf{1, 2};
  std::vector<float> outf(xf.size());
  auto callf = [&](kernel_argument a) { ex.transform<float>(floats, {xf, a}, outf).get(); };
  EXPECT_THROW(callf(1e300), argument_range_error);  // no silent infinity
  EXPECT_THROW(callf(-1e39), argument_range_error);
  callf(std::nan(""));  // NaN and infinities are float32 values
  EXPECT_TRUE(std::isnan(outf[0]));
  callf(-INFINITY);
  EXPECT_EQ(outf[1], -INFINITY);
  callf(std::numeric_limits<std::int64_t>::max());  // int to float: same_kind allows it
  EXPECT_EQ(outf[0], 9223372036854775807.0f);

  elementwise_kernel wide("int64 x, int64 a", "int64 y", "y = x + a;", "plus_wide");
  const std::vector<std::int64_t> xl{1};
  std::vector<std::int64_t> outl(1);
  EXPECT_THROW(ex.transform<std::int64_t>(wide, {xl, std::nan("")}, outl).get(),
               argument_kind_error);
  ex.transform<std::int64_t>(wide, {xl, 1LL << 40}, outl).get();
  EXPECT_EQ(outl[0], (1LL << 40) + 1);
}

TEST(BuiltInKernels, IntegerOverflowWrapsAsInNumPy) {
  executor ex(cpu_executor());
  constexpr auto max32 = std::numeric_limits<std::int32_t>::max();
  constexpr auto min32 = std::numeric_limits<std::int32_t>::min();
  const std::vector<std::int32_t> x{max32, min32, 46341, -46341, 65536};
  std::vector<std::int32_t> out(x.size());
  ex.transform<std::int32_t>(builtin_kernel::square(), x, out).get();
  // (2^31 - 1)^2 = 2^62 - 2^32 + 1 = 1 (mod 2^32); (2^31)^2 = 0; 46341^2 = 2147488281 - 2^32.
  EXPECT_EQ(out, (std::vector<std::int32_t>{1, 0, -2147479015, -2147479015, 0}));
  ex.transform<std::int32_t>(builtin_kernel::axpy(-1.0), x, x, out).get();
  EXPECT_EQ(out, (std::vector<std::int32_t>{0, 0, 0, 0, 0}));
  ex.transform<std::int32_t>(builtin_kernel::scale(-1.0), x, out).get();
  EXPECT_EQ(out[1], min32);  // -(-2^31) wraps to itself
  ex.transform<std::int32_t>(builtin_kernel::add(), x, x, out).get();
  EXPECT_EQ(out[0], -2);

  constexpr auto max64 = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::int64_t> x64{max64, 3037000500};
  std::vector<std::int64_t> out64(x64.size());
  ex.transform<std::int64_t>(builtin_kernel::square(), x64, out64).get();
  EXPECT_EQ(out64[0], 1);
  EXPECT_EQ(out64[1], static_cast<std::int64_t>(3037000500ULL * 3037000500ULL));
}

TEST(BuiltInKernels, AlphaMustFitTheArraysType) {
  executor ex(cpu_executor());
  const std::vector<std::int32_t> x{1, 2};
  std::vector<std::int32_t> out(x.size());
  EXPECT_THROW((void)ex.transform<std::int32_t>(builtin_kernel::scale(0.5), x, out),
               argument_kind_error);
  EXPECT_THROW((void)ex.transform<std::int32_t>(builtin_kernel::scale(std::nan("")), x, out),
               argument_kind_error);
  EXPECT_THROW((void)ex.transform<std::int32_t>(builtin_kernel::axpy(INFINITY), x, x, out),
               argument_kind_error);
  EXPECT_THROW((void)ex.transform<std::int32_t>(builtin_kernel::scale(1e10), x, out),
               argument_range_error);
  const std::vector<std::vector<std::int32_t>> xs{x};
  EXPECT_THROW((void)ex.map(builtin_kernel::scale(2147483648.0), xs), argument_range_error);
  const std::vector<std::int64_t> x64{1};
  std::vector<std::int64_t> out64(1);
  EXPECT_THROW(
      (void)ex.transform<std::int64_t>(builtin_kernel::scale(9223372036854775808.0), x64, out64),
      argument_range_error);
  ex.transform<std::int64_t>(builtin_kernel::scale(-9223372036854775808.0), x64, out64).get();
  EXPECT_EQ(out64[0], std::numeric_limits<std::int64_t>::min());
  const std::vector<float> xf{1};
  std::vector<float> outf(1);
  EXPECT_THROW((void)ex.transform<float>(builtin_kernel::scale(1e300), xf, outf),
               argument_range_error);
  ex.transform<std::int32_t>(builtin_kernel::scale(3.0), x, out).get();
  EXPECT_EQ(out, (std::vector<std::int32_t>{3, 6}));
}

// ---- sizes -----------------------------------------------------------------------------------

TEST(Sizes, HugePinnedRequestsThrowInsteadOfWrapping) {
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  for (const std::size_t bytes : {max - 7, max, max / 2 + 1, max - 4095})
    EXPECT_THROW((void)allocate_pinned(bytes), std::length_error) << bytes;
  EXPECT_THROW((void)pinned_allocator<double>().allocate(max / 4), std::length_error);
  void* p = allocate_pinned(100);
  EXPECT_NE(p, nullptr);
  deallocate_pinned(p, 100);
}

TEST(Sizes, DeviceArraysWhoseByteCountWrapsAreRefused) {
  executor ex(cpu_executor());
  auto f = ex.submit([](lane& l) { (void)l.allocate<double>(SIZE_MAX / 4); });
  EXPECT_THROW(f.get(), std::length_error);
}

}  // namespace
}  // namespace gpupool
