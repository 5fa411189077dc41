// Compiling elementwise kernels for the host with the system's C++ compiler, cached in memory
// (each kernel compiled once per process, however many lanes ask at once) and on disk (a second
// process loads the shared object without compiling).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "gpupool/elementwise.hpp"

namespace gpupool::detail {

class host_kernel {
 public:
  using entry_point = void (*)(void* const* args, std::size_t n);
  /// `descriptor`: the memory file the library was loaded from, closed after the library.
  host_kernel(void* library, entry_point entry, int descriptor)
      : library_(library), entry_(entry), descriptor_(descriptor) {}
  host_kernel(const host_kernel&) = delete;
  host_kernel& operator=(const host_kernel&) = delete;
  ~host_kernel();
  void operator()(void* const* args, std::size_t n) const { entry_(args, n); }

 private:
  void* library_;
  entry_point entry_;
  int descriptor_;
};

/// Compiles (or loads from the caches) `k` for the argument pattern `is_array`. The compiler is
/// GPUPOOL_CXX, else CXX, else the first of c++, g++, clang++ that runs (started with an
/// argument vector, never through a shell). The shared object is kept in the cache as a checked
/// entry and loaded from the checked bytes in memory.
/// @throw compile_error with the compiler's log; gpupool::error if the compiler cannot be run.
std::shared_ptr<const host_kernel> compile_for_host(const elementwise_kernel& k,
                                                    const std::vector<bool>& is_array);

}  // namespace gpupool::detail
