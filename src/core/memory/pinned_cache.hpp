// The pinned-block cache behind allocate_pinned / deallocate_pinned / is_pinned. Page-locking is
// slow (driver-wide locks; first touch), so freed blocks are kept, by size class, up to a limit,
// and handed out again. Every task asks whether its buffers are pinned and many take pinned
// blocks, from every lane at once, so the questions a task asks take no lock that other threads
// take too: blocks are looked up in each thread's own copy of a registry (or, after a change,
// under the thread's own stripe of its lock), and cached blocks sit in shards each thread goes to
// its own one of first.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "core/memory/host_memory.hpp"
#include "gpupool/pinned.hpp"

namespace gpupool::detail {

/// Small numbers that tell the calling thread's stripe or shard from other threads' ones: each
/// thread takes the lowest number no live thread holds (up to 64; beyond, new ones) and gives it
/// back as it ends, so threads started after others ended take those numbers again instead of
/// ever higher ones. The number modulo `count`; with `count` SIZE_MAX, the number itself.
[[nodiscard]] std::size_t thread_stripe(std::size_t count) noexcept;

/// Every block a pinned_cache made and has not given back, by address (in use or cached). Read on
/// every task, written only when a block is made or given back (both slow anyway). A reader
/// answers from a snapshot of the registry (blocks sorted by start, shared by every thread that
/// took it) while the registry's version is the one the snapshot was taken at: one load of a
/// word that only writers change, no lock, nothing written. Else it looks under one stripe of a
/// lock, its own thread's, so readers on different threads never wait for each other or write a
/// shared cache line, and takes the current snapshot, made once for every thread; a writer locks
/// every stripe and moves the version on. Thread-safe.
class pinned_block_registry {
 public:
  pinned_block_registry() noexcept;
  pinned_block_registry(const pinned_block_registry&) = delete;
  pinned_block_registry& operator=(const pinned_block_registry&) = delete;

  /// The capacity of the block that starts exactly at `p`; 0 if no block starts there.
  [[nodiscard]] std::size_t capacity_at(const void* p) const noexcept;
  /// True if `p` is inside a registered block.
  [[nodiscard]] bool contains(const void* p) const noexcept;
  /// True if the `bytes` from `p` on lie inside one registered block.
  [[nodiscard]] bool contains_run(const void* p, std::size_t bytes) const noexcept;
  /// The registered block `p` lies in: {start, capacity}, or {0, 0}.
  [[nodiscard]] std::pair<std::uintptr_t, std::size_t> block_around(const void* p) const noexcept {
    return find(reinterpret_cast<std::uintptr_t>(p));
  }
  /// @throw std::bad_alloc.
  void add(void* p, std::size_t capacity);
  void remove(void* p) noexcept;

  /// The registry's blocks at one version, sorted by start.
  struct snapshot {
    std::uint64_t version = 0;
    std::vector<std::pair<std::uintptr_t, std::size_t>> blocks;
  };

 private:
  static constexpr std::size_t stripe_count = 32;
  // A snapshot that went stale is made again once the locked lookups since then number one in
  // this many of the registry's blocks: however often blocks come and go, copying them costs
  // less than the lookups it saves (a copied block is a few bytes moved; a lookup in the map, a
  // lock and a walk down a tree).
  static constexpr std::size_t blocks_per_stale_lookup = 16;
  struct alignas(64) stripe {
    mutable std::mutex mutex;
  };
  // The registered block around `address`: {start, capacity}, or {0, 0}.
  [[nodiscard]] std::pair<std::uintptr_t, std::size_t> find(std::uintptr_t address) const noexcept;
  // Under a stripe's lock: points the calling thread at the current snapshot, made first if it is
  // time to; else leaves it none.
  void take_snapshot() const noexcept;
  template <class F>
  void write(F f) noexcept(noexcept(f()));

