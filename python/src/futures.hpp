// The one concurrent.futures.Future each task gets from Python, completed from C++: the steps
// that complete one (shared with the Python calls that lanes run, python_calls.hpp), and kernel
// tasks whose array results are made in C++.
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// Completing a concurrent.futures.Future from C++, with the GIL (for kernel tasks here, for
// Python calls in python_calls.cpp). Each reports a failure of the future's method as unraisable
// (it cannot reach the caller), except InvalidStateError: the future had already ended (cancelled
// meanwhile), as the standard library's executors ignore too.

// future.set_running_or_notify_cancel(): whether the work is to run (not if the future was
// cancelled, or the method failed).
bool set_future_running(PyObject* future);
// future.set_result(value), or future.set_exception(value) if `failed`.
void set_future_outcome(PyObject* future, PyObject* value, bool failed);
// future.set_exception() with the Python exception that `failure` becomes.
void set_future_failure(PyObject* future, const std::exception_ptr& failure);
// Ends a future whose task was cancelled before it ran, as ThreadPoolExecutor's shutdown does,
// and notifies the waiters of wait() and as_completed() too.
void end_cancelled(PyObject* future);
// How task `done` (which has ended) ended: cancelled, or failed with what (null: it succeeded).
std::pair<bool, std::exception_ptr> ending_of(gpupool::future<void>& done);

// What a kernel task over host arrays hands over: a new NumPy array in pinned memory.
struct pinned_result {
  std::unique_ptr<pinned_block> block;
  nb::dlpack::dtype type;
  std::vector<std::size_t> shape;
};

// A Python future (made by `future_type()`, a concurrent.futures.Future subclass whose cancel()
// calls its `_task.cancel()`) for kernel task `f`. `inputs` (the exports of the arrays the task
// reads in place) are held until the task has ended and let go before the future reports it.
// Its result is `pinned` as a NumPy array, or else `result` as it is; `keep_alive` is held until
// the task has ended.
nb::object adopt_kernel_task(gpupool::future<void> f, nb::handle future_type,
                             std::vector<host_array> inputs, std::optional<pinned_result> pinned,
                             nb::object result = {}, nb::object keep_alive = {});

// One Python future (as adopt_kernel_task's) for many kernel tasks `fs` (the blocks of a map):
// it ends when the last of them has ended: cancelled if any was cancelled, else with the failure
// of the first task in `fs` that failed, else with `result`; `keep_alive` is held until then.
// Its cancel() cancels every task not started, and succeeds if one was. The callbacks on `fs`
// are registered last: if this throws, nothing of the tasks refers to the future.
nb::object adopt_kernel_tasks(const std::vector<gpupool::future<void>>& fs, nb::handle future_type,
                              nb::object result, nb::object keep_alive);

}  // namespace gpupool_python
