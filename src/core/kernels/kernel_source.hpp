// Turning an elementwise kernel and a call's array/scalar pattern into source code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
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

/// The name of the generated entry point, `extern "C"` in every backend's source (each
/// backend's kernel_generator writes it).
inline constexpr const char* kernel_entry_point = "gpupool_elementwise";
/// Writes the end of every generator's element loop: the output local `out_t name{}`, the
/// user's body in its own scope, the store to `gpupool_out[gpupool_i]`, and the closing braces of
/// the loop and the function. The body starts on the third line this writes. Generators declare
/// `gpupool_out` and `gpupool_i`; the names starting with `gpupool_` are reserved for them
/// (parameter names may not start so).
void write_element_body(std::ostream& s, const elementwise_kernel& k, const char* out_t);

/// In a compiler's log, the line number written right after `prefix` on the first line that
/// reports an error (e.g. prefix "k.cu(" in "k.cu(12): error: ..."), made relative to the body
/// (1 is its first line); 0 if there is none or it lies outside the body.
int body_line_of_first_error(std::string_view log, std::string_view prefix, int body_first_line);

}  // namespace gpupool::detail
