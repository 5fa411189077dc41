// Host arrays and numbers taken from Python (checked at the call, before any work starts), the
// exports held while lanes read them, pinned result blocks, and the future of an array result.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "gpupool/gpupool.hpp"

namespace gpupool_python {

// The exports (Py_buffer or DLPack) of a task's host inputs, held from the call until the task
// has ended: the lanes read the inputs in place, so their owners must not resize or free that
// memory meanwhile. While an export is held a bytearray or array.array refuses to resize
// (BufferError) and NumPy refuses to resize its array, instead of freeing memory a lane reads.
// Released exactly once, by whichever comes first: the task's completion callback (on a lane,
// or on the thread that cancelled it), the future's result()/done(), or the future's end.
class input_exports {
 public:
  explicit input_exports(std::vector<input_array> views) : views_(std::move(views)) {}
  input_exports(const input_exports&) = delete;
  input_exports& operator=(const input_exports&) = delete;
  ~input_exports() { release(); }

  // Any thread, with or without the GIL. The exports are taken out and let go under the GIL, so
  // a thread holding the GIL (result() after the wait) never finds them taken but not yet let
  // go by a lane waiting for the GIL. Once the interpreter is finalizing, taking the GIL could
  // hang or end the thread: leak them instead.
  void release() noexcept {
    {
      std::lock_guard lock(mutex_);
      if (views_.empty()) return;
    }
    if (!interpreter_alive()) {
      std::lock_guard lock(mutex_);
      static_cast<void>(new std::vector<input_array>(std::move(views_)));  // deliberately leaked
      views_.clear();
      return;
    }
    nb::gil_scoped_acquire gil;
    std::vector<input_array> views;
    {
      std::lock_guard lock(mutex_);
      views.swap(views_);
    }
    views.clear();
  }

 private:
  std::mutex mutex_;
  std::vector<input_array> views_;
};

// Pinned memory for one result; returned to gpupool's pinned cache when the last owner (this, or
// the NumPy array it became) lets go.
class pinned_block {
 public:
  explicit pinned_block(std::size_t bytes) : data_(gpupool::allocate_pinned(bytes)) {}
  pinned_block(const pinned_block&) = delete;
  pinned_block& operator=(const pinned_block&) = delete;
  ~pinned_block() { gpupool::deallocate_pinned(data_, 0); }
  [[nodiscard]] void* data() const noexcept { return data_; }

 private:
  void* data_;
};

// The result of a built-in kernel over one array. The result is written by the device straight
// into pinned memory that becomes the NumPy array handed out, so no host copy follows the
// download. Waits without the GIL; keeps the inputs alive until the work is over.
class array_future {
 public:
  // Result in `out`, handed out as a NumPy array of `type` and `shape`.
  // The task reads `inputs` in place: their exports are held until it has ended.
  array_future(gpupool::future<void> f, std::unique_ptr<pinned_block> out, nb::dlpack::dtype type,
               std::vector<std::size_t> shape, nb::object x, nb::object y,
               std::vector<input_array> inputs)
      : future_(std::move(f)),
        out_(std::move(out)),
        type_(type),
        shape_(std::move(shape)),
        x_(std::move(x)),
        y_(std::move(y)),
        inputs_(std::make_shared<input_exports>(std::move(inputs))) {
    // Registered first, so the exports are let go before any caller's done callback runs.
    future_.on_complete([inputs = inputs_](gpupool::future<void>&) { inputs->release(); });
  }
  // Result written into `result`, an array the caller made (on a device), handed out as is.
  array_future(gpupool::future<void> f, nb::object result, nb::object keep_alive)
      : future_(std::move(f)), x_(std::move(keep_alive)), result_(std::move(result)) {}
  array_future(const array_future&) = delete;
  array_future& operator=(const array_future&) = delete;
  ~array_future() {
    // The lanes may still read the inputs and write the output: never let them go before the
    // work is over.
    if (!future_.ready()) {
      future_.cancel();
      nb::gil_scoped_release nogil;
      future_.wait();
    }
    if (inputs_) inputs_->release();
  }

