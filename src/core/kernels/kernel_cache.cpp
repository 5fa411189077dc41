// Where compiled kernels live between processes, and the checks that keep what another account,
// a crash or a full disk left there from being run.
#include "core/kernels/kernel_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#if GPUPOOL_HAS_LIBCRYPTO
#include <openssl/evp.h>
#endif

#include "core/environment.hpp"
#include "gpupool/elementwise.hpp"
#include "gpupool/error.hpp"
#include "gpupool/fork.hpp"

namespace gpupool {

std::string kernel_cache_directory() {
  if (const char* dir = std::getenv("GPUPOOL_CACHE_DIR"); dir != nullptr && *dir != '\0')
    return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return std::string(xdg) + "/gpupool";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::string(home) + "/.cache/gpupool";
  // One folder per user: another user's folder of the same name would be refused.
  return "/tmp/gpupool-cache-" + std::to_string(::geteuid());
}

namespace {
std::atomic<std::size_t> compilations{0};
}  // namespace

std::size_t kernels_compiled() noexcept {
  return compilations.load();
}

namespace detail {
namespace {

// Far above any kernel image (host shared objects and CUBINs are kilobytes to a few megabytes);
// a larger file is not read at all.
constexpr std::size_t largest_entry = std::size_t{256} << 20;

constexpr std::string_view entry_magic = "gpupool-kernel-cache 1\n";

std::string system_message(int code) {
  return std::strerror(code);
}

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// Creates every missing folder of `path` with mode 0700 (existing ones are left as they are).
void make_folders(const std::string& path) {
  for (std::size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
    ::mkdir(path.substr(0, at).c_str(), 0700);
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    throw error("gpupool: cannot create the kernel cache folder " + path + ": " +
                system_message(errno));
}

// A private folder this user owns may still refuse writes (mode 0500, a read-only mount): then
// nothing could be stored, and compiling would fail at the first entry written.
void require_writable_folder(const std::string& path) {
  if (::access(path.c_str(), W_OK | X_OK) != 0)
    throw error("gpupool: cannot write to the kernel cache folder " + path + ": " +
                system_message(errno));
}

// GPUPOOL_QUIET as everywhere else, but never thrown from here (the warning is given from inside
// a compile, where the variable's error would replace the kernel's result): a bad value counts
// as not quiet, since making the executor that compiles already refused it.
bool quiet_for_warning() noexcept {
  try {
    return quiet_from_environment();
  } catch (const std::exception&) {
    return false;
  }
}

std::atomic<bool> cache_warning_given{false};

// The process's own folder for compilers that need files when the cache cannot be used. Never
// destroyed: it is read by the exit handler, after static destructors may have run. A fork()ed
// child starts with a fresh one (fork() may have copied the mutex locked by a thread that is not
// in the child), so it makes a folder of its own and never removes its parent's.
struct scratch_state {
  std::mutex mutex;
  pid_t owner = 0;  // the process that made `path`
  std::string path;
};
constinit fork_fresh<scratch_state> scratch;

// Whether remove_scratch_folder is registered to run at exit. Not part of scratch_state: a
// fork()ed child inherits the registration, and a second one would only run the same removal.
std::atomic<bool> removal_registered{false};

// Runs at exit in the process that registered it and in its fork()ed children, which inherit
// the handler: each removes only a folder it made itself.
void remove_scratch_folder() noexcept {
  scratch_state& s = scratch.get();  // made before this was registered: does not throw
  if (s.path.empty() || s.owner != ::getpid()) return;
  std::error_code ignored;
  std::filesystem::remove_all(s.path, ignored);
}

// Whether a private folder made in `parent` stays private: no one else can swap it for one of
// their own. That holds where only this user or root can write to the parent, or where the
// parent is sticky (as /tmp is), so that others cannot rename or remove what they do not own.
bool safe_parent(const std::string& parent) {
  struct stat st {};
  if (parent.empty() || parent.front() != '/' || ::stat(parent.c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode))
    return false;
  if (st.st_uid != ::geteuid() && st.st_uid != 0) return false;
  return (st.st_mode & (S_IWGRP | S_IWOTH)) == 0 || (st.st_mode & S_ISVTX) != 0;
}

// The process's scratch folder (mode 0700), made at the first call in $TMPDIR, else /tmp.
std::string scratch_folder() {
  scratch_state& s = scratch.get();
  std::lock_guard lock(s.mutex);
  if (s.owner == ::getpid() && !s.path.empty()) {
    try {
      require_private_folder(s.path);
      return s.path;
    } catch (const error&) {
      // Removed or changed under this process: make another.
    }
  }
  std::string why = "no safe temporary folder";
  std::vector<std::string> parents;
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp == '/')
    parents.push_back(tmp);
  parents.push_back("/tmp");
  for (const std::string& parent : parents) {
    if (!safe_parent(parent)) continue;
    std::string pattern = parent + "/gpupool-kernels-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      why = "cannot make a folder in " + parent + ": " + system_message(errno);
      continue;
    }
    s.owner = ::getpid();
    s.path = std::move(pattern);
    if (!removal_registered.exchange(true) && std::atexit(remove_scratch_folder) != 0)
      removal_registered.store(false);
    return s.path;
  }
  throw error("gpupool: no folder to compile kernels in (the kernel cache cannot be used, and " +
              why + ")");
}

#if !GPUPOOL_HAS_LIBCRYPTO
std::uint64_t fnv1a64(std::string_view text) noexcept {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}
#endif

std::string to_hex(const unsigned char* bytes, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 0xf];
  }
  return out;
}

