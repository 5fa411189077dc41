// Host memory as a backend provides it: where pinned blocks come from, what a pointer refers to,
// waiting for a backend's stream. The core (the pinned cache, describe_pointer) is written against
// this alone; src/cuda/ implements it with the CUDA runtime, src/cpu/ with ordinary host memory.
// RMM's memory resources are the model: one class per kind of memory behind one small interface.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpupool/pointer.hpp"

namespace gpupool::detail {

/// Where gpupool's pinned blocks start and end: every block is a whole number of pages, so the
/// allocator never needs more than this alignment from a resource.
inline constexpr std::size_t host_page_bytes = 4096;

/// A source of one kind of memory. Allocation may be slow (page-locking takes driver-wide
/// locks): the core caches what it gets. Thread-safe.
class memory_resource {
 public:
  memory_resource() = default;
  memory_resource(const memory_resource&) = delete;
  memory_resource& operator=(const memory_resource&) = delete;
  virtual ~memory_resource() = default;

  /// `bytes` (a multiple of host_page_bytes) of memory aligned to host_page_bytes.
  /// @throw std::bad_alloc when it cannot be had.
  [[nodiscard]] virtual void* allocate(std::size_t bytes) = 0;
  /// Gives back a block from `allocate` of `bytes`. Never throws (at process exit the runtime may
  /// already be gone; nothing is left to free then).
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
};

/// The host side of one backend. Thread-safe.
class host_memory {
 public:
  host_memory() = default;
  host_memory(const host_memory&) = delete;
  host_memory& operator=(const host_memory&) = delete;
  virtual ~host_memory() = default;

  /// Where pinned (page-locked, usable by every device) host blocks come from.
  [[nodiscard]] virtual memory_resource& pinned() noexcept = 0;
  /// What the backend knows of `p`: its kind and, for device and managed memory, its device.
  /// gpupool's own pinned blocks never get here (the core answers for them without asking).
  /// Never throws: anything the backend cannot describe is memory_kind::unknown.
  [[nodiscard]] virtual pointer_info describe(const void* p) const noexcept = 0;
  /// Blocks until all work enqueued so far on `stream` (a stream of this backend made by any
  /// library, as an integer) has finished. @throw cuda_error if the stream reports a failure.
  virtual void wait_for_stream(std::uintptr_t stream) = 0;
};

/// The host memory this process uses: the one of the backend GPUPOOL_BACKEND names when that
/// backend can run, else the one of the first backend that can run (CUDA, then the CPU). Chosen
/// once per process, before the first pinned block, and once more in a fork()ed child (where CUDA
/// started by the parent cannot run); never throws.
[[nodiscard]] host_memory& process_host_memory() noexcept;

}  // namespace gpupool::detail
