// What kind of memory a pointer refers to, and waiting on other libraries' streams: what a front
// end needs to accept arrays that already live on a GPU.
#pragma once

#include <cstdint>

namespace gpupool {

enum class memory_kind {
  unknown,      ///< Not known to CUDA or gpupool: ordinary (pageable) host memory, usually.
  pinned_host,  ///< Page-locked or registered host memory.
  device,       ///< Device memory.
  managed,      ///< Managed (unified) memory.
};

/// The name of `kind`: "unknown", "pinned_host", "device" or "managed".
[[nodiscard]] const char* to_string(memory_kind kind) noexcept;

struct pointer_info {
  memory_kind kind = memory_kind::unknown;
  int device = -1;  ///< CUDA device ordinal for device and managed memory; -1 otherwise.
};

/// Describes `p`. Never throws; on a machine without a usable GPU only gpupool's own pinned
/// memory is recognised. Thread-safe.
[[nodiscard]] pointer_info describe_pointer(const void* p) noexcept;

/// Blocks until all work enqueued so far on a CUDA stream, created by any library, has finished.
/// Takes the CUDA Array Interface's stream values too: 1 is the legacy default stream, 2 the
/// per-thread default stream. Does nothing without a usable GPU.
/// @throw cuda_error if the stream reports a failure.
void wait_for_stream(std::uintptr_t stream);

}  // namespace gpupool