// Reads a decimal length ending in '\n' at `at`, advancing past it.
bool read_length(std::string_view bytes, std::size_t& at, std::size_t& value) {
  const std::size_t end = bytes.find('\n', at);
  if (end == std::string_view::npos || end == at || end - at > 20) return false;
  const char* first = bytes.data() + at;
  const char* last = bytes.data() + end;
  const auto [stop, ec] = std::from_chars(first, last, value);
  if (ec != std::errc() || stop != last) return false;
  at = end + 1;
  return true;
}

}  // namespace

void count_compilation() noexcept {
  ++compilations;
}

const char* checksum_name() noexcept {
#if GPUPOOL_HAS_LIBCRYPTO
  return "sha256";
#else
  return "fnv1a64";
#endif
}

std::string checksum_hex(std::string_view bytes) {
#if GPUPOOL_HAS_LIBCRYPTO
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr) != 1)
    throw error("gpupool: SHA-256 (OpenSSL) failed");
  return to_hex(digest, size);
#else
  const std::uint64_t h = fnv1a64(bytes);
  unsigned char digest[8];
  for (int i = 0; i < 8; ++i) digest[i] = static_cast<unsigned char>(h >> (56 - 8 * i));
  return to_hex(digest, sizeof digest);
#endif
}

void require_private_folder(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw error("gpupool: cannot use the kernel cache folder " + path + ": " +
                system_message(errno));
  if (!S_ISDIR(st.st_mode))
    throw error("gpupool: the kernel cache folder " + path + " is not a directory");
  if (st.st_uid != ::geteuid())
    throw error("gpupool: refusing the kernel cache folder " + path + ": it is owned by uid " +
                std::to_string(st.st_uid) + ", not by this user (uid " +
                std::to_string(::geteuid()) +
                "), who would run what it holds; set GPUPOOL_CACHE_DIR to a folder of your own");
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    throw error("gpupool: refusing the kernel cache folder " + path + ": its mode " +
                octal_mode(st.st_mode) +
                " lets group or others write to it, so others could plant code this process "
                "would run; make it private (chmod 700) or set GPUPOOL_CACHE_DIR");
}

std::string persistent_cache_folder(const std::string& kind) {
  const std::string root = kernel_cache_directory();
  const std::string path = root + "/" + kind;
  // The root is checked before anything is made inside it.
  make_folders(root);
  require_private_folder(root);
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    throw error("gpupool: cannot create the kernel cache folder " + path + ": " +
                system_message(errno));
  require_private_folder(path);
  require_writable_folder(path);
  return path;
}

void warn_cache_unusable_once(const std::string& why) noexcept {
  if (cache_warning_given.exchange(true)) return;
  if (quiet_for_warning()) return;
  constexpr std::string_view prefix = "gpupool: ";
  const std::string_view reason =
      std::string_view(why).substr(why.rfind(prefix, 0) == 0 ? prefix.size() : 0);
  std::fprintf(stderr,
               "gpupool: not using the kernel cache: %.*s. Kernels are compiled for this process "
               "only (GPUPOOL_QUIET=1 silences this notice)\n",
               static_cast<int>(reason.size()), reason.data());
}

