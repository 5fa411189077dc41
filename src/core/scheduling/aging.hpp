// Aging, the one rule every priority-ordered queue of gpupool follows (the task queue, and the
// Python binding's queue of calls): take the highest priority's oldest entry, except that after
// limits::priority_aging_takes takes in a row that passed over the queue's oldest entry, the next
// take is that oldest entry. Counting takes rather than time bounds a low priority's wait in
// units of work, whatever the tasks' sizes, with no clock on the queue's path.
#pragma once

#include "gpupool/options.hpp"

namespace gpupool::detail {

/// Whether the next take is the queue's oldest entry rather than the highest priority's first.
/// `oldest_is_first`: they are the same entry (or one priority only is queued). `passed`: the
/// queue's count of takes in a row that passed over its oldest entry, updated here.
[[nodiscard]] inline bool oldest_is_due(bool oldest_is_first, unsigned& passed) noexcept {
  if (oldest_is_first) {
    passed = 0;
    return false;
  }
  if (passed >= limits::priority_aging_takes) {
    passed = 0;
    return true;
  }
  ++passed;
  return false;
}

/// Whether a take that passes over the queue's oldest entry (for other work) is still allowed.
[[nodiscard]] inline bool may_pass_oldest(unsigned passed) noexcept {
  return passed < limits::priority_aging_takes;
}

}  // namespace gpupool::detail
