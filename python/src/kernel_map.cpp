// Executor.map over a built-in kernel and host arrays: every call checked, then queued at once
// (the GIL let go once for all of them), and the results yielded in input order as NumPy arrays
// in pinned memory. No Python future is made per call and no lane takes the GIL for the results
// (one does, once, to let go of what a map dropped early kept for its running calls): a map of
// thousands of tiny arrays costs what the core costs, not a Future, a hand-over and a wake-up
// per array.
#include "kernel_map.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "completions.hpp"
#include "kernels.hpp"

namespace gpupool_python {

checked_kernel_inputs check_kernel_inputs(nb::handle kernel_object,
                                          const gpupool::builtin_kernel& k, nb::sequence xs,
                                          std::optional<nb::sequence> ys) {
  const std::size_t n = nb::len(xs);
  if (k.arity() == 2 && !ys)
    throw nb::value_error(
        ("gpupool: kernel '" + std::string(k.name()) + "' takes two arrays").c_str());
  if (k.arity() == 1 && ys)
    throw nb::value_error(
        ("gpupool: kernel '" + std::string(k.name()) + "' takes one array").c_str());
  if (ys && nb::len(*ys) != n)
    throw nb::value_error(("gpupool: the two input lists differ in length (" + std::to_string(n) +
                           " arrays and " + std::to_string(nb::len(*ys)) + ")")
                              .c_str());
  checked_kernel_inputs in;
  in.x.reserve(n);
  in.types.reserve(n);
  if (ys) in.y.reserve(n);
  std::vector<gpupool::dtype> alpha_checked;  // the alpha fits each of these types
  for (std::size_t i = 0; i < n; ++i) {
    in.x.push_back(as_input(xs[i], i, "x"));
    const input_array& x = in.x.back();
    const gpupool::dtype type = gpupool_dtype(x.dtype());
    in.types.push_back(type);
    if (k.takes_alpha() &&
        std::find(alpha_checked.begin(), alpha_checked.end(), type) == alpha_checked.end()) {
      check_alpha(kernel_object, k, type, "x[" + std::to_string(i) + "]");
      alpha_checked.push_back(type);
    }
    if (!ys) continue;
    in.y.push_back(as_input((*ys)[i], i, "y"));
    const input_array& y = in.y.back();
    if (y.dtype() != x.dtype() || y.ndim() != x.ndim() ||
        !std::equal(x.shape_ptr(), x.shape_ptr() + x.ndim(), y.shape_ptr())) {
      const std::string pair = "x[" + std::to_string(i) + "] and y[" + std::to_string(i) + "]";
      if (y.dtype() != x.dtype())
        throw nb::value_error(("gpupool: " + pair + " differ in dtype (" + dtype_name(x.dtype()) +
                               " and " + dtype_name(y.dtype()) +
                               "); the two arrays of a call must have the same dtype")
                                  .c_str());
      throw nb::value_error(("gpupool: " + pair + " differ in length or shape (" +
                             std::to_string(x.size()) + " and " + std::to_string(y.size()) +
                             " elements); the two arrays of a call must have the same shape")
                                .c_str());
    }
  }
  return in;
}

namespace {

using clock = std::chrono::steady_clock;

// How often a wait for a result wakes to let Python run its signal handlers (Ctrl-C): a signal
// does not wake a thread asleep on a C++ future.
constexpr auto wait_slice = std::chrono::milliseconds(50);

}  // namespace

kernel_map::kernel_map(gpupool::executor& exec, nb::handle kernel_object,
                       const gpupool::builtin_kernel& k, nb::sequence xs,
                       std::optional<nb::sequence> ys, std::optional<double> timeout)
    : inputs_(check_kernel_inputs(kernel_object, k, xs, ys)) {
  if (timeout) {
    // As concurrent.futures: a timeout already passed (or negative) times out at the first wait.
    const double seconds = *timeout >= 0 ? std::min(*timeout, 1e9) : 0.0;
    deadline_ = clock::now() +
                std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  }
  const std::size_t n = inputs_.x.size();
  results_.reserve(n);
  for (const input_array& x : inputs_.x)
    results_.push_back(std::make_unique<pinned_block>(x.nbytes()));
  std::vector<gpupool::transform_call> calls(n);
  for (std::size_t i = 0; i < n; ++i)
    calls[i] = {inputs_.x[i].data(), inputs_.y.empty() ? nullptr : inputs_.y[i].data(),
                results_[i]->data(), inputs_.x[i].size()};
  futures_.reserve(n);
  // Queueing may wait for room in the in-flight budget: without the GIL, which nothing here
  // needs (the arrays are held by this object, and no lane hands anything to Python).
  nb::gil_scoped_release nogil;
  try {
    // One transform_each per run of calls of one element type (a map's arrays share theirs).
    for (std::size_t first = 0; first < n;) {
      std::size_t end = first + 1;
      while (end < n && inputs_.types[end] == inputs_.types[first]) ++end;
      auto queued = exec.transform_each(
          k, inputs_.types[first],
          std::span<const gpupool::transform_call>(calls.data() + first, end - first));
      for (auto& f : queued) futures_.push_back(std::move(f));
      first = end;
    }
  } catch (...) {
    // transform_each left nothing of its own calls running; the runs queued before it stop too,
    // before the arrays and result blocks they use are let go.
    for (auto& f : futures_) (void)f.cancel();
    for (auto& f : futures_) f.wait();
    throw;
  }
}

kernel_map::~kernel_map() {
  cancel_rest();
  // Calls that a lane had already started read their inputs and write their result block until
  // they end: those are kept (and let go with the GIL, by a hand-over) until then.
  struct kept_memory {
    std::atomic<std::size_t> running{0};
    std::vector<input_array> inputs;
    std::vector<std::unique_ptr<pinned_block>> results;
  };
  kept_memory* kept = nullptr;
  std::vector<std::size_t> running;
  for (std::size_t i = next_; i < futures_.size(); ++i)
    if (!futures_[i].ready()) running.push_back(i);
  if (running.empty()) return;
  kept = new kept_memory;
  kept->running.store(running.size());
  for (std::size_t i : running) {
    kept->inputs.push_back(std::move(inputs_.x[i]));
    if (!inputs_.y.empty()) kept->inputs.push_back(std::move(inputs_.y[i]));
    kept->results.push_back(std::move(results_[i]));
  }
  for (std::size_t i : running)
    futures_[i].on_complete([kept](gpupool::future<void>&) {
      if (kept->running.fetch_sub(1, std::memory_order_acq_rel) == 1)
        post_handover([kept] { delete kept; });  // with the GIL; leaked if Python is gone
    });
}

void kernel_map::cancel_rest() noexcept {
  for (std::size_t i = next_; i < futures_.size(); ++i) (void)futures_[i].cancel();
  done_ = true;
}

nb::object kernel_map::next() {
  if (done_ || next_ == futures_.size()) {
    done_ = true;
    throw nb::stop_iteration();
  }
  // Another thread waiting in next() (it lets the GIL go) would hand out the same result: a
  // generator refuses to be re-entered likewise.
  if (busy_)
    throw nb::value_error("gpupool: the results of this map are being read by another thread");
  busy_ = true;
  struct not_busy {
    bool& flag;
    ~not_busy() { flag = false; }
  } leave{busy_};
  gpupool::future<void>& f = futures_[next_];
  while (!f.ready()) {
    auto slice = wait_slice;
    if (deadline_) {
      const auto left = *deadline_ - clock::now();
      if (left <= clock::duration::zero()) {
        cancel_rest();
        throw_python(PyExc_TimeoutError, "gpupool: map's timeout passed before result " +
                                             std::to_string(next_) + " was ready");
      }
      slice = std::min(slice, std::chrono::duration_cast<std::chrono::milliseconds>(left) +
                                  std::chrono::milliseconds(1));
    }
    {
      nb::gil_scoped_release nogil;
      (void)f.wait_for(slice);
    }
    if (PyErr_CheckSignals() != 0) {  // Ctrl-C: what has not started is cancelled
      cancel_rest();
      throw nb::python_error();
    }
  }
  const std::size_t i = next_++;
  const input_array& x = inputs_.x[i];
  const std::vector<std::size_t> shape = shape_of(x);
  const nb::dlpack::dtype type = x.dtype();
  // Its task has ended: the arrays it read are free to change.
  inputs_.x[i] = input_array();
  if (!inputs_.y.empty()) inputs_.y[i] = input_array();
  if (f.status() != gpupool::task_status::succeeded) {
    cancel_rest();  // as concurrent.futures' map: the first failure ends the iteration
    f.get();        // throws the task's failure, or cancelled_error
  }
  return pinned_array(std::move(results_[i]), shape, type);
}

void bind_kernel_map(nb::module_& m) {
  nb::class_<kernel_map>(m, "KernelMap",
                         "The results of Executor.map over a built-in kernel, in input order.")
      .def(
          "__iter__", [](nb::handle self) { return nb::borrow(self); },
          nb::sig("def __iter__(self) -> KernelMap"))
      .def("__next__", &kernel_map::next)
      .def("__length_hint__", &kernel_map::remaining)
      .def("cancel", &kernel_map::cancel_rest,
           "Cancels every call not yet started; the iteration then ends.")
      .def("close", &kernel_map::cancel_rest,
           "As a generator's close(): cancels every call not yet started; the iteration ends.");
}

}  // namespace gpupool_python
