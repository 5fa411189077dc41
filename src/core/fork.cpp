// The process's one fork handler and its registry (see gpupool/fork.hpp).
#include "gpupool/fork.hpp"

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <stdexcept>
#include <system_error>

namespace gpupool {
namespace {

constexpr std::size_t most_handlers = 64;

struct registration {
  std::atomic<fork_child_handler> handler{nullptr};
  std::atomic<void*> context{nullptr};
};

// Everything here is constant-initialised (no constructor runs, nothing is destroyed) and
// lock-free, so registering and running the handlers never allocate, never lock, and work from
// any static initialiser or destructor.
registration registry[most_handlers];
std::atomic<std::size_t> taken{0};  // entries handed out (may pass most_handlers: then full)
std::atomic<unsigned> generation{0};
std::atomic<int> atfork_error{0};
std::atomic<bool> atfork_tried{false};  // pthread_once below has run (the fast path)
// pthread_once, not a function-local static: glibc's once control knows about fork(), so a fork
// while another thread registers does not leave the child waiting for that thread for ever.
pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

void run_in_child() noexcept {
  generation.fetch_add(1, std::memory_order_relaxed);
  const std::size_t n = taken.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n && i < most_handlers; ++i) {
    // An entry taken by a thread that had not filled it in at the fork has no handler: that
    // thread is not in the child, and its registration never finished.
    const fork_child_handler handler = registry[i].handler.load(std::memory_order_acquire);
    if (handler != nullptr) handler(registry[i].context.load(std::memory_order_relaxed));
  }
}

void register_atfork() noexcept {
  const int error = pthread_atfork(nullptr, nullptr, run_in_child);
  atfork_error.store(error, std::memory_order_relaxed);
  atfork_tried.store(true, std::memory_order_release);
}

int ensure_atfork() noexcept {
  if (!atfork_tried.load(std::memory_order_acquire)) pthread_once(&atfork_once, register_atfork);
  return atfork_error.load(std::memory_order_acquire);
}

}  // namespace

void on_fork_child(fork_child_handler handler, void* context) {
  if (handler == nullptr) throw std::invalid_argument("gpupool: on_fork_child needs a handler");
  if (const int error = ensure_atfork(); error != 0)
    throw std::system_error(error, std::generic_category(),
                            "gpupool: could not register the fork handler");
  const std::size_t i = taken.fetch_add(1, std::memory_order_acq_rel);
  if (i >= most_handlers)
    throw std::length_error("gpupool: more fork handlers than the registry holds");
  registry[i].context.store(context, std::memory_order_relaxed);
  registry[i].handler.store(handler, std::memory_order_release);
}

unsigned fork_generation() noexcept {
  static_cast<void>(ensure_atfork());
  return generation.load(std::memory_order_relaxed);
}

}  // namespace gpupool
