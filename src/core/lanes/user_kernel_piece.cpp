#include "core/lanes/user_kernel_piece.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/tracing/nvtx.hpp"

namespace gpupool::detail {

void user_kernel_piece::start(slot_context& slot) {
  const auto& operands = job_->inputs();
  const std::size_t n = operands.size();
  // Array operand i travels through the slot's buffer pair i; scalars stay where they are.
  std::vector<host_part> parts(n);
  std::vector<staged_input> inputs;
  inputs.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const user_operand& in = operands[i];
    if (!in.is_array) continue;
    const std::size_t bytes = count_ * in.element_size;
    parts[i] = {in.data + offset_ * in.element_size, bytes};
    inputs.push_back({static_cast<int>(i), std::span<const host_part>(&parts[i], 1), bytes});
  }
  std::vector<const void*> sources(inputs.size());
  out_part_ = {job_->out() + offset_ * job_->out_element(), bytes_out()};
  output_ = {static_cast<int>(n), std::span<const host_out_part>(&out_part_, 1), bytes_out()};
  std::vector<void*> args = job_->call().launch_args(nullptr);
  start_staged(slot, inputs, sources, output_, [&](std::span<staged_input> on_device, void* out) {
    for (const staged_input& in : on_device) args[static_cast<std::size_t>(in.buffer)] = in.device;
    args[n] = out;
    slot.stamp(slot_context::mark::kernel_begin);
    slot.stream().launch_compiled(job_->kernel(slot.device()), args.data(), count_);
    slot.stamp(slot_context::mark::kernel_end);
  });
}

void user_kernel_piece::finish(slot_context& slot) {
  finish_staged(slot, output_);
}

std::size_t user_kernel_piece::bytes_in() const noexcept {
  std::size_t bytes = 0;
  for (const auto& in : job_->inputs())
    if (in.is_array) bytes += count_ * in.element_size;
  return bytes;
}

std::size_t user_kernel_piece::staged_operand_bytes() const noexcept {
  // A raw kernel's body is the user's: it may do with its pointers what pinned host memory
  // across the bus does not serve (atomics, say), so it always goes the ordinary way.
  if (!job_->operands_only()) return 0;
  // The whole call's, however it was split (see elementwise_piece).
  const std::size_t n = job_->count();
  std::size_t most = n * job_->out_element();
  for (const auto& in : job_->inputs())
    if (in.is_array) most = std::max(most, n * in.element_size);
  return most;
}

void device_batch_piece::start(slot_context& slot) {
  GPUPOOL_NVTX_RANGE("gpupool: enqueue a batch of device calls");
  // The table goes to the GPU from the slot's pinned buffer where it fits (the slot is not
  // reused before this item has ended, so the buffer outlives the copy). From pageable memory
  // CUDA stages the copy and may first wait for the lane's stream to drain: the lane then sat in
  // the driver until its previous batch had run, one batch at a time whatever its slots.
  const std::uint64_t* table = table_.data();
  const std::size_t bytes = table_.size() * sizeof(std::uint64_t);
  if (bytes <= slot.buffer_bytes()) {
    void* pinned = slot.host_buffer(0);
    std::memcpy(pinned, table_.data(), bytes);
    table = static_cast<const std::uint64_t*>(pinned);
  }
  slot.stamp(slot_context::mark::upload_begin);
  slot.stamp(slot_context::mark::kernel_begin);
  slot.stream().launch_compiled_batch(job_->kernel(), table, count_);
  slot.stamp(slot_context::mark::kernel_end);
  slot.stamp(slot_context::mark::download_end);
}

}  // namespace gpupool::detail
