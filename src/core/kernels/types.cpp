// Names and sizes of the public value types, and the exception types' constructors.
#include <stdexcept>
#include <string>
#include <utility>

#include "gpupool/error.hpp"
#include "gpupool/types.hpp"

namespace gpupool {

std::size_t detail::checked_bytes(std::size_t count, std::size_t size, const char* what) {
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(count, size, &bytes))
    throw std::length_error(std::string("gpupool: ") + what + ": " + std::to_string(count) +
                            " elements of " + std::to_string(size) +
                            " bytes are more bytes than memory can hold");
  return bytes;
}

std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::float32:
      return 4;
    case dtype::float64:
      return 8;
    case dtype::int32:
      return 4;
    case dtype::int64:
      return 8;
  }
  return 0;
}

const char* to_string(dtype t) noexcept {
  switch (t) {
    case dtype::float32:
      return "float32";
    case dtype::float64:
      return "float64";
    case dtype::int32:
      return "int32";
    case dtype::int64:
      return "int64";
  }
  return "unknown";
}

const char* to_string(backend_kind b) noexcept {
  return b == backend_kind::cuda ? "cuda" : "cpu";
}

const char* kernel::name() const noexcept {
  switch (op_) {
    case op::square:
      return "square";
    case op::scale:
      return "scale";
    case op::add:
      return "add";
    case op::axpy:
      return "axpy";
  }
  return "unknown";
}

cuda_error::cuda_error(int code, std::string name, std::string description, std::string call,
                       std::string file, int line)
    : error(name + " (" + description + ") in " + call + " at " + file + ":" +
            std::to_string(line)),
      code_(code),
      name_(std::move(name)),
      call_(std::move(call)),
      file_(std::move(file)),
      line_(line) {}

}  // namespace gpupool
