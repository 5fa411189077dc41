#include "cuda/nvrtc_compiler.hpp"

#include <dlfcn.h>
#include <nvrtc.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/kernels/compile_once.hpp"
#include "core/kernels/kernel_cache.hpp"
#include "core/kernels/kernel_source.hpp"
#include "cuda/cuda_source.hpp"
#include "gpupool/error.hpp"

namespace gpupool::detail::cuda {
namespace {

// The NVRTC entry points gpupool uses, resolved from the shared library at run time.
struct nvrtc_api {
  decltype(&::nvrtcVersion) version = nullptr;
  decltype(&::nvrtcCreateProgram) create = nullptr;
  decltype(&::nvrtcCompileProgram) compile = nullptr;
  decltype(&::nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) log = nullptr;
  decltype(&::nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) cubin = nullptr;
  decltype(&::nvrtcDestroyProgram) destroy = nullptr;
  decltype(&::nvrtcGetErrorString) error_string = nullptr;
  decltype(&::nvrtcAddNameExpression) add_name = nullptr;
  decltype(&::nvrtcGetLoweredName) lowered_name = nullptr;
  std::string identity;  // "nvrtc 13.0", part of the cache key
  std::string failure;   // why it could not be loaded
};

const nvrtc_api& api() {
  static const nvrtc_api loaded = [] {
    nvrtc_api a;
    void* library = nullptr;
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so", GPUPOOL_NVRTC_FALLBACK}) {
      if (*name != '\0' && (library = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (library == nullptr) {
      a.failure = "NVRTC (libnvrtc.so) cannot be loaded: install the CUDA toolkit's NVRTC";
      return a;
    }
    auto resolve = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(library, symbol));
      if (fn == nullptr && a.failure.empty()) a.failure = std::string("NVRTC lacks ") + symbol;
    };
    resolve(a.version, "nvrtcVersion");
    resolve(a.create, "nvrtcCreateProgram");
    resolve(a.compile, "nvrtcCompileProgram");
    resolve(a.log_size, "nvrtcGetProgramLogSize");
    resolve(a.log, "nvrtcGetProgramLog");
    resolve(a.cubin_size, "nvrtcGetCUBINSize");
    resolve(a.cubin, "nvrtcGetCUBIN");
    resolve(a.destroy, "nvrtcDestroyProgram");
    resolve(a.error_string, "nvrtcGetErrorString");
    resolve(a.add_name, "nvrtcAddNameExpression");
    resolve(a.lowered_name, "nvrtcGetLoweredName");
    if (a.failure.empty()) {
      int major = 0, minor = 0;
      a.version(&major, &minor);
      a.identity = "nvrtc " + std::to_string(major) + "." + std::to_string(minor);
    }
    return a;
  }();
  return loaded;
}

void check(nvrtcResult r, const char* call) {
  if (r != NVRTC_SUCCESS)
    throw error(std::string("gpupool: ") + call + " failed: " + api().error_string(r));
}

// What to compile, and how to name it in messages and find the user's lines in the log.
struct program {
  std::string source;
  std::string file_name;        // as NVRTC reports it: "<file_name>(<line>): error ..."
  std::string display_name;     // the kernel's name in messages
  int body_first_line = 1;      // the source line that is the user's first
  std::string name_expression;  // raw kernels: the entry, whose lowered name is wanted
};

// Compiles `p`; returns the CUBIN and, for a name expression, its lowered (mangled) name.
std::pair<std::string, std::string> compile_program(const program& p,
                                                    const std::vector<std::string>& options) {
  const nvrtc_api& nvrtc = api();
  nvrtcProgram handle = nullptr;
  check(nvrtc.create(&handle, p.source.c_str(), p.file_name.c_str(), 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  struct destroy_program {
    const nvrtc_api& nvrtc;
    nvrtcProgram& p;
    ~destroy_program() { nvrtc.destroy(&p); }
  } guard{nvrtc, handle};
  if (!p.name_expression.empty())
    check(nvrtc.add_name(handle, p.name_expression.c_str()), "nvrtcAddNameExpression");

  std::vector<const char*> raw;
  for (const auto& o : options) raw.push_back(o.c_str());
  const nvrtcResult compiled = nvrtc.compile(handle, static_cast<int>(raw.size()), raw.data());
  std::size_t log_size = 0;
  check(nvrtc.log_size(handle, &log_size), "nvrtcGetProgramLogSize");
  std::string log(log_size, '\0');
  if (log_size > 0) check(nvrtc.log(handle, log.data()), "nvrtcGetProgramLog");
  while (!log.empty() && log.back() == '\0') log.pop_back();
  if (compiled != NVRTC_SUCCESS) {
    const int line = body_line_of_first_error(log, p.file_name + "(", p.body_first_line);
    throw compile_error("gpupool: kernel '" + p.display_name + "' does not compile for the GPU" +
                            (line > 0 ? " (line " + std::to_string(line) + ")" : "") + ":\n" + log,
                        log, line);
  }
  std::string lowered;
  if (!p.name_expression.empty()) {
    const char* name = nullptr;
    if (nvrtc.lowered_name(handle, p.name_expression.c_str(), &name) != NVRTC_SUCCESS ||
        name == nullptr)
      throw compile_error(
          "gpupool: raw kernel source has no kernel named '" + p.name_expression + "'", log, 0);
    lowered = name;
  }
  std::size_t size = 0;
  check(nvrtc.cubin_size(handle, &size), "nvrtcGetCUBINSize");
  std::string image(size, '\0');
  check(nvrtc.cubin(handle, image.data()), "nvrtcGetCUBIN");
  count_compilation();
  return {std::move(image), std::move(lowered)};
}

std::vector<std::string> options_for(int major, int minor) {
  return {"--gpu-architecture=sm_" + std::to_string(major) + std::to_string(minor), "-std=c++17",
          "-default-device"};
}

// The full cache key of `source` compiled with `options` by this NVRTC: stored in the entry and
// compared on load, so entries never stand in for one another.
std::string cache_key(const std::string& source, const std::vector<std::string>& options,
                      const std::string& extra) {
  std::string key = source + '\n' + api().identity + '\n' + extra;
  for (const auto& o : options) key += '\n' + o;
  return key;
}

// Compiled images kept in memory (beyond them the least recently used is read from the disk
// cache again, or compiled again): far more distinct kernels than a program uses, while a
// process that makes ever new ones does not keep them all.
constexpr std::size_t most_images_kept = 1024;

// Where `key`'s entry lives on disk (nullopt: the cache folder cannot be used, and kernels are
// compiled in memory), and the name it is remembered under in this process: the entry's path,
// or for an image kept only in memory the full key, so that distinct kernels never share one.
struct image_place {
  std::optional<std::string> path;
  std::string memo_key;
};

image_place place_of(const std::string& key) {
  image_place place;
  if (auto folder = kernel_cache_folder("cuda")) {
    place.path = *folder + "/" + entry_file_name(key, ".cubin.entry");
    place.memo_key = *place.path + '\n' + key;
  } else {
    place.memo_key = "memory\n" + key;
  }
  return place;
}

// An image that cannot be stored (a full disk, a folder made read-only meanwhile) is still used.
void store_if_possible(const std::string& path, const std::string& key, const std::string& image) {
  try {
    store_entry(path, key, image);
  } catch (const std::exception& e) {
    warn_cache_unusable_once(e.what());
  }
}

void require_nvrtc() {
  if (!api().failure.empty()) throw error("gpupool: " + api().failure);
}

}  // namespace

bool nvrtc_available(std::string* reason) {
  const bool ok = api().failure.empty();
  if (!ok && reason != nullptr) *reason = api().failure;
  return ok;
}

std::shared_ptr<const std::string> compile_cubin(const elementwise_kernel& k,
                                                 const std::vector<bool>& is_array, int major,
                                                 int minor) {
  require_nvrtc();
  const auto options = options_for(major, minor);
  program p{cuda_source(k, is_array), k.name() + ".cu", k.name(), cuda_body_first_line(k), {}};
  const std::string key = cache_key(p.source, options, {});
  const image_place place = place_of(key);
  static compile_once<std::shared_ptr<const std::string>> compiled(most_images_kept);
  return compiled.get(place.memo_key, [&] {
    // An entry that is missing, damaged or for another key is a miss: compiled and replaced.
    if (place.path)
      if (auto cached = load_entry(*place.path, key))
        return std::make_shared<const std::string>(std::move(*cached));
    auto image = compile_program(p, options).first;
    if (place.path) store_if_possible(*place.path, key, image);
    return std::make_shared<const std::string>(std::move(image));
  });
}

std::shared_ptr<const raw_cubin> compile_raw_cubin(const raw_kernel& k, int major, int minor) {
  require_nvrtc();
  const auto options = options_for(major, minor);
  program p{k.source(), k.name() + ".cu", k.name(), 1, k.entry()};
  // One entry holds the entry's lowered name (a line: mangled names have no newline) and then
  // the image, checked together.
  const std::string key = cache_key(p.source, options, "entry " + k.entry());
  const image_place place = place_of(key);
  static compile_once<std::shared_ptr<const raw_cubin>> compiled(most_images_kept);
  return compiled.get(place.memo_key, [&] {
    raw_cubin result;
    if (auto cached = place.path ? load_entry(*place.path, key) : std::nullopt) {
      const std::size_t end = cached->find('\n');
      if (end != std::string::npos && end > 0 && end + 1 < cached->size()) {
        result.entry = cached->substr(0, end);
        result.image = cached->substr(end + 1);
        return std::make_shared<const raw_cubin>(std::move(result));
      }
    }
    auto [image, entry] = compile_program(p, options);
    if (place.path) store_if_possible(*place.path, key, entry + '\n' + image);
    result.image = std::move(image);
    result.entry = std::move(entry);
    return std::make_shared<const raw_cubin>(std::move(result));
  });
}

}  // namespace gpupool::detail::cuda
