// The results of Executor.map over a built-in kernel (kernel_map): each call's pinned result
// block, and the NumPy array handed on for it. Small results of calls queued together share a
// slab, exported to NumPy once, each result a view of it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernel_map.hpp"

namespace gpupool_python {
namespace {

// Results of at most `slab_result_bytes` queued together share slabs of at most `slab_calls`
// results and `slab_bytes`: exporting an array to NumPy costs many times what a view of one
// does, and a slab of a few dozen spreads that cost thin. A result kept alone keeps its whole
// slab alive: the bounds cap what that holds (and a result larger than the bound gains little,
// its own export being small beside its copy).
constexpr std::size_t slab_result_bytes = 64 << 10;
constexpr std::size_t slab_bytes = 1 << 20;
constexpr std::size_t slab_calls = 64;
constexpr std::size_t slab_alignment = 64;

constexpr std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

bool kernel_map::room_for_a_slab() const noexcept {
  const std::size_t calls_free =
      queued_.size() < window_.calls ? window_.calls - queued_.size() : 0;
  const std::size_t bytes_free = queued_bytes_ < window_.bytes ? window_.bytes - queued_bytes_ : 0;
  return calls_free >= std::min(slab_calls, std::max<std::size_t>(1, window_.calls / 2)) &&
         bytes_free >= std::min(slab_bytes, std::max<std::size_t>(1, window_.bytes / 2));
}

void kernel_map::allocate_results(std::size_t first) {
  for (std::size_t at = first; at < queued_.size();) {
    queued_call& head = queued_[at];
    const nb::dlpack::dtype type = head.x.dtype();
    const std::size_t element = type.bits / 8;
    const auto small = [&](const queued_call& q) {
      return q.x.dtype() == type && q.x.nbytes() <= slab_result_bytes;
    };
    // A run of small results of one dtype, each starting on its own cache line: lanes writing
    // neighbouring results then never share one.
    std::size_t end = at + 1;
    std::size_t bytes = round_up(head.x.nbytes(), slab_alignment);
    if (small(head))
      for (; end < queued_.size() && end - at < slab_calls && small(queued_[end]); ++end) {
        const std::size_t more = round_up(queued_[end].x.nbytes(), slab_alignment);
        if (bytes + more > slab_bytes) break;
        bytes += more;
      }
    if (end - at == 1) {
      head.result = std::make_shared<pinned_block>(head.x.nbytes());
      head.slab_elements = 0;
      ++at;
      continue;
    }
    // Results of one shape (of at least one dimension: a row of a 1-d slab would be a NumPy
    // scalar; and not empty, or rows would have no length) are rows of one array, each handed on
    // by an index, which NumPy answers faster than a slice.
    bool rows = head.x.ndim() != 0 && head.x.nbytes() != 0;
    for (std::size_t i = at + 1; rows && i < end; ++i) rows = queued_[i].x.same_shape(head.x);
    const auto slab_rows =
        rows ? static_cast<std::uint32_t>(bytes / round_up(head.x.nbytes(), slab_alignment)) : 0;
    auto slab = std::make_shared<pinned_block>(bytes);
    std::size_t offset = 0;
    for (std::size_t row = 0; at < end; ++at, ++row) {
      queued_call& q = queued_[at];
      q.result = slab;
      q.offset = offset / element;
      q.slab_elements = bytes / element;
      q.row = static_cast<std::uint32_t>(row);
      q.slab_rows = slab_rows;
      offset += round_up(q.x.nbytes(), slab_alignment);
    }
  }
}

nb::object kernel_map::result_of(const queued_call& q) {
  if (q.slab_elements == 0) return shared_pinned_array(q.result, q.x.shape(), q.x.dtype());
  if (q.result.get() != slab_block_) {
    if (q.slab_rows != 0) {
      // (rows, *shape), each row on its own cache lines: C-contiguous within a row.
      std::vector<std::size_t> shape{q.slab_rows};
      const std::vector<std::size_t> row_shape = q.x.shape();
      shape.insert(shape.end(), row_shape.begin(), row_shape.end());
      std::vector<std::int64_t> strides(shape.size());
      strides[0] = static_cast<std::int64_t>(q.slab_elements / q.slab_rows);
      std::int64_t stride = 1;
      for (std::size_t i = shape.size(); i-- > 1;) {
        strides[i] = stride;
        stride *= static_cast<std::int64_t>(shape[i]);
      }
      slab_array_ = shared_pinned_array(q.result, shape, q.x.dtype(), strides.data());
    } else {
      slab_array_ = shared_pinned_array(q.result, {q.slab_elements}, q.x.dtype());
    }
    slab_block_ = q.result.get();
  }
  if (q.slab_rows != 0) {
    nb::object row =
        nb::steal(PySequence_GetItem(slab_array_.ptr(), static_cast<Py_ssize_t>(q.row)));
    if (!row.is_valid()) throw nb::python_error();
    return row;
  }
  const auto begin = static_cast<Py_ssize_t>(q.offset);
  nb::object view = nb::steal(
      PySequence_GetSlice(slab_array_.ptr(), begin, begin + static_cast<Py_ssize_t>(q.x.size())));
  if (!view.is_valid()) throw nb::python_error();
  if (q.x.ndim() == 1) return view;
  return view.attr("reshape")(nb::cast(q.x.shape()));
}

}  // namespace gpupool_python
