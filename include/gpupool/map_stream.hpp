// A map whose results are produced only as far ahead of their consumer as a window allows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpupool/executor.hpp"
#include "gpupool/future.hpp"
#include "gpupool/host_vector.hpp"
#include "gpupool/types.hpp"

namespace gpupool {

/// How far a `map_stream` runs ahead of its consumer: at most `calls` calls whose results have
/// not been taken, together holding at most `bytes` of input and result. A call is always
/// queued when none is, however large.
struct stream_window {
  std::size_t calls = SIZE_MAX;
  std::size_t bytes = std::size_t{1} << 30;
};

/// The results of a built-in kernel over many inputs, in input order, each handed over once by
/// `next()` (or by iterating). Unlike `executor::map`, which queues every input at once and
/// keeps every result until its future is read, a stream queues inputs while they fit its
/// window and more as results are taken: its memory does not grow with the number of inputs.
/// Inputs must stay alive until the stream is gone. Destroying a stream cancels the calls no
/// lane has started and waits for those running (nothing is left reading the inputs). A
/// failed call ends the stream: `next()` throws its error and the calls after it are cancelled.
/// Move-only; one thread at a time.
template <class T>
class map_stream {
 public:
  /// One call's inputs: `y` is empty for a one-input kernel.
  struct call {
    std::span<const T> x;
    std::span<const T> y;
  };
  /// Gives the next call's inputs, or nothing at the end.
  using source = std::function<std::optional<call>()>;

  map_stream(executor& exec, const builtin_kernel& k, source next_call, stream_window window)
      : exec_(&exec), kernel_(k), source_(std::move(next_call)), window_(window) {
    if (window_.calls == 0 || window_.bytes == 0)
      throw std::invalid_argument("gpupool::map_stream: the window holds at least one call");
    top_up();
  }
  /// Iterators of the stream moved from do not follow it.
  map_stream(map_stream&& other) = default;
  map_stream& operator=(map_stream&&) = delete;
  map_stream(const map_stream&) = delete;
  map_stream& operator=(const map_stream&) = delete;
  ~map_stream() { stop(); }

  /// The next result, waiting for it; nothing after the last.
  /// @throw the call's own error (or cancelled_error), after cancelling every later call.
  std::optional<host_vector<T>> next() {
    if (queued_.empty()) top_up();
    if (queued_.empty()) return std::nullopt;
    queued q = std::move(queued_.front());
    queued_.pop_front();
    bytes_ -= q.bytes;
    // This call has left the window: what now fits is queued before its result is waited for
    // and handed on, so that the window's calls run while the consumer works on it.
    try {
      top_up();
      return q.result.get();
    } catch (...) {
      stop();
      if (q.result.valid()) {
        (void)q.result.cancel();
        q.result.wait();
      }
      throw;
    }
  }

  /// Calls queued whose results have not been taken, and their bytes (the window's use).
  [[nodiscard]] std::size_t queued_calls() const noexcept { return queued_.size(); }
  [[nodiscard]] std::size_t queued_bytes() const noexcept { return bytes_; }

  /// An input iterator over the results (each `*it` moves one out).
  class iterator {
   public:
    using iterator_concept = std::input_iterator_tag;
    using value_type = host_vector<T>;
    using difference_type = std::ptrdiff_t;

    iterator() = default;
    explicit iterator(map_stream* s) : stream_(s) { ++*this; }
    value_type& operator*() const { return *current_; }
    iterator& operator++() {
      current_ = stream_->next();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept {
      return !it.current_.has_value();
    }

   private:
    map_stream* stream_ = nullptr;
    mutable std::optional<host_vector<T>> current_;
  };
  iterator begin() { return iterator(this); }
  std::default_sentinel_t end() const noexcept { return {}; }

 private:
  struct queued {
    future<host_vector<T>> result;
    std::size_t bytes = 0;
  };

