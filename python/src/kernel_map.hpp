// Executor.map over a built-in kernel and host arrays, without a Python future per call (see
// kernel_map.cpp).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "arrays.hpp"
#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// The arrays of a built-in kernel's calls, checked before any work starts (TypeError or
// ValueError naming the array), with each call's element type.
struct checked_kernel_inputs {
  std::vector<input_array> x;
  std::vector<input_array> y;  // empty for a one-input kernel
  std::vector<gpupool::dtype> types;
};
checked_kernel_inputs check_kernel_inputs(nb::handle kernel_object,
                                          const gpupool::builtin_kernel& k, nb::sequence xs,
                                          std::optional<nb::sequence> ys);

// The results of one map, in input order (Python: an iterator). Every call is queued when it is
// made; each result, a NumPy array in pinned memory, is handed on once and not kept. As
// concurrent.futures' map: a failure, a cancelled call, the timeout or Ctrl-C during a wait
// raises and cancels every call not yet started, and so does dropping the iterator early; the
// arrays of calls a lane had started are kept until those end.
class kernel_map {
 public:
  // `timeout`: seconds from now for every result (None: no limit).
  kernel_map(gpupool::executor& exec, nb::handle kernel_object, const gpupool::builtin_kernel& k,
             nb::sequence xs, std::optional<nb::sequence> ys, std::optional<double> timeout);
  kernel_map(const kernel_map&) = delete;
  kernel_map& operator=(const kernel_map&) = delete;
  ~kernel_map();

  // The next result; StopIteration at the end.
  nb::object next();
  // Cancels every call not yet started; the iteration ends.
  void cancel_rest() noexcept;
  [[nodiscard]] std::size_t remaining() const noexcept {
    return done_ ? 0 : futures_.size() - next_;
  }

 private:
  checked_kernel_inputs inputs_;
  std::vector<std::unique_ptr<pinned_block>> results_;
  std::vector<gpupool::future<void>> futures_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  std::size_t next_ = 0;
  bool done_ = false;
  bool busy_ = false;  // a next() is waiting, with the GIL let go
};

void bind_kernel_map(nb::module_& m);

}  // namespace gpupool_python
