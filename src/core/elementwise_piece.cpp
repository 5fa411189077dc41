#include "core/elementwise_piece.hpp"

#include <cstring>

#include "core/lane_worker.hpp"
#include "gpupool/error.hpp"
#include "gpupool/pinned.hpp"

namespace gpupool::detail {
namespace {

// Puts `bytes` of host data on the device: straight from pinned memory, or through the slot.
void stage_in(lane_worker& w, int slot, int buffer, const void* host, void* device,
              std::size_t bytes) {
  if (is_pinned(host)) {
    w.stream().copy_to_device(device, host, bytes);
    return;
  }
  void* staging = w.slot_host(slot, buffer);
  std::memcpy(staging, host, bytes);
  w.stream().copy_to_device(device, staging, bytes);
}

}  // namespace

bool elementwise_piece::claim() {
  if (job_->claim_piece()) return true;
  job_->piece_done();  // cancelled or failed: count this piece out
  return false;
}

void elementwise_piece::start(lane& l, int slot) {
  auto& w = static_cast<lane_worker&>(l);
  const std::size_t element = size_of(job_->type());
  const std::size_t bytes = count_ * element;
  const std::size_t skip = offset_ * element;

  void* x = w.slot_device(slot, 0);
  stage_in(w, slot, 0, static_cast<const char*>(job_->x()) + skip, x, bytes);
  void* y = nullptr;
  if (job_->kern().arity() == 2) {
    y = w.slot_device(slot, 1);
    stage_in(w, slot, 1, static_cast<const char*>(job_->y()) + skip, y, bytes);
  }
  w.stream().launch(job_->kern(), job_->type(), x, y, x, count_);

  out_ = static_cast<char*>(job_->output()) + skip;
  staged_output_ = !is_pinned(out_);
  w.stream().copy_to_host(staged_output_ ? w.slot_host(slot, 0) : out_, x, bytes);
}

void elementwise_piece::finish(lane& l, int slot) {
  if (staged_output_) {
    auto& w = static_cast<lane_worker&>(l);
    std::memcpy(out_, w.slot_host(slot, 0), count_ * size_of(job_->type()));
  }
  job_->piece_done();
}

void elementwise_piece::fail(std::exception_ptr e) noexcept {
  job_->piece_failed(std::move(e));
}

void elementwise_piece::cancel() noexcept {
  if (!job_->state().try_cancel()) {
    // Other pieces of the job already ran: the job cannot end as "cancelled", but it must end.
    job_->state().set_exception(std::make_exception_ptr(cancelled_error(
        "gpupool: the executor shut down before every piece of this input was processed")));
  }
  job_->piece_done();
}

}  // namespace gpupool::detail
