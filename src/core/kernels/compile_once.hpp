// One compilation per key per process, however many threads ask for it at once: the first
// builds, the others wait for its result. A failed build is forgotten, so a later call retries.
#pragma once

#include <future>
#include <map>
#include <mutex>
#include <string>

namespace gpupool::detail {

template <class Result>
class compile_once {
 public:
  template <class Build>
  Result get(const std::string& key, Build&& build) {
    std::promise<Result> mine;
    std::shared_future<Result> result;
    bool builder = false;
    {
      std::lock_guard lock(mutex_);
      auto [it, inserted] = done_.try_emplace(key);
      if (inserted) {
        it->second = mine.get_future().share();
        builder = true;
      }
      result = it->second;
    }
    if (builder) {
      try {
        mine.set_value(build());
      } catch (...) {
        mine.set_exception(std::current_exception());
        std::lock_guard lock(mutex_);
        done_.erase(key);
      }
    }
    return result.get();
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::shared_future<Result>> done_;
};

}  // namespace gpupool::detail
