// The pinned allocator: tracking, reuse of freed blocks, the cache limit, pointer kinds, and the
// host-memory seam the core is written against.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/memory/host_memory.hpp"
#include "core/memory/pinned_cache.hpp"
#include "core/memory/result_slabs.hpp"
#include "gpupool/host_vector.hpp"
#include "gpupool/pinned.hpp"
#include "gpupool/pointer.hpp"
#include "test_support.hpp"

namespace gpupool {
namespace {

class PinnedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_pinned_cache_limit(std::size_t{64} << 20);
    trim_pinned_cache();
  }
  void TearDown() override { set_pinned_cache_limit(std::size_t{64} << 20); }
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

TEST_F(PinnedTest, KindsOfPageableFreshAndCachedMemory) {
  std::vector<double> pageable(4096, 1.0);
  EXPECT_EQ(describe_pointer(pageable.data()).kind, memory_kind::unknown);
  EXPECT_EQ(describe_pointer(pageable.data()).device, -1);
  EXPECT_EQ(describe_pointer(nullptr).kind, memory_kind::unknown);

  void* fresh = allocate_pinned(100'000);
  EXPECT_EQ(describe_pointer(fresh).kind, memory_kind::pinned_host);
  EXPECT_EQ(describe_pointer(fresh).device, -1);
  EXPECT_EQ(describe_pointer(static_cast<char*>(fresh) + 99'999).kind, memory_kind::pinned_host);
  deallocate_pinned(fresh, 100'000);

  void* cached = allocate_pinned(100'000);  // the same block, from the cache
  ASSERT_EQ(cached, fresh);
  EXPECT_TRUE(is_pinned(cached));
  EXPECT_EQ(describe_pointer(cached).kind, memory_kind::pinned_host);
  deallocate_pinned(cached, 100'000);
}

// An address gpupool gave back and the system then handed out as ordinary memory is ordinary; an
// address that was ordinary memory and then became a gpupool block is pinned. Nothing is answered
// from a stale record either way.
TEST_F(PinnedTest, FreedAndReallocatedAddressesAreDescribedAsWhatTheyAreNow) {
  set_pinned_cache_limit(0);  // every freed block goes back to the system at once
  constexpr std::size_t bytes = 64 << 10;
  void* pinned = allocate_pinned(bytes);
  ASSERT_TRUE(is_pinned(pinned));
  deallocate_pinned(pinned, bytes);
  EXPECT_FALSE(is_pinned(pinned));
  EXPECT_EQ(describe_pointer(pinned).kind, memory_kind::unknown);

  // Ordinary allocations until one covers the freed block's address (the system usually hands
  // it out again at once).
  std::vector<char*> ordinary;
  bool reused = false;
  for (int i = 0; i < 64 && !reused; ++i) {
    ordinary.push_back(static_cast<char*>(std::malloc(bytes)));
    ASSERT_NE(ordinary.back(), nullptr);
    reused = ordinary.back() <= pinned && pinned < ordinary.back() + bytes;
    EXPECT_FALSE(is_pinned(ordinary.back()));
    EXPECT_EQ(describe_pointer(ordinary.back()).kind, memory_kind::unknown);
  }
  EXPECT_FALSE(is_pinned(pinned));
  const void* last_ordinary = ordinary.back();
  for (char* p : ordinary) std::free(p);
  if (!reused) std::printf("(the system did not hand the freed address out again)\n");

  void* again = allocate_pinned(bytes);
  EXPECT_TRUE(is_pinned(again));
  EXPECT_EQ(describe_pointer(again).kind, memory_kind::pinned_host);
  if (again == last_ordinary) std::printf("(a gpupool block now sits where ordinary memory was)\n");
  deallocate_pinned(again, bytes);
}

// Many threads taking and returning blocks of several sizes while one thread keeps changing the
// limit and trimming: the cache never holds more than the largest limit set, ends within the last
// one, and every byte is accounted for.
TEST_F(PinnedTest, TheCacheLimitAndTrimHoldUnderManyThreads) {
  constexpr std::size_t big_limit = std::size_t{4} << 20;
  constexpr std::size_t small_limit = std::size_t{1} << 20;
  set_pinned_cache_limit(big_limit);
  const std::size_t in_use_before = pinned_memory_stats().in_use;
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> most_cached{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t)
    workers.emplace_back([t] {
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<std::pair<void*, std::size_t>> held;
      for (int i = 0; i < 3000; ++i) {
        if (held.size() < 6 && random() % 2 == 0) {
          const std::size_t bytes = std::size_t{4096} << (random() % 7);  // 4 KiB .. 256 KiB
          void* p = allocate_pinned(bytes);
          static_cast<char*>(p)[bytes - 1] = 1;  // it is as large as asked for
          EXPECT_TRUE(is_pinned(static_cast<char*>(p) + bytes - 1));
          held.emplace_back(p, bytes);
        } else if (!held.empty()) {
          const std::size_t k = random() % held.size();
          deallocate_pinned(held[k].first, held[k].second);
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      for (auto [p, bytes] : held) deallocate_pinned(p, bytes);
    });
  std::thread limits([&] {
    for (int i = 0; !stop.load(); ++i) {
      if (i % 3 == 0) trim_pinned_cache();
      set_pinned_cache_limit(i % 2 ? small_limit : big_limit);
      most_cached = std::max(most_cached.load(), pinned_memory_stats().cached);
    }
  });
  for (auto& w : workers) w.join();
  stop = true;
  limits.join();
  EXPECT_LE(most_cached.load(), big_limit);
  EXPECT_EQ(pinned_memory_stats().in_use, in_use_before);
  set_pinned_cache_limit(small_limit);
  EXPECT_LE(pinned_memory_stats().cached, small_limit);
  trim_pinned_cache();
  EXPECT_EQ(pinned_memory_stats().cached, 0u);
}

// A pinned block released by a destructor that runs after the thread's own gpupool state is gone
// (as static destructors do on the main thread) is still answered and cached rightly. Under
// AddressSanitizer this also checks that nothing freed at thread exit is read.
std::atomic<int> late_answers{0};
struct released_at_thread_exit {
  void* block = nullptr;
  ~released_at_thread_exit() {
    if (is_pinned(block) && describe_pointer(block).kind == memory_kind::pinned_host)
      ++late_answers;
    deallocate_pinned(block, 4096);
    std::vector<char> ordinary(64);
    if (!is_pinned(ordinary.data())) ++late_answers;
  }
};

TEST_F(PinnedTest, BlocksReleasedAtThreadExitAreStillAnsweredRightly) {
  late_answers = 0;
  const std::size_t in_use_before = pinned_memory_stats().in_use;
  void* block = allocate_pinned(4096);
  std::thread([block] {
    // Made before the thread first asks, so destroyed after what the first question made.
    thread_local released_at_thread_exit late;
    late.block = block;
    EXPECT_TRUE(is_pinned(block));
  }).join();
  EXPECT_EQ(late_answers.load(), 2);
  EXPECT_EQ(pinned_memory_stats().in_use, in_use_before);
}

// On a GPU: CUDA's host memory describes device memory with its device, gpupool's pinned blocks
// are memory the driver itself calls pinned, and foreign streams can be waited on.
TEST(CudaHostMemoryTest, DeviceMemoryAndPinnedBlocksAreWhatTheDriverSays) {
  GPUPOOL_SKIP_UNLESS_USABLE(backend_kind::cuda);
  if (const char* forced = std::getenv("GPUPOOL_BACKEND"); forced && std::string(forced) == "cpu")
    GTEST_SKIP() << "GPUPOOL_BACKEND=cpu: pinned blocks are ordinary memory";
  auto cuda = detail::cuda_backend_registration.make({});
  cuda->bind_thread(0);
  auto stream = cuda->open_stream(0);
  void* device = stream->allocate(std::size_t{1} << 20);
  stream->synchronize();
  EXPECT_EQ(describe_pointer(device).kind, memory_kind::device);
  EXPECT_EQ(describe_pointer(device).device, 0);
  EXPECT_FALSE(is_pinned(device));

  detail::host_memory& driver = detail::cuda_backend_registration.host();
  void* block = allocate_pinned(std::size_t{1} << 16);
  EXPECT_EQ(driver.describe(block).kind, memory_kind::pinned_host);
  std::vector<char> pageable(4096);
  EXPECT_EQ(driver.describe(pageable.data()).kind, memory_kind::unknown);
  EXPECT_EQ(describe_pointer(pageable.data()).kind, memory_kind::unknown);
  wait_for_stream(reinterpret_cast<std::uintptr_t>(stream->native_handle()));
  deallocate_pinned(block, std::size_t{1} << 16);
  stream->deallocate(device);
  stream->synchronize();
}

// ---- the seam, with stand-in host memory that counts what it is asked

class counting_resource final : public detail::memory_resource {
 public:
  explicit counting_resource(const detail::pinned_cache* watched = nullptr) : watched_(watched) {}
  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(detail::host_page_bytes, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::lock_guard lock(mutex_);
    live_[p] = bytes;
    ++allocations_;
    allocated_bytes_ += bytes;
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    {
      std::lock_guard lock(mutex_);
      if (watched_ != nullptr && watched_->owns(p)) ++freed_while_owned_;
      if (releasing != nullptr && p != releasing) ++freed_for_another_;
      auto it = live_.find(p);
      if (it == live_.end() || it->second != bytes) ++bad_frees_;
      if (it != live_.end()) live_.erase(it);
    }
    std::free(p);
  }
  void watch(const detail::pinned_cache* cache) { watched_ = cache; }
  std::size_t live_bytes() {
    std::lock_guard lock(mutex_);
    std::size_t sum = 0;
    for (auto& [p, bytes] : live_) sum += bytes;
    return sum;
  }
  int allocations() {
    std::lock_guard lock(mutex_);
    return allocations_;
  }
  std::size_t allocated_bytes() {
    std::lock_guard lock(mutex_);
    return allocated_bytes_;
  }
  int freed_while_owned() {
    std::lock_guard lock(mutex_);
    return freed_while_owned_;
  }
  int bad_frees() {
    std::lock_guard lock(mutex_);
    return bad_frees_;
  }
  // Blocks given back while this thread's `releasing` block was being freed into the cache:
  // blocks that made way for it (set `releasing` around a release to count them).
  int freed_for_another() {
    std::lock_guard lock(mutex_);
    return freed_for_another_;
  }
  static thread_local const void* releasing;

 private:
  const detail::pinned_cache* watched_;
  std::mutex mutex_;
  std::map<void*, std::size_t> live_;
  int allocations_ = 0;
  std::size_t allocated_bytes_ = 0;
  int freed_while_owned_ = 0;
  int bad_frees_ = 0;
  int freed_for_another_ = 0;
};
thread_local const void* counting_resource::releasing = nullptr;

class counting_host_memory final : public detail::host_memory {
 public:
  detail::memory_resource& pinned() noexcept override { return pinned_; }
  pointer_info describe(const void* p) const noexcept override {
    ++descriptions;
    return p == registered ? pointer_info{memory_kind::pinned_host, -1} : pointer_info{};
  }
  void wait_for_stream(std::uintptr_t /*stream*/) override {}

  counting_resource pinned_;
  const void* registered = nullptr;  // stands for memory registered with the driver elsewhere
  mutable std::atomic<int> descriptions{0};
};

TEST_F(PinnedTest, OnlyTheCachesOwnBlocksAreTakenBackByTheirStart) {
  void* block = allocate_pinned(10'000);
  const auto held = pinned_memory_stats();
  // An address inside the block, or memory that is not the cache's: nothing is taken back.
  EXPECT_FALSE(detail::deallocate_if_pinned_block(static_cast<char*>(block) + 64));
  std::vector<char> heap(8192);
  EXPECT_FALSE(detail::deallocate_if_pinned_block(heap.data()));
  EXPECT_FALSE(detail::deallocate_if_pinned_block(nullptr));
  EXPECT_EQ(pinned_memory_stats().in_use, held.in_use);
  EXPECT_TRUE(detail::deallocate_if_pinned_block(block));
  EXPECT_LT(pinned_memory_stats().in_use, held.in_use);
  EXPECT_GT(pinned_memory_stats().cached, held.cached);
}

// Result slabs (core/memory/result_slabs.hpp): while a scope is open on a thread, the results it
// allocates lie end to end, at most 64 to a slab; each slab ends with its last result, freed in
// any order, before or after the scope closes.
TEST_F(PinnedTest, ResultsCarvedFromSlabsLieEndToEndAndEachSlabEndsWithItsLastResult) {
  EXPECT_EQ(detail::carve_result(8192), nullptr);  // no scope open
  {
    const detail::result_slabs one(1, 8192);  // nothing to share: not opened
    EXPECT_EQ(detail::carve_result(8192), nullptr);
  }
  const std::size_t held = pinned_memory_stats().in_use;
  constexpr std::size_t n = 130, bytes = 4096;
  std::vector<char*> carved;
  {
    const detail::result_slabs slabs(n, n * bytes);
    {
      const detail::result_slabs inner(4, 4 * bytes);  // one scope a thread: inert
      for (std::size_t i = 0; i < n; ++i) {
        carved.push_back(static_cast<char*>(detail::carve_result(bytes)));
        ASSERT_NE(carved.back(), nullptr) << i;
        std::fill_n(carved.back(), bytes, static_cast<char>(i));
      }
    }
    EXPECT_EQ(detail::carve_result(bytes), nullptr);  // the scope's results are spent
    // Runs of results end to end, each run one slab of 2 to 64 results.
    std::size_t run = 1, runs = 1;
    for (std::size_t i = 1; i < n; ++i) {
      EXPECT_TRUE(is_pinned(carved[i])) << "result " << i;
      if (carved[i] == carved[i - 1] + bytes) {
        ++run;
        continue;
      }
      EXPECT_GE(run, 2u) << "result " << i;
      EXPECT_LE(run, detail::result_slabs::slab_results) << "result " << i;
      run = 1;
      ++runs;
    }
    EXPECT_LE(run, detail::result_slabs::slab_results);
    EXPECT_EQ(runs, 3u) << "130 results of a page, 63 or 64 to a slab";
    // Freed before the scope closes: the first 64 results, from the last to the first.
    for (std::size_t i = 64; i-- > 0;) EXPECT_TRUE(detail::deallocate_if_pinned_block(carved[i]));
  }
  for (std::size_t i = 64; i < n; ++i)
    EXPECT_TRUE(std::all_of(carved[i], carved[i] + bytes,
                            [&](char c) { return c == static_cast<char>(i); }))
        << "result " << i;
  EXPECT_GT(pinned_memory_stats().in_use, held);
  // The rest freed from four threads at once, in shuffled order.
  std::mt19937 order(7);
  std::shuffle(carved.begin() + 64, carved.end(), order);
  std::vector<std::thread> freeing;
  for (std::size_t k = 0; k < 4; ++k)
    freeing.emplace_back([&, k] {
      for (std::size_t i = 64 + k; i < n; i += 4)
        EXPECT_TRUE(detail::deallocate_if_pinned_block(carved[i]));
    });
  for (auto& t : freeing) t.join();
  EXPECT_EQ(pinned_memory_stats().in_use, held);
  // Results larger than a slab takes, or of over-aligned types, are no slab's.
  {
    const detail::result_slabs slabs(2, 2 * (detail::result_slabs::largest_result + 16));
    EXPECT_EQ(detail::carve_result(detail::result_slabs::largest_result + 1), nullptr);
    void* fits = detail::carve_result(bytes);
    EXPECT_NE(fits, nullptr);
    EXPECT_TRUE(detail::deallocate_if_pinned_block(fits));
  }
  EXPECT_EQ(pinned_memory_stats().in_use, held);
}

TEST_F(PinnedTest, HostVectorsGiveTheirBlocksBackWhereTheyCameFrom) {
  const auto before = pinned_memory_stats();
  {
    host_vector<double> pinned(4096);  // 32 KiB: from the pinned cache
    host_vector<double> small(16);     // below a page: from the heap
    EXPECT_TRUE(is_pinned(pinned.data()));
    EXPECT_FALSE(is_pinned(small.data()));
    EXPECT_GT(pinned_memory_stats().in_use, before.in_use);
  }
  EXPECT_EQ(pinned_memory_stats().in_use, before.in_use);
  EXPECT_GT(pinned_memory_stats().cached, before.cached);
}

TEST(PinnedCacheTest, ThreadsAliveTogetherTakeTheLowestFreeStripesHoweverManyCameBefore) {
  // Threads that came and went, as the lanes of executors made one after another do.
  for (int i = 0; i < 200; ++i) std::thread([] { (void)detail::thread_stripe(SIZE_MAX); }).join();
  const std::size_t mine = detail::thread_stripe(SIZE_MAX);  // held while the others start
  constexpr std::size_t together = 24;
  std::vector<std::size_t> numbers(together);
  std::latch all_taken(together);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < together; ++i)
    threads.emplace_back([&, i] {
      numbers[i] = detail::thread_stripe(SIZE_MAX);
      all_taken.arrive_and_wait();  // alive until every one has its number
    });
  for (auto& t : threads) t.join();
  numbers.push_back(mine);
  std::sort(numbers.begin(), numbers.end());
  EXPECT_EQ(std::adjacent_find(numbers.begin(), numbers.end()), numbers.end())
      << "two threads alive together share a stripe";
  for (std::size_t n : numbers) EXPECT_LT(n, 64u) << "a number not reused after its thread ended";
}

TEST(PinnedCacheTest, OwnBlocksAreAnsweredWithoutAskingTheBackend) {
  counting_host_memory memory;
  detail::pinned_cache cache(memory.pinned(), std::size_t{16} << 20);
  void* block = cache.acquire(10'000);
  EXPECT_TRUE(detail::is_pinned(block, cache, memory));
  EXPECT_TRUE(detail::is_pinned(static_cast<char*>(block) + 12'287, cache, memory));
  EXPECT_EQ(detail::describe_pointer(block, cache, memory).kind, memory_kind::pinned_host);
  EXPECT_EQ(memory.descriptions.load(), 0) << "the backend was asked about gpupool's own block";

  // Past the block's end, and memory the backend knows as pinned: the backend answers.
  std::vector<char> registered(64);
  memory.registered = registered.data();
  EXPECT_FALSE(detail::is_pinned(static_cast<char*>(block) + 12'288, cache, memory));
  EXPECT_TRUE(detail::is_pinned(registered.data(), cache, memory));
  EXPECT_EQ(detail::describe_pointer(registered.data(), cache, memory).kind,
            memory_kind::pinned_host);
  EXPECT_EQ(memory.descriptions.load(), 3);
  cache.release(block);
}

TEST(PinnedCacheTest, CachedBlocksComeBackWithoutANewAllocation) {
  counting_resource source;
  detail::pinned_cache cache(source, std::size_t{16} << 20);
  void* a = cache.acquire(8192);
  cache.release(a);
  void* b = cache.acquire(5000);  // same size class (two pages)
  EXPECT_EQ(a, b);
  EXPECT_EQ(source.allocations(), 1);
  // Taken on one thread, returned and taken again on others: still the one block.
  std::thread([&] { cache.release(b); }).join();
  void* c = nullptr;
  std::thread([&] { c = cache.acquire(8192); }).join();
  EXPECT_EQ(c, a);
  EXPECT_EQ(source.allocations(), 1);
  cache.release(c);
}

TEST(PinnedCacheTest, BlocksLeaveTheRegistryBeforeTheirMemoryIsFreed) {
  counting_resource source;
  {
    detail::pinned_cache cache(source, std::size_t{1} << 20);
    source.watch(&cache);
    std::vector<void*> blocks;
    for (int i = 0; i < 8; ++i) blocks.push_back(cache.acquire(std::size_t{256} << 10));
    for (void* p : blocks) cache.release(p);  // four fit the limit; four are freed at once
    EXPECT_EQ(source.live_bytes(), std::size_t{1} << 20);
    cache.set_limit(std::size_t{256} << 10);
    cache.trim();
    for (void* p : blocks) EXPECT_FALSE(cache.owns(p));
    EXPECT_EQ(source.freed_while_owned(), 0);
    source.watch(nullptr);
  }
  EXPECT_EQ(source.live_bytes(), 0u);
  EXPECT_EQ(source.bad_frees(), 0);
}

// A stand-in clock for the cache's generations, moved by the tests.
std::atomic<std::int64_t> fake_nanoseconds{0};
std::int64_t fake_clock() noexcept {
  return fake_nanoseconds.load();
}
void let_a_generation_pass() {
  fake_nanoseconds += detail::pinned_cache::generation_length.count();
}
// A clock that moves half a generation each time it is read: every other slow step starts a
// new generation, so sizes age as fast as they can.
std::atomic<std::int64_t> racing_nanoseconds{0};
std::int64_t racing_clock() noexcept {
  return racing_nanoseconds.fetch_add(detail::pinned_cache::generation_length.count() / 2);
}

// A cache filled by one size that is then not asked for again, and another size in use, taken
// and freed round after round: once the old size has gone unused for two generations, the size
// in use is cached in its place and comes back as it is, where before every one of its blocks
// was made and given back each round.
TEST(PinnedCacheTest, AFullCacheKeepsTheSizeInUseInPlaceOfSizesNotUsedLately) {
  constexpr std::size_t kib = 1024;
  counting_resource source;
  detail::pinned_cache cache(source, 1024 * kib, &fake_clock);
  source.watch(&cache);
  std::vector<void*> old_size;
  for (int i = 0; i < 4; ++i) old_size.push_back(cache.acquire(256 * kib));
  for (void* p : old_size) cache.release(p);
  ASSERT_EQ(cache.stats().cached, 1024 * kib);
  std::vector<void*> kept;
  for (int round = 0; round < 5; ++round) {
    let_a_generation_pass();
    void* a = cache.acquire(384 * kib);
    void* b = cache.acquire(384 * kib);
    cache.release(a);
    cache.release(b);
    const pinned_stats s = cache.stats();
    if (round == 0) {
      // One generation since the old size was used: it may yet be asked for again.
      EXPECT_EQ(source.allocations(), 6);
      EXPECT_EQ(s.cached, 1024 * kib);
      EXPECT_FALSE(cache.owns(a));
      EXPECT_FALSE(cache.owns(b));
    } else if (round == 1) {
      // Two: two of the old blocks make way for the first, one for the second.
      EXPECT_EQ(source.allocations(), 8);
      EXPECT_EQ(s.cached, 2 * 384 * kib + 256 * kib);
      kept = {a, b};
    } else {
      EXPECT_EQ(source.allocations(), 8) << "round " << round << ": the size in use was made again";
      EXPECT_TRUE((a == kept[0] && b == kept[1]) || (a == kept[1] && b == kept[0]));
      EXPECT_EQ(s.cached, 2 * 384 * kib + 256 * kib);
    }
    EXPECT_EQ(source.live_bytes(), s.cached);
  }
  EXPECT_EQ(source.freed_while_owned(), 0);

  // Sizes unused for long enough but too few to make room stay, and the block is given back; a
  // block larger than the limit makes no way at all.
  detail::pinned_cache same(source, 512 * kib, &fake_clock);
  void* unused = same.acquire(64 * kib);
  same.release(unused);
  let_a_generation_pass();
  void* in_use = same.acquire(448 * kib);  // made: generation 1
  let_a_generation_pass();
  void* freed = same.acquire(256 * kib);  // made: generation 2
  same.release(in_use);
  ASSERT_EQ(same.stats().cached, 512 * kib);
  same.release(freed);  // needs 256 KiB; the unused size has 64
  EXPECT_FALSE(same.owns(freed));
  EXPECT_TRUE(same.owns(unused));
  EXPECT_EQ(same.stats().cached, 512 * kib);
  void* huge = same.acquire(640 * kib);
  let_a_generation_pass();
  let_a_generation_pass();
  same.release(huge);
  EXPECT_EQ(same.stats().cached, 512 * kib);
  EXPECT_FALSE(same.owns(huge));
  // What that look found lasts only its generation: once the 448 KiB size has gone unused too,
  // a freed 256 KiB block takes the place of both.
  let_a_generation_pass();
  same.release(same.acquire(2048 * kib));  // a slow step: generation 3
  let_a_generation_pass();
  void* later = same.acquire(256 * kib);  // made: generation 4
  same.release(later);
  EXPECT_TRUE(same.owns(later));
  EXPECT_FALSE(same.owns(in_use));
  EXPECT_FALSE(same.owns(unused));
  EXPECT_EQ(same.stats().cached, 256 * kib);
  EXPECT_EQ(source.live_bytes(), cache.stats().cached + same.stats().cached);
  source.watch(nullptr);
  same.trim();
  cache.trim();
  EXPECT_EQ(source.live_bytes(), 0u);
  EXPECT_EQ(source.bad_frees(), 0);
}

// Sizes that take turns in a workload larger than the cache (six 64 KiB and two 512 KiB blocks
// a round, 1 MiB cached) are each used every round, so none is displaced, however slow the
// rounds: the cache keeps what it kept, and makes no more blocks than a cache whose sizes never
// age, where displacing would make and give back blocks round after round.
TEST(PinnedCacheTest, SizesThatTakeTurnsDisplaceNothing) {
  constexpr std::size_t kib = 1024;
  const auto blocks_made = [&](bool generations_pass) {
    counting_resource source;
    {
      detail::pinned_cache cache(source, 1024 * kib, &fake_clock);
      for (int round = 0; round < 50; ++round) {
        if (generations_pass) let_a_generation_pass();
        std::vector<void*> held;
        for (int i = 0; i < 8; ++i) held.push_back(cache.acquire((i % 4 == 1 ? 512 : 64) * kib));
        // Freed in a different order each round.
        std::rotate(held.begin(), held.begin() + round % 8, held.end());
        for (void* p : held) cache.release(p);
        EXPECT_LE(cache.stats().cached, 1024 * kib);
      }
      cache.trim();
    }
    EXPECT_EQ(source.live_bytes(), 0u);
    return source.allocations();
  };
  const int never_aging = blocks_made(false);
  const int aging = blocks_made(true);
  EXPECT_EQ(aging, never_aging);
  EXPECT_LT(aging, 8 * 50 / 2) << "the cache serves most blocks";
}

// A size whose blocks made way and that has to be made again soon after (sooner than the wait)
// doubles the wait; a size made again later does not; calm spans on the clock halve it again,
// once each.
TEST(PinnedCacheTest, ASizeBackSoonAfterItMadeWayDoublesTheWaitAndCalmHalvesIt) {
  constexpr std::size_t kib = 1024;
  counting_resource source;
  detail::pinned_cache cache(source, 1024 * kib, &fake_clock);
  // Each round is a generation: a block larger than the limit is made (a slow step, which ends
  // the generation due), then `blocks` of `bytes` are taken and freed.
  const auto round = [&](std::size_t bytes, int blocks) {
    let_a_generation_pass();
    cache.release(cache.acquire(2048 * kib));
    std::vector<void*> held;
    for (int i = 0; i < blocks; ++i) held.push_back(cache.acquire(bytes));
    for (void* p : held) cache.release(p);
  };
  constexpr std::uint32_t first = detail::pinned_cache::first_unused_generations;
  round(256 * kib, 4);  // the cache full of one size
  EXPECT_EQ(cache.unused_generations(), first);
  round(384 * kib, 2);
  round(384 * kib, 2);  // two generations on: three of the first size make way
  EXPECT_EQ(cache.stats().cached, 2 * 384 * kib + 256 * kib);
  round(256 * kib, 4);  // made again one generation after it made way, sooner than the wait
  EXPECT_EQ(cache.unused_generations(), 2 * first);

  // Another size makes way after four generations unused and is made again five generations
  // later: no sooner than the wait (four) and later than it had gone unused before (four), so
  // the wait stays.
  cache.trim();
  round(128 * kib, 1);
  for (int i = 0; i < 8; ++i) round(512 * kib, 2);
  EXPECT_EQ(cache.stats().cached, 1024 * kib) << "the 128 KiB block made way for a 512 KiB one";
  // (The wait is 4 here: the 512 KiB blocks of the rounds above are cached from the second on.)
  round(128 * kib, 1);
  EXPECT_EQ(cache.unused_generations(), 2 * first);
  // Doubled again: the 512 KiB size makes way for the 640 KiB one and is made again at once.
  cache.trim();
  for (int i = 0; i < 2; ++i) round(512 * kib, 2);
  for (int i = 0; i < 4; ++i) round(640 * kib, 1);  // the 512 KiB blocks unused for four
  round(512 * kib, 2);
  ASSERT_EQ(cache.unused_generations(), 4 * first);
  // Calm is counted on the clock, once per span: a span with no slow step (no generation ends)
  // halves it once, at the next slow step.
  for (std::uint32_t i = 0; i < detail::pinned_cache::calm_generations; ++i)
    let_a_generation_pass();
  round(0, 0);
  EXPECT_EQ(cache.unused_generations(), 2 * first);
  // Doubled again, to 8; then two spans at once halve it twice, to 2.
  cache.trim();
  for (int i = 0; i < 2; ++i) round(512 * kib, 2);
  for (int i = 0; i < 4; ++i) round(640 * kib, 1);
  round(512 * kib, 2);
  ASSERT_EQ(cache.unused_generations(), 4 * first);
  for (std::uint32_t i = 0; i < 2 * detail::pinned_cache::calm_generations; ++i)
    let_a_generation_pass();
  round(0, 0);
  EXPECT_EQ(cache.unused_generations(), first);
  cache.trim();
  EXPECT_EQ(source.live_bytes(), 0u);
}

// Of sizes unused as long, the smaller make way first, one block at a time until the room is
// made: a 128 KiB block takes the place of two 64 KiB ones, and a 768 KiB one, unused as long,
// stays.
TEST(PinnedCacheTest, OfSizesUnusedAsLongTheSmallerMakeWayFirst) {
  constexpr std::size_t kib = 1024;
  counting_resource source;
  detail::pinned_cache cache(source, 1024 * kib, &fake_clock);
  std::vector<void*> held;
  for (int i = 0; i < 4; ++i) held.push_back(cache.acquire(64 * kib));
  void* large = cache.acquire(768 * kib);
  for (void* p : held) cache.release(p);
  cache.release(large);
  ASSERT_EQ(cache.stats().cached, 1024 * kib);
  for (int i = 0; i < 2; ++i) {
    let_a_generation_pass();
    cache.release(cache.acquire(2048 * kib));  // a slow step: the generation ends
  }
  void* freed = cache.acquire(128 * kib);
  cache.release(freed);
  EXPECT_TRUE(cache.owns(freed));
  EXPECT_EQ(cache.stats().cached, 768 * kib + 2 * 64 * kib + 128 * kib);
  EXPECT_EQ(cache.capacity_at(large), 768 * kib) << "the larger size stays";
  cache.trim();
  EXPECT_EQ(source.live_bytes(), 0u);
}

// Two phases that take turns every three generations: many small blocks, then one block as
// large as the cache. Without the doubling wait, each phase would make its blocks for two
// generations before displacing the other's; with it, the cache settles into keeping one
// phase's blocks, and page-locks about what a cache whose sizes never age does.
TEST(PinnedCacheTest, PhasesThatTakeTurnsSettleIntoKeepingWhatIsCached) {
  constexpr std::size_t kib = 1024;
  const auto bytes_made = [&](bool generations_pass, std::uint32_t* wait) {
    counting_resource source;
    {
      detail::pinned_cache cache(source, 1024 * kib, &fake_clock);
      for (int phase = 0; phase < 20; ++phase)
        for (int r = 0; r < 30; ++r) {
          if (generations_pass && r % 10 == 0) let_a_generation_pass();
          std::vector<void*> held;
          if (phase % 2 == 0) {
            for (int i = 0; i < 16; ++i) held.push_back(cache.acquire(64 * kib));
          } else {
            held.push_back(cache.acquire(1024 * kib));
          }
          for (void* p : held) cache.release(p);
        }
      if (wait != nullptr) *wait = cache.unused_generations();
      cache.trim();
    }
    EXPECT_EQ(source.live_bytes(), 0u);
    return source.allocated_bytes();
  };
  const std::size_t never_aging = bytes_made(false, nullptr);
  std::uint32_t wait = 0;
  const std::size_t aging = bytes_made(true, &wait);
  EXPECT_GT(wait, detail::pinned_cache::first_unused_generations);
  EXPECT_LE(aging, never_aging + never_aging / 4)
      << "never ageing: " << never_aging / kib << " KiB made; ageing: " << aging / kib;
}

// Sizes used in turn, one a generation, more of them than the cache holds: displacing the one
// used longest ago would displace the next one asked for, every time (a cache that forgets the
// oldest first makes a block at every use). The sizes made again soon after they made way double
// the wait until none makes way: the cache settles, perhaps on other sizes than a cache whose
// sizes never age keeps (so not always on as good a set), and makes few blocks a cycle.
TEST(PinnedCacheTest, SizesUsedInTurnSettleIntoKeepingWhatIsCached) {
  constexpr std::size_t kib = 1024;
  constexpr int cycles = 100, settled = 50;
  const std::vector<std::size_t> all_sizes = {80, 96, 112, 128, 160, 192, 224, 256};
  // Generations between one size's use and the next one's: 1, or 3 (sizes further apart, which
  // come back later after they made way, but no later than they had been away before).
  for (const auto& [count, gap] : {std::pair{std::size_t{5}, 1}, std::pair{std::size_t{8}, 1},
                                   std::pair{std::size_t{4}, 3}, std::pair{std::size_t{8}, 3}}) {
    SCOPED_TRACE(::testing::Message() << count << " sizes, " << gap << " generation(s) apart");
    const std::vector<std::size_t> sizes(all_sizes.end() - static_cast<std::ptrdiff_t>(count),
                                         all_sizes.end());
    std::size_t total = 0;
    for (std::size_t size : sizes) total += size * kib;
    // Bytes made for the sizes over every cycle, and blocks made in the last `settled` cycles.
    const auto made = [&](bool generations_pass) {
      counting_resource source;
      std::size_t bytes = 0;
      int late_blocks = 0;
      {
        detail::pinned_cache cache(source, total - sizes.back() * kib, &fake_clock);
        for (int cycle = 0; cycle < cycles; ++cycle)
          for (std::size_t size : sizes) {
            for (int g = 0; g < gap; ++g) {
              if (generations_pass) let_a_generation_pass();
              cache.release(cache.acquire(4096 * kib));  // a slow step: the generation ends
            }
            const int before = source.allocations();
            cache.release(cache.acquire(size * kib));
            const int new_blocks = source.allocations() - before;
            bytes += static_cast<std::size_t>(new_blocks) * size * kib;
            if (cycle >= cycles - settled) late_blocks += new_blocks;
          }
        cache.trim();
      }
      EXPECT_EQ(source.live_bytes(), 0u);
      return std::pair{bytes, late_blocks};
    };
    const auto [never_aging_bytes, never_aging_late] = made(false);
    const auto [aging_bytes, aging_late] = made(true);
    EXPECT_EQ(never_aging_late, settled) << "one made a cycle";
    EXPECT_LE(aging_late, settled * static_cast<int>(count) / 2)
        << "settled, not making every size";
    EXPECT_LE(aging_bytes, never_aging_bytes + never_aging_bytes / 2)
        << "never ageing: " << never_aging_bytes / kib << " KiB; ageing: " << aging_bytes / kib;
  }
}

// `sizes_age`: the clock moves fast enough that freed blocks must have made others make way.
void expect_every_byte_accounted_for_under_many_threads(detail::pinned_cache::clock_function clock,
                                                        bool sizes_age) {
  counting_resource source;
  constexpr std::size_t limit = std::size_t{2} << 20;
  {
    detail::pinned_cache cache(source, limit, clock);
    source.watch(&cache);
    std::atomic<bool> stop{false};
    std::atomic<bool> over_limit{false};
    std::thread watcher([&] {
      while (!stop.load())
        if (cache.stats().cached > limit) over_limit = true;
    });
    std::vector<std::thread> workers;
    for (int t = 0; t < 8; ++t)
      workers.emplace_back([&, t] {
        std::mt19937 random(static_cast<unsigned>(100 + t));
        std::vector<void*> held;
        for (int i = 0; i < 4000; ++i) {
          if (held.size() < 8 && random() % 2 == 0) {
            held.push_back(cache.acquire(std::size_t{4096} << (random() % 8)));
          } else if (!held.empty()) {
            const std::size_t k = random() % held.size();
            counting_resource::releasing = held[k];
            cache.release(held[k]);
            counting_resource::releasing = nullptr;
            held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
          }
          if (i % 500 == 0 && t == 0) cache.trim();
          // The limit lowered and raised again while blocks make way for others.
          if (i % 700 == 0 && t == 1) {
            cache.set_limit(limit / 2);
            cache.set_limit(limit);
          }
        }
        for (void* p : held) cache.release(p);
      });
    for (auto& w : workers) w.join();
    stop = true;
    watcher.join();
    EXPECT_FALSE(over_limit.load());
    const pinned_stats s = cache.stats();
    EXPECT_EQ(s.in_use, 0u);
    EXPECT_LE(s.cached, limit);
    EXPECT_EQ(source.live_bytes(), s.cached) << "cached bytes and the source's live bytes differ";
    if (sizes_age) {
      EXPECT_GT(source.freed_for_another(), 0) << "no block made way for another";
    }
    cache.trim();
    EXPECT_EQ(cache.stats().cached, 0u);
    EXPECT_EQ(source.live_bytes(), 0u);
    EXPECT_EQ(source.freed_while_owned(), 0);
    source.watch(nullptr);
  }
  EXPECT_EQ(source.bad_frees(), 0);
}

TEST(PinnedCacheTest, EveryByteIsAccountedForUnderManyThreads) {
  expect_every_byte_accounted_for_under_many_threads(&detail::pinned_cache::steady_nanoseconds,
                                                     /*sizes_age=*/false);
}

// The same with sizes ageing as fast as they can, so that freed blocks displace others while
// other threads take and free them.
TEST(PinnedCacheTest, EveryByteIsAccountedForUnderManyThreadsWhileSizesAge) {
  expect_every_byte_accounted_for_under_many_threads(&racing_clock, /*sizes_age=*/true);
}

// Results freed on one thread and made again on many (a caller dropping a map's results, lanes
// making the next map's): a thread that takes a block from another thread's shard moves some of
// its class to its own. Every block is still handed out once at a time and none is lost: later
// rounds make no new block (the takers need half of what is cached, so the first thread's shard
// never runs dry and no look can miss), and everything cached is still the source's.
TEST(PinnedCacheTest, BlocksFreedOnOneThreadServeManyThreadsWithoutNewOnesOrDuplicates) {
  counting_resource source;
  constexpr std::size_t blocks = 4096, takers = 8, per_taker = blocks / 2 / takers;
  constexpr std::size_t block_bytes = 8192;
  detail::pinned_cache cache(source, std::size_t{64} << 20);
  source.watch(&cache);
  std::thread([&] {
    std::vector<void*> made;
    for (std::size_t i = 0; i < blocks; ++i) made.push_back(cache.acquire(block_bytes));
    for (void* p : made) cache.release(p);  // all in this thread's shard
  }).join();
  ASSERT_EQ(source.allocations(), static_cast<int>(blocks));
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<void*>> taken(takers);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < takers; ++t)
      threads.emplace_back([&, t] {
        for (std::size_t i = 0; i < per_taker; ++i) taken[t].push_back(cache.acquire(block_bytes));
      });
    for (auto& th : threads) th.join();
    std::vector<void*> all;
    for (const auto& mine : taken) all.insert(all.end(), mine.begin(), mine.end());
    std::sort(all.begin(), all.end());
    EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end())
        << "a block was handed out twice in round " << round;
    EXPECT_EQ(source.allocations(), static_cast<int>(blocks)) << "round " << round;
    EXPECT_EQ(cache.stats().cached, (blocks - takers * per_taker) * block_bytes);
    // Freed on yet other threads, half each, for the next round.
    std::thread([&] {
      for (std::size_t t = 0; t < takers / 2; ++t)
        for (void* p : taken[t]) cache.release(p);
    }).join();
    std::thread([&] {
      for (std::size_t t = takers / 2; t < takers; ++t)
        for (void* p : taken[t]) cache.release(p);
    }).join();
    EXPECT_EQ(cache.stats().cached, blocks * block_bytes);
  }
  EXPECT_EQ(source.live_bytes(), blocks * block_bytes);
  cache.trim();
  EXPECT_EQ(source.live_bytes(), 0u);
  EXPECT_EQ(source.freed_while_owned(), 0);
  source.watch(nullptr);
}

// The move itself: a thread whose shard has no block of a class, taking one from a shard that
// holds 100, takes half of the rest along into its own shard.
TEST(PinnedCacheTest, ATakeFromAnotherThreadsShardMovesHalfOfTheRestToTheTakersShard) {
  counting_resource source;
  detail::pinned_cache cache(source, std::size_t{64} << 20);
  // The freeing thread stays alive while the other takes: a thread that has ended gives its
  // shard to the next thread that starts.
  std::latch freed(1), taken_one(1);
  std::thread freeing([&] {
    std::vector<void*> made;
    for (int i = 0; i < 100; ++i) made.push_back(cache.acquire(8192));
    for (void* p : made) cache.release(p);
    EXPECT_EQ(cache.blocks_cached_here(), 100u);
    freed.count_down();
    taken_one.wait();
  });
  freed.wait();
  void* taken = nullptr;
  std::size_t here_after = 0;
  std::thread([&] {
    EXPECT_EQ(cache.blocks_cached_here(), 0u);
    taken = cache.acquire(8192);
    here_after = cache.blocks_cached_here();
  }).join();
  taken_one.count_down();
  freeing.join();
  EXPECT_EQ(here_after, 49u);  // (100 - 1) / 2
  EXPECT_EQ(source.allocations(), 100);
  EXPECT_EQ(cache.stats().cached, 99u * 8192);
  cache.release(taken);
  cache.trim();
}

TEST(PinnedCacheTest, TheRegistryAnswersExactlyTheBlocksRange) {
  detail::pinned_block_registry registry;
  const auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
  registry.add(at(0x10000), 0x3000);
  registry.add(at(0x20000), 0x1000);
  EXPECT_FALSE(registry.contains(at(0xffff)));
  EXPECT_TRUE(registry.contains(at(0x10000)));
  EXPECT_TRUE(registry.contains(at(0x12fff)));
  EXPECT_FALSE(registry.contains(at(0x13000)));
  EXPECT_TRUE(registry.contains(at(0x20fff)));
  EXPECT_EQ(registry.capacity_at(at(0x10000)), 0x3000u);
  EXPECT_EQ(registry.capacity_at(at(0x10001)), 0u) << "only a block's start is a block";
  registry.remove(at(0x10000));
  EXPECT_FALSE(registry.contains(at(0x10000)));
  EXPECT_TRUE(registry.contains(at(0x20000)));
}

// A thread answers from its own copy of the registry; the copy is never used once the registry
// has changed, whichever thread changed it.
TEST(PinnedCacheTest, AThreadsCopyOfTheRegistryIsNeverUsedAfterAChange) {
  detail::pinned_block_registry registry;
  const auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
  registry.add(at(0x40000), 0x1000);
  std::atomic<int> step{0};
  std::vector<bool> seen;
  std::thread reader([&] {
    const auto wait_for = [&](int s) {
      while (step.load() != s) std::this_thread::yield();
    };
    for (int i = 0; i < 100; ++i) seen.push_back(registry.contains(at(0x40800)));  // copy taken
    step = 1;
    wait_for(2);
    seen.push_back(registry.contains(at(0x40800)));  // removed by the other thread
    seen.push_back(registry.contains(at(0x50800)));
    step = 3;
    wait_for(4);
    seen.push_back(registry.contains(at(0x50800)));  // added by the other thread
    seen.push_back(registry.capacity_at(at(0x50000)) == 0x1000);
  });
  while (step.load() != 1) std::this_thread::yield();
  registry.remove(at(0x40000));
  step = 2;
  while (step.load() != 3) std::this_thread::yield();
  registry.add(at(0x50000), 0x1000);
  step = 4;
  reader.join();
  ASSERT_EQ(seen.size(), 104u);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(seen[i]);
  EXPECT_FALSE(seen[100]) << "answered from a copy taken before the block was removed";
  EXPECT_FALSE(seen[101]);
  EXPECT_TRUE(seen[102]) << "answered from a copy taken before the block was added";
  EXPECT_TRUE(seen[103]);
}

// Past a few thousand blocks (every result of a large map is one), lookups still answer from a
// shared snapshot; while another thread adds and removes blocks, every answer about the blocks
// that stay is right, and a removed block is never found once its removal is seen.
TEST(PinnedCacheTest, AManyBlockRegistryAnswersRightWhileItChanges) {
  detail::pinned_block_registry registry;
  constexpr std::uintptr_t base = 0x1000000;
  constexpr std::uintptr_t stride = 0x2000;
  constexpr std::size_t blocks = 10000;
  const auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
  constexpr int rounds = 20;
  const auto leaving = [&](int k) {
    return base + (3 + 64 * static_cast<std::size_t>(k)) * stride;
  };
  for (std::size_t i = 0; i < blocks; i += 2) registry.add(at(base + i * stride), 0x1000);
  for (int k = 0; k < rounds; ++k) registry.add(at(leaving(k)), 0x1000);  // one leaves each round
  std::atomic<bool> stop{false};
  std::atomic<std::uintptr_t> removed_for_good{0};
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r)
    readers.emplace_back([&, r] {
      std::size_t i = static_cast<std::size_t>(r) * 2;
      while (!stop.load()) {
        const std::uintptr_t kept = base + (i % blocks) * stride;  // even: always there
        if (!registry.contains(at(kept + 0x800)) || registry.capacity_at(at(kept)) != 0x1000 ||
            registry.contains(at(kept + 0x1000)) || registry.capacity_at(at(kept + 8)) != 0)
          wrong.fetch_add(1);
        if (const std::uintptr_t gone = removed_for_good.load();
            gone != 0 && registry.contains(at(gone)))
          wrong.fetch_add(1);
        i += 2;
      }
    });
  // Other odd blocks come and go.
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t i = 1; i < blocks; i += 64) registry.add(at(base + i * stride), 0x1000);
    for (std::size_t i = 1; i < blocks; i += 64) registry.remove(at(base + i * stride));
    registry.remove(at(leaving(round)));
    removed_for_good.store(leaving(round));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  stop.store(true);
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  for (std::size_t i = 0; i < blocks; ++i)
    EXPECT_EQ(registry.capacity_at(at(base + i * stride)), i % 2 == 0 ? 0x1000u : 0u) << i;
}

// The core is written against the backend interfaces alone: no CUDA header, no build switch on
// the backend. (src/cuda/ and src/cpu/ implement them.)
TEST(BackendSeamTest, TheCoreHasNoCudaIncludeAndNoBackendSwitch) {
  const std::filesystem::path core =
      std::filesystem::path(__FILE__).parent_path().parent_path() / "src" / "core";
  if (!std::filesystem::is_directory(core)) GTEST_SKIP() << "no source tree at " << core;
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(core)) {
    if (!entry.is_regular_file()) continue;
    ++files;
    std::ifstream in(entry.path());
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      const std::string where = entry.path().string() + ":" + std::to_string(number) + ": " + line;
      const bool include = line.find("#include") != std::string::npos;
      EXPECT_FALSE(include && line.find("cuda") != std::string::npos) << where;
      EXPECT_EQ(line.find("GPUPOOL_HAS_CUDA"), std::string::npos) << where;
    }
  }
  EXPECT_GT(files, 10);
}

// A measurement, not a check: the per-task host-memory calls on 1, 8 and 16 threads. Run with
// --gtest_also_run_disabled_tests --gtest_filter='*HostMemoryCostPerTask*'.
TEST(PinnedBenchmark, DISABLED_HostMemoryCostPerTask) {
  constexpr long per_thread = 2'000'000;
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(allocate_pinned(std::size_t{8192} * (1 + i % 8)));
  std::vector<double> pageable(1024);
  const auto rate = [](int threads, long n, auto body) {
    std::vector<std::thread> pool;
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { body(t, n); });
    for (auto& th : pool) th.join();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return double(threads) * double(n) / s / 1e6;
  };
  std::atomic<long> hits{0};
  for (int threads : {1, 8, 16}) {
    const double own = rate(threads, per_thread, [&](int t, long n) {
      long h = 0;
      for (long i = 0; i < n; ++i) h += is_pinned(static_cast<char*>(blocks[(i + t) % 64]) + 100);
      hits += h;
    });
    const double ordinary = rate(threads, per_thread, [&](int, long n) {
      long h = 0;
      for (long i = 0; i < n; ++i) h += is_pinned(pageable.data() + (i & 511));
      hits += h;
    });
    const double cycle = rate(threads, per_thread / 4, [&](int, long n) {
      for (long i = 0; i < n; ++i) deallocate_pinned(allocate_pinned(8192), 8192);
    });
    std::printf(
        "%d thread(s): is_pinned(gpupool block) %.1f M/s, is_pinned(pageable) %.1f M/s, "
        "allocate+deallocate 8 KiB %.2f M/s\n",
        threads, own, ordinary, cycle);
  }
  for (void* p : blocks) deallocate_pinned(p, 0);
  EXPECT_EQ(hits.load(), 25 * per_thread);  // every lookup of a gpupool block, on 1, 8, 16 threads
}

}  // namespace
}  // namespace gpupool
