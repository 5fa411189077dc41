#include "core/lanes/express_slot.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "core/fault_injection.hpp"
#include "gpupool/options.hpp"

namespace gpupool::detail {

namespace {

lane_tracer::where express_where(lane_tracer::where where) {
  where.express = true;
  return where;
}

}  // namespace

express_slot::express_slot(lane& owner, std::size_t buffer_bytes, const lane_tracer::where& where)
    : owner_(owner),
      buffers_(owner, std::min(buffer_bytes, most_operand_bytes)),
      tracer_(express_where(where)) {}

void express_slot::open(backend& owner, int ordinal, fault_injector* faults,
                        coalescing_counters* coalescing) {
  // Made current again where the stream is made, as lane_worker::open does for the lane's.
  owner.bind_thread(ordinal);
  // The most urgent level the device has within gpupool's range: the express kernel should
  // take the multiprocessors ahead of the bulk work's.
  std::unique_ptr<backend_stream> stream;
  for (int p = limits::highest_priority; !stream; --p) {
    try {
      stream = owner.open_stream(ordinal, p);
    } catch (const std::invalid_argument&) {
      if (p <= 0) throw;  // every backend gives priority 0
    }
  }
  try {
    buffers_.open(*stream, 1, /*device_buffers=*/false);
    if (faults != nullptr) stream = with_faults(std::move(stream), *faults);
    tracer_.attach(*stream, 1);
  } catch (...) {
    buffers_.close();
    throw;
  }
  stream_ = std::move(stream);
  context_.emplace(owner_, *stream_, buffers_, tracer_, coalescing, 0, /*express=*/true);
}

void express_slot::recover() noexcept {
  if (!stream_) return;
  try {
    stream_->synchronize();
  } catch (...) {
    // The failure went to the item that caused it; what matters is that the stream is empty.
  }
}

void express_slot::close() noexcept {
  if (!stream_) return;
  recover();
  context_.reset();
  tracer_.detach();
  buffers_.close();
  stream_.reset();
}

}  // namespace gpupool::detail
