#include "core/lanes/host_lanes.hpp"

#include <exception>
#include <stdexcept>
#include <string>
#include <system_error>

#include "core/lanes/elementwise_piece.hpp"
#include "core/lanes/lane_thread.hpp"

namespace gpupool::detail {
namespace {
// The host lanes the calling thread is one of (null off host lanes).
thread_local const host_lanes* current_lanes = nullptr;
}  // namespace

host_lanes::host_lanes(int count, const setup& s) : setup_(s), queue_(1, s.spin, s.priority) {
  try {
    threads_.reserve(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i)
      threads_.push_back(
          start_lane_thread("gpupool host." + std::to_string(i), [this, i] { run(i); }));
  } catch (const std::system_error& e) {
    close_and_join();
    throw std::runtime_error("gpupool: could not start host lane " +
                             std::to_string(threads_.size()) + " of " + std::to_string(count) +
                             " (no thread: " + e.what() +
                             "); the lanes already started were stopped");
  } catch (...) {
    close_and_join();
    throw;
  }
}

host_lanes::~host_lanes() {
  close_and_join();
}

bool host_lanes::push_all(std::vector<work_item_ptr>& items) {
  return !threads_.empty() && queue_.push_all(items);
}

void host_lanes::cancel_queued() noexcept {
  for (auto& [item, device] : queue_.drain(/*spare_woken=*/true))
    if (!item->cancel() && !queue_.offer(item, device))
      item->fail(std::make_exception_ptr(
          std::runtime_error("gpupool: the host lanes' queue closed before this call ran")));
}

void host_lanes::close_and_join() {
  queue_.close();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

bool host_lanes::is_own_thread() const noexcept {
  return current_lanes == this;
}

void host_lanes::run(int index) noexcept {
  current_lanes = this;
  while (work_item_ptr item = queue_.pop(0, /*block=*/true)) run_item(std::move(item), index);
}

void host_lanes::run_item(work_item_ptr item, int index) noexcept {
  // Only placement queues here, and only pieces of built-in kernels.
  auto* piece = dynamic_cast<elementwise_piece*>(item.get());
  if (piece == nullptr) {
    item->fail(std::make_exception_ptr(
        std::logic_error("gpupool: a host lane was given work other than a built-in kernel")));
    return;
  }
  try {
    if (!piece->claim()) return;
  } catch (...) {
    piece->fail(std::current_exception());
    return;
  }
  const bool traced = setup_.tracing != nullptr && setup_.tracing->load(std::memory_order_relaxed);
  const double started = traced ? clock_us(setup_.epoch) : 0.0;
  std::exception_ptr failure;
  try {
    piece->run_on_host();
  } catch (...) {
    failure = std::current_exception();
  }
  // Recorded before the results are handed over, as a device lane does.
  if (traced) record(*piece, index, started, clock_us(setup_.epoch), failure != nullptr);
  completion_batch pass(setup_.budget);
  if (failure)
    piece->fail(failure);
  else
    piece->complete();
}

void host_lanes::record(const work_item& item, int index, double started, double ended,
                        bool failed) {
  for (std::size_t i = 0, n = item.carried_count(); i < n; ++i) {
    task_record r;
    if (!item.carried(i, r.id, r.submitted, r.bytes_in, r.bytes_out)) break;
    try {
      r.name = item.trace_name();
    } catch (...) {
      return;  // no memory for a name: the trace goes without these records
    }
    r.device = host_device;
    r.lane = setup_.first_index + index;
    r.priority = item.priority;
    r.started = started;
    r.kernel = {started, ended};
    r.done = ended;
    r.failed = failed;
    setup_.recorder->add(std::move(r));
  }
}

}  // namespace gpupool::detail
