// Completing the Python future of each task from C++ (see futures.hpp).
#include "futures.hpp"

#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "completions.hpp"
#include "errors.hpp"

namespace gpupool_python {
namespace {

// Method and attribute names, interned once (with the GIL, at the first task).
struct interned_names {
  PyObject* set_running_or_notify_cancel =
      PyUnicode_InternFromString("set_running_or_notify_cancel");
  PyObject* set_result = PyUnicode_InternFromString("set_result");
  PyObject* set_exception = PyUnicode_InternFromString("set_exception");
  PyObject* cancel = PyUnicode_InternFromString("cancel");
  PyObject* notify_cancelled = PyUnicode_InternFromString("_notify_cancelled");
  PyObject* task = PyUnicode_InternFromString("_task");
};
const interned_names& names() {
  static const auto* const n = new interned_names;  // leaked: used until the process ends
  return *n;
}

// Reports the Python error being raised as unraisable (it cannot reach the caller), except
// InvalidStateError: the future had already ended (cancelled meanwhile), as the standard
// library's executors ignore too.
void discard_error(const char* where) {
  static PyObject* const invalid_state =
      nb::module_::import_("concurrent.futures").attr("InvalidStateError").inc_ref().ptr();
  if (PyErr_ExceptionMatches(invalid_state)) {
    PyErr_Clear();
    return;
  }
  nb::python_error e;
  e.discard_as_unraisable(where);
}

// Calls future.<method>(argument) (or with no argument), reporting a failure as unraisable.
// Returns the call's result (a new reference), or nullptr when it failed.
PyObject* call_method(PyObject* future, PyObject* method, PyObject* argument = nullptr) {
  PyObject* r = argument != nullptr ? PyObject_CallMethodOneArg(future, method, argument)
                                    : PyObject_CallMethodNoArgs(future, method);
  if (r == nullptr) discard_error("gpupool: handing over a task's outcome");
  return r;
}

void call_method_and_drop(PyObject* future, PyObject* method, PyObject* argument = nullptr) {
  Py_XDECREF(call_method(future, method, argument));
}

}  // namespace

bool set_future_running(PyObject* future) {
  PyObject* running = call_method(future, names().set_running_or_notify_cancel);
  const bool go = running == Py_True;
  Py_XDECREF(running);
  return go;
}

void set_future_outcome(PyObject* future, PyObject* value, bool failed) {
  call_method_and_drop(future, failed ? names().set_exception : names().set_result, value);
}

void set_future_failure(PyObject* future, const std::exception_ptr& failure) {
  nb::object error = python_exception(failure);
  call_method_and_drop(future, names().set_exception, error.ptr());
}

void end_cancelled(PyObject* future) {
  call_method_and_drop(future, names().cancel);
  call_method_and_drop(future, names().set_running_or_notify_cancel);
}

std::pair<bool, std::exception_ptr> ending_of(gpupool::future<void>& done) {
  if (done.status() == gpupool::task_status::cancelled) return {true, nullptr};
  try {
    done.get();
  } catch (...) {
    return {false, std::current_exception()};
  }
  return {false, nullptr};
}

namespace {

// What a kernel task hands over once it has ended, shared by its completion callback.
class kernel_outcome {
 public:
  kernel_outcome(std::vector<host_array> inputs, std::optional<pinned_result> pinned,
                 nb::object result, nb::object keep_alive)
      : inputs_(std::move(inputs)),
        pinned_(std::move(pinned)),
        result_(std::move(result)),
        keep_alive_(std::move(keep_alive)) {}
  kernel_outcome(const kernel_outcome&) = delete;
  kernel_outcome& operator=(const kernel_outcome&) = delete;
  ~kernel_outcome() {
    if (future_ == nullptr && inputs_.empty() && !result_.is_valid() && !keep_alive_.is_valid())
      return;
    if (!interpreter_alive()) {
      // Deliberately leaked: releasing Python objects needs a live interpreter.
      static_cast<void>(new std::vector<host_array>(std::move(inputs_)));
      static_cast<void>(result_.release());
      static_cast<void>(keep_alive_.release());
      return;
    }
    nb::gil_scoped_acquire gil;
    release();
  }

  void set_future(nb::handle future) { future_ = future.inc_ref().ptr(); }

  // With the GIL, once the task has ended. The inputs are let go first: once the future says
  // the work is over, the arrays are free to resize.
  void finish(bool cancelled, const std::exception_ptr& failure) {
    inputs_.clear();
    if (future_ != nullptr) {
      if (cancelled) {
        call_method_and_drop(future_, names().notify_cancelled);
      } else if (failure) {
        set_future_failure(future_, failure);
      } else {
        nb::object value =
            pinned_ ? pinned_array(std::move(pinned_->block), pinned_->shape, pinned_->type)
                    : result_;
        set_future_outcome(future_, value.ptr(), /*failed=*/false);
      }
    }
    release();
  }

