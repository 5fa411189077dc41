// Recycled storage for objects made on one thread and freed on others (the queue's pieces of
// small tasks): storage freed elsewhere comes back to the thread that makes the objects, each
// block is handed out once at a time, and a thread's blocks outlive the thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "core/memory/recycled_storage.hpp"

namespace gpupool {
namespace {

struct alignas(32) sample_object {
  unsigned char bytes[200];
};
using storage = detail::recycled_storage<sample_object>;

TEST(RecycledStorage, BlocksFreedOnOtherThreadsComeBackToTheThreadThatMakesObjects) {
  constexpr std::size_t count = 4096;
  std::vector<void*> first;
  for (std::size_t i = 0; i < count; ++i) {
    first.push_back(storage::allocate());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first.back()) % alignof(sample_object), 0u);
  }
  // Freed on two other threads, which then end: what they kept goes to the shared list.
  std::thread([&] {
    for (std::size_t i = 0; i < count / 2; ++i) storage::deallocate(first[i]);
  }).join();
  std::thread([&] {
    for (std::size_t i = count / 2; i < count; ++i) storage::deallocate(first[i]);
  }).join();
  const std::set<void*> freed(first.begin(), first.end());
  ASSERT_EQ(freed.size(), count) << "a block was handed out twice";
  std::vector<void*> second;
  for (std::size_t i = 0; i < count; ++i) second.push_back(storage::allocate());
  const std::set<void*> again(second.begin(), second.end());
  EXPECT_EQ(again.size(), count) << "a block was handed out twice";
  const auto reused = static_cast<std::size_t>(
      std::count_if(second.begin(), second.end(), [&](void* p) { return freed.count(p) != 0; }));
  EXPECT_EQ(reused, count) << "storage freed on other threads was not used again";
  for (void* p : second) storage::deallocate(p);
}

TEST(RecycledStorage, ManyThreadsMakingAndFreeingNeverShareABlock) {
  constexpr int threads = 6, rounds = 200, per_round = 64;
  std::vector<std::thread> workers;
  std::vector<int> overlaps(threads, 0);
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      std::vector<sample_object*> mine;
      for (int r = 0; r < rounds; ++r) {
        for (int i = 0; i < per_round; ++i) {
          auto* o = static_cast<sample_object*>(storage::allocate());
          std::fill(std::begin(o->bytes), std::end(o->bytes), static_cast<unsigned char>(t));
          mine.push_back(o);
        }
        // Another thread writing into a block this one holds would show here.
        for (sample_object* o : mine)
          if (std::any_of(std::begin(o->bytes), std::end(o->bytes),
                          [t](unsigned char b) { return b != static_cast<unsigned char>(t); }))
            ++overlaps[static_cast<std::size_t>(t)];
        for (std::size_t i = 0; i < mine.size(); i += 2) storage::deallocate(mine[i]);
        std::vector<sample_object*> kept;
        for (std::size_t i = 1; i < mine.size(); i += 2) kept.push_back(mine[i]);
        mine.swap(kept);
      }
      for (sample_object* o : mine) storage::deallocate(o);
    });
  for (auto& w : workers) w.join();
  for (int t = 0; t < threads; ++t) EXPECT_EQ(overlaps[static_cast<std::size_t>(t)], 0) << t;
}

}  // namespace
}  // namespace gpupool
