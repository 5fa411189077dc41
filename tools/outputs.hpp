// Output files of the command-line tool: their type follows the extension (or the request is
// refused before any work starts), and a file that cannot be written is an error naming it.
#pragma once

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

namespace gpupool_cli {

/// The extension of `path` in lower case, with its dot ("" when there is none).
inline std::string extension_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string ext = path.substr(dot);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

/// Writes a file through `fill`, or throws naming the path and the reason.
inline void write_file(const std::string& path, const std::function<void(std::ostream&)>& fill) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
  fill(out);
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
}

/// Fails early (before a long run) when `path` cannot be created or replaced: opens it for
/// appending, which leaves an existing file as it was, and removes what the probe created.
inline void check_writable(const std::string& path) {
  if (path.empty()) return;
  std::error_code ignored;
  const bool existed = std::filesystem::exists(path, ignored);
  {
    std::ofstream probe(path, std::ios::app);
    if (!probe) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
  }
  if (!existed) std::filesystem::remove(path, ignored);
}

}  // namespace gpupool_cli
