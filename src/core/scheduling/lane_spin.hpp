// How long a lane that finds no work keeps looking before it sleeps (GPUPOOL_LANE_SPIN_US), read
// and checked when an executor is made.
#pragma once

#include <chrono>

namespace gpupool::detail {

/// The default look before a lane sleeps. A caller that waits for each result before it submits
/// the next (`submit(...).result()` in a loop) comes back within tens of microseconds, longer
/// from Python; a lane asleep by then costs a wake-up of a thread on a core that went idle, and
/// a task that goes to the longest-sleeping lane, so that one task at a time ran far slower
/// with many lanes than with one. The cost: a lane that runs dry uses its core for this long,
/// yielding it to any other thread that wants it.
inline constexpr std::chrono::microseconds default_lane_spin{50};
/// The longest accepted: beyond it a lane would keep a core busy for no caller's benefit.
inline constexpr std::chrono::microseconds longest_lane_spin{100'000};

/// Parses a GPUPOOL_LANE_SPIN_US value: microseconds, digits only, at most longest_lane_spin;
/// unset or empty is the default; 0 makes lanes sleep at once. Throws std::invalid_argument
/// naming the variable and the value otherwise.
std::chrono::microseconds parse_lane_spin(const char* value);

/// GPUPOOL_LANE_SPIN_US as read now.
std::chrono::microseconds lane_spin_from_environment();

/// The longest a thread waiting on a future looks before it sleeps, whatever the lanes' look: a
/// lane looks only when it runs dry, a waiter at every wait, on any thread, for tasks of any
/// length.
inline constexpr std::chrono::microseconds longest_waiter_spin{100};

/// How long a thread waiting on a future looks for its outcome before it sleeps (process-wide;
/// default_lane_spin until set): every executor sets it to its lanes' look as it is made, at most
/// longest_waiter_spin.
void set_waiter_spin(std::chrono::microseconds spin) noexcept;

}  // namespace gpupool::detail
