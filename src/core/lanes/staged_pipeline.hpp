// The one path every host-array piece takes through a slot: inputs staged into pinned memory
// (gathered when an operand is several host parts), one upload per input operand, a launch step,
// one download of the output (scattered back to its host parts after the stream passed it).
// Operands already in pinned memory skip the staging copy: an input in one pinned run is
// uploaded from it, an output in long enough pinned runs is downloaded into them, a copy each.
// A piece only says what its operands are and how to launch; this does the rest.
#pragma once

#include <cstddef>
#include <span>
#include <utility>

#include "core/lanes/slot_context.hpp"
#include "core/tracing/nvtx.hpp"

namespace gpupool::detail {

/// A run of host memory one operand reads from or writes to.
struct host_part {
  const void* data = nullptr;
  std::size_t bytes = 0;
};
struct host_out_part {
  void* data = nullptr;
  std::size_t bytes = 0;
};

/// An array input: its host parts, laid end to end in the slot's buffer pair `buffer`.
struct staged_input {
  int buffer = 0;
  std::span<const host_part> parts;
  std::size_t bytes = 0;   ///< The parts' total.
  void* device = nullptr;  ///< Set by the pipeline: where the launch step finds it.
};

/// The output: on the device in the slot's buffer `buffer` (an input's buffer when the kernel
/// works in place), coming back to its host parts.
struct staged_output {
  int buffer = 0;
  std::span<const host_out_part> parts;
  std::size_t bytes = 0;
  void* device = nullptr;  ///< Set by the pipeline before the launch step.
  bool staged = false;     ///< Set by the pipeline: waits in the pinned buffer for `finish`.
};

/// Host side, before the uploads: each input's source for its upload (the input itself where it
/// is one pinned run: a pinned part, or parts end to end in one of gpupool's pinned blocks; else
/// the slot's pinned buffer, filled here). Traces the stage-in.
void stage_inputs(slot_context& slot, std::span<staged_input> inputs,
                  std::span<const void*> sources);
/// One upload per input, into the slot's device buffers; stamps the upload's start.
void upload_inputs(slot_context& slot, std::span<staged_input> inputs,
                   std::span<const void* const> sources);
/// The output downloaded: straight into it where its parts make pinned runs (as for inputs) few
/// enough for their lengths, a download per run; else once, into the slot's pinned buffer.
/// Stamps the download's end.
void download_output(slot_context& slot, staged_output& output);

/// The express slot's path: every input gathered into the slot's pinned buffers, where the kernel
/// reads it, and the output left there for `finish`; the upload and download marks are stamped
/// around the kernel's, so that a trace shows both as taking no time.
void stage_express(slot_context& slot, std::span<staged_input> inputs, staged_output& output);

/// Enqueues the whole path; `launch(inputs, output)` enqueues the kernel (and, when it does not
/// stamp them itself, the kernel marks). `sources` is scratch of `inputs.size()` entries. In the
/// express slot nothing is copied to or from the device (stage_express).
template <class Launch>
void start_staged(slot_context& slot, std::span<staged_input> inputs,
                  std::span<const void*> sources, staged_output& output, Launch&& launch) {
  if (slot.express()) {
    GPUPOOL_NVTX_RANGE("gpupool: stage in, enqueue an express kernel");
    stage_express(slot, inputs, output);
    slot.stamp(slot_context::mark::upload_begin);
    std::forward<Launch>(launch)(std::as_const(inputs), output.device);
    slot.stamp(slot_context::mark::download_end);
    return;
  }
  GPUPOOL_NVTX_RANGE("gpupool: stage in, enqueue upload/kernel/download");
  // Every input is staged first, so that the uploads go out back to back.
  stage_inputs(slot, inputs, sources);
  upload_inputs(slot, inputs, sources);
  output.device = slot.device_buffer(output.buffer);
  std::forward<Launch>(launch)(std::as_const(inputs), output.device);
  download_output(slot, output);
}

/// After the stream passed the slot's item: the output scattered from the pinned buffer to its
/// host parts, when it was staged.
void finish_staged(slot_context& slot, const staged_output& output);

}  // namespace gpupool::detail
