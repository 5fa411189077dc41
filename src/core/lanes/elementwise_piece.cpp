#include "core/lanes/elementwise_piece.hpp"

#include <bit>
#include <cstdint>

#include "core/kernels/elementwise_math.hpp"
#include "core/memory/result_slabs.hpp"
#include "core/scheduling/placement.hpp"
#include "gpupool/error.hpp"
#include "gpupool/host_vector.hpp"

namespace gpupool::detail {

void elementwise_job::ended(bool succeeded) noexcept {
  if (group_) group_->finished(on_host_, bytes_in_and_out(limits::most_host_task_bytes), succeeded);
}

void require_alpha_fits(const builtin_kernel& k, dtype t) {
  if (!k.takes_alpha()) return;
  dispatch_elementwise(k.operation(), t,
                       [&]<op O, class T>() { (void)alpha_as<T>(k.alpha(), k.name()); });
}

bool elementwise_piece::coalesces_with(const elementwise_piece& other) const noexcept {
  const builtin_kernel& a = job_->kern();
  const builtin_kernel& b = other.job_->kern();
  // Alphas compared bit for bit: 0.0 and -0.0 give differently signed zeros, and NaN != NaN.
  return other.whole_job() && other.riders_.empty() && a.operation() == b.operation() &&
         std::bit_cast<std::uint64_t>(a.alpha()) == std::bit_cast<std::uint64_t>(b.alpha()) &&
         job_->type() == other.job_->type() && device_ == other.device_;
}

bool elementwise_piece::absorb(std::unique_ptr<work_item>& next) noexcept {
  if (!whole_job() || riders_.size() + 1 >= most_tasks_) return false;
  auto* other = dynamic_cast<elementwise_piece*>(next.get());
  if (other == nullptr || !coalesces_with(*other)) return false;
  const std::size_t elements = batch_elements_ + other->count_;
  if (elements > slot_bytes_ / size_of(job_->type())) return false;
  try {
    // Room for a whole batch at the first absorb (one allocation each, made by the submitting
    // thread under the queue's lock, rather than one per doubling), and for every task's claim,
    // so that claim() never allocates.
    if (riders_.capacity() < most_tasks_ - 1) riders_.reserve(most_tasks_ - 1);
    if (running_.capacity() < most_tasks_) running_.reserve(most_tasks_);
    riders_.emplace_back(static_cast<elementwise_piece*>(next.get()));
  } catch (...) {
    return false;  // no memory for a longer batch: `next` is queued on its own
  }
  (void)next.release();
  batch_elements_ = elements;
  return true;
}

std::span<elementwise_piece* const> elementwise_piece::members() const noexcept {
  if (riders_.empty()) return {&self_, 1};
  return running_;
}

bool elementwise_piece::claim() {
  if (riders_.empty()) return piece_item::claim();
  // Each task claims for itself: a cancelled one is counted out and left out of the batch.
  running_.clear();
  if (piece_item::claim()) running_.push_back(this);
  for (auto& r : riders_)
    if (r->piece_item::claim()) running_.push_back(r.get());
  return !running_.empty();
}

void elementwise_piece::run_on_host() {
  const builtin_kernel k = job_->kern();
  const dtype type = job_->type();
  const std::size_t element = size_of(type);
  for (const elementwise_piece* t : members()) {
    const std::size_t skip = t->offset_ * element;
    const void* y = t->job_->y();
    apply_on_host(k, type, static_cast<const char*>(t->job_->x()) + skip,
                  y != nullptr ? static_cast<const char*>(y) + skip : nullptr,
                  static_cast<char*>(t->job_->output()) + skip, t->count_);
  }
}

void elementwise_piece::start(slot_context& slot) {
  const auto tasks = members();
  const builtin_kernel k = job_->kern();
  const dtype type = job_->type();
  const std::size_t element = size_of(type);
  const bool two_inputs = k.arity() == 2;

  std::span<host_part> xs(&solo_x_, 1), ys(&solo_y_, 1);
  std::span<host_out_part> outs(&solo_out_, 1);
  if (!riders_.empty()) {
    xs_.resize(tasks.size());
    if (two_inputs) ys_.resize(tasks.size());
    outs_.resize(tasks.size());
    xs = xs_;
    ys = two_inputs ? std::span<host_part>(ys_) : ys;
    outs = outs_;
  }
  // A batch's members are whole calls no lane has touched: the results the map's calls among
  // them make now lie end to end in shared slabs, which one download then writes in place. The
  // slabs are open while the outputs are made, and only then.
  std::size_t elements = 0;
  {
    std::size_t results = 0, result_bytes = 0;
    if (tasks.size() > 1)
      for (const elementwise_piece* t : tasks) {
        const std::size_t bytes = t->count_ * element;
        if (t->job_->makes_its_output() && bytes >= result_allocator<char>::pinned_from_bytes &&
            bytes <= result_slabs::largest_result) {
          ++results;
          result_bytes += result_slabs::bytes_of(bytes);
        }
      }
    const result_slabs slabs(results, result_bytes);
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      const elementwise_piece& t = *tasks[i];
      const std::size_t bytes = t.count_ * element;
      const std::size_t skip = t.offset_ * element;
      xs[i] = {static_cast<const char*>(t.job_->x()) + skip, bytes};
      if (two_inputs) ys[i] = {static_cast<const char*>(t.job_->y()) + skip, bytes};
      outs[i] = {static_cast<char*>(t.job_->output()) + skip, bytes};
      elements += t.count_;
    }
  }

