// Bulk handover of outcomes to Python futures (see completions.hpp).
#include "completions.hpp"

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "gpupool/fork.hpp"
#include "gpupool/future.hpp"

namespace gpupool_python {
namespace {

struct handover_queue {
  std::mutex mutex;
  std::vector<handover> pending;
  bool draining = false;  // a thread is waiting for the GIL to run `pending`
};

// Lanes may post after static destruction has begun, so it is never destroyed. A fork()ed child
// gets a fresh one: the parent's may have been left mid-drain (`draining` set by a lane waiting
// for the GIL, its mutex even held) by a thread the child does not have, and then nothing would
// ever be handed over in the child.
gpupool::fork_fresh<handover_queue> the_queue;

handover_queue& queue() {
  return the_queue.get();
}

struct kept_thread_state {
  kept_thread_state() : state(PyGILState_Ensure()), saved(PyEval_SaveThread()) {}
  kept_thread_state(const kept_thread_state&) = delete;
  kept_thread_state& operator=(const kept_thread_state&) = delete;
  ~kept_thread_state() {
    if (!interpreter_alive()) return;  // leaked with the interpreter
    PyEval_RestoreThread(saved);
    PyGILState_Release(state);
  }
  PyGILState_STATE state;
  PyThreadState* saved;
};

}  // namespace

void keep_python_thread_state() {
  if (PyGILState_GetThisThreadState() != nullptr || !interpreter_alive()) return;
  thread_local kept_thread_state kept;
}

namespace {

// Handovers running on this thread now (drain nests when one posts another).
thread_local int handing_over = 0;

// Takes the GIL and runs every queued handover until none is left. Called by the thread that
// set `draining` (under the queue's lock, after queuing its own).
void drain(handover_queue& q) {
  std::vector<handover> batch;
  if (!interpreter_alive()) {
    std::lock_guard lock(q.mutex);
    static_cast<void>(new std::vector<handover>(std::move(q.pending)));  // deliberately leaked
    q.pending.clear();
    q.draining = false;
    return;
  }
  keep_python_thread_state();
  nb::gil_scoped_acquire gil;
  {
    // What queued while this thread waited for the GIL is handed over now, in one go. The queue
    // is free again before any of it runs: a handover may run a done callback that waits for
    // another task, whose outcome must then find a thread to hand it over, not this one.
    std::lock_guard lock(q.mutex);
    batch.swap(q.pending);
    q.draining = false;
  }
  // While handovers run here, what they post (a done callback submitting and waiting for more
  // work, whose outcome may arrive on this very thread) is handed over at once, never deferred
  // to the end of a completion pass this thread is still inside: that would wait for itself.
  struct running_handovers {
    running_handovers() { ++handing_over; }
    ~running_handovers() { --handing_over; }
    running_handovers(const running_handovers&) = delete;
    running_handovers& operator=(const running_handovers&) = delete;
  } running;
  for (auto& run : batch) {
    // One handover that fails (out of memory making its result, say) must not strand the rest.
    try {
      run();
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("gpupool: handing a task's outcome over");
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      PyErr_WriteUnraisable(nullptr);
    }
  }
  batch.clear();  // their Python objects are released here, with the GIL
}

// The handovers of the completion pass open on this thread (a lane's), queued together when it
// ends. Queuing each at once would make the pass's first one take the GIL in the middle of the
// pass, and often each later one take it again: one acquisition per pass instead.
thread_local std::vector<handover> pass_handovers;

void hand_over_pass(void* /*unused*/) {
  auto& q = queue();
  {
    std::lock_guard lock(q.mutex);
    if (q.pending.empty()) {
      q.pending.swap(pass_handovers);
    } else {
      for (auto& h : pass_handovers) q.pending.push_back(std::move(h));
      pass_handovers.clear();
    }
    if (q.draining) return;  // the thread draining takes them with the rest
    q.draining = true;
  }
  drain(q);
}

}  // namespace

void post_handover(handover h) {
  if (handing_over == 0 && gpupool::detail::completion_batch::open()) {
    // The first of the pass has the batch hand them all over at its end.
    if (pass_handovers.empty())
      static_cast<void>(gpupool::detail::completion_batch::defer(&hand_over_pass, nullptr));
    pass_handovers.push_back(std::move(h));
    return;
  }
  auto& q = queue();
  {
    std::lock_guard lock(q.mutex);
    q.pending.push_back(std::move(h));
    if (q.draining) return;  // the thread draining takes it with the rest
    q.draining = true;
  }
  drain(q);
}

nb::object fetch_raised_exception() {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr && value != nullptr) PyException_SetTraceback(value, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  return nb::steal(value);
}

}  // namespace gpupool_python
