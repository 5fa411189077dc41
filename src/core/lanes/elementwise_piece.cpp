#include "core/lanes/elementwise_piece.hpp"

#include <cstring>

#include "core/kernels/elementwise_math.hpp"
#include "core/lanes/lane_worker.hpp"
#include "core/lanes/staging.hpp"
#include "core/tracing/nvtx.hpp"
#include "gpupool/error.hpp"
#include "gpupool/pinned.hpp"

namespace gpupool::detail {

void require_alpha_fits(const kernel& k, dtype t) {
  if (k.operation() != op::scale && k.operation() != op::axpy) return;  // alpha unused
  dispatch_elementwise(k.operation(), t,
                       [&]<op O, class T>() { (void)alpha_as<T>(k.alpha(), k.name()); });
}

void elementwise_piece::start(lane& l, int slot) {
  GPUPOOL_NVTX_RANGE("gpupool: stage in, enqueue upload/kernel/download");
  auto& w = static_cast<lane_worker&>(l);
  const std::size_t element = size_of(job_->type());
  const std::size_t bytes = count_ * element;
  const std::size_t skip = offset_ * element;
  const bool two_inputs = job_->kern().arity() == 2;
  const auto* x_host = static_cast<const char*>(job_->x()) + skip;
  const auto* y_host = two_inputs ? static_cast<const char*>(job_->y()) + skip : nullptr;
  void* x = w.slot_device(slot, 0);
  void* y = two_inputs ? w.slot_device(slot, 1) : nullptr;

  // Stage both inputs into pinned memory first, so that the uploads go out back to back.
  const double staging_began = w.traced(slot) ? w.now_us() : 0.0;
  const void* x_from = stage(w, slot, 0, x_host, bytes);
  const void* y_from = two_inputs ? stage(w, slot, 1, y_host, bytes) : nullptr;
  w.trace_stage_in(slot, staging_began);

  w.trace_mark(slot, lane_worker::mark::upload_begin);
  w.stream().copy_to_device(x, x_from, bytes);
  if (two_inputs) w.stream().copy_to_device(y, y_from, bytes);
  w.launch(slot, job_->kern(), job_->type(), x, y, x, count_);  // marks the kernel when traced

  out_ = static_cast<char*>(job_->output()) + skip;
  staged_output_ = !is_pinned(out_);
  w.stream().copy_to_host(staged_output_ ? w.slot_host(slot, 0) : out_, x, bytes);
  w.trace_mark(slot, lane_worker::mark::download_end);
}

void elementwise_piece::finish(lane& l, int slot) {
  GPUPOOL_NVTX_RANGE("gpupool: stage out");
  if (staged_output_) {
    auto& w = static_cast<lane_worker&>(l);
    const double began = w.traced(slot) ? w.now_us() : 0.0;
    std::memcpy(out_, w.slot_host(slot, 0), count_ * size_of(job_->type()));
    w.trace_stage_out(slot, began);
  }
}

std::size_t elementwise_piece::bytes_in() const noexcept {
  return count_ * size_of(job_->type()) * static_cast<std::size_t>(job_->kern().arity());
}

std::size_t elementwise_piece::bytes_out() const noexcept {
  return count_ * size_of(job_->type());
}

}  // namespace gpupool::detail
