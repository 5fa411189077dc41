// The CPU backend's code generator: host C++ for an elementwise kernel and a call's pattern of
// arrays and scalars, compiled into a shared library (host_compiler.cpp).
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/kernels/kernel_source.hpp"
#include "gpupool/elementwise.hpp"

namespace gpupool::detail {

namespace host_generation {
// Lines of generated code before the inputs (kept in step with host_source).
constexpr int lines_before_inputs = 8;
}  // namespace host_generation

/// The line of host_source(k, ...) on which k's body starts.
inline int host_body_first_line(const elementwise_kernel& k) {
  return host_generation::lines_before_inputs + 2 * static_cast<int>(k.inputs().size()) + 5;
}

/// Host C++ for `k` called with arrays where `is_array` is true and scalars elsewhere:
/// `extern "C" void gpupool_elementwise(void* const* args, std::size_t n)`, where `args` holds
/// one pointer per input (to the array, or to the scalar's value) and then the output array.
inline std::string host_source(const elementwise_kernel& k, const std::vector<bool>& is_array) {
  // A dtype's C++ spelling, with <cstdint>.
  const auto host_type = [](dtype t) { return info_of(t).host_name; };
  std::ostringstream s;
  s << "// gpupool elementwise kernel '" << k.name() << "' (generated)\n"
    << "#include <cmath>\n"
    << "#include <cstddef>\n"
    << "#include <cstdint>\n"
    << "using namespace std;\n"
    << "extern \"C\" void " << kernel_entry_point
    << "(void* const* gpupool_args, std::size_t gpupool_n) {\n"
    << "  // inputs\n"
    << "  (void)gpupool_args;\n";
  // Two lines per input: its pointer, then (inside the loop) its value.
  std::ostringstream loads;
  for (std::size_t i = 0; i < k.inputs().size(); ++i) {
    const auto& p = k.inputs()[i];
    const char* t = host_type(p.type);
    s << "  const " << t << "* const gpupool_in" << i << " = static_cast<const " << t
      << "*>(gpupool_args[" << i << "]);\n";
    loads << "    const " << t << ' ' << p.name << " = gpupool_in" << i
          << (is_array[i] ? "[gpupool_i]" : "[0]") << ";\n";
  }
  const char* out_t = host_type(k.output().type);
  s << "  " << out_t << "* const gpupool_out = static_cast<" << out_t << "*>(gpupool_args["
    << k.inputs().size() << "]);\n"
    << "  for (std::size_t gpupool_i = 0; gpupool_i < gpupool_n; ++gpupool_i) {\n"
    << loads.str();
  write_element_body(s, k, out_t);
  return s.str();
}

/// The CPU backend's generator (its traits name it).
class host_kernel_generator final : public kernel_generator {
 public:
  const char* language() const noexcept override { return "host C++"; }
  std::string source(const elementwise_kernel& k,
                     const std::vector<bool>& is_array) const override {
    return host_source(k, is_array);
  }
  int body_first_line(const elementwise_kernel& k) const override {
    return host_body_first_line(k);
  }
};

}  // namespace gpupool::detail
