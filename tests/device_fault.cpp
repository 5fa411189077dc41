// A kernel that writes to an illegal address on the last GPU, while a map of many 8 MiB arrays
// runs over every GPU. Such a CUDA error is "sticky" for the whole process: every later CUDA
// call fails with it, on every device (CUDA's documentation). So gpupool takes every device out
// of service at once: the faulting task fails with the CUDA error, everything still queued fails
// promptly with device_fault naming it, no result that comes back is wrong, new work is refused,
// and the process shuts the pool down and exits normally. Its own process (ctest
// cuda.device_fault), since CUDA is lost to it afterwards.
// Exit 0: as described; 1: it was not; 77: no usable GPU (ctest reports the test skipped).
#include <cstdio>
#include <exception>
#include <future>
#include <span>
#include <string>
#include <vector>

#include "gpupool/gpupool.hpp"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// "device_fault: ..." for a device fault, "error: ..." for another failure, "" for success.
template <class F>
std::string outcome(F&& wait) {
  try {
    wait();
    return "";
  } catch (const gpupool::device_fault& e) {
    return std::string("device_fault: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("error: ") + e.what();
  }
}

// Runs the scenario; the executor (with the faulted device's lanes and memory) is gone when it
// returns, so a failure to shut down or to free shows before the verdict.
void run() {
  gpupool::executor_options options;
  options.backend = gpupool::backend_kind::cuda;
  options.lanes_per_device = 4;
  options.chunk_bytes = 4 << 20;
  options.tuning = gpupool::tuning::fixed;
  gpupool::executor ex(options);
  const int devices = static_cast<int>(ex.devices().size());
  const int faulty = devices - 1;
  std::printf("%d GPU(s); a wild write on device %d\n", devices, faulty);

  const gpupool::raw_kernel wild_write(R"(
extern "C" __global__ void wild_write(const float* x, float* out, unsigned long long n) {
  const unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i];
  if (i == 0) *(volatile float*)(0x10) = x[0];  // no allocation is there: an illegal address
}
)",
                                       "wild_write", "float32* x", "float32* out");
  // 200 arrays of 1M float64 (8 MiB each), for any device.
  std::vector<std::vector<double>> inputs(200, std::vector<double>(1 << 20));
  for (std::size_t i = 0; i < inputs.size(); ++i)
    for (std::size_t j = 0; j < inputs[i].size(); ++j)
      inputs[i][j] = static_cast<double>((i + j) % 1000) * 0.5;
  std::vector<float> small(1024, 1.0f);
  // The fault waits until the map is queued, so that there is queued work for it to end.
  std::promise<void> map_queued;
  const std::shared_future<void> go = map_queued.get_future().share();
  auto fault = ex.submit_to(faulty, [&](gpupool::lane& l) {
    go.wait();
    auto x = l.upload(std::span<const float>(small));
    auto out = l.allocate<float>(small.size());
    l.run(wild_write, {x}, out);
    l.synchronize();
  });
  auto squares = ex.map(gpupool::builtin_kernel::square(), inputs);
  map_queued.set_value();

  const std::string faulted = outcome([&] { fault.get(); });
  check(faulted.find("cudaErrorIllegalAddress") != std::string::npos,
        "the faulting task failed with the fault: " + faulted);

  std::size_t right = 0, wrong = 0, refused = 0, other = 0;
  for (std::size_t i = 0; i < squares.size(); ++i) {
    std::string why = outcome([&] {
      const auto out = squares[i].get();
      for (std::size_t j = 0; j < out.size(); ++j)
        if (out[j] != inputs[i][j] * inputs[i][j]) {
          ++wrong;
          return;
        }
      ++right;
    });
    if (why.rfind("device_fault: ", 0) == 0)
      ++refused;
    else if (!why.empty() && ++other == 1)
      std::printf("  first other failure: %s\n", why.c_str());
  }
  std::printf("map: %zu right, %zu wrong, %zu device_fault, %zu other failures\n", right, wrong,
              refused, other);
  check(wrong == 0, "no result of the map is wrong");
  const std::string later = outcome([&] { ex.submit_to(faulty, [](gpupool::lane&) {}).get(); });
  check(later.rfind("device_fault: ", 0) == 0 && later.find("out of service") != std::string::npos,
        "new work for the faulted device is refused: " + later);
  check(right + refused + other == inputs.size(), "every task of the map ended");
  check(refused > 0, "queued work failed with device_fault");
  for (int d = 0; d < devices; ++d) {
    const std::string none = outcome([&] { ex.submit_to(d, [](gpupool::lane&) {}).get(); });
    check(none.rfind("device_fault: ", 0) == 0 && none.find("out of service") != std::string::npos,
          "new work for device " + std::to_string(d) + " is refused: " + none);
  }
  const std::string none = outcome([&] { ex.submit([](gpupool::lane&) {}).get(); });
  check(none.find("every device is out of service") != std::string::npos,
        "new work for any device is refused: " + none);
  ex.shutdown();
}

}  // namespace

int main() {
  const auto cuda = gpupool::cuda_availability();
  if (!cuda.usable) {
    std::printf("no usable GPU (%s): skipped\n", cuda.reason.c_str());
    return 77;
  }
  try {
    run();
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    ++failures;
  }
  std::printf("%s\n", failures == 0 ? "device fault contained" : "FAILED");
  return failures == 0 ? 0 : 1;
}
