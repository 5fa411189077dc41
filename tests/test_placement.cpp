// Placement's model (core/scheduling/placement.*): each side's time is a latency plus a time per
// byte, fitted from what its calls took; a push is shared so that both sides would finish it
// together, given what each has pending.
#include "core/scheduling/placement.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <initializer_list>
#include <utility>
#include <vector>

namespace gpupool::detail {
namespace {

constexpr double kib = 1024;

// Teaches a side exact times of `latency` seconds plus bytes at `bytes_per_second`, over loads
// that differ (so that the fit can tell the two terms apart).
void teach(host_placement& p, bool on_host, double latency, double bytes_per_second) {
  for (int round = 0; round < 4; ++round)
    for (double bytes : {16 * kib, 256 * kib, 1024 * kib, 4096 * kib})
      p.learn(on_host, bytes, latency + bytes / bytes_per_second);
}

TEST(HostPlacementModel, BeforeAnyMeasurementEachLaneCountsAlike) {
  host_placement p(2, 6);
  EXPECT_TRUE(p.enabled());
  EXPECT_DOUBLE_EQ(p.host_share_of(1 << 20), 0.25);
  const placement_stats s = p.stats();
  EXPECT_DOUBLE_EQ(s.host_share, 0.25);
  EXPECT_EQ(s.host_bytes_per_second, 0.0);
  EXPECT_EQ(s.device_bytes_per_second, 0.0);
  EXPECT_FALSE(host_placement(0, 4).enabled());
  EXPECT_EQ(host_placement(0, 4).stats().host_share, 0.0);
}

TEST(HostPlacementModel, TheFitTellsLatencyFromPace) {
  host_placement p(1, 1);
  teach(p, /*on_host=*/false, 100e-6, 10e9);
  teach(p, /*on_host=*/true, 1e-6, 1e9);
  const placement_stats s = p.stats();
  EXPECT_NEAR(s.device_latency_seconds, 100e-6, 1e-9);
  EXPECT_NEAR(s.device_bytes_per_second, 10e9, 1e3);
  EXPECT_NEAR(s.host_latency_seconds, 1e-6, 1e-9);
  EXPECT_NEAR(s.host_bytes_per_second, 1e9, 1e2);
  // Busy on both sides, calls go in proportion to the paces.
  EXPECT_NEAR(s.host_share, 1.0 / 11, 1e-9);
}

TEST(HostPlacementModel, WithNothingPendingALoneSmallCallGoesToTheLowerLatencyAndALargePushByPace) {
  host_placement p(1, 1);
  teach(p, false, 100e-6, 10e9);
  teach(p, true, 1e-6, 1e9);
  // 16 KiB: the host ends it in 17 us, the device in 100 us: the host takes it (but for the
  // device's least share).
  EXPECT_DOUBLE_EQ(p.host_share_of(16 * 1024), 1.0 - host_placement::least_share);
  // 64 MiB: both finish together when the host takes a little more than its pace's share.
  const double share = p.host_share_of(64 << 20);
  EXPECT_GT(share, 1.0 / 11);
  EXPECT_LT(share, 1.0 / 11 + 0.01);
}

// Places one call of `bytes`; true if it went to the host lanes.
bool place_one(host_placement& p, std::size_t bytes) {
  bool on_host = false;
  (void)p.place(
      1, [&](std::size_t) { return bytes; }, [&](std::size_t, bool host) { on_host = host; });
  return on_host;
}

using pending_bytes = std::pair<std::size_t, std::size_t>;

TEST(HostPlacementModel, WhatIsPendingOnASideCountsAgainstIt) {
  constexpr std::size_t mib = std::size_t{1} << 20;
  host_placement p(1, 1);
  teach(p, false, 100e-6, 10e9);
  teach(p, true, 1e-6, 1e9);
  const double idle = p.host_share_of(mib);
  // A large call goes to the faster pace; then the devices are 6.7 ms behind, and the host
  // takes the next MiB (it ends it in about 1 ms).
  EXPECT_FALSE(place_one(p, 64 * mib));
  EXPECT_EQ(p.pending(), pending_bytes(0, 64 * mib));
  EXPECT_DOUBLE_EQ(p.host_share_of(mib), 1.0 - host_placement::least_share);
  EXPECT_TRUE(place_one(p, mib));
  EXPECT_EQ(p.pending(), pending_bytes(mib, 64 * mib));
  p.ended(false, 64 * mib);
  p.ended(true, mib);
  EXPECT_EQ(p.pending(), pending_bytes(0, 0));
  EXPECT_DOUBLE_EQ(p.host_share_of(mib), idle);

  // The other way round: a host faster per byte, and behind, leaves the next call to the device.
  host_placement q(1, 1);
  teach(q, false, 100e-6, 1e9);
  teach(q, true, 1e-6, 10e9);
  EXPECT_TRUE(place_one(q, 64 * mib));
  EXPECT_DOUBLE_EQ(q.host_share_of(mib), host_placement::least_share);
  EXPECT_FALSE(place_one(q, mib));
  EXPECT_EQ(q.pending(), pending_bytes(64 * mib, mib));
}

TEST(HostPlacementModel, AShareSpreadsTheHostsCallsAndWithdrawingGivesTheirBytesBack) {
  host_placement p(1, 3);  // a quarter to the host, nothing measured yet
  std::vector<bool> where;
  const auto placed = p.place(
      16, [](std::size_t) { return std::size_t{1000}; },
      [&](std::size_t, bool host) { where.push_back(host); });
  ASSERT_EQ(where.size(), 16u);
  EXPECT_EQ(placed.host_bytes, 4000u);
  EXPECT_EQ(placed.device_bytes, 12000u);
  for (std::size_t i = 0; i < 16; i += 4)  // every fourth call, never two in a row
    EXPECT_EQ(where[i] + where[i + 1] + where[i + 2] + where[i + 3], 1) << "calls " << i;
  EXPECT_EQ(p.pending(), pending_bytes(4000, 12000));
  p.withdraw(placed);
  EXPECT_EQ(p.pending(), pending_bytes(0, 0));
}

TEST(HostPlacementModel, OneLoadAloneCountsItsWholeTimePerByte) {
  host_placement p(1, 1);
  for (int i = 0; i < 8; ++i) p.learn(false, 16 * kib, 100e-6);
  const placement_stats s = p.stats();
  EXPECT_NEAR(s.device_latency_seconds, 0.0, 1e-12);
  EXPECT_NEAR(s.device_bytes_per_second, 16 * kib / 100e-6, 1e-3);
  // The host, unmeasured, is taken as fast as one of the device's lanes.
  EXPECT_DOUBLE_EQ(s.host_share, 0.5);
}

TEST(HostPlacementModel, AGroupLearnsFromASidesLastCallUnlessOneOfItsCallsFailed) {
  host_placement p(1, 1);
  const std::size_t call = 4096;
  {
    // Half each, alternating: calls 0 and 2 to the host.
    const auto placed = p.place(
        4, [&](std::size_t) { return call; }, [](std::size_t, bool) {});
    ASSERT_EQ(placed.host_bytes, 2 * call);
    placement_group g(p, 2, 2, placed, /*device_learns=*/true);
    g.finished(true, call, true);
    EXPECT_EQ(p.stats().host_bytes_per_second, 0.0);  // one host call still pending
    g.finished(true, call, true);
    EXPECT_GT(p.stats().host_bytes_per_second, 0.0);
    g.finished(false, call, false);
    g.finished(false, call, true);
    EXPECT_EQ(p.stats().device_bytes_per_second, 0.0);  // a failed call: nothing learnt
  }
  {
    // A push that also carried calls placement did not consider: the devices learn nothing.
    const auto placed = p.place(
        2, [&](std::size_t) { return call; }, [](std::size_t, bool) {});
    placement_group g(p, 1, 1, placed, /*device_learns=*/false);
    g.finished(false, call, true);
    g.finished(true, call, true);
    EXPECT_EQ(p.stats().device_bytes_per_second, 0.0);
  }
  // Every call's bytes were given back, failed or not.
  EXPECT_EQ(p.pending(), pending_bytes(0, 0));
}

TEST(HostPlacementModel, ATimeThatDoesNotGrowWithTheBytesIsLatency) {
  host_placement p(1, 1);
  teach(p, false, 100e-6, 10e9);
  // Then every load takes the same time, the larger ones a little less (noise).
  for (int i = 0; i < 200; ++i)
    p.learn(false, i % 2 ? 16 * kib : 4096 * kib, i % 2 ? 300e-6 : 299e-6);
  const placement_stats s = p.stats();
  EXPECT_DOUBLE_EQ(s.device_bytes_per_second, host_placement::fastest_pace);
  EXPECT_NEAR(s.device_latency_seconds, 300e-6, 5e-6);
  // The host gets what it ends within that latency (1 GB/s: about 300 KB), the devices the rest.
  teach(p, true, 0, 1e9);
  const double share = p.host_share_of(std::size_t{3} << 20);
  EXPECT_GT(share, 0.08);
  EXPECT_LT(share, 0.11);
}

}  // namespace
}  // namespace gpupool::detail
