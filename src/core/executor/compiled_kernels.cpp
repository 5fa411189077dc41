// Compiled kernels (elementwise_kernel, raw_kernel) over host arrays: checked and compiled for
// every device at the call, then streamed through the lanes in pieces like the built-in kernels.
#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/executor/executor_impl.hpp"
#include "core/kernels/user_call.hpp"
#include "core/lanes/user_kernel_piece.hpp"

namespace gpupool {

template <class K>
future<void> executor::impl::launch_user(const K& k, const std::vector<kernel_argument>& inputs,
                                         dtype out_type, void* out, std::size_t count) {
  require_accepting();
  auto call = detail::prepare_call(k, inputs, out_type, count);
  // Pieces run on every device: compile for each one's architecture (devices of one kind share
  // the compiled image and its loaded library).
  std::vector<std::shared_ptr<const detail::compiled_kernel>> compiled;
  for (int ordinal : ordinals) compiled.push_back(detail::compile_for(*owner, k, call, ordinal));
  if (count == 0) return nothing_to_do();
  std::size_t bytes_per_element = size_of(out_type);
  for (const auto& op : call.operands)
    if (op.is_array) bytes_per_element += op.element_size;
  const std::size_t cost =
      gate->cost(count > detail::no_in_flight_limit / bytes_per_element ? detail::no_in_flight_limit
                                                                        : count * bytes_per_element,
                 /*piecewise=*/true);
  admit(cost);
  auto state = state_holding(cost);
  const std::size_t widest = call.widest;
  try {
    auto job = std::make_shared<detail::user_kernel_job>(
        k.name(), std::move(compiled), std::move(call), out, size_of(out_type), count, state,
        /*operands_only=*/std::is_same_v<K, elementwise_kernel>);
    enqueue_pieces<detail::user_kernel_piece>(job, count, widest);
  } catch (...) {
    state->try_cancel();  // never queued: ending it gives the bytes back
    throw;
  }
  return future<void>(std::move(state));
}

future<void> executor::launch_elementwise(const elementwise_kernel& k,
                                          const std::vector<kernel_argument>& inputs,
                                          dtype out_type, void* out, std::size_t count) {
  return launch_elementwise(k, inputs, out_type, out, count, task_options{});
}

future<void> executor::launch_raw(const raw_kernel& k, const std::vector<kernel_argument>& inputs,
                                  dtype out_type, void* out, std::size_t count) {
  return launch_raw(k, inputs, out_type, out, count, task_options{});
}

future<void> executor::launch_elementwise(const elementwise_kernel& k,
                                          const std::vector<kernel_argument>& inputs,
                                          dtype out_type, void* out, std::size_t count,
                                          const task_options& options) {
  const detail::call_priority_scope priority(options);
  return impl_->launch_user(k, inputs, out_type, out, count);
}

future<void> executor::launch_raw(const raw_kernel& k, const std::vector<kernel_argument>& inputs,
                                  dtype out_type, void* out, std::size_t count,
                                  const task_options& options) {
  const detail::call_priority_scope priority(options);
  return impl_->launch_user(k, inputs, out_type, out, count);
}

}  // namespace gpupool
