// How many batches a map over arrays already on a device (executor::map_on_device) is cut into.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>

#include "core/backend.hpp"
#include "gpupool/types.hpp"

namespace gpupool::detail {

/// The fewest elements worth a batch of an elementwise kernel (one launch over the batch's
/// table) on `device`, as its backend rules (backend_traits::least_device_batch_elements): on a
/// GPU enough to fill it several times over, where a bigger batch keeps every multiprocessor busy
/// on its own and cutting a map finer only costs time; where a lane runs its batch on one host
/// core (the CPU backend) every batch counts: 1.
inline std::size_t least_device_batch_elements(const device_info& device) {
  return traits_of(device.backend).least_device_batch_elements(device);
}

/// a + b, or the largest std::size_t where that overflows (a total of counts only bounds how
/// many batches a map gets: any total that large gets them all).
constexpr std::size_t saturating_add(std::size_t a, std::size_t b) {
  return a > std::numeric_limits<std::size_t>::max() - b ? std::numeric_limits<std::size_t>::max()
                                                         : a + b;
}

/// Batches for `calls` calls of `elements` elements in all on a device with `lanes` lanes: two
/// per lane (each lane has its next batch while one runs), but none smaller than `least`
/// elements on average, and never more than the calls nor fewer than one (none for no calls).
constexpr std::size_t device_map_batches(std::size_t calls, std::size_t elements, int lanes,
                                         std::size_t least) {
  if (calls == 0) return 0;
  const std::size_t by_lanes = 2 * static_cast<std::size_t>(std::max(lanes, 1));
  const std::size_t by_size = std::max<std::size_t>(1, elements / std::max<std::size_t>(least, 1));
  return std::min({calls, by_lanes, by_size});
}

}  // namespace gpupool::detail
