// The CUDA backend's code generator: CUDA C++ (for NVRTC) for an elementwise kernel and a call's
// pattern of arrays and scalars. Header-only, so that builds without the toolkit still describe
// (and tests still read) what the CUDA backend would compile.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/kernels/kernel_source.hpp"
#include "gpupool/elementwise.hpp"

namespace gpupool::detail {

/// The CUDA source's second entry point: many calls from a table in one launch.
inline constexpr const char* kernel_batch_entry_point = "gpupool_elementwise_batch";

namespace cuda_generation {
constexpr int lines_before_parameters = 2;
}  // namespace cuda_generation

/// The line of cuda_source(k, ...) on which k's body starts.
inline int cuda_body_first_line(const elementwise_kernel& k) {
  // parameters (one a line), output, count, loop head (3 lines), loads, output local, brace.
  return cuda_generation::lines_before_parameters + static_cast<int>(k.inputs().size()) + 2 + 3 +
         static_cast<int>(k.inputs().size()) + 2 + 1;
}

/// CUDA C++ (for NVRTC) for `k` called with arrays where `is_array` is true and scalars
/// elsewhere: `extern "C" __global__ void gpupool_elementwise(...)` taking, per input, a device
/// array (`const T*`) or the scalar by value, then the output array and the element count; a
/// grid-stride loop over the elements. A second entry point,
/// `gpupool_elementwise_batch(const unsigned long long* table)`, runs call `blockIdx.y` of a
/// table laid out as backend_stream::launch_compiled_batch describes.
inline std::string cuda_source(const elementwise_kernel& k, const std::vector<bool>& is_array) {
  // A dtype's C++ spelling for NVRTC, which compiles without the standard headers.
  const auto cuda_type = [](dtype t) { return info_of(t).cuda_name; };
  const std::size_t n = k.inputs().size();
  const char* out_t = cuda_type(k.output().type);
  std::ostringstream s, loads, batch_inputs;
  s << "// gpupool elementwise kernel '" << k.name() << "' (generated, CUDA)\n"
    << "extern \"C\" __global__ void " << kernel_entry_point << "(\n";
  for (std::size_t i = 0; i < n; ++i) {
    const auto& p = k.inputs()[i];
    const char* t = cuda_type(p.type);
    if (is_array[i]) {
      s << "    const " << t << "* __restrict__ gpupool_in" << i << ",\n";
      loads << "    const " << t << ' ' << p.name << " = gpupool_in" << i << "[gpupool_i];\n";
      batch_inputs << "  const " << t << "* __restrict__ const gpupool_in" << i << " = (const " << t
                   << "*)gpupool_row[" << i << "];\n";
    } else {
      s << "    const " << t << " gpupool_in" << i << ",\n";
      loads << "    const " << t << ' ' << p.name << " = gpupool_in" << i << ";\n";
      batch_inputs << "  const " << t << " gpupool_in" << i << " = *(const " << t
                   << "*)(gpupool_row + " << i << ");\n";
    }
  }
  const std::string loop_and_loads =
      "  for (unsigned long long gpupool_i =\n"
      "           blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
      "       gpupool_i < gpupool_n; gpupool_i += (unsigned long long)gridDim.x * blockDim.x) {\n" +
      loads.str();
  s << "    " << out_t << "* __restrict__ gpupool_out,\n"
    << "    unsigned long long gpupool_n) {\n"
    << loop_and_loads;
  write_element_body(s, k, out_t);
  // The same loop over many calls at once: block row y runs the call in row y of a table with,
  // per call, one 8-byte slot per input (address or scalar), the output's address and the count.
  s << "\nextern \"C\" __global__ void " << kernel_batch_entry_point
    << "(const unsigned long long* __restrict__ gpupool_table) {\n"
    << "  const unsigned long long* const gpupool_row = gpupool_table + blockIdx.y * " << (n + 2)
    << "ull;\n"
    << batch_inputs.str() << "  " << out_t << "* __restrict__ const gpupool_out = (" << out_t
    << "*)gpupool_row[" << n << "];\n"
    << "  const unsigned long long gpupool_n = gpupool_row[" << n + 1 << "];\n"
    << loop_and_loads;
  write_element_body(s, k, out_t);
  return s.str();
}

/// The CUDA backend's generator (its traits name it).
class cuda_kernel_generator final : public kernel_generator {
 public:
  const char* language() const noexcept override { return "CUDA C++"; }
  std::string source(const elementwise_kernel& k,
                     const std::vector<bool>& is_array) const override {
    return cuda_source(k, is_array);
  }
  int body_first_line(const elementwise_kernel& k) const override {
    return cuda_body_first_line(k);
  }
};

}  // namespace gpupool::detail
