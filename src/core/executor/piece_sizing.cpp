#include "core/executor/piece_sizing.hpp"

#include "core/scheduling/task_queue.hpp"

namespace gpupool::detail {
namespace {

// A call cut finer than chunk_bytes to keep every lane busy is cut into pieces of whole
// multiples of this, and never below the floor: smaller pieces cost more in per-piece overhead
// than the lanes they bring in gain.
constexpr std::size_t piece_alignment = std::size_t{64} << 10;
constexpr std::size_t adaptive_piece_floor = std::size_t{1} << 20;

}  // namespace

std::size_t piece_sizing::piece_bytes(std::size_t total, const task_queue& queue) const {
  if (given_) return chunk_bytes_;
  const std::size_t lanes_in_all = std::max<std::size_t>(
      static_cast<std::size_t>(queue.live_devices()) * static_cast<std::size_t>(lanes_per_device_),
      1);
  if (queue.size() >= lanes_in_all) return chunk_bytes_;
  const std::size_t share = total / (2 * lanes_in_all);
  const std::size_t rounded = (share + piece_alignment - 1) / piece_alignment * piece_alignment;
  return std::clamp(rounded, std::min(adaptive_piece_floor, chunk_bytes_), chunk_bytes_);
}

}  // namespace gpupool::detail