bool cache_unusable_warned() noexcept {
  return cache_warning_given.load();
}

std::optional<std::string> kernel_cache_folder(const std::string& kind) {
  try {
    return persistent_cache_folder(kind);
  } catch (const std::exception& e) {
    warn_cache_unusable_once(e.what());
    return std::nullopt;
  }
}

std::string cache_folder(const std::string& kind, if_cache_unusable fallback) {
  if (fallback == if_cache_unusable::fail) return persistent_cache_folder(kind);
  if (auto folder = kernel_cache_folder(kind)) return *folder;
  const std::string path = scratch_folder() + "/" + kind;
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    throw error("gpupool: cannot create the folder " + path + ": " + system_message(errno));
  require_private_folder(path);
  return path;
}

std::string entry_file_name(std::string_view key, std::string_view extension) {
  return checksum_hex(key) + std::string(extension);
}

std::string make_entry(std::string_view key, std::string_view image) {
  std::string out(entry_magic);
  out += checksum_name();
  out += ' ';
  out += checksum_hex(image);
  out += '\n';
  out += std::to_string(key.size());
  out += '\n';
  out += key;
  out += '\n';
  out += std::to_string(image.size());
  out += '\n';
  out += image;
  return out;
}

std::optional<std::string> parse_entry(std::string_view bytes, std::string_view key) {
  if (bytes.substr(0, entry_magic.size()) != entry_magic) return std::nullopt;
  std::size_t at = entry_magic.size();
  const std::string algorithm = std::string(checksum_name()) + ' ';
  if (bytes.substr(at, algorithm.size()) != algorithm) return std::nullopt;
  at += algorithm.size();
  const std::size_t checksum_end = bytes.find('\n', at);
  if (checksum_end == std::string_view::npos) return std::nullopt;
  const std::string_view checksum = bytes.substr(at, checksum_end - at);
  at = checksum_end + 1;
  std::size_t key_size = 0;
  if (!read_length(bytes, at, key_size) || key_size != key.size()) return std::nullopt;
  if (bytes.size() - at < key_size + 1 || bytes.substr(at, key_size) != key ||
      bytes[at + key_size] != '\n')
    return std::nullopt;
  at += key_size + 1;
  std::size_t image_size = 0;
  if (!read_length(bytes, at, image_size) || bytes.size() - at != image_size || image_size == 0)
    return std::nullopt;
  const std::string_view image = bytes.substr(at);
  if (checksum != checksum_hex(image)) return std::nullopt;
  return std::string(image);
}

std::optional<std::string> load_entry(const std::string& path, std::string_view key) {
  // O_NONBLOCK: a FIFO planted under the name must not block the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 || st.st_size <= 0 ||
      static_cast<std::size_t>(st.st_size) > largest_entry)
    return std::nullopt;
  // Read into memory (never mapped: a file truncated under a mapping raises SIGBUS); what is
  // checked here is what the caller uses.
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;  // shrank while read: damaged or being replaced
    got += static_cast<std::size_t>(n);
  }
  return parse_entry(bytes, key);
}

void store_entry(const std::string& path, std::string_view key, std::string_view image) {
  const std::string bytes = make_entry(key, image);
  const std::string temporary = path + "." + unique_suffix() + ".tmp";
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    throw error("gpupool: cannot write the kernel cache entry " + temporary + ": " +
                system_message(errno));
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int code = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      throw error("gpupool: cannot write the kernel cache entry " + temporary + ": " +
                  system_message(code));
    }
    written += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(temporary.c_str(), path.c_str()) != 0) {
    const int code = errno;
    ::unlink(temporary.c_str());
    throw error("gpupool: cannot store the kernel cache entry " + path + ": " +
                system_message(code));
  }
}

std::string unique_suffix() {
  static std::atomic<unsigned long long> counter{0};
  std::ostringstream s;
  s << ::getpid() << "." << std::this_thread::get_id() << "." << counter++;
  return s.str();
}

}  // namespace detail
}  // namespace gpupool
