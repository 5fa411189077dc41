#include "core/memory/result_slabs.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <new>

#include "core/memory/pinned_cache.hpp"
#include "gpupool/pinned.hpp"

namespace gpupool::detail {
namespace {

// The front of every slab: the count of its live results, plus one while its thread still carves
// from it. Results start after it, so that no result's address is its block's start (which the
// pinned cache would take for the whole block).
struct slab_header {
  static constexpr std::uint64_t mark = 0x67707062736c6162;  // "gppbslab": a slab's own
  std::uint64_t magic = mark;
  std::atomic<std::size_t> holders{1};
};
constexpr std::size_t header_bytes = 64;
static_assert(sizeof(slab_header) <= header_bytes);
// A result's start, as operator new aligns (the results of one shape stay end to end).
constexpr std::size_t result_alignment = alignof(std::max_align_t);

constexpr std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

// The calling thread's open scope: what it was opened for and has not carved yet, and the slab
// it carves from (null before the first carve, and after the slab ran out of room).
struct carving {
  bool open = false;
  std::size_t results_left = 0;
  std::size_t bytes_left = 0;
  slab_header* slab = nullptr;
  char* next = nullptr;
  char* end = nullptr;
  std::size_t carved_here = 0;  // results carved from `slab`
};
thread_local carving current;

// Lets go of the thread's hold on its slab (the slab ends here if no result is left in it).
void leave_slab() noexcept {
  if (current.slab == nullptr) return;
  (void)release_carved_result(current.slab, process_pinned_cache());
  current.slab = nullptr;
  current.next = current.end = nullptr;
  current.carved_here = 0;
}

// Starts a slab for the next results, sized for what the scope has left (at most one slab's
// bounds, its results counted at the scope's average size; at least `bytes`), its header in the
// size class the results alone would take (one result fewer where it does not fit beside them and
// more slabs follow), and carving up to the end of the block the cache hands out. False if none
// could be had.
bool start_slab(std::size_t bytes) noexcept {
  leave_slab();
  const std::size_t average = round_up(
      (current.bytes_left + current.results_left - 1) / current.results_left, result_alignment);
  std::size_t room = std::max(
      bytes, std::min({current.bytes_left, result_slabs::slab_bytes,
                       average * std::min(current.results_left, result_slabs::slab_results)}));
  if (header_bytes + room > pinned_cache::size_class(room) && room < current.bytes_left &&
      room >= bytes + average)
    room -= average;  // a slab follows anyway: it takes that result
  void* block = nullptr;
  try {
    block = allocate_pinned(header_bytes + room);
  } catch (...) {
    return false;  // each result then takes a block of its own, as without slabs
  }
  const std::size_t capacity =
      std::max(process_pinned_cache().capacity_at(block), header_bytes + room);
  current.slab = ::new (block) slab_header();
  current.next = static_cast<char*>(block) + header_bytes;
  current.end = static_cast<char*>(block) + capacity;
  return true;
}

}  // namespace

std::size_t result_slabs::bytes_of(std::size_t result_bytes) noexcept {
  return round_up(result_bytes, result_alignment);
}

result_slabs::result_slabs(std::size_t results, std::size_t bytes) noexcept {
  if (results < 2 || current.open) return;
  current = carving{};
  current.open = open_ = true;
  current.results_left = results;
  current.bytes_left = bytes;
}

result_slabs::~result_slabs() {
  if (!open_) return;
  leave_slab();
  current = carving{};
}

void* carve_result(std::size_t bytes) noexcept {
  if (!current.open || current.results_left == 0 || bytes > result_slabs::largest_result)
    return nullptr;
  const std::size_t taken = round_up(bytes, result_alignment);
  if (current.slab == nullptr || current.carved_here == result_slabs::slab_results ||
      taken > static_cast<std::size_t>(current.end - current.next)) {
    if (!start_slab(taken)) {
      current.open = false;  // no pinned memory now: the rest go their own way
      return nullptr;
    }
  }
  void* p = current.next;
  current.next += taken;
  ++current.carved_here;
  --current.results_left;
  current.bytes_left -= std::min(current.bytes_left, taken);
  current.slab->holders.fetch_add(1, std::memory_order_relaxed);
  return p;
}

bool release_carved_result(void* slab, pinned_cache& cache) noexcept {
  auto* header = static_cast<slab_header*>(slab);
  // Anything else inside a pinned block is no result of ours: not freed as something it is not.
  if (header->magic != slab_header::mark) return false;
  if (header->holders.fetch_sub(1, std::memory_order_acq_rel) != 1) return true;
  header->magic = 0;  // the block may be handed out again, as anything
  header->~slab_header();
  (void)cache.release(slab);
  return true;
}

}  // namespace gpupool::detail
