// Storage for many short-lived objects of one type that one thread makes and others destroy: the
// queue's pieces of small tasks, made by the submitting thread and freed by lanes at a high rate.
// Freed through the system allocator, each lane's free of a block the submitter's arena handed
// out takes that arena's lock, which the submitter takes for its next allocation: with many small
// tasks, that lock took a large share of all the CPU time. Here each thread keeps the blocks it
// frees, and a shared list passes them between threads in runs of `run` blocks, one lock per run.
//
// A class uses it through its own operator new and delete (see elementwise_piece).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "gpupool/fork.hpp"

namespace gpupool::detail {

template <class T>
class recycled_storage {
 public:
  /// Storage for one T. @throw std::bad_alloc.
  static void* allocate() {
    shared_list& list = shared();
    if (std::vector<void*>* mine = local()) {
      if (mine->empty()) refill(*mine, list);
      if (!mine->empty()) {
        void* p = mine->back();
        mine->pop_back();
        return p;
      }
    }
    return ::operator new (sizeof(T), std::align_val_t{alignof(T)});
  }

  /// Takes back storage from allocate(). Never throws.
  static void deallocate(void* p) noexcept {
    if (p == nullptr) return;
    std::vector<void*>* mine = local();
    if (mine == nullptr) {
      // This thread's own blocks were already handed back (a destructor running at its exit).
      share_one(p);
      return;
    }
    if (mine->size() >= 2 * run) hand_back(*mine, run);
    try {
      mine->push_back(p);
    } catch (const std::bad_alloc&) {
      release(p);
    }
  }

 private:
  // Blocks moved between a thread and the shared list at once.
  static constexpr std::size_t run = 64;
  // Blocks the shared list keeps at most; beyond, they go back to the system (a burst of many
  // pieces in flight at once leaves no lasting memory behind).
  static constexpr std::size_t most_shared = 16384;

  struct shared_list {
    std::mutex mutex;
    std::vector<void*> blocks;
  };
  // Never destroyed: threads hand their blocks back as they exit, which may be after static
  // destruction has begun. Made at the first allocate(), before any block exists. A fork()ed
  // child starts with a new list: the parent's lock may have been held by a thread that is not in
  // the child (the parent's blocks are leaked there, not reused).
  static inline fork_fresh<shared_list> shared_list_;
  static shared_list& shared() { return shared_list_.get(); }

  // This thread's blocks, reached through a plain pointer (trivially destructible, so still
  // readable while the thread's other thread_local objects are destroyed): once they are handed
  // back at the thread's exit, a later free goes to the shared list directly.
  struct thread_blocks {
    std::vector<void*>* blocks = nullptr;
    bool ended = false;
  };
  static thread_blocks& this_thread() noexcept {
    thread_local thread_blocks mine;
    return mine;
  }
  struct thread_exit {
    ~thread_exit() {
      thread_blocks& mine = this_thread();
      if (mine.blocks != nullptr) hand_back(*mine.blocks, mine.blocks->size());
      delete mine.blocks;
      mine = {nullptr, true};
    }
  };
  static std::vector<void*>* local() noexcept {
    thread_blocks& mine = this_thread();
    if (mine.blocks == nullptr && !mine.ended) {
      try {
        auto blocks = std::make_unique<std::vector<void*>>();
        blocks->reserve(2 * run + 1);
        thread_local thread_exit at_exit;  // hands them back when this thread ends
        (void)at_exit;
        mine.blocks = blocks.release();
      } catch (const std::bad_alloc&) {
        return nullptr;
      }
    }
    return mine.blocks;
  }

  static void release(void* p) noexcept { ::operator delete (p, std::align_val_t{alignof(T)}); }

  // Takes up to `run` blocks from the shared list.
  static void refill(std::vector<void*>& into, shared_list& list) noexcept {
    std::lock_guard lock(list.mutex);
    const std::size_t n = list.blocks.size() < run ? list.blocks.size() : run;
    if (n == 0) return;
    try {
      into.insert(into.end(), list.blocks.end() - static_cast<std::ptrdiff_t>(n),
                  list.blocks.end());
    } catch (const std::bad_alloc&) {
      return;  // no room to take them: they stay shared
    }
    list.blocks.resize(list.blocks.size() - n);
  }

  // Puts one block on the shared list (or gives it to the system, past the list's bound).
  static void share_one(void* p) noexcept {
    shared_list& list = shared();
    {
      std::lock_guard lock(list.mutex);
      if (list.blocks.size() < most_shared) {
        try {
          list.blocks.push_back(p);
          return;
        } catch (const std::bad_alloc&) {
          // no room to note it: given back below
        }
      }
    }
    release(p);
  }

  // Moves the last `n` blocks of `from` to the shared list (or to the system, past its bound).
  // Only blocks from allocate() exist to be handed back, so the list was made before.
  static void hand_back(std::vector<void*>& from, std::size_t n) noexcept {
    if (n == 0) return;
    shared_list& list = shared();
    {
      std::lock_guard lock(list.mutex);
      while (n > 0 && list.blocks.size() < most_shared) {
        try {
          list.blocks.push_back(from.back());
        } catch (const std::bad_alloc&) {
          break;
        }
        from.pop_back();
        --n;
      }
    }
    for (; n > 0; --n) {
      release(from.back());
      from.pop_back();
    }
  }
};

}  // namespace gpupool::detail
