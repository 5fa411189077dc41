// Whole numbers from environment variables (core/environment.hpp): digits within the range are
// the number; anything else, signs and spaces included, is refused by name with the value.
#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "core/environment.hpp"

namespace {

using gpupool::detail::count_variable;
using gpupool::detail::parse_count;

constexpr count_variable lanes{"GPUPOOL_SOMETHING", "a count", 1, 1024};

TEST(EnvironmentCount, UnsetAndEmptyAreNotGiven) {
  EXPECT_FALSE(parse_count(lanes, nullptr).has_value());
  EXPECT_FALSE(parse_count(lanes, "").has_value());
}

TEST(EnvironmentCount, DigitsWithinTheRangeAreTheNumber) {
  EXPECT_EQ(parse_count(lanes, "1"), 1u);
  EXPECT_EQ(parse_count(lanes, "16"), 16u);
  EXPECT_EQ(parse_count(lanes, "0016"), 16u);
  EXPECT_EQ(parse_count(lanes, "1024"), 1024u);
  constexpr auto most = std::numeric_limits<unsigned long long>::max();
  EXPECT_EQ(parse_count({"GPUPOOL_BIG", "bytes", 0, most}, "18446744073709551615"), most);
}

TEST(EnvironmentCount, AnythingElseIsRefusedByNameWithTheValue) {
  for (const char* bad : {"0", "1025", "+5", "-5", " 5", "5 ", "5\n", "0x10", "1e3", "5a", "abc",
                          "1.5", "99999999999999999999999"}) {
    try {
      (void)parse_count(lanes, bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), std::string("GPUPOOL_SOMETHING must be a count from 1 to "
                                                   "1024 (digits only), not '") +
                                           bad + "'");
    }
  }
  // One past the largest the type holds is out of range too, not wrapped around.
  EXPECT_THROW(
      (void)parse_count({"GPUPOOL_BIG", "bytes", 0, std::numeric_limits<unsigned long long>::max()},
                        "18446744073709551616"),
      std::invalid_argument);
}

}  // namespace
