// One piece (at most chunk_bytes per input) of a built-in kernel's job, through the staged
// pipeline: host -> pinned slot -> device, kernel, device -> pinned slot -> host.
//
// A piece that is a whole job (a small map input or transform) coalesces: while it waits in the
// queue it absorbs the whole-job pieces queued right behind it that run the same kernel (alpha
// included) on the same type and device, up to a slot buffer's bytes and `most_tasks_per_batch`.
// The batch then gathers every input into the slot's pinned buffers, uploads each operand once,
// launches once over the concatenated elements (a built-in kernel reads and writes element i
// alone, so where one task's elements end and the next begin does not matter), downloads once
// and scatters each task's results (or, where the results lie end to end in pinned blocks,
// downloads straight into them: staged_pipeline.hpp). Each task keeps its own future: a
// cancelled one is left out when the batch is claimed, and a failure of the batch fails exactly
// the tasks that ran in it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <memory>
#include <span>
#include <vector>

#include "core/lanes/elementwise_job.hpp"
#include "core/lanes/piece_item.hpp"
#include "core/lanes/staged_pipeline.hpp"
#include "core/memory/recycled_storage.hpp"
#include "core/sanitizers.hpp"
#include "core/scheduling/work_item.hpp"

namespace gpupool::detail {

// Whether pieces take their storage from recycled_storage (not under AddressSanitizer, so that
// it sees every use of a freed piece).
#ifdef GPUPOOL_UNDER_ADDRESS_SANITIZER
inline constexpr bool recycled_pieces = false;
#else
inline constexpr bool recycled_pieces = true;
#endif

class elementwise_piece final : public piece_item<elementwise_job> {
 public:
  /// The most tasks one batch carries: bounds the time the first task of a batch waits for the
  /// last one's staging copy, and leaves other lanes work when many tiny tasks arrive at once.
  static constexpr std::size_t most_tasks_per_batch = 256;

  /// The most tasks one batch carries on the host lanes: a host lane has no launch to share, and
  /// smaller batches spread a push over every host lane.
  static constexpr std::size_t most_tasks_per_host_batch = 16;

  /// `slot_bytes`: the size of a slot buffer, the most bytes per input a batch may stage.
  /// `device`: the device the piece is queued for, -1 for any. `most_tasks`: the most tasks its
  /// batch may carry (at most most_tasks_per_batch).
  elementwise_piece(std::shared_ptr<elementwise_job> job, std::size_t offset, std::size_t count,
                    std::size_t slot_bytes, int device = -1,
                    std::size_t most_tasks = most_tasks_per_batch)
      : piece_item(std::move(job), offset, count),
        slot_bytes_(slot_bytes),
        device_(device),
        most_tasks_(std::min(most_tasks, most_tasks_per_batch)),
        batch_elements_(count) {}

  // Pieces are made by the submitting thread and freed by lanes, one per small task: their
  // storage is recycled rather than taken from the system allocator each time (see
  // recycled_storage). Under AddressSanitizer they are ordinary allocations, so that it still
  // sees every use after free.
  static void* operator new(std::size_t bytes) {
    if (!recycled_pieces || bytes != sizeof(elementwise_piece)) return ::operator new(bytes);
    return recycled_storage<elementwise_piece>::allocate();
  }
  static void operator delete(void* p, std::size_t bytes) noexcept {
    if (!recycled_pieces || bytes != sizeof(elementwise_piece))
      ::operator delete(p);
    else
      recycled_storage<elementwise_piece>::deallocate(p);
  }

  bool claim() override;
  /// Runs the claimed tasks on the calling thread, a host lane: each from its host arrays
  /// straight into its output, without slots or streams. Then complete() or fail() as a lane's
  /// finish() would be followed. @throw as the kernel does (an alpha the type cannot hold).
  void run_on_host();
  void start(slot_context& slot) override;
  void finish(slot_context& slot) override;
  void complete() noexcept override;
  void fail(std::exception_ptr e) noexcept override;
  bool cancel() noexcept override;
  bool absorb(std::unique_ptr<work_item>& next) noexcept override;

  const char* trace_name() const noexcept override { return job_->kern().name(); }
  std::size_t bytes_in() const noexcept override;
  std::size_t bytes_out() const noexcept override;
  std::size_t staged_operand_bytes() const noexcept override;
  std::size_t carried_count() const noexcept override;
  bool carried(std::size_t i, std::uint64_t& id, double& submitted, std::size_t& in,
               std::size_t& out) const noexcept override;

  /// Tasks this item carries, itself included (1 unless it absorbed others).
  [[nodiscard]] std::size_t tasks() const noexcept { return 1 + riders_.size(); }

 private:
  [[nodiscard]] bool whole_job() const noexcept { return offset_ == 0 && count_ == job_->count(); }
  [[nodiscard]] bool coalesces_with(const elementwise_piece& other) const noexcept;
  /// The tasks that run: this piece alone, or the batch's tasks claimed by `claim()`.
  [[nodiscard]] std::span<elementwise_piece* const> members() const noexcept;

  std::size_t slot_bytes_;
  int device_;
  std::size_t most_tasks_;
  std::size_t batch_elements_;  // elements per input of this piece and every absorbed one
  std::vector<std::unique_ptr<elementwise_piece>> riders_;  // absorbed tasks, in queue order
  std::vector<elementwise_piece*> running_;  // batch tasks claimed, in order (capacity kept)
  elementwise_piece* self_ = this;

  // Where the operands are, kept from start() to finish(): one part each when alone, one per
  // running task in a batch.
  host_part solo_x_, solo_y_;
  host_out_part solo_out_;
  std::vector<host_part> xs_, ys_;
  std::vector<host_out_part> outs_;
  staged_output output_;
};

}  // namespace gpupool::detail
