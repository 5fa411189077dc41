// One map input or one transform: an elementwise kernel over whole arrays, which the executor
// splits into pieces that lanes pipeline (upload -> kernel -> download). Internal.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "gpupool/future.hpp"
#include "gpupool/host_vector.hpp"
#include "gpupool/types.hpp"

namespace gpupool::detail {

/// Shared by every piece of one job split into pieces. The first piece to start moves the future
/// to running; the last piece to finish hands the outcome over: the output, or the first failure.
/// After a failure the pieces not yet started skip their work, but the future fails only once
/// every piece already running has ended, so that no piece still reads the inputs or writes the
/// output when the caller learns of the failure (and frees or reuses them).
class split_job {
 public:
  split_job() = default;
  split_job(const split_job&) = delete;
  split_job& operator=(const split_job&) = delete;
  virtual ~split_job() = default;

  virtual state_base& state() noexcept = 0;

  void set_piece_count(std::size_t n) noexcept { remaining_.store(n, std::memory_order_relaxed); }

  /// True if this piece should run: the job is not cancelled and has not failed.
  bool claim_piece() {
    if (failed_.load(std::memory_order_acquire)) return false;
    return state().try_start() || state().status() == task_status::running;
  }

  /// Called once per piece that ran to the end, failed or was skipped; the last one delivers.
  void piece_done() {
    // acq_rel: the last decrement sees every piece's writes, the first failure's included.
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    // ended() comes before the future ends: whoever sees the outcome sees what it taught.
    if (failed_.load(std::memory_order_acquire)) {
      discard();
      ended(false);
      state().set_exception(first_failure_);
    } else if (state().status() == task_status::running) {
      ended(true);
      deliver();
    } else {
      discard();  // cancelled
      ended(false);
    }
  }

  void piece_failed(std::exception_ptr e) {
    if (!failed_.exchange(true, std::memory_order_acq_rel)) first_failure_ = std::move(e);
    piece_done();
  }

 protected:
  /// All pieces succeeded: hand the output to the future.
  virtual void deliver() = 0;
  /// The job ended without an output (failed or cancelled) and no piece runs any more: let go of
  /// what was made for it (a job may outlive its pieces, held with its future's state).
  virtual void discard() noexcept {}
  /// The job's last piece ended, all of them successfully (`succeeded`) or not, just before its
  /// future ends.
  virtual void ended(bool /*succeeded*/) noexcept {}

 private:
  std::atomic<std::size_t> remaining_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr first_failure_;  // written once, by the piece that set failed_
};

class placement_group;

/// Refuses (argument_kind_error, argument_range_error) an alpha that element type `t` cannot
/// hold: a fraction, NaN or infinity for an integer type, or a value out of the type's range.
void require_alpha_fits(const builtin_kernel& k, dtype t);

/// A built-in kernel over one or two arrays.
class elementwise_job : public split_job {
 public:
  elementwise_job(builtin_kernel k, dtype t, const void* x, const void* y, std::size_t count)
      : kernel_(k), type_(t), x_(x), y_(y), count_(count) {
    require_alpha_fits(k, t);
  }

  [[nodiscard]] const builtin_kernel& kern() const noexcept { return kernel_; }
  [[nodiscard]] dtype type() const noexcept { return type_; }
  [[nodiscard]] const void* x() const noexcept { return x_; }
  [[nodiscard]] const void* y() const noexcept { return y_; }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  /// Bytes of its arrays, in and out together; no more than `most`, else `most` + 1 (a count too
  /// large to multiply out is not wanted anywhere this is asked).
  [[nodiscard]] std::size_t bytes_in_and_out(std::size_t most) const noexcept {
    const std::size_t per_element = size_of(type_) * static_cast<std::size_t>(kernel_.arity() + 1);
    return count_ <= most / per_element ? count_ * per_element : most + 1;
  }

  /// Where results go (`count()` elements). Thread-safe; may allocate on first call.
  virtual void* output() = 0;
  /// Whether output() allocates the results (a map's call) rather than returning the caller's
  /// memory.
  [[nodiscard]] bool makes_its_output() const noexcept { return given_output() == nullptr; }

  /// Whether one pass over the elements in order may write the results straight over the host
  /// arrays (as a host lane does): the output is new memory, one of the inputs itself, or
  /// apart from both. The staged path reads every input before it writes, so it has no such
  /// condition.
  [[nodiscard]] bool writable_in_one_pass() const noexcept {
    // The call's output is only read through here: the predicate takes it as the call spells it.
    const transform_call call{x_, y_, const_cast<void*>(given_output()), count_};
    return call.output_in_place_or_apart(size_of(type_));
  }

  /// Where placement (core/scheduling/placement.hpp) put this call: its group, and whether on the
  /// host lanes. Set before the call is queued; no group for a call it did not consider. The
  /// group learns of the call once, as it ends (however it ends).
  void place(std::shared_ptr<placement_group> group, bool on_host) noexcept {
    group_ = std::move(group);
    on_host_ = on_host;
  }

 protected:
  /// Tells the placement group, if any, that the call ended (elementwise_piece.cpp).
  void ended(bool succeeded) noexcept override;

