// Pinned host memory for users, for results and for the lanes' staging slots: a cache of blocks
// from the process's host memory (page-locked by CUDA with a usable GPU; otherwise ordinary
// aligned memory that gpupool still tracks, so the CPU backend takes the same "already pinned,
// skip staging" paths that the CUDA backend does).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/environment.hpp"
#include "core/memory/host_memory.hpp"
#include "core/memory/pinned_cache.hpp"
#include "core/memory/result_slabs.hpp"
#include "gpupool/fork.hpp"
#include "gpupool/pinned.hpp"

namespace gpupool {
namespace detail {
namespace {

// More than any machine's memory: larger requests are refused before any rounding, which would
// wrap around (SIZE_MAX - 7 would round to 0) and hand out a block smaller than asked for.
constexpr std::size_t largest_request = std::numeric_limits<std::size_t>::max() / 2;

// GPUPOOL_PINNED_CACHE_BYTES, else a quarter of the machine's memory. The cache is made at the
// first use of pinned memory, by functions that must not throw (is_pinned, say): a bad value,
// which making an executor refuses by name, leaves the default here.
std::size_t default_cache_limit() {
  try {
    if (const auto bytes = pinned_cache_bytes_from_environment()) return *bytes;
  } catch (...) {  // refused (or no memory left to say why): the default
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return std::size_t{1} << 30;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size) / 4;
}

}  // namespace

std::optional<std::size_t> pinned_cache_bytes_from_environment() {
  const auto bytes =
      count_from_environment({"GPUPOOL_PINNED_CACHE_BYTES", "a byte count", 0, largest_request});
  if (!bytes) return std::nullopt;
  return static_cast<std::size_t>(*bytes);
}

namespace {

// The stripe numbers of live threads: a thread takes the lowest free one and gives it back as it
// exits, so that a new executor's lanes (new threads) take the numbers of lanes that ended rather
// than ever higher ones, which would wrap around onto the stripes of threads still alive, its
// caller's among them, differently for each executor. Lock-free, so a fork()ed child never
// finds it held.
constexpr std::size_t reusable_stripes = 64;
std::atomic<std::uint64_t> stripes_taken{0};
std::atomic<std::size_t> stripes_beyond{0};  // numbers past the reusable ones, never given back

std::size_t take_stripe_number() noexcept {
  std::uint64_t taken = stripes_taken.load(std::memory_order_relaxed);
  while (taken != ~std::uint64_t{0}) {
    const auto lowest_free = static_cast<std::size_t>(__builtin_ctzll(~taken));
    if (stripes_taken.compare_exchange_weak(taken, taken | (std::uint64_t{1} << lowest_free),
                                            std::memory_order_relaxed))
      return lowest_free;
  }
  return reusable_stripes + stripes_beyond.fetch_add(1, std::memory_order_relaxed);
}

// The thread's number plus one; constant-initialised (0: not given yet), so reading it costs no
// initialisation check.
thread_local std::size_t stripe_plus_one = 0;

// Gives the thread's number back at its exit. A lookup later in the thread's exit (a pinned block
// freed by a destructor that runs after this one) still uses the number: sharing a stripe with a
// thread that took it since costs a lock now and then, never a wrong answer.
struct stripe_number_owner {
  stripe_number_owner() = default;
  stripe_number_owner(const stripe_number_owner&) = delete;
  stripe_number_owner& operator=(const stripe_number_owner&) = delete;
  ~stripe_number_owner() {
    const std::size_t number = stripe_plus_one - 1;
    if (number < reusable_stripes)
      stripes_taken.fetch_and(~(std::uint64_t{1} << number), std::memory_order_relaxed);
  }
};
thread_local stripe_number_owner stripe_owner;

// In a fork()ed child only the forking thread lives on: the parent's other threads' numbers are
// free again there.
void keep_only_this_threads_stripe() noexcept {
  const std::size_t mine = stripe_plus_one - 1;  // wraps to SIZE_MAX where none was taken
  stripes_taken.store(mine < reusable_stripes ? std::uint64_t{1} << mine : 0,
                      std::memory_order_relaxed);
}

}  // namespace

std::size_t thread_stripe(std::size_t count) noexcept {
  if (stripe_plus_one == 0) {
    stripe_plus_one = take_stripe_number() + 1;
    [[maybe_unused]] stripe_number_owner& owner = stripe_owner;  // gives it back at thread exit
  }
  return (stripe_plus_one - 1) % count;
}

// ---- pinned_block_registry

namespace {

// The snapshot of one registry the thread answers from (none: look under the lock).
struct thread_snapshot {
  std::uint64_t registry = 0;  // the registry's id; 0: none
  std::shared_ptr<const pinned_block_registry::snapshot> held;
};

// Reached through a plain pointer, which stays readable to the thread's very end: a pinned block
// may be released by a destructor that runs after the thread's own objects are gone (on the main
// thread, every static destructor). The owner frees it at thread exit and leaves the thread on
// the locked path from then on.
thread_local thread_snapshot* thread_held = nullptr;
thread_local bool thread_held_gone = false;
struct thread_snapshot_owner {
  thread_snapshot_owner() = default;
  thread_snapshot_owner(const thread_snapshot_owner&) = delete;
  thread_snapshot_owner& operator=(const thread_snapshot_owner&) = delete;
  ~thread_snapshot_owner() {
    delete thread_held;
    thread_held = nullptr;
    thread_held_gone = true;
  }
};
thread_local thread_snapshot_owner thread_held_owner;

// This thread's holder of a snapshot, made at its first use; null at thread exit or without
// memory for it.
thread_snapshot* this_threads_snapshot() noexcept {
  if (thread_held != nullptr || thread_held_gone) return thread_held;
  [[maybe_unused]] thread_snapshot_owner& owner = thread_held_owner;  // frees it at thread exit
  thread_held = new (std::nothrow) thread_snapshot();
  return thread_held;
}

// The block holding `address`, given `after`, the first block that starts after it: {start,
// capacity}, or {0, 0}.
template <class Iterator>
std::pair<std::uintptr_t, std::size_t> block_holding(std::uintptr_t address, Iterator first,
                                                     Iterator after) noexcept {
  if (after == first) return {0, 0};
  --after;
  if (address - after->first >= after->second) return {0, 0};
  return {after->first, after->second};
}

std::atomic<std::uint64_t> next_registry_id{1};

}  // namespace

pinned_block_registry::pinned_block_registry() noexcept
    : id_(next_registry_id.fetch_add(1, std::memory_order_relaxed)) {}

std::pair<std::uintptr_t, std::size_t> pinned_block_registry::find(
    std::uintptr_t address) const noexcept {
  const thread_snapshot* mine = thread_held;
  // Acquire: a block freed (or made) before this call, by way of any synchronisation that led
  // here, moved the version on before its memory was freed, so a stale snapshot is never used.
  if (mine != nullptr && mine->registry == id_ &&
      mine->held->version == version_.load(std::memory_order_acquire)) {
    const auto& blocks = mine->held->blocks;
    return block_holding(
        address, blocks.begin(),
        std::upper_bound(blocks.begin(), blocks.end(), address,
                         [](std::uintptr_t a, const auto& block) { return a < block.first; }));
  }
  std::lock_guard lock(stripes_[thread_stripe(stripe_count)].mutex);
  take_snapshot();
  return block_holding(address, blocks_.begin(), blocks_.upper_bound(address));
}

void pinned_block_registry::take_snapshot() const noexcept {
  thread_snapshot* mine = this_threads_snapshot();
  if (mine == nullptr) return;
  // Whatever happens below, the thread's stale snapshot goes: nothing would answer from it, and
  // an idle thread would keep its blocks' copy alive.
  if (mine->registry == id_) {
    mine->registry = 0;
    mine->held.reset();
  }
  // Another thread is taking or making it: this lookup stays on the locked path, with no wait.
  std::unique_lock lock(snapshot_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  // No writer moves it on meanwhile: writers wait for the caller's stripe.
  const std::uint64_t version = version_.load(std::memory_order_relaxed);
  if (snapshot_ == nullptr || snapshot_->version != version) {
    if (++stale_lookups_ * blocks_per_stale_lookup < blocks_.size()) return;
    try {
      auto made = std::make_shared<snapshot>();
      made->version = version;
      made->blocks.assign(blocks_.begin(), blocks_.end());
      snapshot_ = std::move(made);
    } catch (const std::bad_alloc&) {
      return;  // no memory for it: lookups stay on the locked path
    }
    stale_lookups_ = 0;
  }
  mine->held = snapshot_;
  mine->registry = id_;
}

template <class F>
void pinned_block_registry::write(F f) noexcept(noexcept(f())) {
  // Every stripe, always in the same order, so two writers never wait on each other in a cycle.
  std::array<std::unique_lock<std::mutex>, stripe_count> locks;
  for (std::size_t i = 0; i < stripe_count; ++i) locks[i] = std::unique_lock(stripes_[i].mutex);
  f();
  // Release, before the stripes are unlocked and before a removed block's memory is freed.
  version_.fetch_add(1, std::memory_order_release);
}

std::size_t pinned_block_registry::capacity_at(const void* p) const noexcept {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  const auto [start, capacity] = find(address);
  return start == address ? capacity : 0;
}

bool pinned_block_registry::contains(const void* p) const noexcept {
  return find(reinterpret_cast<std::uintptr_t>(p)).second != 0;
}

bool pinned_block_registry::contains_run(const void* p, std::size_t bytes) const noexcept {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  const auto [start, capacity] = find(address);
  return capacity != 0 && bytes <= capacity - (address - start);
}

void pinned_block_registry::add(void* p, std::size_t capacity) {
  write([&] { blocks_.emplace(reinterpret_cast<std::uintptr_t>(p), capacity); });
}

void pinned_block_registry::remove(void* p) noexcept {
  write([&]() noexcept { blocks_.erase(reinterpret_cast<std::uintptr_t>(p)); });
}

// ---- pinned_cache

std::int64_t pinned_cache::steady_nanoseconds() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

pinned_cache::pinned_cache(memory_resource& source, std::size_t cache_limit,
                           clock_function clock) noexcept
    : source_(source),
      limit_(cache_limit),
      generation_began_(clock()),
      calm_since_(clock()),
      clock_(clock) {}

pinned_cache::~pinned_cache() {
  try {
    trim();
  } catch (const std::bad_alloc&) {
    // Nothing to do at teardown: the cached blocks stay with the process.
  }
}

std::size_t pinned_cache::size_class(std::size_t bytes) noexcept {
  if (bytes <= (std::size_t{64} << 10))
    return (bytes + host_page_bytes - 1) / host_page_bytes * host_page_bytes;
  const std::size_t power = std::size_t{1} << (63 - __builtin_clzll(bytes));
  const std::size_t step = power / 4;
  return (bytes + step - 1) / step * step;
}

std::size_t pinned_cache::class_index(std::size_t capacity) noexcept {
  constexpr std::size_t page_classes = (std::size_t{64} << 10) / host_page_bytes;
  if (capacity <= (std::size_t{64} << 10)) return capacity / host_page_bytes - 1;
  const int power = 63 - __builtin_clzll(capacity);  // 16 or more
  const std::size_t quarter = (capacity - (std::size_t{1} << power)) >> (power - 2);
  return page_classes + 4 * static_cast<std::size_t>(power - 16) + quarter;
}

void pinned_cache::note_use(std::size_t capacity) noexcept {
  class_use& use = uses_[class_index(capacity)];
  const std::uint32_t now = generation_.load(std::memory_order_relaxed);
  if (use.generation.load(std::memory_order_relaxed) != now)
    use.generation.store(now, std::memory_order_relaxed);
}

void pinned_cache::note_cached(std::size_t index) noexcept {
  std::atomic<bool>& maybe_cached = uses_[index].maybe_cached;
  if (!maybe_cached.load(std::memory_order_relaxed))
    maybe_cached.store(true, std::memory_order_relaxed);
}

std::array<std::unique_lock<std::mutex>, pinned_cache::shard_count>
pinned_cache::lock_every_shard() {
  std::array<std::unique_lock<std::mutex>, shard_count> locks;
  for (std::size_t i = 0; i < shard_count; ++i) locks[i] = std::unique_lock(shards_[i].mutex);
  return locks;
}

void pinned_cache::note_miss(std::size_t capacity) noexcept {
  class_use& use = uses_[class_index(capacity)];
  if (!use.displaced.load(std::memory_order_relaxed) ||
      !use.displaced.exchange(false, std::memory_order_acquire))
    return;
  const std::uint32_t now = generation_.load(std::memory_order_relaxed);
  const auto since =
      static_cast<std::int32_t>(now - use.displaced_in.load(std::memory_order_relaxed));
  const auto unused_before =
      static_cast<std::int32_t>(use.unused_when_displaced.load(std::memory_order_relaxed));
  std::lock_guard lock(wait_mutex_);
  const std::uint32_t wait = unused_generations_.load(std::memory_order_relaxed);
  // Made again a wait or more after it made way, and later than it had been away before: the
  // room it made served that long, and the size was going out of use.
  if (since >= static_cast<std::int32_t>(wait) && since > unused_before) return;
  if (wait < most_unused_generations)
    unused_generations_.store(wait * 2, std::memory_order_relaxed);
  calm_since_ = clock_();
}

void pinned_cache::next_generation_if_due() noexcept {
  const std::int64_t now = clock_();
  std::int64_t began = generation_began_.load(std::memory_order_relaxed);
  if (now - began < generation_length.count()) return;
  // One of the threads that find it due starts the next one.
  if (!generation_began_.compare_exchange_strong(began, now, std::memory_order_relaxed)) return;
  generation_.fetch_add(1, std::memory_order_relaxed);
  if (unused_generations_.load(std::memory_order_relaxed) == first_unused_generations) return;
  // Calm is counted on the clock, not in generations, which pass only at slow steps: a wait
  // doubled before a long spell of nothing but cached blocks taken is halved for it.
  constexpr std::int64_t calm_span = calm_generations * generation_length.count();
  std::lock_guard lock(wait_mutex_);
  const std::int64_t spans = (now - calm_since_) / calm_span;
  if (spans <= 0) return;
  std::uint32_t wait = unused_generations_.load(std::memory_order_relaxed);
  for (std::int64_t i = 0; i < spans && wait > first_unused_generations; ++i) wait /= 2;
  unused_generations_.store(std::max(wait, first_unused_generations), std::memory_order_relaxed);
  calm_since_ += spans * calm_span;
}

void* pinned_cache::take_cached(std::size_t capacity) noexcept {
  const std::size_t home_index = thread_stripe(shard_count);
  shard& home = shards_[home_index];
  const auto take_one = [&](shard& s) -> void* {
    auto hit = s.free.find(capacity);
    if (hit == s.free.end() || hit->second.empty()) return nullptr;
    void* p = hit->second.back();
    hit->second.pop_back();
    s.blocks.fetch_sub(1, std::memory_order_relaxed);
    cached_.fetch_sub(capacity, std::memory_order_relaxed);
    return p;
  };
  // Another thread may cache a block in a shard right after this look skips it; missing it only
  // costs a new block, as a miss under one lock would have a moment earlier.
  if (home.blocks.load(std::memory_order_relaxed) != 0) {
    std::lock_guard lock(home.mutex);
    if (void* p = take_one(home)) return p;
  }
  for (std::size_t i = 1; i < shard_count; ++i) {
    shard& s = shards_[(home_index + i) % shard_count];
    if (s.blocks.load(std::memory_order_relaxed) == 0) continue;
    // Both locks, so that blocks move from one shard to the other without ever being outside
    // both (trim_to sees each in one of them). std::scoped_lock takes them without deadlock
    // against trim_to's lock of every shard in order: it never waits holding one.
    std::scoped_lock locks(home.mutex, s.mutex);
    void* p = take_one(s);
    if (p == nullptr) continue;
    // Blocks freed on one thread and taken on others (results a caller drops, made again on
    // every lane) would otherwise bring every lane to that one shard's lock for each block:
    // a few more of the class move to this thread's shard, where its next requests find them.
    auto& from = s.free[capacity];
    const std::size_t moving = std::min(from.size() / 2, most_blocks_moved);
    if (moving == 0) return p;
    try {
      auto& to = home.free[capacity];
      to.insert(to.end(), from.end() - static_cast<std::ptrdiff_t>(moving), from.end());
    } catch (const std::bad_alloc&) {
      return p;  // no room to note them here: they stay where they are
    }
    from.resize(from.size() - moving);
    s.blocks.fetch_sub(moving, std::memory_order_relaxed);
    home.blocks.fetch_add(moving, std::memory_order_relaxed);
    return p;
  }
  return nullptr;
}

void* pinned_cache::acquire(std::size_t bytes) {
  if (bytes > largest_request)
    throw std::length_error("gpupool::allocate_pinned: " + std::to_string(bytes) +
                            " bytes is more than any allocation can hold");
  const std::size_t capacity = size_class(bytes == 0 ? 1 : bytes);
  // Marked before the take: a look for blocks to displace takes every shard's lock, so once the
  // take has its shard's lock, no later look counts this size as unused.
  note_use(capacity);
  void* p = take_cached(capacity);
  if (p == nullptr) {
    next_generation_if_due();
    note_miss(capacity);
    p = source_.allocate(capacity);  // slow: no lock held
    try {
      registry_.add(p, capacity);
    } catch (...) {
      source_.deallocate(p, capacity);
      throw;
    }
  }
  shards_[thread_stripe(shard_count)].in_use.fetch_add(capacity, std::memory_order_relaxed);
  return p;
}

bool pinned_cache::reserve_cache_room(std::size_t capacity) noexcept {
  std::size_t cached = cached_.load(std::memory_order_relaxed);
  do {
    const std::size_t limit = limit_.load(std::memory_order_relaxed);
    if (cached > limit || capacity > limit - cached) return false;
  } while (!cached_.compare_exchange_weak(cached, cached + capacity, std::memory_order_relaxed));
  return true;
}

bool pinned_cache::release(void* p) noexcept {
  if (p == nullptr) return false;
  const std::size_t capacity = registry_.capacity_at(p);
  if (capacity == 0) return false;  // not a block this cache handed out
  release_known(p, capacity);
  return true;
}

bool pinned_cache::release_block_or_result(void* p) noexcept {
  if (p == nullptr) return false;
  const auto [start, capacity] = registry_.block_around(p);
  if (capacity == 0) return false;  // in no block of this cache
  if (start != reinterpret_cast<std::uintptr_t>(p))
    return release_carved_result(reinterpret_cast<void*>(start), *this);
  release_known(p, capacity);
  return true;
}

void pinned_cache::release_known(void* p, std::size_t capacity) noexcept {
  shard& home = shards_[thread_stripe(shard_count)];
  home.in_use.fetch_sub(capacity, std::memory_order_relaxed);
  note_use(capacity);
  {
    // The room is reserved under the shard's lock, so trim_to (which holds every shard's lock)
    // sees either this block in the shard or, after it, its own new limit applied to it.
    std::lock_guard lock(home.mutex);
    if (reserve_cache_room(capacity)) {
      try {
        home.free[capacity].push_back(p);
        home.blocks.fetch_add(1, std::memory_order_relaxed);
        note_cached(class_index(capacity));
        return;
      } catch (const std::bad_alloc&) {
        cached_.fetch_sub(capacity, std::memory_order_relaxed);  // no room to note it: give it back
      }
    }
  }
  if (cache_in_place_of_unused(p, capacity, home)) return;
  give_back(p, capacity);
}

bool pinned_cache::cache_in_place_of_unused(void* p, std::size_t capacity, shard& home) noexcept {
  if (capacity > limit_.load(std::memory_order_relaxed)) return false;
  next_generation_if_due();
  const std::uint32_t now = generation_.load(std::memory_order_relaxed);
  const std::uint32_t wait = unused_generations_.load(std::memory_order_relaxed);
  const std::size_t mine = class_index(capacity);
  // Signed: a class marked by a thread that read the generation after this one did is in use.
  const auto unused_for = [&](std::size_t i) {
    const auto age =
        static_cast<std::int32_t>(now - uses_[i].generation.load(std::memory_order_relaxed));
    return i == mine || age < 0 ? std::uint32_t{0} : static_cast<std::uint32_t>(age);
  };
  // Unlocked: where nothing can make way (the common case of a cache full of the sizes in use),
  // no shard's lock is taken.
  const std::size_t needed = [&] {
    const std::size_t cached = cached_.load(std::memory_order_relaxed);
    const std::size_t limit = limit_.load(std::memory_order_relaxed);
    return cached + capacity > limit ? cached + capacity - limit : std::size_t{0};
  }();
  const std::uint64_t no_room = no_room_.load(std::memory_order_relaxed);
  if (no_room >> 32 == std::uint64_t{now} + 1 && needed > (no_room & 0xffffffffu) * host_page_bytes)
    return false;
  bool any = false;
  for (std::size_t i = 0; i < class_count && !any; ++i)
    any = uses_[i].maybe_cached.load(std::memory_order_relaxed) && unused_for(i) >= wait;
  if (!any) return false;

  std::vector<std::pair<void*, std::size_t>> taken;
  {
    const auto locks = lock_every_shard();
    // Under every lock: nothing is cached or taken meanwhile, so cached_ stands still.
    const std::size_t limit = limit_.load(std::memory_order_relaxed);
    const std::size_t cached = cached_.load(std::memory_order_relaxed);
    if (capacity > limit) return false;
    // Each class's age read once: a use noted meanwhile (on another thread, unlocked) must not
    // make one class count as unused in one shard and in use in another, nor reorder the sort.
    std::array<std::uint32_t, class_count> age{};
    for (std::size_t i = 0; i < class_count; ++i) age[i] = unused_for(i);
    struct candidate {
      std::size_t size = 0;
      std::size_t bytes = 0;
      std::uint32_t age = 0;
    };
    std::array<bool, class_count> present{};
    std::array<candidate, class_count> unused{};
    std::size_t room = 0, unused_blocks = 0, unused_count = 0;
    for (const shard& s : shards_)
      for (const auto& [size, blocks] : s.free) {
        if (blocks.empty()) continue;
        const std::size_t i = class_index(size);
        present[i] = true;
        if (age[i] < wait) continue;
        candidate& c = unused[i];
        if (c.bytes == 0) {
          c.size = size;
          c.age = age[i];
          ++unused_count;
        }
        c.bytes += size * blocks.size();
        room += size * blocks.size();
        unused_blocks += blocks.size();
      }
    for (std::size_t i = 0; i < class_count; ++i)
      if (!present[i] && uses_[i].maybe_cached.load(std::memory_order_relaxed))
        uses_[i].maybe_cached.store(false, std::memory_order_relaxed);
    if (cached > limit - capacity + room) {  // giving them all back is not enough
      const std::uint64_t pages =
          std::min<std::uint64_t>((room + host_page_bytes - 1) / host_page_bytes, 0xffffffffu);
      no_room_.store((std::uint64_t{now + 1} << 32) | pages, std::memory_order_relaxed);
      return false;
    }
    std::vector<candidate> order;
    try {
      taken.reserve(unused_blocks);
      order.reserve(unused_count);
      auto& mine_cached = home.free[capacity];
      mine_cached.reserve(mine_cached.size() + 1);  // so that nothing below can fail
    } catch (const std::bad_alloc&) {
      return false;
    }
    for (const candidate& c : unused)
      if (c.bytes != 0) order.push_back(c);
    // Used longest ago first; of those used as long ago, smaller first (the larger cost the most
    // to page-lock again). Taken one block at a time until the room is made, so at most one
    // block beyond the room needed is given back.
    std::sort(order.begin(), order.end(), [](const candidate& a, const candidate& b) {
      return a.age != b.age ? a.age > b.age : a.size < b.size;
    });
    const auto full = [&] { return cached_.load(std::memory_order_relaxed) > limit - capacity; };
    for (const candidate& c : order) {
      if (!full()) break;
      class_use& use = uses_[class_index(c.size)];
      use.displaced_in.store(now, std::memory_order_relaxed);
      use.unused_when_displaced.store(c.age, std::memory_order_relaxed);
      use.displaced.store(true, std::memory_order_release);
      for (shard& s : shards_) {
        const auto found = s.free.find(c.size);
        if (found == s.free.end()) continue;
        auto& blocks = found->second;
        while (!blocks.empty() && full()) {
          taken.emplace_back(blocks.back(), c.size);
          blocks.pop_back();
          s.blocks.fetch_sub(1, std::memory_order_relaxed);
          cached_.fetch_sub(c.size, std::memory_order_relaxed);
        }
      }
    }
    cached_.fetch_add(capacity, std::memory_order_relaxed);
    home.free[capacity].push_back(p);
    home.blocks.fetch_add(1, std::memory_order_relaxed);
    note_cached(mine);
  }
  for (auto [block, size] : taken) give_back(block, size);  // slow: no shard lock held
  return true;
}

void pinned_cache::give_back(void* p, std::size_t capacity) noexcept {
  // Out of the registry before the source frees it: once freed, the address may come back as
  // another library's (pageable, or pinned elsewhere) memory, and must not be answered as ours.
  registry_.remove(p);
  source_.deallocate(p, capacity);
}

void pinned_cache::trim_to(std::size_t limit) {
  std::vector<std::pair<void*, std::size_t>> taken;
  {
    const auto locks = lock_every_shard();
    // Room for every cached block before any leaves its shard: running out of memory half-way
    // would lose the blocks already taken.
    std::size_t cached_blocks = 0;
    for (const shard& s : shards_) cached_blocks += s.blocks.load(std::memory_order_relaxed);
    taken.reserve(cached_blocks);
    // Largest first: the fewest blocks given back for the bytes freed.
    while (cached_.load(std::memory_order_relaxed) > limit) {
      shard* largest = nullptr;
      for (shard& s : shards_) {
        while (!s.free.empty() && s.free.rbegin()->second.empty())
          s.free.erase(std::prev(s.free.end()));
        if (!s.free.empty() &&
            (largest == nullptr || s.free.rbegin()->first > largest->free.rbegin()->first))
          largest = &s;
      }
      if (largest == nullptr) break;
      auto& [capacity, blocks] = *largest->free.rbegin();
      taken.emplace_back(blocks.back(), capacity);
      blocks.pop_back();
      largest->blocks.fetch_sub(1, std::memory_order_relaxed);
      cached_.fetch_sub(capacity, std::memory_order_relaxed);
    }
  }
  for (auto [p, capacity] : taken) give_back(p, capacity);  // slow: no shard lock held
}

void pinned_cache::set_limit(std::size_t bytes) {
  limit_.store(bytes, std::memory_order_relaxed);
  trim_to(bytes);
}

void pinned_cache::trim() {
  trim_to(0);
}

pinned_stats pinned_cache::stats() const noexcept {
  std::size_t in_use = 0;
  for (const shard& s : shards_) in_use += s.in_use.load(std::memory_order_relaxed);
  return {in_use, cached_.load(std::memory_order_relaxed), limit_.load(std::memory_order_relaxed)};
}

bool is_pinned(const void* p, const pinned_cache& cache, const host_memory& memory) noexcept {
  if (p == nullptr) return false;
  // A freed block leaves the registry before its memory is freed, so an address reused by other
  // memory is never answered from it.
  if (cache.owns(p)) return true;
  return memory.describe(p).kind == memory_kind::pinned_host;
}

namespace {

// Made at the first use, never destroyed. A fork()ed child starts a cache of its own: the
// parent's blocks came from a backend that may not run there (CUDA's pinned memory is not even
// mapped in a child), and a parent's thread may have held a shard's lock at the fork. The parent's
// cache is left alone (leaked): what it holds is never handed out, or given back, in the child.
std::atomic<pinned_cache*> the_pinned_cache{nullptr};
std::atomic<bool> forget_registered{false};

void forget_pinned_cache_in_child(void*) noexcept {
  the_pinned_cache.store(nullptr, std::memory_order_relaxed);  // lock-free: safe in a child
  keep_only_this_threads_stripe();
}

}  // namespace

pinned_cache& process_pinned_cache() {
  if (pinned_cache* known = the_pinned_cache.load(std::memory_order_acquire)) return *known;
  // Registered before the first cache is published, once per process tree (a child inherits
  // the registration): not a fork_fresh, since a child's cache is made with arguments, at its
  // first use there.
  if (!forget_registered.exchange(true, std::memory_order_acq_rel)) {
    try {
      on_fork_child(forget_pinned_cache_in_child, nullptr);
    } catch (...) {
      forget_registered.store(false, std::memory_order_release);
      throw;
    }
  }
  auto fresh =
      std::make_unique<pinned_cache>(process_host_memory().pinned(), default_cache_limit());
  pinned_cache* expected = nullptr;
  // Racing first users: one cache wins, the others' (still empty) are dropped.
  if (the_pinned_cache.compare_exchange_strong(expected, fresh.get(), std::memory_order_acq_rel))
    return *fresh.release();
  return *expected;
}

}  // namespace detail

void* allocate_pinned(std::size_t bytes) {
  return detail::process_pinned_cache().acquire(bytes);
}

void deallocate_pinned(void* p, std::size_t /*bytes*/) noexcept {
  (void)detail::process_pinned_cache().release(p);
}

bool detail::deallocate_if_pinned_block(void* p) noexcept {
  return detail::process_pinned_cache().release_block_or_result(p);
}

bool is_pinned(const void* p) noexcept {
  return detail::is_pinned(p, detail::process_pinned_cache(), detail::process_host_memory());
}

std::size_t pinned_bytes_in_use() noexcept {
  return detail::process_pinned_cache().stats().in_use;
}

pinned_stats pinned_memory_stats() noexcept {
  return detail::process_pinned_cache().stats();
}

void set_pinned_cache_limit(std::size_t bytes) {
  detail::process_pinned_cache().set_limit(bytes);
}

void trim_pinned_cache() {
  detail::process_pinned_cache().trim();
}

}  // namespace gpupool
