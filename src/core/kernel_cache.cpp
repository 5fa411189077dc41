// Where compiled kernels live between processes.
#include "core/kernel_cache.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>

#include "gpupool/elementwise.hpp"
#include "gpupool/error.hpp"

namespace gpupool {

std::string kernel_cache_directory() {
  if (const char* dir = std::getenv("GPUPOOL_CACHE_DIR"); dir != nullptr && *dir != '\0')
    return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return std::string(xdg) + "/gpupool";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::string(home) + "/.cache/gpupool";
  return "/tmp/gpupool-cache";
}

namespace {
std::atomic<std::size_t> compilations{0};
}  // namespace

std::size_t kernels_compiled() noexcept {
  return compilations.load();
}

namespace detail {

void count_compilation() noexcept {
  ++compilations;
}

std::string cache_folder(const std::string& kind) {
  const std::string path = kernel_cache_directory() + "/" + kind;
  for (std::size_t at = 1; at != std::string::npos; at = path.find('/', at + 1))
    ::mkdir(path.substr(0, at).c_str(), 0755);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    throw error("gpupool: cannot create the kernel cache folder " + path);
  return path;
}

std::string unique_suffix() {
  std::ostringstream s;
  s << ::getpid() << "." << std::this_thread::get_id();
  return s.str();
}

void publish(const std::string& finished, const std::string& destination) {
  if (std::rename(finished.c_str(), destination.c_str()) != 0) {
    std::remove(finished.c_str());
    throw error("gpupool: cannot store the compiled kernel as " + destination);
  }
}

bool read_file(const std::string& path, std::string& bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !bytes.empty();
}

void publish_bytes(const std::string& bytes, const std::string& destination) {
  const std::string temporary = destination + "." + unique_suffix() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary);
    if (!out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())))
      throw error("gpupool: cannot write " + temporary);
  }
  publish(temporary, destination);
}

}  // namespace detail
}  // namespace gpupool
