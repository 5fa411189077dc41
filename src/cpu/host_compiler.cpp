#include "cpu/host_compiler.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/kernels/compile_once.hpp"
#include "core/kernels/kernel_cache.hpp"
#include "core/kernels/kernel_source.hpp"
#include "cpu/host_source.hpp"
#include "gpupool/fork.hpp"

extern char** environ;

namespace gpupool::detail {
namespace {

const std::vector<std::string> host_flags{"-O2", "-std=c++17", "-shared", "-fPIC", "-w"};

// Closes a file descriptor when it goes out of scope.
struct fd_closer {
  int fd = -1;
  ~fd_closer() {
    if (fd >= 0) ::close(fd);
  }
};

// Runs `argv` (argv[0] looked up on PATH) with no shell in between, stdin from /dev/null, and
// returns its exit status (-1 if it did not exit normally) with what it printed on stdout and
// stderr. @throw gpupool::error if it cannot be started.
int run(const std::vector<std::string>& argv, std::string& output) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
    throw error(std::string("gpupool: cannot make a pipe: ") + std::strerror(errno));
  fd_closer read_end{pipe_fds[0]};
  fd_closer write_end{pipe_fds[1]};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  struct actions_guard {
    posix_spawn_file_actions_t* a;
    ~actions_guard() { posix_spawn_file_actions_destroy(a); }
  } guard{&actions};
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.fd, 1);
  posix_spawn_file_actions_adddup2(&actions, write_end.fd, 2);

  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t child = 0;
  const int failed = ::posix_spawnp(&child, args[0], &actions, nullptr, args.data(), environ);
  if (failed != 0) throw error("gpupool: cannot run '" + argv[0] + "': " + std::strerror(failed));
  ::close(write_end.fd);
  write_end.fd = -1;

  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(read_end.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buf, static_cast<std::size_t>(n));
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// What the host compiler keeps for the whole process. Made at the first use, never destroyed
// (kernels may be compiled during exit); a forked child starts with a fresh one, since fork() may
// have copied a mutex locked, or a compilation left in flight, by a thread that is not in the
// child, which would then wait for ever.
struct host_compiler_state {
  host_compiler_state() noexcept {}  // compile_once allocates nothing until it is used

  std::mutex found_mutex;
  std::optional<std::string> found;  // the first of c++, g++, clang++ that runs
  std::mutex identities_mutex;
  std::map<std::vector<std::string>, std::string> identities;  // by compiler command
  compile_once<std::shared_ptr<const host_kernel>> compiled;
};
constinit fork_fresh<host_compiler_state> state;

// GPUPOOL_CXX, else CXX, else the first of c++, g++, clang++ that runs. A variable's value is
// split at spaces into the program and its first arguments ("ccache g++"); no shell reads it.
std::vector<std::string> compiler() {
  for (const char* name : {"GPUPOOL_CXX", "CXX"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      std::vector<std::string> words;
      std::istringstream in(v);
      for (std::string w; in >> w;) words.push_back(w);
      if (!words.empty()) return words;
    }
  }
  host_compiler_state& s = state.get();
  std::lock_guard lock(s.found_mutex);
  if (!s.found) {
    s.found = "c++";
    for (const char* candidate : {"c++", "g++", "clang++"}) {
      std::string ignored;
      try {
        if (run({candidate, "--version"}, ignored) == 0) {
          s.found = candidate;
          break;
        }
      } catch (const error&) {
        // not installed: try the next
      }
    }
  }
  return {*s.found};
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

// The first line of `compiler --version`: part of the cache key, so a new compiler recompiles.
const std::string& compiler_identity(const std::vector<std::string>& cxx) {
  host_compiler_state& s = state.get();
  std::lock_guard lock(s.identities_mutex);
  auto it = s.identities.find(cxx);
  if (it != s.identities.end()) return it->second;
  std::string out;
  std::vector<std::string> argv = cxx;
  argv.push_back("--version");
  int status = -1;
  try {
    status = run(argv, out);
  } catch (const error& e) {
    out = e.what();
  }
  if (status != 0)
    throw error("gpupool: the host C++ compiler '" + joined(cxx) + "' does not run (" + out +
                "); set GPUPOOL_CXX to one that does");
  return s.identities[cxx] = out.substr(0, out.find('\n'));
}

std::string machine() {
  utsname u{};
  return ::uname(&u) == 0 ? u.machine : "unknown";
}

// Loads a shared object from bytes already checked, never from a path another process could
// change between the check and the load: the bytes go into an anonymous memory file, which
// dlopen reads through /proc/self/fd. Returns nullptr (with `why`) if it does not load.
std::shared_ptr<const host_kernel> load_image(const std::string& image, std::string& why) {
  int fd = static_cast<int>(::memfd_create("gpupool-kernel", MFD_CLOEXEC));
  if (fd < 0) {
    why = std::string("memfd_create: ") + std::strerror(errno);
    return nullptr;
  }
  fd_closer guard{fd};
  for (std::size_t written = 0; written < image.size();) {
    const ssize_t n = ::write(fd, image.data() + written, image.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      why = std::string("cannot write the kernel to memory: ") + std::strerror(errno);
      return nullptr;
    }
    written += static_cast<std::size_t>(n);
  }
  // dlopen finds libraries already loaded by name: a library that stayed loaded after its
  // descriptor was closed would answer for this number. Move to a number no library holds.
  std::string name = "/proc/self/fd/" + std::to_string(guard.fd);
  while (void* existing = ::dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    ::dlclose(existing);
    const int other = ::fcntl(guard.fd, F_DUPFD_CLOEXEC, guard.fd + 1);
    if (other < 0) {
      why = std::string("cannot duplicate a descriptor: ") + std::strerror(errno);
      return nullptr;
    }
    ::close(guard.fd);
    guard.fd = other;
    name = "/proc/self/fd/" + std::to_string(guard.fd);
  }
  void* library = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* message = ::dlerror();
    why = message != nullptr ? message : "dlopen failed";
    return nullptr;
  }
  auto entry = reinterpret_cast<host_kernel::entry_point>(::dlsym(library, kernel_entry_point));
  if (entry == nullptr) {
    ::dlclose(library);
    why = std::string("no ") + kernel_entry_point + " in the library";
    return nullptr;
  }
  auto kernel = std::make_shared<const host_kernel>(library, entry, guard.fd);
  guard.fd = -1;  // the kernel keeps its descriptor, so no other library reuses the name
  return kernel;
}

// Reads a whole file; nullopt if it cannot be read.
std::optional<std::string> read_whole(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  fd_closer guard{fd};
  std::string bytes;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    bytes.append(buf, static_cast<std::size_t>(n));
  }
  return bytes;
}

