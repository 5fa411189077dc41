// A run-time compiled elementwise kernel over whole arrays, split into pieces that lanes
// pipeline like the built-in kernels: every array input staged and uploaded, the kernel, the
// output downloaded.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/job_piece.hpp"
#include "gpupool/detail/elementwise_job.hpp"
#include "gpupool/detail/work_item.hpp"

namespace gpupool::detail {

/// One input of a call, ready for the lanes.
struct user_operand {
  bool is_array = false;
  const char* data = nullptr;  // the array
  std::size_t element_size = 0;
  alignas(8) unsigned char scalar[8] = {};  // the scalar, as the parameter's type
};

class user_kernel_job final : public piecewise_job {
 public:
  user_kernel_job(std::string name, std::shared_ptr<const compiled_kernel> kernel,
                  std::vector<user_operand> inputs, void* out, std::size_t out_element,
                  std::size_t count, std::shared_ptr<shared_state<void>> state)
      : name_(std::move(name)),
        kernel_(std::move(kernel)),
        inputs_(std::move(inputs)),
        out_(static_cast<char*>(out)),
        out_element_(out_element),
        count_(count),
        state_(std::move(state)) {}

  state_base& state() noexcept override { return *state_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const compiled_kernel& kernel() const noexcept { return *kernel_; }
  [[nodiscard]] std::vector<user_operand>& inputs() noexcept { return inputs_; }
  [[nodiscard]] char* out() const noexcept { return out_; }
  [[nodiscard]] std::size_t out_element() const noexcept { return out_element_; }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }

 protected:
  void deliver() override { state_->set_value(); }

 private:
  std::string name_;
  std::shared_ptr<const compiled_kernel> kernel_;
  std::vector<user_operand> inputs_;
  char* out_;
  std::size_t out_element_;
  std::size_t count_;
  std::shared_ptr<shared_state<void>> state_;
};

class user_kernel_piece final : public job_piece<user_kernel_job> {
 public:
  using job_piece::job_piece;

  void start(lane& l, int slot) override;
  void finish(lane& l, int slot) override;
  const char* trace_name() const noexcept override { return job_->name().c_str(); }
  std::size_t bytes_in() const noexcept override;
  std::size_t bytes_out() const noexcept override { return count_ * job_->out_element(); }

 private:
  char* out_ = nullptr;
  bool staged_output_ = false;
};

}  // namespace gpupool::detail
