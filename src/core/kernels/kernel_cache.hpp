// The on-disk cache of compiled kernels. Nothing in it is trusted: the folder must belong to this
// user and be writable by no one else, and every entry carries its full key and a checksum of
// its image, both checked before the image is used. An entry that fails a check is a miss: the
// kernel is compiled again and the entry replaced.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace gpupool::detail {

/// kernel_cache_directory()/`kind`, created (mode 0700) if missing, checked as the cache's rules
/// say: it and the cache directory must be folders owned by this process's user, closed to
/// writes by group and others, and writable by this user.
/// @throw gpupool::error naming the folder and what is wrong.
std::string persistent_cache_folder(const std::string& kind);

/// The folder of compiled kernels of `kind` ("host", "cuda") kept between processes:
/// persistent_cache_folder(kind) where it can be used; nullopt where it cannot, after one warning
/// on stderr per process (none when GPUPOOL_QUIET is 1). A kernel is never refused for want of a
/// cache: without one it is compiled for this process only. Nothing is ever read from or written
/// to a folder that fails the checks.
std::optional<std::string> kernel_cache_folder(const std::string& kind);

/// What cache_folder gives where the persistent folder cannot be used: the caller says, since
/// only it knows whether it can do without one.
enum class if_cache_unusable {
  /// A folder of this process's own: for a compiler that needs files to write (a kernel is never
  /// refused for want of a cache).
  use_scratch,
  /// None: persistent_cache_folder's error is thrown, for the caller to report (tuning results,
  /// which are worth keeping only between processes).
  fail,
};

/// The folder `kind`'s entries go to: persistent_cache_folder(kind) where it can be used. Where
/// it cannot, with use_scratch: after kernel_cache_folder's warning, `kind` inside a private
/// folder of this process (mode 0700, made in $TMPDIR or /tmp and removed when the process exits;
/// a fork()ed child makes its own), where a compiler that needs files writes them; with fail:
/// persistent_cache_folder's error, and no warning.
/// @throw gpupool::error where no folder can be had.
std::string cache_folder(const std::string& kind, if_cache_unusable fallback);

/// Prints, once per process, why the kernel cache is not used (`why`); later calls print nothing.
/// Silent when GPUPOOL_QUIET is 1.
void warn_cache_unusable_once(const std::string& why) noexcept;

/// Whether warn_cache_unusable_once has printed (or, quiet, would have printed) its warning in
/// this process.
bool cache_unusable_warned() noexcept;

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
