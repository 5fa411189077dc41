// One piece (at most chunk_bytes per input) of an elementwise job, pipelined on one lane:
// host -> pinned slot -> device, kernel, device -> pinned slot -> host.
#pragma once

#include <cstddef>
#include <memory>

#include "core/lanes/job_piece.hpp"
#include "gpupool/detail/elementwise_job.hpp"
#include "gpupool/detail/work_item.hpp"

namespace gpupool::detail {

class elementwise_piece final : public job_piece<elementwise_job> {
 public:
  using job_piece::job_piece;

  void start(lane& l, int slot) override;
  void finish(lane& l, int slot) override;
  const char* trace_name() const noexcept override { return job_->kern().name(); }
  std::size_t bytes_in() const noexcept override;
  std::size_t bytes_out() const noexcept override;

 private:
  void* out_ = nullptr;         // where this piece's results go
  bool staged_output_ = false;  // results wait in the slot's pinned buffer for finish()
};

}  // namespace gpupool::detail
