// Results of the calls a lane starts together, end to end in shared pinned blocks (slabs), so
// that one download writes them all in place and a result costs no block of its own.
#pragma once

#include <cstddef>

namespace gpupool::detail {

class pinned_cache;

/// While one is open on a thread, the results of at most `largest_result` bytes that thread
/// allocates (result_allocator, through carve_result) are carved end to end from slabs: pinned
/// blocks of at most `slab_results` results and about `slab_bytes`, each ended (given back to the
/// pinned cache) when its last result is freed, wherever and whenever that is. A result kept
/// alone keeps its slab: the bounds cap what that holds, and larger results, which download in
/// place on their own anyway, take blocks of their own. Allocations beyond what the scope was
/// opened for, or whose slab cannot be had, are left to result_allocator's own path. Not
/// copyable; one open per thread at a time (an inner one is inert).
class result_slabs {
 public:
  /// Opens slabs for the next `results` results the thread allocates, `bytes` in all (the sum of
  /// bytes_of() of each; the bytes only size the slabs). Fewer than two results: nothing to
  /// share, nothing opened.
  result_slabs(std::size_t results, std::size_t bytes) noexcept;
  result_slabs(const result_slabs&) = delete;
  result_slabs& operator=(const result_slabs&) = delete;
  ~result_slabs();

  static constexpr std::size_t slab_results = 64;
  static constexpr std::size_t slab_bytes = std::size_t{1} << 20;
  static constexpr std::size_t largest_result = std::size_t{64} << 10;

  /// What a result of `result_bytes` takes of a slab (its start stays aligned as operator new's).
  [[nodiscard]] static std::size_t bytes_of(std::size_t result_bytes) noexcept;

 private:
  bool open_ = false;
};

/// `bytes` of the calling thread's open slabs (a new slab is started when the current one has no
/// room); null where no result_slabs is open, or the scope's bytes are spent, or no slab could be
/// had. Thread-safe (thread-local state).
[[nodiscard]] void* carve_result(std::size_t bytes) noexcept;

/// Frees a result carved from the slab that starts at `slab` (a block of `cache`): the slab goes
/// back to the cache with its last result. False, and nothing freed, if the block is no slab.
/// Thread-safe.
bool release_carved_result(void* slab, pinned_cache& cache) noexcept;

}  // namespace gpupool::detail
