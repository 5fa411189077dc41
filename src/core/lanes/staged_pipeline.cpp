#include "core/lanes/staged_pipeline.hpp"

#include <cstring>

#include "gpupool/pinned.hpp"

namespace gpupool::detail {

void stage_inputs(slot_context& slot, std::span<staged_input> inputs,
                  std::span<const void*> sources) {
  const double began = slot.trace_clock();
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const staged_input& in = inputs[k];
    if (in.parts.size() == 1 && is_pinned(in.parts[0].data)) {
      sources[k] = in.parts[0].data;  // pinned already: the upload reads it in place
      continue;
    }
    auto* staging = static_cast<char*>(slot.host_buffer(in.buffer));
    std::size_t at = 0;
    for (const host_part& p : in.parts) {
      std::memcpy(staging + at, p.data, p.bytes);
      at += p.bytes;
    }
    sources[k] = staging;
  }
  slot.stage_in(began);
}

void stage_express(slot_context& slot, std::span<staged_input> inputs, staged_output& output) {
  // Always into the slot's own buffers, even from pinned memory: those are the pinned blocks
  // the backend allocated itself, which its kernels are known to reach.
  const double began = slot.trace_clock();
  for (staged_input& in : inputs) {
    auto* staging = static_cast<char*>(slot.host_buffer(in.buffer));
    std::size_t at = 0;
    for (const host_part& p : in.parts) {
      std::memcpy(staging + at, p.data, p.bytes);
      at += p.bytes;
    }
    in.device = staging;
  }
  slot.stage_in(began);
  output.device = slot.host_buffer(output.buffer);
  output.staged = true;
}

void upload_inputs(slot_context& slot, std::span<staged_input> inputs,
                   std::span<const void* const> sources) {
  for (auto& in : inputs) in.device = slot.device_buffer(in.buffer);
  slot.stamp(slot_context::mark::upload_begin);
  for (std::size_t k = 0; k < inputs.size(); ++k)
    slot.stream().copy_to_device(inputs[k].device, sources[k], inputs[k].bytes);
}

void download_output(slot_context& slot, staged_output& output) {
  output.staged = !(output.parts.size() == 1 && is_pinned(output.parts[0].data));
  void* to = output.staged ? slot.host_buffer(output.buffer) : output.parts[0].data;
  slot.stream().copy_to_host(to, output.device, output.bytes);
  slot.stamp(slot_context::mark::download_end);
}

void finish_staged(slot_context& slot, const staged_output& output) {
  if (!output.staged) return;
  GPUPOOL_NVTX_RANGE("gpupool: stage out");
  const double began = slot.trace_clock();
  const auto* from = static_cast<const char*>(slot.host_buffer(output.buffer));
  for (const host_out_part& p : output.parts) {
    std::memcpy(p.data, from, p.bytes);
    from += p.bytes;
  }
  slot.stage_out(began);
}

}  // namespace gpupool::detail
