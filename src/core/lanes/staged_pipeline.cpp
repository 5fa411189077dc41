#include "core/lanes/staged_pipeline.hpp"

#include <cstring>
#include <utility>

#include "core/memory/pinned_cache.hpp"
#include "gpupool/pinned.hpp"

namespace gpupool::detail {
namespace {

// The least average length of an output's runs (below) downloaded a copy each: below it, one
// download into the slot's buffer and a scatter are taken to cost the host less than a copy call
// per run (an estimate of a copy call's host cost, not a measurement).
constexpr std::size_t least_bytes_per_download = std::size_t{32} << 10;

// Whether one copy may read or write `bytes` from `data` in place: a whole part in pinned memory
// (of whatever allocation), or a run of parts end to end inside one of gpupool's own pinned
// blocks (results of calls queued together that share a slab, say). A run across two blocks that
// happen to be neighbours is not one allocation to the driver.
bool copies_in_place(const void* data, std::size_t bytes, bool one_part) {
  return one_part ? gpupool::is_pinned(data) : process_pinned_cache().owns_run(data, bytes);
}

// The parts from `first` on laid end to end: how many, and their bytes.
template <class Part>
std::pair<std::size_t, std::size_t> run_from(std::span<const Part> parts, std::size_t first) {
  const auto* at = static_cast<const char*>(static_cast<const void*>(parts[first].data));
  std::size_t i = first, bytes = 0;
  for (; i < parts.size() && static_cast<const void*>(parts[i].data) == at + bytes; ++i)
    bytes += parts[i].bytes;
  return {i - first, bytes};
}

}  // namespace

void stage_inputs(slot_context& slot, std::span<staged_input> inputs,
                  std::span<const void*> sources) {
  const double began = slot.trace_clock();
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const staged_input& in = inputs[k];
    if (!in.parts.empty() && run_from(in.parts, 0).first == in.parts.size() &&
        copies_in_place(in.parts[0].data, in.bytes, in.parts.size() == 1)) {
      sources[k] = in.parts[0].data;  // one pinned run: the upload reads it in place
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
  const std::span<const host_out_part> parts = output.parts;
  // The runs counted first (pointers compared alone), then asked whether they are pinned.
  std::size_t runs = 0;
  for (std::size_t i = 0; i < parts.size(); ++runs) i += run_from(parts, i).first;
  bool in_place = runs == 1 || (runs > 1 && runs * least_bytes_per_download <= output.bytes);
  for (std::size_t i = 0; in_place && i < parts.size();) {
    const auto [count, bytes] = run_from(parts, i);
    in_place = copies_in_place(parts[i].data, bytes, count == 1);
    i += count;
  }
  output.staged = !in_place;
  if (output.staged) {
    slot.stream().copy_to_host(slot.host_buffer(output.buffer), output.device, output.bytes);
  } else {
    // A download per run, straight into it.
    const auto* from = static_cast<const char*>(output.device);
    for (std::size_t i = 0; i < parts.size();) {
      const auto [count, bytes] = run_from(parts, i);
      slot.stream().copy_to_host(parts[i].data, from, bytes);
      from += bytes;
      i += count;
    }
  }
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
