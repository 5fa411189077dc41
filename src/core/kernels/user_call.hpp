// A call of a run-time compiled kernel (elementwise or raw), checked against the kernel's
// signature and turned into what backends launch: argument pointers for one launch, or rows of a
// batch table for many calls at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.hpp"
#include "gpupool/elementwise.hpp"

namespace gpupool::detail {

/// One input of a call, ready for the lanes.
struct user_operand {
  bool is_array = false;
  const char* data = nullptr;  // the array
  std::size_t element_size = 0;
  alignas(8) unsigned char scalar[8] = {};  // the scalar, as the parameter's type
};

/// A call checked against its kernel.
struct prepared_call {
  std::vector<user_operand> operands;
  std::vector<bool> is_array;
  std::size_t widest = 0;  // the widest element among the array inputs and the output

  /// cudaLaunchKernel-style argument list for one launch over `count` elements at `offset`:
  /// per input the array (advanced by `offset` elements) or a pointer to the scalar, then `out`.
  [[nodiscard]] std::vector<void*> launch_args(void* out, std::size_t offset = 0) const;
  /// Appends this call's row to a batch table (see backend_stream::launch_compiled_batch).
  void append_row(std::vector<std::uint64_t>& table, void* out, std::size_t count) const;
};

/// Checks `inputs` against `k`'s parameters: their number, array types and lengths (`count`),
/// the output's type, and for raw kernels arrays exactly where declared.
/// Scalars are converted by NumPy's "same_kind" rule (see kernel_argument).
/// @throw std::invalid_argument naming the kernel and the parameter; argument_kind_error for a
///        floating-point scalar given to an integer parameter; argument_range_error for a scalar
///        outside its parameter type's range.
prepared_call prepare_call(const elementwise_kernel& k, const std::vector<kernel_argument>& inputs,
                           dtype out_type, std::size_t count);
prepared_call prepare_call(const raw_kernel& k, const std::vector<kernel_argument>& inputs,
                           dtype out_type, std::size_t count);
/// The same into `call`, whose vectors keep their storage from one call to the next: a map over
/// thousands of calls checks each into one prepared_call without allocating.
void prepare_call_into(prepared_call& call, const elementwise_kernel& k,
                       const std::vector<kernel_argument>& inputs, dtype out_type,
                       std::size_t count);
void prepare_call_into(prepared_call& call, const raw_kernel& k,
                       const std::vector<kernel_argument>& inputs, dtype out_type,
                       std::size_t count);

/// The kernel compiled for backend device `ordinal` and the call's array/scalar pattern. Looked
/// up first in the backend's memo of what it compiled (backend::compiled), by the kernel's text,
/// the pattern and the device: making the source, its hash and the disk cache's path, as the
/// backend's compile does before its own caches answer, costs tens of microseconds, and every
/// task of a compiled kernel asks.
std::shared_ptr<const compiled_kernel> compile_for(backend& b, const elementwise_kernel& k,
                                                   const prepared_call& call, int ordinal);
std::shared_ptr<const compiled_kernel> compile_for(backend& b, const raw_kernel& k,
                                                   const prepared_call& call, int ordinal);

}  // namespace gpupool::detail
