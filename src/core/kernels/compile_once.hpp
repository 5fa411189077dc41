// One compilation per key per process, however many threads ask for it at once: the first
// builds, the others wait for its result. A failed build is forgotten, so a later call retries.
// Optionally bounded: beyond `most_kept` finished results the least recently asked for is
// dropped (a later call builds it again), so a process that compiles ever new kernels does not
// keep every one of them.
#pragma once

#include <cstddef>
#include <future>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <string>

namespace gpupool::detail {

template <class Result>
class compile_once {
 public:
  /// Keeps every result unless `most_kept` (at least 1) says how many finished ones to keep.
  explicit compile_once(std::size_t most_kept = std::numeric_limits<std::size_t>::max())
      : most_kept_(most_kept < 1 ? 1 : most_kept) {}

  template <class Build>
  Result get(const std::string& key, Build&& build) {
    std::promise<Result> mine;
    std::shared_future<Result> result;
    bool builder = false;
    {
      std::lock_guard lock(mutex_);
      auto [it, inserted] = done_.try_emplace(key);
      if (inserted) {
        it->second.result = mine.get_future().share();
        it->second.recent = recent_.end();  // not finished: never dropped
        builder = true;
      } else if (it->second.recent != recent_.end()) {
        recent_.splice(recent_.begin(), recent_, it->second.recent);
      }
      result = it->second.result;
    }
    if (builder) {
      try {
        mine.set_value(build());
      } catch (...) {
        mine.set_exception(std::current_exception());
        std::lock_guard lock(mutex_);
        done_.erase(key);
        return result.get();
      }
      std::lock_guard lock(mutex_);
      keep(key);
    }
    return result.get();
  }

  /// Finished results held now.
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mutex_);
    return recent_.size();
  }

 private:
  struct entry {
    std::shared_future<Result> result;
    typename std::list<std::string>::iterator recent;
  };

  // Under the lock: `key` has finished; the oldest finished results beyond the bound go.
  void keep(const std::string& key) {
    auto it = done_.find(key);
    if (it == done_.end()) return;
    try {
      recent_.push_front(key);
    } catch (...) {
      done_.erase(it);  // no memory to remember it: the next call builds it again
      return;
    }
    it->second.recent = recent_.begin();
    while (recent_.size() > most_kept_) {
      done_.erase(recent_.back());
      recent_.pop_back();
    }
  }

  const std::size_t most_kept_;
  mutable std::mutex mutex_;
  std::map<std::string, entry> done_;
  std::list<std::string> recent_;  // finished keys, most recently asked for first
};

}  // namespace gpupool::detail
