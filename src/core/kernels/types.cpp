// Names and sizes of the public value types, and the exception types' constructors.
#include <array>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/kernels/builtin_kernels.hpp"
#include "gpupool/error.hpp"
#include "gpupool/types.hpp"

namespace gpupool {

std::size_t detail::checked_bytes(std::size_t count, std::size_t size, const char* what) {
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(count, size, &bytes))
    throw std::length_error(std::string("gpupool: ") + what + ": " + std::to_string(count) +
                            " elements of " + std::to_string(size) +
                            " bytes are more bytes than memory can hold");
  return bytes;
}

namespace {
// A dtype from outside the enum's values (a cast) is no row of the table.
bool in_table(dtype t) noexcept {
  return static_cast<std::size_t>(t) < std::size(dtypes);
}
}  // namespace

std::size_t size_of(dtype t) noexcept {
  return in_table(t) ? info_of(t).size : 0;
}

const char* to_string(dtype t) noexcept {
  return in_table(t) ? info_of(t).name : "unknown";
}

const char* to_string(backend_kind b) noexcept {
  for (const auto& [kind, name] : backend_names)
    if (kind == b) return name;
  return "unknown";
}

std::optional<backend_kind> backend_from_name(std::string_view name) noexcept {
  for (const auto& [kind, known] : backend_names)
    if (name == known) return kind;
  return std::nullopt;
}

std::string backend_name_list() {
  std::string list;
  const std::size_t n = std::size(backend_names);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) list += i + 1 == n ? " or " : ", ";
    list += std::string("'") + backend_names[i].name + "'";
  }
  return list;
}

namespace {
template <op... O>
constexpr auto builtin_table(detail::op_list<O...>) {
  return std::array<builtin_kernel_info, sizeof...(O)>{detail::builtin<O>::info...};
}
constexpr auto builtin_table_v = builtin_table(detail::builtin_ops{});
}  // namespace

std::span<const builtin_kernel_info> builtin_kernels() noexcept {
  return builtin_table_v;
}

const builtin_kernel_info& info_of(op o) noexcept {
  return builtin_table_v[static_cast<std::size_t>(o)];
}

cuda_error::cuda_error(int code, std::string name, std::string description, std::string call,
                       std::string file, int line)
    : error(name + " (" + description + ") in " + call + " at " + file + ":" +
            std::to_string(line)),
      code_(code),
      name_(std::move(name)),
      call_(std::move(call)),
      file_(std::move(file)),
      line_(line) {}

}  // namespace gpupool
