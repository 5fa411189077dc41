#include "cpu/host_compiler.hpp"

#include <dlfcn.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <string>

#include "core/compile_once.hpp"
#include "core/kernel_cache.hpp"
#include "core/kernel_source.hpp"

namespace gpupool::detail {
namespace {

constexpr const char* host_flags = "-O2 -std=c++17 -shared -fPIC -w";

int run(const std::string& command, std::string& output);

// GPUPOOL_CXX, else CXX, else the first of c++, g++, clang++ that runs.
std::string compiler() {
  for (const char* name : {"GPUPOOL_CXX", "CXX"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return v;
  static const std::string found = [] {
    for (const char* candidate : {"c++", "g++", "clang++"}) {
      std::string ignored;
      if (run(std::string(candidate) + " --version", ignored) == 0) return std::string(candidate);
    }
    return std::string("c++");
  }();
  return found;
}

// Runs `command`, returns its exit status and what it printed (stdout and stderr).
int run(const std::string& command, std::string& output) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw error("gpupool: cannot run '" + command + "'");
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The first line of `compiler --version`: part of the cache key, so a new compiler recompiles.
const std::string& compiler_identity(const std::string& cxx) {
  static std::mutex m;
  static std::map<std::string, std::string> known;
  std::lock_guard lock(m);
  auto it = known.find(cxx);
  if (it != known.end()) return it->second;
  std::string out;
  if (run(cxx + " --version", out) != 0)
    throw error("gpupool: the host C++ compiler '" + cxx + "' does not run (" + out +
                "); set GPUPOOL_CXX to one that does");
  return known[cxx] = out.substr(0, out.find('\n'));
}

std::string machine() {
  utsname u{};
  return ::uname(&u) == 0 ? u.machine : "unknown";
}

std::shared_ptr<const host_kernel> load(const std::string& library_path) {
  void* library = ::dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return nullptr;
  auto entry = reinterpret_cast<host_kernel::entry_point>(::dlsym(library, kernel_entry_point));
  if (entry == nullptr) {
    ::dlclose(library);
    return nullptr;
  }
  return std::make_shared<const host_kernel>(library, entry);
}

std::shared_ptr<const host_kernel> build(const elementwise_kernel& k, const std::string& source,
                                         const std::string& cxx, const std::string& directory,
                                         const std::string& key) {
  const std::string library = directory + "/" + key + ".so";
  if (auto cached = load(library)) return cached;  // another process compiled it already

  const std::string unique = directory + "/" + key + "." + unique_suffix();
  const std::string source_path = unique + ".cpp";
  const std::string temporary = unique + ".so";
  {
    std::ofstream out(source_path);
    if (!(out << source)) throw error("gpupool: cannot write " + source_path);
  }
  std::string log;
  const int status =
      run(cxx + " " + host_flags + " -o '" + temporary + "' '" + source_path + "'", log);
  if (status != 0) {
    const int line = body_line_of_first_error(log, source_path + ":", host_body_first_line(k));
    std::remove(source_path.c_str());
    std::remove(temporary.c_str());
    throw compile_error("gpupool: kernel '" + k.name() + "' does not compile" +
                            (line > 0 ? " (body line " + std::to_string(line) + ")" : "") + ":\n" +
                            log,
                        log, line);
  }
  std::remove(source_path.c_str());
  publish(temporary, library);  // a concurrent process sees the whole library or none
  count_compilation();
  auto loaded = load(library);
  if (!loaded) throw error("gpupool: cannot load " + library + ": " + ::dlerror());
  return loaded;
}

}  // namespace

host_kernel::~host_kernel() {
  ::dlclose(library_);
}

std::shared_ptr<const host_kernel> compile_for_host(const elementwise_kernel& k,
                                                    const std::vector<bool>& is_array) {
  const std::string source = host_source(k, is_array);
  const std::string cxx = compiler();
  const std::string key = hex(
      stable_hash(source + '\n' + host_flags + '\n' + compiler_identity(cxx) + '\n' + machine()));
  const std::string directory = cache_folder("host");

  static compile_once<std::shared_ptr<const host_kernel>> compiled;
  return compiled.get(directory + "/" + key, [&] { return build(k, source, cxx, directory, key); });
}

}  // namespace gpupool::detail
