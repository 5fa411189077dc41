// submit: a user callable f(lane&) (a detail::user_task, built by the public template, which
// knows its type) queued as one work item.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <utility>

#include "core/executor/executor_impl.hpp"

namespace gpupool {
namespace {

// The item a lane takes for a user task, and the task itself, in one allocation: the item at
// the start of the block, the task (built there by the public template, which knows its type)
// after it. The task's value is handed over after the lane's stream has finished the work the
// callable enqueued.
class user_task_item final : public detail::work_item {
 public:
  using construct_fn = detail::user_task* (*)(void* storage, void* context);

  // @throw std::bad_alloc, or what `construct` throws (nothing is left made then).
  static std::unique_ptr<user_task_item> make(std::size_t bytes, std::size_t align,
                                              construct_fn construct, void* context) {
    const std::size_t alignment = std::max(alignof(user_task_item), align);
    const std::size_t offset = (sizeof(user_task_item) + align - 1) / align * align;
    const std::size_t size = (offset + bytes + alignment - 1) / alignment * alignment;
    // malloc's alignment is enough for nearly every callable; free() needs no alignment back.
    void* block = alignment <= alignof(std::max_align_t) ? std::malloc(size)
                                                         : std::aligned_alloc(alignment, size);
    if (block == nullptr) throw std::bad_alloc();
    detail::user_task* task = nullptr;
    try {
      task = construct(static_cast<unsigned char*>(block) + offset, context);
    } catch (...) {
      std::free(block);
      throw;
    }
    return std::unique_ptr<user_task_item>(::new (block) user_task_item(task));
  }

  ~user_task_item() override { task_->~user_task(); }
  // The block came from malloc (see make).
  static void operator delete(void* p) noexcept { std::free(p); }

  [[nodiscard]] detail::state_base& state() noexcept { return task_->state(); }

  bool claim() override { return task_->state().try_start(); }
  void start(detail::slot_context& slot) override { task_->run(detail::lane_of(slot)); }
  void finish(detail::slot_context& /*slot*/) override {}
  void complete() noexcept override { task_->complete(); }
  void fail(std::exception_ptr e) noexcept override { task_->state().set_exception(std::move(e)); }
  bool cancel() noexcept override {
    task_->state().try_cancel();  // a queued callable cannot have started
    return true;
  }

 private:
  explicit user_task_item(detail::user_task* task) noexcept : task_(task) {}
  detail::user_task* task_;  // in this item's block
};

}  // namespace

void executor::check_priority_option(const task_options& options) {
  if (options.priority) check_priority(*options.priority, "task_options::priority");
}

void executor::queue_user_task(std::size_t bytes, std::size_t align,
                               detail::user_task* (*construct)(void* storage, void* context),
                               void* context, std::optional<int> device, std::size_t admitted,
                               const task_options& options) {
  std::optional<detail::call_priority_scope> priority;
  try {
    priority.emplace(options);  // checks it
  } catch (...) {
    impl_->gate->release(admitted);  // nothing holds the bytes yet
    throw;
  }
  std::unique_ptr<user_task_item> item;
  try {
    item = user_task_item::make(bytes, align, construct, context);
  } catch (...) {
    impl_->gate->release(admitted);  // nothing holds the bytes yet
    throw;
  }
  // The future's state (held by the caller too) outlives the item.
  detail::state_base& state = item->state();
  // Held before anything else may fail: from here, ending the state gives the bytes back.
  if (admitted != 0) state.hold(*impl_->gate, admitted);
  try {
    impl_->require_accepting();
    impl_->stamp(*item);
    if (!impl_->queue.push(std::move(item), device)) impl_->refuse(device);
  } catch (...) {
    // Never queued (or refused): ending it gives the bytes back.
    state.try_cancel();
    throw;
  }
}

}  // namespace gpupool
