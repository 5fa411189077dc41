// Where compiled kernels live between processes.
#include <cstdlib>
#include <string>

#include "gpupool/elementwise.hpp"

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

}  // namespace gpupool
