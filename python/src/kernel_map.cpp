// Executor.map over a built-in kernel and host arrays: calls checked, then queued as the map's
// window has room (the GIL let go once per top-up), and the results yielded in input order as
// NumPy arrays in pinned memory. No Python future is made per call and no lane takes the GIL for
// the results (one does, once, to let go of what a map dropped early kept for its running
// calls): a map of thousands of tiny arrays costs what the core costs, not a Future, a hand-over
// and a wake-up per array; a map of many large arrays holds only its window's results.
#include "kernel_map.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "completions.hpp"
#include "kernels.hpp"

namespace gpupool_python {

checked_kernel_call check_kernel_call(nb::handle kernel_object, const gpupool::builtin_kernel& k,
                                      nb::handle x_object, nb::handle y_object, std::size_t index,
                                      std::vector<gpupool::dtype>& alpha_checked) {
  checked_kernel_call call{read_host_array(x_object, index, "x"), std::nullopt, gpupool::dtype{}};
  const host_array& x = call.x;
  call.type = gpupool_dtype(x.dtype());
  if (k.takes_alpha() &&
      std::find(alpha_checked.begin(), alpha_checked.end(), call.type) == alpha_checked.end()) {
    check_alpha(kernel_object, k, call.type, "x[" + std::to_string(index) + "]");
    alpha_checked.push_back(call.type);
  }
  if (!y_object.is_valid()) return call;
  call.y = read_host_array(y_object, index, "y");
  const host_array& y = *call.y;
  if (y.dtype() != x.dtype() || !x.same_shape(y)) {
    const std::string pair =
        "x[" + std::to_string(index) + "] and y[" + std::to_string(index) + "]";
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
  return call;
}

host_array read_output_array(nb::handle obj, const checked_kernel_call& call, std::size_t index) {
  const auto which = [&] { return "out[" + std::to_string(index) + "]"; };  // when refused
  host_array out = read_writable_host_array(obj, index, "out");
  const nb::dlpack::dtype want = call.x.dtype();
  if (out.dtype() != want)
    throw nb::type_error(
        ("gpupool: " + which() + " has another dtype than its call's result (the input's)")
            .c_str());
  if (!out.same_shape(call.x))
    throw nb::value_error(
        ("gpupool: " + which() + " has another shape than its call's input").c_str());
  // Same dtype and shape as the input (checked above), so the call's count covers each array.
  const gpupool::transform_call as_queued{call.x.data(), call.y ? call.y->data() : nullptr,
                                          const_cast<void*>(out.data()), call.x.size()};
  if (!as_queued.output_in_place_or_apart(gpupool::size_of(call.type)))
    throw nb::value_error(("gpupool: " + which() +
                           " overlaps an input of its call part way (give the input itself, "
                           "or memory apart from it)")
                              .c_str());
  return out;
}

namespace {

void check_kernel_arity(const gpupool::builtin_kernel& k, bool two_inputs) {
  if (k.arity() == 2 && !two_inputs)
    throw nb::value_error(
        ("gpupool: kernel '" + std::string(k.name()) + "' takes two arrays").c_str());
  if (k.arity() == 1 && two_inputs)
    throw nb::value_error(
        ("gpupool: kernel '" + std::string(k.name()) + "' takes one array").c_str());
}

}  // namespace

std::vector<checked_kernel_call> check_kernel_inputs(nb::handle kernel_object,
                                                     const gpupool::builtin_kernel& k,
                                                     nb::sequence xs,
                                                     std::optional<nb::sequence> ys) {
  const std::size_t n = nb::len(xs);
  check_kernel_arity(k, ys.has_value());
  if (ys && nb::len(*ys) != n)
    throw nb::value_error(("gpupool: the two input lists differ in length (" + std::to_string(n) +
                           " arrays and " + std::to_string(nb::len(*ys)) + ")")
                              .c_str());
  std::vector<checked_kernel_call> calls;
  calls.reserve(n);
  std::vector<gpupool::dtype> alpha_checked;
  for (std::size_t i = 0; i < n; ++i)
    calls.push_back(check_kernel_call(kernel_object, k, xs[i],
                                      ys ? nb::handle((*ys)[i]) : nb::handle(), i, alpha_checked));
  return calls;
}

namespace {

using clock = std::chrono::steady_clock;

// How often a wait for a result wakes to let Python run its signal handlers (Ctrl-C): a signal
// does not wake a thread asleep on a C++ future.
constexpr auto wait_slice = std::chrono::milliseconds(50);

// How many of the last results' futures a map keeps (see kernel_map::handed_futures_).
constexpr std::size_t kept_handed_on = 1024;

// The next item of a Python iterator, or nothing at its end (its error raised as is).
std::optional<nb::object> next_item(const nb::object& iterator) {
  PyObject* item = PyIter_Next(iterator.ptr());
  if (item == nullptr) {
    if (PyErr_Occurred() != nullptr) throw nb::python_error();
    return std::nullopt;
  }
  return nb::steal(item);
}

}  // namespace

kernel_map::kernel_map(gpupool::executor& exec, nb::handle kernel_object,
                       const gpupool::builtin_kernel& k, nb::object xs,
                       std::optional<nb::object> ys, std::optional<double> timeout,
                       map_window window, bool lazy, gpupool::task_options options)
    : exec_(exec),
      options_(options),
      kernel_object_(nb::borrow(kernel_object)),
      kernel_(k),
      window_(window),
      lazy_(lazy) {
  if (window_.calls == 0 || window_.bytes == 0)
    throw nb::value_error("gpupool: a map's window holds at least one call");
  if (options_.priority) gpupool::check_priority(*options_.priority, "priority");
  if (lazy_) {
    check_kernel_arity(k, ys.has_value());
    x_iter_ = nb::steal(PyObject_GetIter(xs.ptr()));
    if (!x_iter_.is_valid()) throw nb::python_error();
    if (ys) {
      y_iter_ = nb::steal(PyObject_GetIter(ys->ptr()));
      if (!y_iter_.is_valid()) throw nb::python_error();
    }
  } else {
    inputs_ = check_kernel_inputs(
        kernel_object, k, nb::borrow<nb::sequence>(xs),
        ys ? std::optional<nb::sequence>(nb::borrow<nb::sequence>(*ys)) : std::nullopt);
  }
  if (timeout) {
    // As concurrent.futures: a timeout already passed (or negative) times out at the first wait.
    const double seconds = *timeout >= 0 ? std::min(*timeout, 1e9) : 0.0;
    deadline_ = clock::now() +
                std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  }
  top_up();
}

std::optional<checked_kernel_call> kernel_map::read_call() {
  if (lookahead_) {
    std::optional<checked_kernel_call> call = std::move(lookahead_);
    lookahead_.reset();
    return call;
  }
  if (inputs_done_) return std::nullopt;
  if (!lazy_) {
    if (read_ == inputs_.size()) {
      inputs_done_ = true;
      return std::nullopt;
    }
    return std::move(inputs_[read_++]);
  }
  const std::size_t index = handed_on_ + queued_.size();
  std::optional<nb::object> x = next_item(x_iter_);
  std::optional<nb::object> y;
  if (y_iter_.is_valid()) y = next_item(y_iter_);
  if (!x || (y_iter_.is_valid() && !y)) {
    inputs_done_ = true;
    if (x.has_value() != y.has_value() && y_iter_.is_valid())
      throw nb::value_error(("gpupool: the two inputs differ in length (one ended after " +
                             std::to_string(index) + " arrays)")
                                .c_str());
    return std::nullopt;
  }
  return check_kernel_call(kernel_object_, kernel_, *x, y ? nb::handle(*y) : nb::handle(), index,
                           alpha_checked_);
}

void kernel_map::top_up() {
  // Calls read now and queued below, in order; runs of one element type share a transform_each.
  const std::size_t first = queued_.size();
  try {
    while (true) {
      // Full by count: nothing more is read (a lazy map reads no input before it has room).
      if (!queued_.empty() && queued_.size() >= window_.calls) break;
      std::optional<checked_kernel_call> call = read_call();
      if (!call) break;
      const std::size_t result_bytes = call->x.nbytes();
      const std::size_t bytes = result_bytes + (lazy_ ? result_bytes * (call->y ? 2 : 1) : 0);
      // A call always goes when nothing is queued, however large: the map must make progress.
      if (!queued_.empty() && (bytes > window_.bytes || queued_bytes_ > window_.bytes - bytes)) {
        lookahead_ = std::move(call);
        break;
      }
      queued_call& q = queued_.emplace_back();
      q.x = std::move(call->x);
      q.y = std::move(call->y);
      q.bytes = bytes;
      queued_bytes_ += bytes;
    }
    allocate_results(first);
  } catch (...) {
    // Not queued yet: dropped without a wait. What was queued before stays for next() to hand
    // on or cancel; the error ends the map as a failed call would.
    while (queued_.size() > first) {
      queued_bytes_ -= queued_.back().bytes;
      queued_.pop_back();
    }
    cancel_rest();
    throw;
  }
  if (queued_.size() == first) return;
  std::vector<gpupool::transform_call> calls;
  std::vector<gpupool::dtype> types;
  calls.reserve(queued_.size() - first);
  types.reserve(queued_.size() - first);
  for (std::size_t i = first; i < queued_.size(); ++i) {
    const queued_call& q = queued_[i];
    void* out = static_cast<char*>(q.result->data()) + q.offset * (q.x.dtype().bits / 8);
    calls.push_back({q.x.data(), q.y ? q.y->data() : nullptr, out, q.x.size()});
    types.push_back(gpupool_dtype(q.x.dtype()));
  }
  // The futures are gathered here and set on the calls once the GIL is back: while it is let go,
  // another thread may take results from the front of queued_ (queue_rest runs beside the
  // consumer), never one of these calls (their futures are not valid yet, see next()), so they
  // stay the last `count` of queued_.
  const std::size_t count = calls.size();
  std::vector<gpupool::future<void>> futures;
  futures.reserve(count);
  bool failed = false;
  std::exception_ptr failure;
  queueing_ = true;
  {
    // Queueing may wait for room in the in-flight budget: without the GIL, which nothing here
    // needs (the arrays are held by this object, and no lane hands anything to Python).
    nb::gil_scoped_release nogil;
    try {
      for (std::size_t at = 0; at < count;) {
        std::size_t end = at + 1;
        while (end < count && types[end] == types[at]) ++end;
        auto some = exec_.transform_each(
            kernel_, types[at],
            std::span<const gpupool::transform_call>(calls.data() + at, end - at), options_);
        for (auto& f : some) futures.push_back(std::move(f));
        at = end;
      }
    } catch (...) {
      failed = true;
      failure = std::current_exception();
    }
  }
  queueing_ = false;
  const std::size_t at = queued_.size() - count;
  for (std::size_t i = 0; i < futures.size(); ++i) queued_[at + i].future = std::move(futures[i]);
  if (failed) {
    // transform_each left nothing of its own calls running. The calls queued before stay in
    // queued_, cancelled: those a lane had started keep their arrays until they end (see the
    // destructor), so nothing here waits for them, with the GIL that their lanes may need.
    for (std::size_t i = at + futures.size(); i < queued_.size(); ++i)
      queued_bytes_ -= queued_[i].bytes;
    queued_.resize(at + futures.size());
    cancel_rest();
    std::rethrow_exception(failure);
  }
  // Cancelled by another thread meanwhile: what this top-up queued is cancelled too.
  if (done_) cancel_queued();
}

void kernel_map::wait_while_queueing() {
  while (queueing_) {
    {
      nb::gil_scoped_release nogil;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (PyErr_CheckSignals() != 0) {  // Ctrl-C, as in next()'s own wait
      cancel_rest();
      throw nb::python_error();
    }
  }
}

kernel_map::~kernel_map() {
  cancel_queued();
  // Calls that a lane had already started read their inputs and write their result block until
  // they end: those are kept (and let go with the GIL, by a hand-over) until then.
  struct kept_memory {
    std::atomic<std::size_t> running{0};
    std::vector<host_array> inputs;
    std::vector<std::shared_ptr<pinned_block>> results;
  };
  std::vector<queued_call*> running;
  for (queued_call& q : queued_)
    if (q.future.valid() && !q.future.ready()) running.push_back(&q);
  if (running.empty()) return;
  auto* kept = new kept_memory;
  kept->running.store(running.size());
  for (queued_call* q : running) {
    kept->inputs.push_back(std::move(q->x));
    if (q->y) kept->inputs.push_back(std::move(*q->y));
    kept->results.push_back(std::move(q->result));
  }
  for (queued_call* q : running)
    q->future.on_complete([kept](gpupool::future<void>&) {
      if (kept->running.fetch_sub(1, std::memory_order_acq_rel) == 1)
        post_handover([kept] { delete kept; });  // with the GIL; leaked if Python is gone
    });
}

void kernel_map::cancel_queued() noexcept {
  for (queued_call& q : queued_)
    if (q.future.valid()) (void)q.future.cancel();
}

void kernel_map::cancel_rest() noexcept {
  cancel_queued();
  lookahead_.reset();
  inputs_done_ = true;
  done_ = true;
  // Nothing more is handed on: the last slab's array goes (its results keep what they view).
  slab_array_.reset();
  slab_block_ = nullptr;
}

std::size_t kernel_map::remaining() const noexcept {
  if (done_) return 0;
  return queued_.size() + (lookahead_ ? 1 : 0) + (lazy_ ? 0 : inputs_.size() - read_);
}

nb::object kernel_map::next() {
  if (done_) throw nb::stop_iteration();
  // Another thread waiting in next() (it lets the GIL go) would hand out the same result: a
  // generator refuses to be re-entered likewise.
  if (busy_)
    throw nb::value_error("gpupool: the results of this map are being read by another thread");
  busy_ = true;
  struct not_busy {
    bool& flag;
    ~not_busy() { flag = false; }
  } leave{busy_};
  if (queued_.empty() && (!inputs_done_ || lookahead_) && !queueing_) top_up();
  // Calls another thread is queueing have no future yet: their results wait for it to finish.
  if (!queued_.empty() && !queued_.front().future.valid()) {
    wait_while_queueing();
    if (done_) throw nb::stop_iteration();  // cancelled meanwhile
  }
  if (queued_.empty()) {
    done_ = true;
    slab_array_.reset();
    slab_block_ = nullptr;
    throw nb::stop_iteration();
  }
  gpupool::future<void>& f = queued_.front().future;
  while (!f.ready()) {
    auto slice = wait_slice;
    if (deadline_) {
      const auto left = *deadline_ - clock::now();
      if (left <= clock::duration::zero()) {
        cancel_rest();
        throw_python(PyExc_TimeoutError, "gpupool: map's timeout passed before result " +
                                             std::to_string(handed_on_) + " was ready");
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
  queued_call q = std::move(queued_.front());
  queued_.pop_front();
  queued_bytes_ -= q.bytes;
  ++handed_on_;
  if (q.future.status() != gpupool::task_status::succeeded) {
    cancel_rest();   // as concurrent.futures' map: the first failure ends the iteration
    q.future.get();  // throws the task's failure, or cancelled_error
  }
  handed_futures_.push_back(std::move(q.future));
  if (handed_futures_.size() > kept_handed_on) handed_futures_.pop_front();
  // This result has left the window: what now fits is queued before it is handed on, so that
  // the window's calls run while the consumer works on it.
  if ((!inputs_done_ || lookahead_) && !queueing_ && room_for_a_slab()) top_up();
  return result_of(q);
}

void kernel_map::queue_rest() {
  if (busy_ || queueing_ || done_ || lazy_) return;
  window_ = map_window{};
  top_up();
}

void kernel_map::cancel_from_python() {
  if (busy_)
    throw nb::value_error("gpupool: the results of this map are being read by another thread");
  cancel_rest();
}

void bind_kernel_map(nb::module_& m) {
  nb::class_<kernel_map>(m, "KernelMap",
                         "The results of Executor.map over a built-in kernel, in input order.",
                         nb::is_weak_referenceable())
      .def(
          "__iter__", [](nb::handle self) { return nb::borrow(self); },
          nb::sig("def __iter__(self) -> KernelMap"))
      .def("__next__", &kernel_map::next)
      .def("__length_hint__", &kernel_map::remaining)
      .def_prop_ro("queued_calls", &kernel_map::queued_calls,
                   "Calls queued and not yet handed on (the window's use).")
      .def_prop_ro("queued_bytes", &kernel_map::queued_bytes,
                   "Their input and result bytes, as the window counts them.")
      .def("cancel", &kernel_map::cancel_from_python,
           "Cancels every call not yet started; the iteration then ends.")
      .def("close", &kernel_map::cancel_from_python,
           "As a generator's close(): cancels every call not yet started; the iteration ends.")
      .def("queue_rest", &kernel_map::queue_rest,
           "Queues every call its window has not, as the executor shuts down (a map whose\n"
           "inputs were read whole at the call; not while another thread reads it).");
}

}  // namespace gpupool_python