std::shared_ptr<const host_kernel> build(const elementwise_kernel& k, const std::string& source,
                                         const std::vector<std::string>& cxx,
                                         const std::string& directory, const std::string& key) {
  const std::string entry_path = directory + "/" + entry_file_name(key, ".so.entry");
  std::string why;
  if (auto image = load_entry(entry_path, key)) {  // another process compiled it already
    if (auto cached = load_image(*image, why)) return cached;
    // A checked entry that does not load (e.g. another libc): compile it again below.
  }

  const std::string unique = directory + "/build." + unique_suffix();
  const std::string source_path = unique + ".cpp";
  const std::string library_path = unique + ".so";
  struct remover {
    const std::string& a;
    const std::string& b;
    ~remover() {
      ::unlink(a.c_str());
      ::unlink(b.c_str());
    }
  } cleanup{source_path, library_path};
  {
    const int fd =
        ::open(source_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) throw error("gpupool: cannot write " + source_path + ": " + std::strerror(errno));
    fd_closer guard{fd};
    if (::write(fd, source.data(), source.size()) != static_cast<ssize_t>(source.size()))
      throw error("gpupool: cannot write " + source_path);
  }
  std::vector<std::string> argv = cxx;
  argv.insert(argv.end(), host_flags.begin(), host_flags.end());
  argv.insert(argv.end(), {"-o", library_path, source_path});
  std::string log;
  if (run(argv, log) != 0) {
    const int line = body_line_of_first_error(log, source_path + ":", host_body_first_line(k));
    throw compile_error("gpupool: kernel '" + k.name() + "' does not compile" +
                            (line > 0 ? " (body line " + std::to_string(line) + ")" : "") + ":\n" +
                            log,
                        log, line);
  }
  const auto image = read_whole(library_path);
  if (!image || image->empty())
    throw error("gpupool: the compiler wrote no library at " + library_path);
  count_compilation();
  // Published whole or not at all (a concurrent process sees the old entry or this one); a
  // damaged or planted entry is replaced.
  store_entry(entry_path, key, *image);
  auto loaded = load_image(*image, why);
  if (!loaded) throw error("gpupool: cannot load the compiled kernel '" + k.name() + "': " + why);
  return loaded;
}

}  // namespace

host_kernel::~host_kernel() {
  ::dlclose(library_);
  if (descriptor_ >= 0) ::close(descriptor_);
}

std::shared_ptr<const host_kernel> compile_for_host(const elementwise_kernel& k,
                                                    const std::vector<bool>& is_array) {
  const std::string source = host_source(k, is_array);
  const auto cxx = compiler();
  std::string key = source + '\n';
  for (const auto& f : host_flags) key += f + ' ';
  key += '\n' + compiler_identity(cxx) + '\n' + machine();
  // A compiler needs files to write even where the cache cannot be used.
  const std::string directory = cache_folder("host", if_cache_unusable::use_scratch);
  return state.get().compiled.get(directory + "/" + key,
                                  [&] { return build(k, source, cxx, directory, key); });
}

}  // namespace gpupool::detail
