// Python calls waiting for a lane, and the tasks in gpupool's queue that run them: each
// executor's FIFOs of queued calls (ordered by priority, with the queue's aging) and the lanes'
// chains of calls in one hold of the GIL. Each call's future is completed as futures.hpp does.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// The Python calls of one executor waiting for a lane, one FIFO per target (any device, or each
// device for submit_to).
class python_calls;
std::shared_ptr<python_calls> make_python_calls(std::size_t devices);
// Before a shutdown that cancels what has not started: a lane runs only the call it takes.
void stop_running_python_calls(python_calls& calls) noexcept;
// Whether a lane runs the calls queued behind the one it takes (off while tracing).
void chain_python_calls(python_calls& calls, bool on) noexcept;

// Queues `fn(*args, **kwargs)` on a lane of `exec` (of `device` if given); `future` (a
// concurrent.futures.Future) gets its outcome, as ThreadPoolExecutor's workers hand it over: the
// lane calls set_running_or_notify_cancel() (skipping a cancelled call) and set_result() or
// set_exception(). That happens in the one hold of the GIL that runs the call when the lane's
// stream holds no unfinished work by then (always on the CPU backend; on CUDA when the call
// waited for its work); otherwise once the stream has finished it, handed over in bulk.
// `runner`, if not None, is called as runner(fn, args, kwargs) instead of fn on CUDA lanes (it
// makes the lane's stream current for CuPy and PyTorch); after the call the lane's device is
// made current again. A call cancelled in the queue (shutdown) ends its future cancelled,
// waiters notified; a lane failure after the call ran (a CUDA error) ends it with that error.
//
// The call joins its FIFO in `calls` and queues one task in gpupool's queue. A lane running such
// a task takes the oldest call of the FIFO and, in the same hold of the GIL, the calls queued
// behind it (up to python_calls::chain_length; one while tracing): consecutive Python calls then
// cost one hold of the GIL, as a ThreadPoolExecutor worker takes its next call without letting
// the GIL go. The chain stops after a call whose outcome waits for the stream (it is handed over
// when the task ends, and a call behind it might wait for it), and before a call when work of a
// higher priority than that call's waits for the lane (executor::work_waits_above). A task whose
// call another lane already ran finds the FIFO empty and ends without the GIL; one that ends
// without running (cancelled, or failed before it started) ends one call of its FIFO the same way.
// So every call ends exactly once.
//
// `options.priority` (else the executor's) orders the call: its task in gpupool's queue, and the
// call in its FIFO, which gives a lane the oldest call of the highest priority queued.
void submit_python_call(gpupool::executor& exec, std::optional<int> device, nb::handle fn,
                        nb::handle args, nb::handle kwargs, nb::handle future, nb::handle runner,
                        const std::shared_ptr<python_calls>& calls,
                        const gpupool::task_options& options = {});

// Waits (without the GIL) until no task of `calls` is still to end beyond the calls still to end
// (a task whose call another lane ran ends soon after), so that what the core records at a
// task's end (its trace record) is there once the futures of the calls are done. Gives up after
// two seconds (lanes held by calls that do not return).
void wait_for_surplus_python_tasks(python_calls& calls);

}  // namespace gpupool_python
