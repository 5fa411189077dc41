// What every piece of a split job does the same way: skip when the job is over, count
// itself out, fail or cancel the whole job.
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <utility>

#include "core/lanes/elementwise_job.hpp"
#include "core/scheduling/work_item.hpp"
#include "gpupool/error.hpp"

namespace gpupool::detail {

template <class Job>
class piece_item : public work_item {
 public:
  piece_item(std::shared_ptr<Job> job, std::size_t offset, std::size_t count)
      : job_(std::move(job)), offset_(offset), count_(count) {}

  bool claim() override {
    if (job_->claim_piece()) return true;
    job_->piece_done();  // cancelled or failed: count this piece out
    return false;
  }

  void complete() noexcept override {
    try {
      job_->piece_done();
    } catch (...) {
      job_->state().set_exception(std::current_exception());
    }
  }

  void fail(std::exception_ptr e) noexcept override { job_->piece_failed(std::move(e)); }

  bool cancel() noexcept override {
    // A job some of whose pieces were taken is running: its other pieces must run too, so that it
    // ends normally, as a running task does at shutdown(cancel_pending).
    if (!job_->state().try_cancel() && !job_->state().done()) return false;
    job_->piece_done();
    return true;
  }

 protected:
  std::shared_ptr<Job> job_;
  std::size_t offset_;
  std::size_t count_;
};

}  // namespace gpupool::detail
