// Exception types thrown by gpupool.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

namespace gpupool {

/// Base of every gpupool-specific exception.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A CUDA runtime call failed. Carries the CUDA error name, the failing call's text and where it
/// was made; it fails the task that made the call, not the process.
class cuda_error : public error {
 public:
  cuda_error(int code, std::string name, std::string description, std::string call,
             std::string file, int line);

  /// The numeric `cudaError_t` value.
  [[nodiscard]] int code() const noexcept { return code_; }
  /// The error's name, e.g. `cudaErrorMemoryAllocation`.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// The source text of the failing call.
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  [[nodiscard]] const std::string& file() const noexcept { return file_; }
  [[nodiscard]] int line() const noexcept { return line_; }

 private:
  int code_;
  std::string name_;
  std::string call_;
  std::string file_;
  int line_;
};

/// A device memory request exceeded the device's configured budget or its free memory.
class out_of_memory : public error {
 public:
  using error::error;
};

/// A device can run nothing more. A task may throw it to take its device out of service (the
/// executor goes on with the devices left); gpupool raises it for work that only a device out of
/// service could have run, and for all queued and new work after a sticky CUDA error (an illegal
/// address), which ends CUDA on every device of the process (see the README's "Guarantees").
class device_fault : public error {
 public:
  using error::error;
};

/// Thrown by `future::get()` for a task that was cancelled before it started.
class cancelled_error : public error {
 public:
  using error::error;
};

/// The requested backend is not available (e.g. `GPUPOOL_BACKEND=cuda` without a usable GPU).
class backend_unavailable : public error {
 public:
  using error::error;
};

/// A scalar argument of a kind its parameter does not take under NumPy's "same_kind" casting
/// rule: a floating-point value (including NaN and infinities) for an integer parameter. The
/// message names the kernel, the argument and both types. (std::invalid_argument, as the other
/// checks of a call are.)
class argument_kind_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A scalar argument outside the range of its parameter's type (2**40 for an int32, 1e300 for a
/// float32): refused rather than wrapped, truncated or made infinite. The message names the
/// kernel, the argument, its value and the type's range.
class argument_range_error : public std::overflow_error {
 public:
  using std::overflow_error::overflow_error;
};

/// A call of executor::map_on_device refused by its checks. what() is the reason followed by
/// " (call N)"; call() is N, the call's index in the vector given, and reason() the message
/// without it (for a caller that numbers the calls its own way). The check's own error (an
/// argument_kind_error, an argument_range_error, ...) is nested in it: std::rethrow_if_nested
/// throws it.
class call_error : public std::invalid_argument {
 public:
  call_error(std::size_t call, const std::string& reason)
      : std::invalid_argument(reason + " (call " + std::to_string(call) + ")"),
        call_(call),
        reason_(std::make_shared<const std::string>(reason)) {}
  [[nodiscard]] std::size_t call() const noexcept { return call_; }
  [[nodiscard]] const std::string& reason() const noexcept { return *reason_; }

 private:
  std::size_t call_;
  std::shared_ptr<const std::string> reason_;  // shared: copying an exception must not throw
};

}  // namespace gpupool
