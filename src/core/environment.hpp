// Environment variables read in more than one place, each with one grammar wherever it is read.
// Whole numbers: digits only (no sign, space or base prefix, all of which strtol takes), within
// the variable's range. Anything else is refused by the variable's name, with the value.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace gpupool::detail {

/// The range and wording of one variable: refusals read "<name> must be <what> from <lowest> to
/// <highest> (digits only), not '<value>'".
struct count_variable {
  const char* name;
  const char* what;  ///< "a count", "microseconds", ...
  unsigned long long lowest;
  unsigned long long highest;
};

/// `value` (the variable's text; null or empty: not given, nullopt) as a number in `v`'s range.
/// Throws std::invalid_argument otherwise.
std::optional<unsigned long long> parse_count(const count_variable& v, const char* value);

/// The variable as read now, through parse_count.
std::optional<unsigned long long> count_from_environment(const count_variable& v);

/// GPUPOOL_DEVICES as read now: device ordinals separated by commas ("0,0", "1,0"), each
/// digits only and at most 65535, at most limits::most_lanes_per_executor of them (each device
/// needs a lane); unset or empty: nullopt. Whether each exists is the executor's to check.
/// Throws std::invalid_argument naming the variable and its value otherwise.
std::optional<std::vector<int>> devices_from_environment();

/// GPUPOOL_QUIET as read now: "1" silences the library's notices on stderr (the CPU-backend
/// notice, as executor_options::quiet does, and the kernel cache's); "0", empty or unset: not
/// quiet. Throws std::invalid_argument naming the variable and its value otherwise.
bool quiet_from_environment();

}  // namespace gpupool::detail
