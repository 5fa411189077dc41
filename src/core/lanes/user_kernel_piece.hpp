// Run-time compiled kernels as lane work: over whole host arrays, split into pieces that lanes
// pipeline like the built-in kernels (every array input staged and uploaded, the kernel, the
// output downloaded); and over many calls on device arrays, in batches of one launch each.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/kernels/user_call.hpp"
#include "core/lanes/elementwise_job.hpp"
#include "core/lanes/piece_item.hpp"
#include "core/lanes/staged_pipeline.hpp"
#include "core/scheduling/work_item.hpp"

namespace gpupool::detail {

class user_kernel_job final : public split_job {
 public:
  /// `kernels[d]` is the kernel compiled for executor device `d`. `operands_only`: the kernel is
  /// gpupool's making (an elementwise kernel's), which touches its operands element by element
  /// and nothing else; a raw kernel's body is the user's.
  user_kernel_job(std::string name, std::vector<std::shared_ptr<const compiled_kernel>> kernels,
                  prepared_call call, void* out, std::size_t out_element, std::size_t count,
                  std::shared_ptr<shared_state<void>> state, bool operands_only)
      : name_(std::move(name)),
        kernels_(std::move(kernels)),
        call_(std::move(call)),
        out_(static_cast<char*>(out)),
        out_element_(out_element),
        count_(count),
        state_(std::move(state)),
        operands_only_(operands_only) {}

  state_base& state() noexcept override { return *state_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const compiled_kernel& kernel(int device) const noexcept {
    return *kernels_[static_cast<std::size_t>(device)];
  }
  [[nodiscard]] prepared_call& call() noexcept { return call_; }
  [[nodiscard]] const std::vector<user_operand>& inputs() const noexcept { return call_.operands; }
  [[nodiscard]] char* out() const noexcept { return out_; }
  [[nodiscard]] std::size_t out_element() const noexcept { return out_element_; }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] bool operands_only() const noexcept { return operands_only_; }

 protected:
  void deliver() override { state_->set_value(); }

 private:
  std::string name_;
  std::vector<std::shared_ptr<const compiled_kernel>> kernels_;
  prepared_call call_;
  char* out_;
  std::size_t out_element_;
  std::size_t count_;
  std::shared_ptr<shared_state<void>> state_;
  bool operands_only_;
};

class user_kernel_piece final : public piece_item<user_kernel_job> {
 public:
  using piece_item::piece_item;

  void start(slot_context& slot) override;
  void finish(slot_context& slot) override;
  const char* trace_name() const noexcept override { return job_->name().c_str(); }
  std::size_t bytes_in() const noexcept override;
  std::size_t bytes_out() const noexcept override { return count_ * job_->out_element(); }
  std::size_t staged_operand_bytes() const noexcept override;

 private:
  host_out_part out_part_;
  staged_output output_;
};

/// Many calls on device arrays (executor::map_on_device): one future for all of them.
class device_calls_job final : public split_job {
 public:
  device_calls_job(std::string name, std::shared_ptr<const compiled_kernel> kernel,
                   std::shared_ptr<shared_state<void>> state)
      : name_(std::move(name)), kernel_(std::move(kernel)), state_(std::move(state)) {}
  state_base& state() noexcept override { return *state_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const compiled_kernel& kernel() const noexcept { return *kernel_; }

 protected:
  void deliver() override { state_->set_value(); }

 private:
  std::string name_;
  std::shared_ptr<const compiled_kernel> kernel_;
  std::shared_ptr<shared_state<void>> state_;
};

/// A batch of those calls, run by one lane with one launch (a table of calls) where the backend
/// can. `offset`/`count` of the base count calls, not elements.
class device_batch_piece final : public piece_item<device_calls_job> {
 public:
  device_batch_piece(std::shared_ptr<device_calls_job> job, std::vector<std::uint64_t> table,
                     std::size_t rows, std::size_t bytes_in, std::size_t bytes_out)
      : piece_item(std::move(job), 0, rows),
        table_(std::move(table)),
        bytes_in_(bytes_in),
        bytes_out_(bytes_out) {}

  void start(slot_context& slot) override;
  void finish(slot_context& /*slot*/) override {}
  const char* trace_name() const noexcept override { return job_->name().c_str(); }
  // Device memory read and written (no host copies are made).
  std::size_t bytes_in() const noexcept override { return bytes_in_; }
  std::size_t bytes_out() const noexcept override { return bytes_out_; }

 private:
  std::vector<std::uint64_t> table_;
  std::size_t bytes_in_;
  std::size_t bytes_out_;
};

}  // namespace gpupool::detail
