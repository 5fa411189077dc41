// The executor, the coordinator: it makes its parts (src/core/executor/: configuration,
// admission, the lane set, piece sizing), answers what they know and shuts them down. What it
// queues is made in the files of each kind of work (see executor/executor_impl.hpp).
#include "gpupool/executor.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

#include <unistd.h>

#include "core/executor/configuration.hpp"
#include "core/executor/executor_impl.hpp"

namespace gpupool {

executor::impl::impl(const executor_options& options)
    : generation(fork_generation()),
      owner(detail::select_backend(options)),
      ordinals(detail::choose_ordinals(options, owner->device_count())),
      settings(detail::checked_settings(options, *owner, ordinals)),
      lanes_per_device(settings.lanes_per_device),
      slots(options.slots_per_lane),
      chunk_bytes(settings.chunk_bytes),
      sizing(chunk_bytes, settings.chunk_from == setting_source::given, lanes_per_device),
      queue(static_cast<int>(ordinals.size()), lane_spin, options.priority),
      placement(options.host_lanes, lanes_per_device * static_cast<int>(ordinals.size())),
      default_priority(options.priority) {
  // Those waiting on this executor's futures look as long as its lanes do before they sleep.
  detail::set_waiter_spin(lane_spin);
  for (std::size_t d = 0; d < ordinals.size(); ++d) {
    owner->prepare_device(ordinals[d]);
    device_info info = owner->describe(ordinals[d]);
    // Devices of one GPU share its free memory, so that the budgets made from it add up to what
    // one device alone would have.
    const auto sharing = std::count(ordinals.begin(), ordinals.end(), ordinals[d]);
    info.free_memory = owner->free_memory(ordinals[d]) / static_cast<std::size_t>(sharing);
    info.id = static_cast<int>(d);
    devices.push_back(std::move(info));
    memory.push_back(std::make_unique<detail::device_memory>(options.device_memory_budget));
  }
  gate = std::make_unique<detail::in_flight_gate>(detail::choose_in_flight_budget(options, devices),
                                                  options.when_full, devices.size());
  std::vector<std::string> names;
  for (const device_info& info : devices) names.push_back(info.name);
  health = std::make_unique<detail::device_health>(*owner, queue, std::move(names), options.quiet);

  detail::lane_setup shared;  // what every lane shares; the lane set fills in the rest
  shared.owner = owner.get();
  shared.queue = &queue;
  shared.recorder = &recorder;
  shared.faults = &faults;
  shared.slots = slots;
  shared.priority = options.priority;
  shared.chunk_bytes = chunk_bytes;
  shared.tracing = &tracing;
  shared.epoch = epoch;
  shared.coalescing = &coalescing;
  shared.health = health.get();
  shared.budget = gate.get();
  try {
    if (options.host_lanes > 0) {
      detail::host_lanes::setup host_setup;
      host_setup.recorder = &recorder;
      host_setup.tracing = &tracing;
      host_setup.epoch = epoch;
      host_setup.first_index = lanes_per_device * static_cast<int>(ordinals.size());
      host_setup.budget = gate.get();
      host_setup.priority = options.priority;
      host_setup.spin = lane_spin;
      host = std::make_unique<detail::host_lanes>(options.host_lanes, host_setup);
    }
    // If these cannot start, the host lanes stop as `host` goes.
    lanes.start(shared, ordinals, lanes_per_device, memory, queue);
  } catch (...) {
    accepting.store(false);
    throw;
  }
}

void executor::impl::stop(bool cancel_pending) {
  // A lane cannot wait for itself to stop.
  if (on_own_thread())
    throw std::logic_error(
        "gpupool: an executor cannot be shut down or destroyed by its own tasks");
  std::lock_guard lock(shutdown_mutex);
  accepting.store(false);
  gate->close();         // submitters waiting for room find the executor shut down
  if (forked()) return;  // nothing of the parent's lanes to stop here
  if (cancel_pending) {
    // Tasks not started are cancelled; pieces of a task that has started go back to the queue
    // and run, so that task ends normally, like every running one.
    for (auto& [item, device] : queue.drain(/*spare_woken=*/true))
      if (!item->cancel() && !queue.offer(item, device))
        // Its device was taken out of service meanwhile, and no other may run it.
        item->fail(std::make_exception_ptr(
            health->refusal(queue.live_devices() > 0 ? device : std::nullopt)));
    if (host) host->cancel_queued();
  }
  queue.close();
  lanes.join();
  if (host) host->close_and_join();
}

void executor::impl::require_accepting() const {
  if (forked())
    throw std::runtime_error(
        "gpupool: this executor was made before fork(); its lanes are not in this process "
        "(pid " +
        std::to_string(getpid()) + "), so it takes no work here. Make a new executor in it");
  if (!accepting.load()) throw std::runtime_error(detail::shut_down_message);
}

void executor::impl::refuse(std::optional<int> device) const {
  require_accepting();
  if (queue.closed()) throw std::runtime_error(detail::shut_down_message);
  throw health->refusal(queue.live_devices() > 0 ? device : std::nullopt);
}

executor::executor(executor_options options) : impl_(std::make_unique<impl>(options)) {}

executor::~executor() {
  if (impl_->forked()) {
    // In a fork()ed child: the lanes (and the device state) belong to the parent. Joining or
    // freeing them here could hang or crash, so this copy is left as it is.
    (void)impl_.release();
    return;
  }
  try {
    shutdown(/*cancel_pending=*/false);
  } catch (const std::exception& e) {
    // Destroyed by one of its own tasks: nothing sane is left to do.
    std::fprintf(stderr, "%s\n", e.what());
    std::terminate();
  }
}

void executor::shutdown(bool cancel_pending) {
  impl_->stop(cancel_pending);
}
bool executor::is_shutdown() const noexcept {
  return !impl_->accepting.load();
}
bool executor::is_lane_thread() const noexcept {
  return impl_->on_own_thread();
}

backend_kind executor::backend() const noexcept {
  return impl_->owner->kind();
}
const std::vector<device_info>& executor::devices() const noexcept {
  return impl_->devices;
}
bool executor::in_service(int device) const noexcept {
  return device >= 0 && static_cast<std::size_t>(device) < impl_->devices.size() &&
         !impl_->queue.retired(device);
}
bool executor::work_waits_above(int device, int priority) const {
  check_priority(priority, "priority");
  return device >= 0 && static_cast<std::size_t>(device) < impl_->devices.size() &&
         impl_->queue.waits_above(device, priority);
}
int executor::lanes_per_device() const noexcept {
  return impl_->lanes_per_device;
}
int executor::lane_count() const noexcept {
  return static_cast<int>(impl_->lanes.size());
}
int executor::slots_per_lane() const noexcept {
  return impl_->slots;
}
std::size_t executor::chunk_bytes() const noexcept {
  return impl_->chunk_bytes;
}
const executor_settings& executor::settings() const noexcept {
  return impl_->settings;
}
int executor::priority() const noexcept {
  return impl_->default_priority;
}

std::size_t executor::queued() const {
  return impl_->queue.size() + (impl_->host ? impl_->host->queued() : 0);
}

std::vector<device_memory_stats> executor::memory_stats() const {
  std::vector<device_memory_stats> stats;
  for (const auto& m : impl_->memory) stats.push_back({m->in_use(), m->peak(), m->budget()});
  return stats;
}

coalescing_stats executor::coalescing() const noexcept {
  return {impl_->coalescing.batches.load(std::memory_order_relaxed),
          impl_->coalescing.tasks.load(std::memory_order_relaxed)};
}

int executor::host_lanes() const noexcept {
  return impl_->host ? impl_->host->count() : 0;
}
placement_stats executor::placement() const {
  return impl_->placement.stats();
}

// --- the in-flight budget (admission.*) ---

in_flight_stats executor::in_flight() const noexcept {
  return impl_->gate->stats();
}
std::size_t executor::in_flight_cost(std::size_t bytes, bool piecewise) const {
  return impl_->gate->cost(bytes, piecewise);
}
void executor::admit(std::size_t cost) {
  impl_->admit(cost);
}
void executor::release_in_flight(std::size_t cost) noexcept {
  impl_->gate->release(cost);
}

// --- tracing ---

void executor::set_tracing(bool on) noexcept {
  impl_->tracing.store(on);
}
bool executor::tracing() const noexcept {
  return impl_->tracing.load();
}
trace executor::trace(std::uint64_t first_task) const {
  std::vector<std::string> names;
  for (const auto& d : impl_->devices) names.push_back(d.name);
  return gpupool::trace(backend(), std::move(names), impl_->lanes_per_device,
                        impl_->recorder.since(first_task));
}
void executor::clear_trace() {
  impl_->recorder.clear();
}
void executor::set_trace_capacity(std::size_t records) {
  impl_->recorder.set_capacity(records);
}
std::size_t executor::trace_capacity() const {
  return impl_->recorder.capacity();
}
std::size_t executor::trace_dropped() const {
  return impl_->recorder.dropped();
}
std::uint64_t executor::next_task_id() const noexcept {
  return impl_->next_id.load(std::memory_order_relaxed);
}

// --- checks of the public templates' arguments ---

void executor::check_device(int device) const {
  if (device < 0 || device >= static_cast<int>(impl_->devices.size()))
    throw std::out_of_range("gpupool: device " + std::to_string(device) +
                            " is not one of this executor's " +
                            std::to_string(impl_->devices.size()) + " devices");
}

void executor::require_arity(const builtin_kernel& k, int arity, const char* what) {
  if (k.arity() != arity)
    throw std::invalid_argument(std::string("gpupool::executor::") + what + ": kernel '" +
                                k.name() + "' takes " + std::to_string(k.arity()) +
                                " input(s), but " + std::to_string(arity) + " were given");
}

void executor::require_same_size(std::size_t a, std::size_t b) {
  if (a != b)
    throw std::invalid_argument("gpupool::executor::transform: input and output sizes differ (" +
                                std::to_string(a) + " vs " + std::to_string(b) + ")");
}

}  // namespace gpupool
