#include "core/lanes/user_kernel_piece.hpp"

#include <cstring>

#include "core/lanes/lane_worker.hpp"
#include "core/lanes/staging.hpp"
#include "core/tracing/nvtx.hpp"
#include "gpupool/error.hpp"
#include "gpupool/pinned.hpp"

namespace gpupool::detail {

void user_kernel_piece::start(lane& l, int slot) {
  GPUPOOL_NVTX_RANGE("gpupool: stage in, enqueue upload/kernel/download");
  auto& w = static_cast<lane_worker&>(l);
  const auto& inputs = job_->inputs();
  const int n = static_cast<int>(inputs.size());
  std::vector<const void*> from(inputs.size());

  const double staging_began = w.traced(slot) ? w.now_us() : 0.0;
  for (int i = 0; i < n; ++i) {
    const user_operand& in = inputs[static_cast<std::size_t>(i)];
    if (in.is_array)
      from[static_cast<std::size_t>(i)] =
          stage(w, slot, i, in.data + offset_ * in.element_size, count_ * in.element_size);
  }
  w.trace_stage_in(slot, staging_began);

  // The kernel reads the slot's device buffers: arrays start there, scalars stay as they are.
  std::vector<void*> args = job_->call().launch_args(nullptr);
  w.trace_mark(slot, lane_worker::mark::upload_begin);
  for (int i = 0; i < n; ++i) {
    const user_operand& in = inputs[static_cast<std::size_t>(i)];
    if (in.is_array) {
      void* device = w.slot_device(slot, i);
      w.stream().copy_to_device(device, from[static_cast<std::size_t>(i)],
                                count_ * in.element_size);
      args[static_cast<std::size_t>(i)] = device;
    }
  }
  w.trace_mark(slot, lane_worker::mark::kernel_begin);
  void* result = w.slot_device(slot, n);
  args[static_cast<std::size_t>(n)] = result;
  w.stream().launch_compiled(job_->kernel(w.device()), args.data(), count_);
  w.trace_mark(slot, lane_worker::mark::kernel_end);

  out_ = job_->out() + offset_ * job_->out_element();
  staged_output_ = !is_pinned(out_);
  w.stream().copy_to_host(staged_output_ ? w.slot_host(slot, n) : out_, result, bytes_out());
  w.trace_mark(slot, lane_worker::mark::download_end);
}

void user_kernel_piece::finish(lane& l, int slot) {
  GPUPOOL_NVTX_RANGE("gpupool: stage out");
  if (!staged_output_) return;
  auto& w = static_cast<lane_worker&>(l);
  const double began = w.traced(slot) ? w.now_us() : 0.0;
  std::memcpy(out_, w.slot_host(slot, static_cast<int>(job_->inputs().size())), bytes_out());
  w.trace_stage_out(slot, began);
}

std::size_t user_kernel_piece::bytes_in() const noexcept {
  std::size_t bytes = 0;
  for (const auto& in : job_->inputs())
    if (in.is_array) bytes += count_ * in.element_size;
  return bytes;
}

void device_batch_piece::start(lane& l, int slot) {
  GPUPOOL_NVTX_RANGE("gpupool: enqueue a batch of device calls");
  auto& w = static_cast<lane_worker&>(l);
  w.trace_mark(slot, lane_worker::mark::upload_begin);
  w.trace_mark(slot, lane_worker::mark::kernel_begin);
  w.stream().launch_compiled_batch(job_->kernel(), table_.data(), count_);
  w.trace_mark(slot, lane_worker::mark::kernel_end);
  w.trace_mark(slot, lane_worker::mark::download_end);
}

}  // namespace gpupool::detail