  // The completion callback runs after waiters wake, so a caller that saw the task end lets the
  // exports go itself: once done() or result() says the work is over, the inputs are free.
  bool done() const {
    if (!future_.ready()) return false;
    if (inputs_) inputs_->release();
    return true;
  }
  bool cancel() { return future_.cancel(); }
  bool cancelled() const { return future_.status() == gpupool::task_status::cancelled; }

  // Waits at most `timeout` seconds (forever if None). Raises TimeoutError if not done.
  nb::object result(std::optional<double> timeout) {
    bool finished = true;
    {
      nb::gil_scoped_release nogil;
      if (timeout)
        finished = future_.wait_for(std::chrono::duration<double>(*timeout));
      else
        future_.wait();
    }
    if (!finished) {
      PyErr_SetString(PyExc_TimeoutError, "gpupool: the result was not ready in time");
      throw nb::python_error();
    }
    if (inputs_) inputs_->release();
    future_.get();  // rethrows the task's failure
    if (!result_.is_valid()) result_ = make_array();
    return result_;
  }

  // Calls `callback()` (with the GIL) once the work has ended, possibly right away.
  void add_done_callback(nb::callable callback) {
    auto ref = std::make_shared<py_ref>(callback);
    future_.on_complete([ref](gpupool::future<void>&) {
      if (!interpreter_alive()) return;
      nb::gil_scoped_acquire gil;
      try {
        ref->get()();
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("gpupool: in a done callback");
      }
    });
  }

 private:
  nb::object make_array() {
    pinned_block* block = out_.release();
    nb::capsule owner(block, [](void* p) noexcept { delete static_cast<pinned_block*>(p); });
    return nb::cast(
        nb::ndarray<nb::numpy>(block->data(), shape_.size(), shape_.data(), owner, nullptr, type_));
  }

  gpupool::future<void> future_;
  std::unique_ptr<pinned_block> out_;
  nb::dlpack::dtype type_;
  std::vector<std::size_t> shape_;
  nb::object x_;
  nb::object y_;
  nb::object result_;
  std::shared_ptr<input_exports> inputs_;
};

const char* dtype_name(nb::dlpack::dtype t);
gpupool::dtype dtype_from_name(const std::string& name);
nb::dlpack::dtype dlpack_of(gpupool::dtype t);

// Checks one input at the call, before any work starts.
// `parameter` names a compiled kernel's parameter, which may also take a number.
input_array as_input(nb::handle obj, std::size_t index, const char* which,
                     const std::string& parameter = {});

// A checked host array as a kernel argument (its dtype is checked against the parameter later).
gpupool::kernel_argument argument_of(const input_array& a, const std::string& name);

// What kind of number a value is, as NumPy's casting rules see it.
enum class number_kind { boolean, integer, real, complex };

struct number {
  number_kind kind;
  nb::object value;  // a Python bool, int, float or complex
};

const char* kind_name(number_kind k);
std::optional<number_kind> python_number_kind(PyObject* p);

// `value` as a number if it is one: a Python bool, int, float or complex, or a NumPy scalar or
// 0-d array (whose item() is one of those, of the same kind). Nothing for anything else.
std::optional<number> as_number(nb::handle value);

// A short text of `value` for messages: huge ints are refused by str() (and would flood them).
std::string describe_value(nb::handle value);

// `n` (a number given for `where`, whose type is `type`) as a kernel argument, by NumPy's
// "same_kind" casting rule: a bool becomes any type, an int an int or a float, a float only a
// float; a complex nothing here. A value the type cannot hold is refused (OverflowError), never
// converted out of range: in C++ that would be undefined or silently change the number.
gpupool::kernel_argument scalar_argument(const number& n, gpupool::dtype type,
                                         const std::string& where);

std::vector<std::size_t> shape_of(const input_array& a);

}  // namespace gpupool_python