  // Counted as it starts, whether or not its launch then succeeds.
  if (tasks.size() > 1) slot.count_batch(tasks.size());
  const std::size_t bytes = elements * element;
  staged_input inputs[2] = {{0, xs, bytes}, {1, ys, bytes}};
  const void* sources[2] = {};
  output_ = {0, outs, bytes};  // in place: the kernel overwrites the first input's device buffer
  start_staged(slot, std::span<staged_input>(inputs, two_inputs ? 2 : 1), sources, output_,
               [&](std::span<staged_input> on_device, void* out) {
                 slot.launch(k, type, on_device[0].device,
                             two_inputs ? on_device[1].device : nullptr, out, elements);
               });
}

void elementwise_piece::finish(slot_context& slot) {
  finish_staged(slot, output_);
}

void elementwise_piece::complete() noexcept {
  for (elementwise_piece* t : members()) t->piece_item::complete();
}

void elementwise_piece::fail(std::exception_ptr e) noexcept {
  for (elementwise_piece* t : members()) t->piece_item::fail(e);
}

bool elementwise_piece::cancel() noexcept {
  // Every task of a batch is a whole job that no lane has touched, so each cancels (and counts
  // itself out) for sure.
  bool all = piece_item::cancel();
  for (auto& r : riders_) all = r->piece_item::cancel() && all;
  return all;
}

std::size_t elementwise_piece::bytes_in() const noexcept {
  return count_ * size_of(job_->type()) * static_cast<std::size_t>(job_->kern().arity());
}

std::size_t elementwise_piece::bytes_out() const noexcept {
  return count_ * size_of(job_->type());
}

std::size_t elementwise_piece::staged_operand_bytes() const noexcept {
  // Every operand holds as much. A batch of whole calls counts its elements (tasks cancelled
  // since it formed included); a piece of a call split in several counts the whole call's, so
  // that the pieces of a large call all go the ordinary way.
  return (whole_job() ? batch_elements_ : job_->count()) * size_of(job_->type());
}

std::size_t elementwise_piece::carried_count() const noexcept {
  return members().size();
}

bool elementwise_piece::carried(std::size_t i, std::uint64_t& id, double& submitted,
                                std::size_t& in, std::size_t& out) const noexcept {
  const auto tasks = members();
  if (i >= tasks.size()) return false;
  const elementwise_piece& t = *tasks[i];
  id = t.trace_id;
  submitted = t.submitted_us;
  in = t.bytes_in();
  out = t.bytes_out();
  return true;
}

}  // namespace gpupool::detail
