// The on-disk cache of compiled kernels: folders, and files published whole or not at all.
#pragma once

#include <string>

namespace gpupool::detail {

/// kernel_cache_directory()/`kind`, created if missing. @throw gpupool::error if it cannot be.
std::string cache_folder(const std::string& kind);

/// A name no other thread or process will pick: "<pid>.<thread>".
std::string unique_suffix();

/// Moves a finished file into place atomically (rename), so readers never see half a file.
/// @throw gpupool::error.
void publish(const std::string& finished, const std::string& destination);

/// Reads a whole file; false if it is not there.
bool read_file(const std::string& path, std::string& bytes);

/// Writes `bytes` to `destination` through a temporary file and `publish`.
void publish_bytes(const std::string& bytes, const std::string& destination);

/// Counts one kernel compiled (not loaded from a cache), for kernels_compiled().
void count_compilation() noexcept;

}  // namespace gpupool::detail
