// Fault injection for tests and soaks: makes a share of allocations, copies, kernel launches and
// task starts fail as real faults would, on either backend. Off unless GPUPOOL_FAULTS is set.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>

#include "core/backend.hpp"

namespace gpupool::detail {

enum class fault_kind { allocation, copy, launch, call };
inline constexpr std::size_t fault_kinds = 4;

/// How often each kind of operation fails (0 to 1), and the seed of the draws.
struct fault_plan {
  std::array<double, fault_kinds> rate{};
  std::uint64_t seed = 0;
  [[nodiscard]] bool any() const noexcept;
  /// Parses GPUPOOL_FAULTS: comma-separated `kind=rate` with kinds alloc, copy, launch, call and
  /// all, and `seed=n`; e.g. "all=0.01,seed=7". Unset or empty: no faults.
  /// @throw std::invalid_argument for anything else.
  static fault_plan from_environment();
};

/// One lane's draws (used only on that lane's thread). Throws, at the chosen share of calls,
/// the error a real fault of that kind would raise: out_of_memory for an allocation,
/// gpupool::error otherwise; every message starts with "gpupool: injected fault".
class fault_injector {
 public:
  fault_injector(const fault_plan& plan, std::uint64_t lane);
  void maybe_fail(fault_kind kind);

 private:
  fault_plan plan_;
  std::mt19937_64 rng_;
};

/// `inner`, with each allocation, copy and launch first offered to `faults`.
std::unique_ptr<backend_stream> with_faults(std::unique_ptr<backend_stream> inner,
                                            fault_injector& faults);

}  // namespace gpupool::detail
