#include "cuda/nvrtc_compiler.hpp"

#include <dlfcn.h>
#include <nvrtc.h>

#include <mutex>
#include <string>

#include "core/compile_once.hpp"
#include "core/kernel_cache.hpp"
#include "core/kernel_source.hpp"
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

std::shared_ptr<const std::string> build(const elementwise_kernel& k, const std::string& source,
                                         const std::vector<std::string>& options,
                                         const std::string& path) {
  std::string cached;
  if (read_file(path, cached)) return std::make_shared<const std::string>(std::move(cached));

  const nvrtc_api& nvrtc = api();
  nvrtcProgram program = nullptr;
  check(nvrtc.create(&program, source.c_str(), (k.name() + ".cu").c_str(), 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  struct destroy_program {
    const nvrtc_api& nvrtc;
    nvrtcProgram& p;
    ~destroy_program() { nvrtc.destroy(&p); }
  } guard{nvrtc, program};

  std::vector<const char*> raw;
  for (const auto& o : options) raw.push_back(o.c_str());
  const nvrtcResult compiled = nvrtc.compile(program, static_cast<int>(raw.size()), raw.data());
  std::size_t log_size = 0;
  check(nvrtc.log_size(program, &log_size), "nvrtcGetProgramLogSize");
  std::string log(log_size, '\0');
  if (log_size > 0) check(nvrtc.log(program, log.data()), "nvrtcGetProgramLog");
  while (!log.empty() && log.back() == '\0') log.pop_back();
  if (compiled != NVRTC_SUCCESS) {
    const int line = body_line_of_first_error(log, k.name() + ".cu(", cuda_body_first_line(k));
    throw compile_error("gpupool: kernel '" + k.name() + "' does not compile for the GPU" +
                            (line > 0 ? " (body line " + std::to_string(line) + ")" : "") + ":\n" +
                            log,
                        log, line);
  }
  std::size_t size = 0;
  check(nvrtc.cubin_size(program, &size), "nvrtcGetCUBINSize");
  std::string image(size, '\0');
  check(nvrtc.cubin(program, image.data()), "nvrtcGetCUBIN");
  publish_bytes(image, path);
  count_compilation();
  return std::make_shared<const std::string>(std::move(image));
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
  const nvrtc_api& nvrtc = api();
  if (!nvrtc.failure.empty()) throw error("gpupool: " + nvrtc.failure);
  const std::string arch = "sm_" + std::to_string(major) + std::to_string(minor);
  const std::vector<std::string> options{"--gpu-architecture=" + arch, "-std=c++17",
                                         "-default-device"};
  const std::string source = cuda_source(k, is_array);
  std::string key_text = source + '\n' + nvrtc.identity;
  for (const auto& o : options) key_text += '\n' + o;
  const std::string path = cache_folder("cuda") + "/" + hex(stable_hash(key_text)) + ".cubin";
  static compile_once<std::shared_ptr<const std::string>> compiled;
  return compiled.get(path, [&] { return build(k, source, options, path); });
}

}  // namespace gpupool::detail::cuda