  std::array<stripe, stripe_count> stripes_;
  std::map<std::uintptr_t, std::size_t> blocks_;  // start address -> capacity
  const std::uint64_t id_;                        // tells registries apart in threads' pointers
  alignas(64) std::atomic<std::uint64_t> version_{1};
  // The latest snapshot made, and the locked lookups since it went stale: under snapshot_mutex_.
  mutable std::mutex snapshot_mutex_;
  mutable std::shared_ptr<const snapshot> snapshot_;
  mutable std::size_t stale_lookups_ = 0;
};

/// Pinned blocks from one memory_resource, with the freed ones kept for reuse up to a limit.
/// A block freed into a full cache takes the place of cached blocks of sizes not used lately
/// (see release()). Thread-safe.
class pinned_cache {
 public:
  /// Nanoseconds on a monotonic clock: what tells how long ago a size was used.
  using clock_function = std::int64_t (*)() noexcept;
  /// The process's steady clock.
  [[nodiscard]] static std::int64_t steady_nanoseconds() noexcept;
  /// The shortest span of one generation of use. A generation ends only at a slow step (a block
  /// made, or one freed into a full cache), so a workload that page-locks nothing never ages its
  /// sizes.
  static constexpr std::chrono::nanoseconds generation_length = std::chrono::seconds(1);
  /// How many generations a size class must go unused (no block of it taken or freed) before its
  /// cached blocks may make way for others, at first: it has then not been used for at least a
  /// generation's length. Doubled (up to most_unused_generations) each time a size whose blocks
  /// made way has to be made again sooner after than that many generations, or no later than it
  /// had gone unused before (it was still in use, only less often), so that sizes that take turns
  /// settle
  /// into keeping what is cached; halved for each calm_generations times generation_length that
  /// passes with no such return.
  static constexpr std::uint32_t first_unused_generations = 2;
  static constexpr std::uint32_t most_unused_generations = 64;
  static constexpr std::uint32_t calm_generations = 256;

  pinned_cache(memory_resource& source, std::size_t cache_limit,
               clock_function clock = &steady_nanoseconds) noexcept;
  pinned_cache(const pinned_cache&) = delete;
  pinned_cache& operator=(const pinned_cache&) = delete;
  /// Gives every cached block back to the source; blocks still in use must have been released.
  ~pinned_cache();

  /// A block of at least `bytes`: a cached one of its size class, else a new one.
  /// @throw std::length_error beyond any machine's memory; std::bad_alloc.
  [[nodiscard]] void* acquire(std::size_t bytes);
  /// Takes back a block from `acquire`: cached while the cache has room; else cached in place of
  /// cached blocks of sizes unused for long enough (unused_generations(); given back, those used
  /// longest ago first) where that makes room; else given back to the source. A size in use
  /// thus keeps its blocks however full of sizes no longer asked for the cache was, while sizes
  /// each used in every generation (a cyclic workload larger than the cache) displace nothing.
  /// Pointers this cache did not hand out are ignored: the result says which it was (one lookup
  /// answers both whether the block is the cache's and its size class).
  bool release(void* p) noexcept;
  /// Takes back `p` as `release` does, or, where `p` lies inside a block rather than at its start,
  /// a result carved from a result slab there (result_slabs.hpp): one lookup for both. False if
  /// `p` is neither.
  bool release_block_or_result(void* p) noexcept;
  /// True if `p` points into a block of this cache (in use or cached). No source call, no lock
  /// other threads take.
  [[nodiscard]] bool owns(const void* p) const noexcept { return registry_.contains(p); }
  /// The capacity of this cache's block that starts at `p` (its size class); 0 if none does.
  [[nodiscard]] std::size_t capacity_at(const void* p) const noexcept {
    return registry_.capacity_at(p);
  }
  /// True if the `bytes` from `p` on lie inside one block of this cache.
  [[nodiscard]] bool owns_run(const void* p, std::size_t bytes) const noexcept {
    return registry_.contains_run(p, bytes);
  }
  /// Sets the limit and gives back cached blocks, largest first, until the cache fits it.
  void set_limit(std::size_t bytes);
  /// Gives back every cached block.
  void trim();
  [[nodiscard]] pinned_stats stats() const noexcept;
  /// How many generations a size must go unused before its blocks may make way, now.
  [[nodiscard]] std::uint32_t unused_generations() const noexcept {
    return unused_generations_.load(std::memory_order_relaxed);
  }
  /// Blocks cached in the calling thread's own shard (for tests).
  [[nodiscard]] std::size_t blocks_cached_here() const noexcept {
    return shards_[thread_stripe(shard_count)].blocks.load(std::memory_order_relaxed);
  }

  /// The size class a request is rounded up to: whole pages up to 64 KiB, then four classes per
  /// power of two, so a cached block is never more than 25% larger than what is asked for.
  [[nodiscard]] static std::size_t size_class(std::size_t bytes) noexcept;

 private:
  static constexpr std::size_t shard_count = 32;
  // The most cached blocks of a size class that move to a thread's own shard when it takes one
  // from another shard (half of what that shard holds, up to this).
  static constexpr std::size_t most_blocks_moved = 64;
  // Free blocks by capacity. A thread caches what it frees in its own shard and looks there
  // first; it takes from the others only when its own has nothing of the class.
  struct alignas(64) shard {
    std::mutex mutex;
    std::map<std::size_t, std::vector<void*>> free;  // capacity -> cached blocks
    std::atomic<std::size_t> blocks{0};              // cached here, to skip empty shards unlocked
    // Bytes handed out by this shard's threads minus bytes released by them: only the sum over
    // shards means anything (it wraps per shard when one thread frees what another took).
    std::atomic<std::size_t> in_use{0};
  };

