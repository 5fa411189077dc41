// One piece (at most chunk_bytes per input) of an elementwise job, pipelined on one lane:
// host -> pinned slot -> device, kernel, device -> pinned slot -> host.
#pragma once

#include <cstddef>
#include <memory>

#include "gpupool/detail/elementwise_job.hpp"
#include "gpupool/detail/work_item.hpp"

namespace gpupool::detail {

class elementwise_piece final : public work_item {
 public:
  elementwise_piece(std::shared_ptr<elementwise_job> job, std::size_t offset, std::size_t count)
      : job_(std::move(job)), offset_(offset), count_(count) {}

  bool claim() override;
  void start(lane& l, int slot) override;
  void finish(lane& l, int slot) override;
  void complete() noexcept override;
  void fail(std::exception_ptr e) noexcept override;
  void cancel() noexcept override;
  const char* trace_name() const noexcept override { return job_->kern().name(); }
  std::size_t bytes_in() const noexcept override;
  std::size_t bytes_out() const noexcept override;

 private:
  std::shared_ptr<elementwise_job> job_;
  std::size_t offset_;
  std::size_t count_;
  void* out_ = nullptr;         // where this piece's results go
  bool staged_output_ = false;  // results wait in the slot's pinned buffer for finish()
};

}  // namespace gpupool::detail
