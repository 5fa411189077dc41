// The on-disk cache of compiled kernels. Nothing in it is trusted: the folder must belong to this
// user and be writable by no one else, and every entry carries its full key and a checksum of
// its image, both checked before the image is used. An entry that fails a check is a miss: the
// kernel is compiled again and the entry replaced.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace gpupool::detail {

/// kernel_cache_directory()/`kind`, created (mode 0700) if missing.
/// @throw gpupool::error if it cannot be created, or if it or the cache directory is not a
///        folder owned by this process's user and closed to writes by group and others.
std::string cache_folder(const std::string& kind);

/// Refuses (gpupool::error, naming the folder and what is wrong) a folder that is not a
/// directory, is owned by another user, or is writable by group or others.
void require_private_folder(const std::string& path);

/// The checksum entries carry: "sha256" (OpenSSL's libcrypto) or, where gpupool was built
/// without it, "fnv1a64" (detects damage, not deliberate forgery).
const char* checksum_name() noexcept;
/// The checksum of `bytes` in hex.
std::string checksum_hex(std::string_view bytes);

/// The file name of the entry for `key` (a checksum of the key, then `extension`): distinct keys
/// may share a name only by a checksum collision, and loading compares the full key anyway.
std::string entry_file_name(std::string_view key, std::string_view extension);

/// An entry's bytes: a header naming the format, the checksum of `image`, then `key` and `image`
/// with their lengths.
std::string make_entry(std::string_view key, std::string_view image);

/// The image of an entry's bytes if they are a whole, well-formed entry for exactly `key` whose
/// checksum matches; nullopt for anything else (never throws for bad bytes).
std::optional<std::string> parse_entry(std::string_view bytes, std::string_view key);

/// Reads and checks the entry at `path` (a regular file of this user, not too large), returning
/// its image; nullopt if it is missing or fails any check.
std::optional<std::string> load_entry(const std::string& path, std::string_view key);

/// Writes the entry for `key` to `path` atomically: a new file (mode 0600) in the same folder,
/// renamed over `path`, so readers see the old entry or the whole new one. @throw gpupool::error.
void store_entry(const std::string& path, std::string_view key, std::string_view image);

/// A name no other thread or process will pick: "<pid>.<thread>.<counter>".
std::string unique_suffix();

/// Counts one kernel compiled (not loaded from a cache), for kernels_compiled().
void count_compilation() noexcept;

}  // namespace gpupool::detail
