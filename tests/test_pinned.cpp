// The pinned allocator: tracking, reuse of freed blocks, the cache limit.
#include <gtest/gtest.h>

#include <vector>

#include "gpupool/pinned.hpp"

namespace gpupool {
namespace {

class PinnedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_pinned_cache_limit(std::size_t{64} << 20);
    trim_pinned_cache();
  }
};

TEST_F(PinnedTest, FreedBlocksAreReusedForTheSameSizeClass) {
  const auto before = pinned_memory_stats();
  void* a = allocate_pinned(8'000'000);
  EXPECT_TRUE(is_pinned(a));
  EXPECT_TRUE(is_pinned(static_cast<char*>(a) + 7'999'999));
  EXPECT_GE(pinned_memory_stats().in_use, before.in_use + 8'000'000);
  deallocate_pinned(a, 8'000'000);
  EXPECT_EQ(pinned_memory_stats().in_use, before.in_use);
  EXPECT_GE(pinned_memory_stats().cached, 8'000'000u);
  void* b = allocate_pinned(7'900'000);  // same size class
  EXPECT_EQ(a, b);
  deallocate_pinned(b, 7'900'000);
}

TEST_F(PinnedTest, TheCacheNeverHoldsMoreThanItsLimit) {
  set_pinned_cache_limit(std::size_t{1} << 20);
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(allocate_pinned(256 << 10));
  for (void* p : blocks) deallocate_pinned(p, 256 << 10);
  EXPECT_LE(pinned_memory_stats().cached, std::size_t{1} << 20);
  EXPECT_GT(pinned_memory_stats().cached, 0u);
  trim_pinned_cache();
  EXPECT_EQ(pinned_memory_stats().cached, 0u);
  EXPECT_FALSE(is_pinned(blocks.back())) << "a freed block still counts as pinned";
}

TEST_F(PinnedTest, PinnedVectorIsPinnedAndOrdinaryMemoryIsNot) {
  pinned_vector<double> v(1000, 1.5);
  std::vector<double> w(1000, 1.5);
  EXPECT_TRUE(is_pinned(v.data()));
  EXPECT_FALSE(is_pinned(w.data()));
  EXPECT_FALSE(is_pinned(nullptr));
}

}  // namespace
}  // namespace gpupool