  // Queues calls while the window has room, one `executor::map` per batch. An error (a pair
  // of different sizes, a shut-down executor) ends the stream.
  void top_up() {
    const bool two_inputs = kernel_.arity() == 2;
    std::vector<std::span<const T>> xs, ys;
    std::vector<std::size_t> costs;
    std::size_t batch_bytes = 0;
    try {
      while (source_) {
        if (!pending_) pending_ = source_();
        if (!pending_) {
          source_ = nullptr;  // the inputs have ended
          break;
        }
        const std::size_t cost = (two_inputs ? 3 : 2) * pending_->x.size() * sizeof(T);
        const std::size_t count = queued_.size() + xs.size();
        const std::size_t used = bytes_ + batch_bytes;
        if (count != 0 &&
            (count >= window_.calls || cost > window_.bytes || used > window_.bytes - cost))
          break;
        xs.push_back(pending_->x);
        if (two_inputs) ys.push_back(pending_->y);
        costs.push_back(cost);
        batch_bytes += cost;
        pending_.reset();
      }
      if (xs.empty()) return;
      auto futures = two_inputs ? exec_->map(kernel_, xs, ys) : exec_->map(kernel_, xs);
      for (std::size_t i = 0; i < futures.size(); ++i)
        queued_.push_back({std::move(futures[i]), costs[i]});
      bytes_ += batch_bytes;
    } catch (...) {
      stop();
      throw;
    }
  }

  // Cancels what no lane has started and waits for what runs; no more calls are queued.
  void stop() noexcept {
    source_ = nullptr;
    pending_.reset();
    for (queued& q : queued_)
      if (q.result.valid()) (void)q.result.cancel();
    for (queued& q : queued_)
      if (q.result.valid()) q.result.wait();
    queued_.clear();
    bytes_ = 0;
  }

  executor* exec_;
  builtin_kernel kernel_;
  source source_;
  stream_window window_;
  std::optional<call> pending_;  // read, not queued yet: the window was full
  std::deque<queued> queued_;
  std::size_t bytes_ = 0;
};

/// Streams a one-input built-in kernel over `xs` (a sized range of contiguous ranges of T,
/// such as std::vector<std::vector<double>>), as `executor::map` does but within `window`.
/// @throw std::invalid_argument if the kernel takes two inputs.
template <class Inputs>
auto stream_map(executor& exec, const builtin_kernel& k, const Inputs& xs,
                stream_window window = {}) {
  using T =
      std::remove_cv_t<std::ranges::range_value_t<std::ranges::range_reference_t<const Inputs>>>;
  if (k.arity() != 1)
    throw std::invalid_argument("gpupool::stream_map: this kernel takes two inputs");
  auto it = std::ranges::begin(xs);
  auto end = std::ranges::end(xs);
  return map_stream<T>(
      exec, k,
      [it, end]() mutable -> std::optional<typename map_stream<T>::call> {
        if (it == end) return std::nullopt;
        const auto& x = *it;
        ++it;
        return typename map_stream<T>::call{
            std::span<const T>(std::ranges::data(x), std::ranges::size(x)), {}};
      },
      window);
}

/// A stream reads its inputs as it goes: a temporary list of inputs would be gone by then.
template <class Inputs>
requires(!std::is_lvalue_reference_v<Inputs>) auto stream_map(executor& exec,
                                                              const builtin_kernel& k, Inputs&& xs,
                                                              stream_window window = {}) = delete;

/// Streams a two-input built-in kernel over pairs (xs[i], ys[i]).
/// @throw std::invalid_argument if the kernel takes one input or the lists differ in length;
///        a pair whose sizes differ throws from `next()`, as `executor::map` would.
template <class Inputs>
auto stream_map(executor& exec, const builtin_kernel& k, const Inputs& xs, const Inputs& ys,
                stream_window window = {}) {
  using T =
      std::remove_cv_t<std::ranges::range_value_t<std::ranges::range_reference_t<const Inputs>>>;
  if (k.arity() != 2)
    throw std::invalid_argument("gpupool::stream_map: this kernel takes one input");
  if (std::ranges::size(xs) != std::ranges::size(ys))
    throw std::invalid_argument("gpupool::stream_map: input lists differ in length");
  auto x = std::ranges::begin(xs);
  auto y = std::ranges::begin(ys);
  auto end = std::ranges::end(xs);
  return map_stream<T>(
      exec, k,
      [x, y, end]() mutable -> std::optional<typename map_stream<T>::call> {
        if (x == end) return std::nullopt;
        typename map_stream<T>::call c{
            std::span<const T>(std::ranges::data(*x), std::ranges::size(*x)),
            std::span<const T>(std::ranges::data(*y), std::ranges::size(*y))};
        ++x;
        ++y;
        return c;
      },
      window);
}

template <class Inputs>
requires(!std::is_lvalue_reference_v<Inputs>) auto stream_map(executor& exec,
                                                              const builtin_kernel& k, Inputs&& xs,
                                                              Inputs&& ys,
                                                              stream_window window = {}) = delete;

}  // namespace gpupool
