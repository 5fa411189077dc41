// Executor.map over a built-in kernel and host arrays, without a Python future per call (see
// kernel_map.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "arrays.hpp"
#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// One call of a built-in kernel, its arrays checked (TypeError or ValueError naming the array)
// and held (read_host_array) while lanes read them.
struct checked_kernel_call {
  host_array x;
  std::optional<host_array> y;  // the second array of a two-input kernel
  gpupool::dtype type;
};

// Checks call `index`'s arrays. `alpha_checked` lists the element types the kernel's alpha has
// been checked against (it is checked once per type, and the list grows).
checked_kernel_call check_kernel_call(nb::handle kernel_object, const gpupool::builtin_kernel& k,
                                      nb::handle x, nb::handle y, std::size_t index,
                                      std::vector<gpupool::dtype>& alpha_checked);

// Call `index`'s output as given by the caller (`Executor.submit(kernel, x, out=...)`): a
// numpy.ndarray it may write (read_writable_host_array), of the call's dtype and shape, that is
// one of the call's inputs (in place) or apart from both: a call reads its input piece by piece
// as it writes, so a partial overlap would read what it already wrote.
host_array read_output_array(nb::handle obj, const checked_kernel_call& call, std::size_t index);

// The arrays of a built-in kernel's calls, checked before any work starts.
std::vector<checked_kernel_call> check_kernel_inputs(nb::handle kernel_object,
                                                     const gpupool::builtin_kernel& k,
                                                     nb::sequence xs,
                                                     std::optional<nb::sequence> ys);

// How far a map runs ahead of its consumer: the calls queued and not yet handed on, and their
// input and result bytes. A call is always queued when nothing is, however large it is.
struct map_window {
  std::size_t calls = SIZE_MAX;
  std::size_t bytes = SIZE_MAX;
};

// The results of one map, in input order (Python: an iterator). Calls are queued while they fit
// the window, and more as results are handed on: memory does not grow with the map's length.
// Each result, a NumPy array in pinned memory, is handed on once and not kept. The small results
// of calls queued together share a pinned slab, exported to NumPy once, and each is a view of it
// (see allocate_results): a result kept alone keeps its slab alive. The inputs are
// either a list checked whole at the call (`xs`, `ys` sequences), or iterators read lazily as
// the window has room (each array checked as it is read). As concurrent.futures' map: a
// failure, a cancelled call, the timeout or Ctrl-C during a wait raises and cancels every call
// not yet started, and so does dropping the iterator early; the arrays of calls a lane had
// started are kept until those end.
class kernel_map {
 public:
  // `timeout`: seconds from now for every result (None: no limit). With `lazy`, `xs` and `ys`
  // are iterators; otherwise sequences.
  kernel_map(gpupool::executor& exec, nb::handle kernel_object, const gpupool::builtin_kernel& k,
             nb::object xs, std::optional<nb::object> ys, std::optional<double> timeout,
             map_window window, bool lazy, gpupool::task_options options = {});
  kernel_map(const kernel_map&) = delete;
  kernel_map& operator=(const kernel_map&) = delete;
  ~kernel_map();

  // The next result; StopIteration at the end.
  nb::object next();
  // Cancels every call not yet started; the iteration ends.
  void cancel_rest() noexcept;
  // cancel_rest() for Python: refused (ValueError) while another thread is in next().
  void cancel_from_python();
  // Queues every call the window has not (the executor is shutting down, and concurrent.futures
  // runs a map's every call, read or not); nothing for a lazy map, or while next() runs.
  void queue_rest();
  // Calls not yet handed on, of those known (a lazy map's unread inputs are not).
  [[nodiscard]] std::size_t remaining() const noexcept;
  // The window's use now: calls queued and not handed on, and their bytes.
  [[nodiscard]] std::size_t queued_calls() const noexcept { return queued_.size(); }
  [[nodiscard]] std::size_t queued_bytes() const noexcept { return queued_bytes_; }

 private:
  struct queued_call {
    host_array x;
    std::optional<host_array> y;
    // The block the result is written into: its own, or a slab that other calls share.
    std::shared_ptr<pinned_block> result;
    std::size_t offset = 0;         // where in the slab the result starts, in elements
    std::size_t slab_elements = 0;  // the slab's length in elements; 0 when the block is its own
    // In a slab of results of one shape, exported as an array of them: this result's row in it,
    // and how many rows the slab has (0: the slab is exported flat, each result a slice).
    std::uint32_t row = 0;
    std::uint32_t slab_rows = 0;
    gpupool::future<void> future;
    std::size_t bytes = 0;
  };

  // The next call's arrays, checked, or nothing at the end of the inputs (with the GIL).
  std::optional<checked_kernel_call> read_call();
  // Gives the calls queued_[first...] their result blocks (slabs for runs of small results).
  void allocate_results(std::size_t first);
  // Whether the window has room for a slab's worth of calls (or half of a smaller window): a
  // full window is topped up once that is free, not at every result, so that small results
  // refilled as the consumer takes them still share slabs.
  [[nodiscard]] bool room_for_a_slab() const noexcept;
  // Call `q`'s result, handed on: a NumPy array over its block, or a view of its slab's array.
  nb::object result_of(const queued_call& q);
  // Queues calls while the window has room (with the GIL; let go while queueing).
  void top_up();
  // Waits, the GIL let go, while another thread's top_up queues (queue_rest at a shutdown,
  // beside the consumer's next()).
  void wait_while_queueing();
  void cancel_queued() noexcept;

  gpupool::executor& exec_;
  gpupool::task_options options_;  // every call's (its priority)
  nb::object kernel_object_;
  const gpupool::builtin_kernel& kernel_;
  map_window window_;
  bool lazy_;
  // Eager inputs: checked at the call, taken from the front as they are queued.
  std::vector<checked_kernel_call> inputs_;
  std::size_t read_ = 0;
  // Lazy inputs: the iterators, and the element types the alpha has been checked against.
  nb::object x_iter_, y_iter_;
  std::vector<gpupool::dtype> alpha_checked_;
  std::optional<checked_kernel_call> lookahead_;  // read, not yet queued (the window was full)
  bool inputs_done_ = false;

  std::deque<queued_call> queued_;
  // The futures of the last results handed on. A lane may still hold a finished task's state
  // for a moment after it is ready; letting go of ours then would leave the lane to free it,
  // across threads. Kept until they are `kept_handed_on` results old.
  std::deque<gpupool::future<void>> handed_futures_;
  std::size_t queued_bytes_ = 0;
  // The slab of the last result handed on, exported to NumPy (results are views of it), and its
  // block: the array keeps the block alive, so the address names no other block meanwhile.
  nb::object slab_array_;
  const pinned_block* slab_block_ = nullptr;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  std::size_t handed_on_ = 0;
  bool done_ = false;
  bool busy_ = false;      // a next() is waiting, with the GIL let go
  bool queueing_ = false;  // a top_up is queueing, with the GIL let go
};

void bind_kernel_map(nb::module_& m);

}  // namespace gpupool_python
