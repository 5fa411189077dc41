// Handing task outcomes over to Python futures in bulk: whatever completes while the GIL is being
// waited for is handed over under that one acquisition, not one acquisition per future.
#pragma once

#include <functional>

#include "common.hpp"

namespace gpupool_python {

// Runs with the GIL held; must not throw (it reports its own Python errors as unraisable).
using handover = std::function<void()>;

// Queues `h` and, unless another thread is already handing outcomes over, takes the GIL and runs
// every queued handover until none is left. Any thread, without the GIL (a lane, or a thread
// that cancelled a task). Inside a completion pass (a gpupool::detail::completion_batch open on
// this thread, as on a lane completing its ready tasks) that happens once, when the pass ends,
// for every handover the pass posted. Once the interpreter is finalizing, handovers are dropped
// unrun and the Python objects they hold are leaked rather than released without a live
// interpreter.
void post_handover(handover h);

// The exception object of the Python error being raised (the error indicator), which it clears;
// its traceback is kept on it. With the GIL held, and an error set.
nb::object fetch_raised_exception();

}  // namespace gpupool_python
