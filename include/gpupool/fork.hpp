/// @file
/// Living through fork(): one registry of handlers that run in a forked child, the count of
/// forks the process came out of, and `fork_fresh<T>`, a lazily made process-wide object that a
/// forked child replaces with a fresh one.
///
/// A child of a threaded process has only the thread that called fork(): a lock another thread
/// held stays locked for ever, and state that thread was changing stays half changed. What the
/// library shares between threads is therefore either started afresh in the child (by a handler
/// here) or left alone and never used there.
#pragma once

#include <atomic>
#include <memory>
#include <new>
#include <type_traits>

namespace gpupool {

/// A handler run in a forked child. It runs before fork() returns there, in a process that may
/// have had other threads: it may do only what is async-signal-safe (no malloc, no lock).
using fork_child_handler = void (*)(void* context) noexcept;

/// Registers `handler(context)` to run in every child this process forks from now on (and in
/// that child's children: the child inherits the registry), after fork_generation() has counted
/// the fork, in registration order. Lock-free and allocation-free; registrations are never
/// removed, so `context` must live as long as the process (a namespace-scope object, say).
/// @throw std::length_error when the registry (a fixed 64 entries) is full.
/// @throw std::system_error when the process's one fork handler could not be registered.
void on_fork_child(fork_child_handler handler, void* context);

/// The number of fork()s this process came out of as the child (0 in a process that was not
/// forked since its first call here). Something made under one count and used under another
/// belongs to another process (an executor's lanes, say). The first call registers the process's
/// fork handler; if that failed (pthread_atfork: out of memory), the count stays where it is.
[[nodiscard]] unsigned fork_generation() noexcept;

/// One process-wide T, made at the first get() and never destroyed (it may be used during exit,
/// after static destruction has begun). A forked child gets a freshly constructed T in place of
/// the parent's, which may have been left mid-change (a mutex held, a flag set) by a thread the
/// child does not have; the parent's is abandoned there, never destroyed. The child's is built
/// in storage inside this object, without malloc (a grandchild builds its own over it). A child
/// forked before the first get() makes its own at its first get().
///
/// Constant-initialised, so it can be a namespace-scope object used from any static initialiser
/// or destructor; made without a function-local static (a fork() while another thread was inside
/// such a static's initialisation would leave the child waiting on its guard for ever).
template <class T>
class fork_fresh {
  static_assert(std::is_nothrow_default_constructible_v<T>,
                "fork_fresh<T>: a forked child constructs T in a fork handler, which cannot throw");

 public:
  constexpr fork_fresh() noexcept = default;
  fork_fresh(const fork_fresh&) = delete;
  fork_fresh& operator=(const fork_fresh&) = delete;

  /// The object, made at the first call. @throw std::bad_alloc, or what on_fork_child throws
  /// (only at the first call).
  T& get() {
    if (T* made = current_.load(std::memory_order_acquire)) return *made;
    return make();
  }

 private:
  T& make() {
    // Registered before the object is published, once per process tree (the child inherits the
    // registration): a child forked in between sees nothing made and makes its own.
    if (!registered_.exchange(true, std::memory_order_acq_rel)) {
      try {
        on_fork_child(&fresh_in_child, this);
      } catch (...) {
        registered_.store(false, std::memory_order_release);
        throw;
      }
    }
    auto made = std::make_unique<T>();
    T* expected = nullptr;
    if (!current_.compare_exchange_strong(expected, made.get(), std::memory_order_acq_rel))
      return *expected;  // another thread's came first
    return *made.release();
  }

  static void fresh_in_child(void* self) noexcept {
    auto* me = static_cast<fork_fresh*>(self);
    if (me->current_.load(std::memory_order_relaxed) == nullptr) return;  // made at first use
    me->current_.store(::new (static_cast<void*>(me->in_child_)) T(), std::memory_order_relaxed);
  }

  std::atomic<T*> current_{nullptr};
  std::atomic<bool> registered_{false};
  alignas(T) unsigned char in_child_[sizeof(T)]{};
};

}  // namespace gpupool