  // Size classes: every page up to 64 KiB, then four per power of two up to 2^63 bytes.
  static constexpr std::size_t class_count = (std::size_t{64} << 10) / host_page_bytes + 1 + 4 * 48;
  [[nodiscard]] static std::size_t class_index(std::size_t capacity) noexcept;
  // When a size class was last used; whether blocks of it may be cached (set as one is cached;
  // cleared only under every shard's lock, by a look that finds none); whether cached blocks of
  // it made way for others since it last had to be made, the generation they did and how many
  // generations it had gone unused then.
  struct class_use {
    std::atomic<std::uint32_t> generation{0};
    std::atomic<bool> maybe_cached{false};
    std::atomic<bool> displaced{false};
    std::atomic<std::uint32_t> displaced_in{0};
    std::atomic<std::uint32_t> unused_when_displaced{0};
  };

  [[nodiscard]] void* take_cached(std::size_t capacity) noexcept;
  // Marks the class used in the current generation: two loads, and a store only the first time
  // in a generation.
  void note_use(std::size_t capacity) noexcept;
  // A block of the class (by index) is cached: its blocks may now make way. Under the shard's
  // lock that caches it.
  void note_cached(std::size_t index) noexcept;
  // Every shard's lock, taken in index order (the one order that every taker of more than one
  // shard's lock keeps, or backs off from, as take_cached does).
  [[nodiscard]] std::array<std::unique_lock<std::mutex>, shard_count> lock_every_shard();
  // A block of the class is made: if its blocks made way for others fewer generations ago than
  // the wait, or no more than it had gone unused before they did, the wait doubles.
  void note_miss(std::size_t capacity) noexcept;
  // Starts a new generation if the current one has lasted generation_length, and halves the wait
  // for each calm span since the last return. Slow paths only.
  void next_generation_if_due() noexcept;
  // release() of a block this cache handed out, its capacity known.
  void release_known(void* p, std::size_t capacity) noexcept;
  // For a block the limit leaves no room for: caches it in `home` in place of cached blocks of
  // classes not used lately, where giving those back makes room (see release()).
  [[nodiscard]] bool cache_in_place_of_unused(void* p, std::size_t capacity, shard& home) noexcept;
  // Reserves room for `capacity` more cached bytes if the limit allows.
  [[nodiscard]] bool reserve_cache_room(std::size_t capacity) noexcept;
  void trim_to(std::size_t limit);
  void give_back(void* p, std::size_t capacity) noexcept;

  memory_resource& source_;
  pinned_block_registry registry_;
  std::array<shard, shard_count> shards_;
  std::atomic<std::size_t> cached_{0};
  std::atomic<std::size_t> limit_;
  // Read on every acquire and release; written once a generation: away from cached_, which
  // every cached block's coming and going writes.
  alignas(64) std::atomic<std::uint32_t> generation_{0};
  std::atomic<std::uint32_t> unused_generations_{first_unused_generations};
  std::atomic<std::int64_t> generation_began_;
  // Serialises changes of the wait (rare: returns and halvings), and guards calm_since_, the
  // clock at the last return or halving.
  std::mutex wait_mutex_;
  std::int64_t calm_since_;
  // The last look that found too few bytes of unused sizes to make room, in one word: its
  // generation plus one (0: none) above, those bytes in pages (rounded up) below. Within a
  // generation no size becomes unused, so no more than that can make room until it ends:
  // releases that need more give their block back without a look.
  std::atomic<std::uint64_t> no_room_{0};
  const clock_function clock_;
  // Written once per class a generation: on lines of their own, away from generation_.
  alignas(64) std::array<class_use, class_count> uses_{};
};

/// is_pinned and describe_pointer over a given cache and host memory (the public functions pass the
/// process's): the cache's own blocks are answered without asking the host memory (on CUDA, a
/// driver call); anything else is what the host memory says.
[[nodiscard]] bool is_pinned(const void* p, const pinned_cache& cache,
                             const host_memory& memory) noexcept;
[[nodiscard]] pointer_info describe_pointer(const void* p, const pinned_cache& cache,
                                            const host_memory& memory) noexcept;

/// GPUPOOL_PINNED_CACHE_BYTES as read now: the pinned cache's limit in bytes, nullopt when unset
/// or empty. Throws std::invalid_argument naming the variable for anything but digits within
/// the size of a request the cache accepts.
[[nodiscard]] std::optional<std::size_t> pinned_cache_bytes_from_environment();

/// The process's pinned cache, over process_host_memory()'s pinned resource. Never destroyed:
/// blocks may be released by static destructors after main returns. A fork()ed child gets a new,
/// empty one at its first use (the parent's blocks are not given back, nor handed out, there).
[[nodiscard]] pinned_cache& process_pinned_cache();

}  // namespace gpupool::detail
