// Turning an elementwise kernel and a call's array/scalar pattern into source code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpupool/elementwise.hpp"

namespace gpupool::detail {

/// Longest kernel, entry or parameter name accepted (names are checked as C++ identifiers before
/// any source is generated).
inline constexpr std::size_t max_name_length = 128;
/// Longest declaration string ("float64 x, float64 a") accepted.
inline constexpr std::size_t max_declaration_length = 16 * 1024;

/// The name of the generated entry point, `extern "C"` in every backend's source.
inline constexpr const char* kernel_entry_point = "gpupool_elementwise";
/// The CUDA source's second entry point: many calls from a table in one launch.
inline constexpr const char* kernel_batch_entry_point = "gpupool_elementwise_batch";

/// Host C++ for `k` called with arrays where `is_array` is true and scalars elsewhere:
/// `extern "C" void gpupool_elementwise(void* const* args, std::size_t n)`, where `args` holds
/// one pointer per input (to the array, or to the scalar's value) and then the output array.
/// The body's first line is line `body_first_line()` of the source.
std::string host_source(const elementwise_kernel& k, const std::vector<bool>& is_array);
int host_body_first_line(const elementwise_kernel& k);

/// CUDA C++ (for NVRTC) for the same call: `extern "C" __global__ void gpupool_elementwise(...)`
/// taking, per input, a device array (`const T*`) or the scalar by value, then the output array
/// and the element count; a grid-stride loop over the elements. A second entry point,
/// `gpupool_elementwise_batch(const unsigned long long* table)`, runs call `blockIdx.y` of a
/// table laid out as backend_stream::launch_compiled_batch describes.
std::string cuda_source(const elementwise_kernel& k, const std::vector<bool>& is_array);
int cuda_body_first_line(const elementwise_kernel& k);

/// In a compiler's log, the line number written right after `prefix` on the first line that
/// reports an error (e.g. prefix "k.cu(" in "k.cu(12): error: ..."), made relative to the body
/// (1 is its first line); 0 if there is none or it lies outside the body.
int body_line_of_first_error(std::string_view log, std::string_view prefix, int body_first_line);

}  // namespace gpupool::detail