 private:
  void release() {
    inputs_.clear();
    result_.reset();
    keep_alive_.reset();
    Py_CLEAR(future_);
  }

  std::vector<host_array> inputs_;
  std::optional<pinned_result> pinned_;
  nb::object result_;
  nb::object keep_alive_;
  PyObject* future_ = nullptr;
};

// A kernel future's handle on its tasks in gpupool's queue (one, or the blocks of a map).
class queued_task {
 public:
  explicit queued_task(gpupool::future<void> f) { futures_.push_back(std::move(f)); }
  explicit queued_task(std::vector<gpupool::future<void>> fs) : futures_(std::move(fs)) {}
  // Cancels every task that has not started. True if one was: the future can then never have
  // its result, and ends cancelled (tasks that started run to their end meanwhile).
  bool cancel() {
    bool any = false;
    for (auto& f : futures_) any = f.cancel() || any;
    return any;
  }
  // Waits until every task has ended (run, failed or cancelled), without the GIL: after a
  // cancel(), what had started still runs to its end, writing where its calls write.
  void wait() {
    nb::gil_scoped_release nogil;
    for (auto& f : futures_) f.wait();
  }

 private:
  std::vector<gpupool::future<void>> futures_;
};

// How the tasks of one future ended so far: whether any was cancelled, and the failure of the
// earliest task (in the order given) that failed.
struct joint_ending {
  explicit joint_ending(std::size_t tasks) : remaining(tasks) {}
  std::mutex lock;
  std::size_t remaining;
  bool cancelled = false;
  std::size_t failed_task = 0;
  std::exception_ptr failure;
};

}  // namespace

nb::object adopt_kernel_task(gpupool::future<void> f, nb::handle future_type,
                             std::vector<host_array> inputs, std::optional<pinned_result> pinned,
                             nb::object result, nb::object keep_alive) {
  auto outcome = std::make_shared<kernel_outcome>(std::move(inputs), std::move(pinned),
                                                  std::move(result), std::move(keep_alive));
  nb::object future = future_type();
  outcome->set_future(future);
  // A task that has already ended is handed over right here.
  f.on_complete([outcome](gpupool::future<void>& done) {
    auto [cancelled, failure] = ending_of(done);
    post_handover([outcome, cancelled, failure] { outcome->finish(cancelled, failure); });
  });
  nb::object task = nb::cast(queued_task(std::move(f)));
  if (PyObject_SetAttr(future.ptr(), names().task, task.ptr()) != 0) throw nb::python_error();
  return future;
}

nb::object adopt_kernel_tasks(const std::vector<gpupool::future<void>>& fs, nb::handle future_type,
                              nb::object result, nb::object keep_alive) {
  auto outcome = std::make_shared<kernel_outcome>(std::vector<host_array>{}, std::nullopt,
                                                  std::move(result), std::move(keep_alive));
  nb::object future = future_type();
  outcome->set_future(future);
  if (fs.empty()) {
    outcome->finish(false, nullptr);
    return future;
  }
  nb::object task = nb::cast(queued_task(fs));
  if (PyObject_SetAttr(future.ptr(), names().task, task.ptr()) != 0) throw nb::python_error();
  // Only the last task to end hands over (taking the GIL): the others end on their lanes
  // without it, which matters while a caller holds the GIL queueing more of a map.
  auto ending = std::make_shared<joint_ending>(fs.size());
  for (std::size_t i = 0; i < fs.size(); ++i) {
    gpupool::future<void> f = fs[i];  // a handle on the same task
    f.on_complete([outcome, ending, i](gpupool::future<void>& done) {
      auto [cancelled, failure] = ending_of(done);
      bool cancelled_any = false;
      std::exception_ptr first_failure;
      {
        std::lock_guard<std::mutex> hold(ending->lock);
        ending->cancelled = ending->cancelled || cancelled;
        if (failure && (!ending->failure || i < ending->failed_task)) {
          ending->failure = failure;
          ending->failed_task = i;
        }
        if (--ending->remaining > 0) return;
        cancelled_any = ending->cancelled;
        first_failure = ending->failure;
      }
      // Cancelled wins: a cancel() that returned True has already ended the future so.
      post_handover([outcome, cancelled_any, first_failure] {
        outcome->finish(cancelled_any, cancelled_any ? nullptr : first_failure);
      });
    });
  }
  return future;
}

void bind_futures(nb::module_& m) {
  nb::class_<queued_task>(m, "QueuedTask", "A kernel future's handle on its queued tasks.")
      .def("cancel", &queued_task::cancel,
           "Cancels every task not started; True if one was (the future then ends cancelled).")
      .def("wait", &queued_task::wait,
           "Waits until every task has ended: those a cancel() left running included.");
}

}  // namespace gpupool_python
