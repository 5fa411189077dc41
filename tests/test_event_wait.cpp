// GPUPOOL_EVENT_WAIT's parser: every accepted spelling, and refusals that name the variable and
// the value.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "core/lanes/event_wait.hpp"

namespace {

using gpupool::detail::event_wait;
using gpupool::detail::parse_event_wait;

TEST(EventWait, UnsetAndEmptyMeanSpin) {
  EXPECT_EQ(parse_event_wait(nullptr), event_wait::spin);
  EXPECT_EQ(parse_event_wait(""), event_wait::spin);
  EXPECT_EQ(parse_event_wait("spin"), event_wait::spin);
  EXPECT_EQ(parse_event_wait("block"), event_wait::block);
}

TEST(EventWait, AnythingElseIsRefusedByName) {
  for (const char* bad : {"bogus", "Block", "SPIN", "spin ", " block", "poll", "hybrid", "0"}) {
    try {
      (void)parse_event_wait(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("GPUPOOL_EVENT_WAIT must be 'spin' or 'block'"), std::string::npos)
          << what;
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
    }
  }
}

}  // namespace