 private:
  builtin_kernel kernel_;
  dtype type_;
  const void* x_;
  const void* y_;
  std::size_t count_;
  /// The caller's output memory, null where the job makes its own.
  [[nodiscard]] virtual const void* given_output() const noexcept { return nullptr; }

  std::shared_ptr<placement_group> group_;
  bool on_host_ = false;
};

/// A map input: results go to a new host_vector<T>, allocated by the first lane that needs it.
/// It lives in one allocation with the future's state (map_task), which it refers to.
template <class T>
class map_job final : public elementwise_job {
 public:
  map_job(builtin_kernel k, const T* x, const T* y, std::size_t count,
          shared_state<host_vector<T>>& state)
      : elementwise_job(k, dtype_of<T>(), x, y, count), state_(state) {}

  void* output() override {
    if (output_made_.load(std::memory_order_acquire) != made) make_output();
    return output_.data();
  }
  state_base& state() noexcept override { return state_; }

 protected:
  void deliver() override { state_.set_value(std::move(output_)); }
  void discard() noexcept override { host_vector<T>().swap(output_); }

 private:
  // The first piece to need the output allocates it; pieces of one job on other lanes that ask
  // meanwhile wait for it (an allocation that throws leaves it to the next to try). Not
  // std::call_once: glibc's makes a system call for every flag it runs, here one per task; a
  // notify with nobody waiting makes none.
  void make_output() {
    for (;;) {
      int seen = none;
      if (output_made_.compare_exchange_strong(seen, making, std::memory_order_acquire)) {
        try {
          output_.resize(count());
        } catch (...) {
          output_made_.store(none, std::memory_order_release);
          output_made_.notify_all();
          throw;
        }
        output_made_.store(made, std::memory_order_release);
        output_made_.notify_all();
        return;
      }
      if (seen == made) return;
      output_made_.wait(making, std::memory_order_acquire);  // another lane is allocating it
    }
  }

  static constexpr int none = 0, making = 1, made = 2;
  shared_state<host_vector<T>>& state_;
  std::atomic<int> output_made_{none};
  host_vector<T> output_;
};

/// One map input's future state and job in one allocation: the future and the input's pieces
/// hold it through aliasing pointers to its two parts (see make_map_task), so a small task costs
/// one allocation for both, freed by whichever lets go last (usually the caller's future, on the
/// caller's thread, rather than a lane).
template <class T>
struct map_task {
  map_task(builtin_kernel k, const T* x, const T* y, std::size_t count)
      : job(k, x, y, count, state) {}
  shared_state<host_vector<T>> state;
  map_job<T> job;
};

/// A map input's state and job (each the other's owner's alias); throws as map_job does.
template <class T>
std::pair<std::shared_ptr<shared_state<host_vector<T>>>, std::shared_ptr<elementwise_job>>
make_map_task(builtin_kernel k, const T* x, const T* y, std::size_t count) {
  auto task = std::make_shared<map_task<T>>(k, x, y, count);
  auto* state = &task->state;
  auto* job = &task->job;
  return {std::shared_ptr<shared_state<host_vector<T>>>(task, state),
          std::shared_ptr<elementwise_job>(std::move(task), job)};
}

/// A transform: results go to memory the caller owns.
class transform_job final : public elementwise_job {
 public:
  transform_job(builtin_kernel k, dtype t, const void* x, const void* y, void* out,
                std::size_t count, std::shared_ptr<shared_state<void>> state)
      : elementwise_job(k, t, x, y, count),
        out_(out),
        state_(state.get()),
        owned_(std::move(state)) {}
  /// Refers to `state` without owning it: the two live in one allocation (transform_task).
  transform_job(builtin_kernel k, dtype t, const void* x, const void* y, void* out,
                std::size_t count, shared_state<void>& state)
      : elementwise_job(k, t, x, y, count), out_(out), state_(&state) {}

  void* output() override { return out_; }
  state_base& state() noexcept override { return *state_; }

 protected:
  void deliver() override { state_->set_value(); }

 private:
  const void* given_output() const noexcept override { return out_; }

  void* out_;
  shared_state<void>* state_;
  std::shared_ptr<shared_state<void>> owned_;  // empty in a transform_task
};

/// One transform's future state and job in one allocation, as map_task: a call of
/// transform_each costs one allocation for both.
struct transform_task {
  transform_task(builtin_kernel k, dtype t, const void* x, const void* y, void* out,
                 std::size_t count)
      : job(k, t, x, y, out, count, state) {}
  shared_state<void> state;
  transform_job job;
};

/// A transform's state and job (each the other's owner's alias); throws as transform_job does.
inline std::pair<std::shared_ptr<shared_state<void>>, std::shared_ptr<elementwise_job>>
make_transform_task(builtin_kernel k, dtype t, const void* x, const void* y, void* out,
                    std::size_t count) {
  auto task = std::make_shared<transform_task>(k, t, x, y, out, count);
  auto* state = &task->state;
  auto* job = &task->job;
  return {std::shared_ptr<shared_state<void>>(task, state),
          std::shared_ptr<elementwise_job>(std::move(task), job)};
}

}  // namespace gpupool::detail
