// A one-line progress display for long commands: done/total, rate and ETA, redrawn in place on
// standard error, and nothing at all when standard error is not a terminal. (No progress-bar
// library for C++ is packaged by the registries this project installs from.)
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace gpupool_cli {

class progress_line {
 public:
  progress_line(std::string label, std::size_t total)
      : label_(std::move(label)), total_(total), enabled_(isatty(STDERR_FILENO) == 1) {}
  progress_line(const progress_line&) = delete;
  progress_line& operator=(const progress_line&) = delete;
  ~progress_line() { clear(); }

  /// Erases the line, so that other output can be printed; the next step() draws it again.
  void clear() {
    if (enabled_ && drawn_) std::fprintf(stderr, "\r\033[K");
    drawn_ = false;
  }

  /// Marks one more step done and redraws (at most ten times a second).
  void step() {
    ++done_;
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && done_ < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
    const double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : 0.0;
    std::fprintf(stderr, "\r\033[K%s: %zu/%zu (%3.0f%%), %.2f/s, ETA %.0fs", label_.c_str(), done_,
                 total_, 100.0 * static_cast<double>(done_) / static_cast<double>(total_), rate,
                 eta);
    std::fflush(stderr);
    drawn_ = true;
  }

 private:
  std::string label_;
  std::size_t total_;
  std::size_t done_ = 0;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace gpupool_cli
