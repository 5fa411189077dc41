// Getting host data ready for an upload: the data itself when it is pinned, else a copy in the
// slot's pinned buffer.
#pragma once

#include <cstring>

#include "core/lanes/lane_worker.hpp"
#include "gpupool/pinned.hpp"

namespace gpupool::detail {

/// Where the upload of `bytes` of `host` data reads from: `host` itself when it is pinned,
/// otherwise slot `slot`'s pinned buffer `buffer`, filled here.
inline const void* stage(lane_worker& w, int slot, int buffer, const void* host,
                         std::size_t bytes) {
  if (is_pinned(host)) return host;
  void* staging = w.slot_host(slot, buffer);
  std::memcpy(staging, host, bytes);
  return staging;
}

}  // namespace gpupool::detail
