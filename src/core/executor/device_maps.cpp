// map_on_device: a compiled kernel over many calls whose arrays already live on one device.
// Every call is checked into one table before anything runs, the kernel compiled once, and the
// table cut into batches shared out among the device's lanes (device_map_batches.hpp).
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "core/executor/executor_impl.hpp"
#include "core/kernels/user_call.hpp"
#include "core/lanes/user_kernel_piece.hpp"
#include "core/scheduling/device_map_batches.hpp"

namespace gpupool {

template <class K>
future<void> executor::impl::map_user_on_device(int device, const K& k,
                                                const std::vector<device_call>& calls) {
  require_accepting();
  const dtype out_type = k.output().type;
  // Every call is checked into one prepared_call in turn (no allocation per call: a map from
  // Python brings thousands) and leaves its row in one table, in call order; the batches below
  // take consecutive rows of it. The first call's check is kept: its pattern of arrays and
  // scalars chooses the compiled kernel, and every later call must match it.
  const std::size_t row_size = k.inputs().size() + 2;  // see prepared_call::append_row
  std::vector<std::uint64_t> table;
  table.reserve(calls.size() * row_size);
  detail::prepared_call first, call;
  std::size_t array_bytes_per_element = 0;  // over the array inputs, the same for every call
  for (std::size_t i = 0; i < calls.size(); ++i) {
    detail::prepared_call& checked = i == 0 ? first : call;
    try {
      detail::prepare_call_into(checked, k, calls[i].inputs, out_type, calls[i].count);
    } catch (const std::invalid_argument& e) {
      std::throw_with_nested(call_error(i, e.what()));  // the check's own error, nested
    } catch (const std::overflow_error& e) {
      std::throw_with_nested(call_error(i, e.what()));  // a scalar out of its type's range
    }
    if (calls[i].out == nullptr && calls[i].count > 0)
      throw call_error(i, "gpupool: kernel '" + k.name() + "': the call has no output");
    if (i > 0 && call.is_array != first.is_array)
      throw call_error(i, "gpupool: kernel '" + k.name() +
                              "': the call mixes arrays and scalars differently from the first "
                              "call; pass each pattern in its own map");
    checked.append_row(table, calls[i].out, calls[i].count);
  }
  if (calls.empty()) return nothing_to_do();
  for (const auto& op : first.operands)
    if (op.is_array) array_bytes_per_element += op.element_size;
  auto state = std::make_shared<detail::shared_state<void>>();
  const int ordinal = ordinals[static_cast<std::size_t>(device)];
  auto job = std::make_shared<detail::device_calls_job>(
      k.name(), detail::compile_for(*owner, k, first, ordinal), state);

  // Two batches per lane of the device keep every lane busy while letting each launch cover
  // many calls (one launch per batch where the backend runs tables), but on a GPU none smaller
  // on average than fills it several times over (see device_map_batches.hpp). A raw kernel has
  // no table entry (each of its calls is a launch of its own, of the caller's grid), so its
  // calls are shared out among the lanes whatever their size.
  std::size_t least = 1;
  if constexpr (!std::is_same_v<K, raw_kernel>)
    least = detail::least_device_batch_elements(devices[static_cast<std::size_t>(device)]);
  std::size_t total_elements = 0;
  for (const auto& c : calls) total_elements = detail::saturating_add(total_elements, c.count);
  const std::size_t batches =
      detail::device_map_batches(calls.size(), total_elements, lanes_per_device, least);
  std::vector<detail::work_item_ptr> items;
  items.reserve(batches);
  for (std::size_t b = 0; b < batches; ++b) {
    const std::size_t begin = calls.size() * b / batches;
    const std::size_t end = calls.size() * (b + 1) / batches;
    std::size_t elements = 0;
    for (std::size_t i = begin; i < end; ++i) elements += calls[i].count;
    const auto rows = table.begin() + static_cast<std::ptrdiff_t>(begin * row_size);
    items.push_back(std::make_unique<detail::device_batch_piece>(
        job,
        std::vector<std::uint64_t>(rows,
                                   rows + static_cast<std::ptrdiff_t>((end - begin) * row_size)),
        end - begin, elements * array_bytes_per_element, elements * size_of(out_type)));
    stamp(*items.back());
  }
  job->set_piece_count(items.size());
  push_all_or_refuse(items, device);
  return future<void>(std::move(state));
}

future<void> executor::map_on_device(int device, const elementwise_kernel& k,
                                     const std::vector<device_call>& calls) {
  return map_on_device(device, k, calls, task_options{});
}

future<void> executor::map_on_device(int device, const raw_kernel& k,
                                     const std::vector<device_call>& calls) {
  return map_on_device(device, k, calls, task_options{});
}

future<void> executor::map_on_device(int device, const elementwise_kernel& k,
                                     const std::vector<device_call>& calls,
                                     const task_options& options) {
  check_device(device);
  const detail::call_priority_scope priority(options);
  return impl_->map_user_on_device(device, k, calls);
}

future<void> executor::map_on_device(int device, const raw_kernel& k,
                                     const std::vector<device_call>& calls,
                                     const task_options& options) {
  check_device(device);
  const detail::call_priority_scope priority(options);
  return impl_->map_user_on_device(device, k, calls);
}

}  // namespace gpupool
