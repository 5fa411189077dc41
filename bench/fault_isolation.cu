// Does a fault on one GPU reach another GPU of the same process? On a machine with two GPUs:
// pinned host blocks are made with each device current, device 1 runs a kernel that writes to an
// illegal address, then a thread that only ever used device 0 copies from each block, runs a
// kernel and copies from a block made after the fault. Prints what each call returned.
// gpupool's cuda.device_fault test saw device 0 fail right after device 1's fault; this tells
// whether pinned memory made while the faulted device was current is the path.
//   nvcc -O2 -arch=sm_90 -o /tmp/fault_isolation bench/fault_isolation.cu && /tmp/fault_isolation
// Not part of the build (it ruins a device's context on purpose).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

__global__ void wild_write(const float* in) {
  *reinterpret_cast<volatile float*>(0x10) = in[0];  // nothing is mapped there
}

__global__ void fill(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 1.0f;
}

const char* name(cudaError_t e) {
  return cudaGetErrorName(e);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::puts("needs two GPUs");
    return 77;
  }
  constexpr std::size_t bytes = std::size_t{1} << 20;
  void* pinned_by_0 = nullptr;
  void* pinned_by_1 = nullptr;
  float* on_0 = nullptr;
  float* on_1 = nullptr;
  cudaSetDevice(0);
  std::printf("pinned with device 0 current: %s\n",
              name(cudaHostAlloc(&pinned_by_0, bytes, cudaHostAllocPortable)));
  cudaMalloc(&on_0, bytes);
  cudaSetDevice(1);
  std::printf("pinned with device 1 current: %s\n",
              name(cudaHostAlloc(&pinned_by_1, bytes, cudaHostAllocPortable)));
  cudaMalloc(&on_1, bytes);

  auto device_0_work = [&](const char* when) {
    std::thread([&] {
      cudaSetDevice(0);
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      const cudaError_t a = cudaMemcpyAsync(on_0, pinned_by_0, bytes, cudaMemcpyHostToDevice, s);
      const cudaError_t a_done = cudaStreamSynchronize(s);
      const cudaError_t b = cudaMemcpyAsync(on_0, pinned_by_1, bytes, cudaMemcpyHostToDevice, s);
      const cudaError_t b_done = cudaStreamSynchronize(s);
      fill<<<(bytes / 4 + 255) / 256, 256, 0, s>>>(on_0, static_cast<int>(bytes / 4));
      const cudaError_t k = cudaGetLastError();
      const cudaError_t k_done = cudaStreamSynchronize(s);
      void* fresh = nullptr;
      const cudaError_t f = cudaHostAlloc(&fresh, bytes, cudaHostAllocPortable);
      cudaError_t c = cudaErrorUnknown, c_done = cudaErrorUnknown;
      if (f == cudaSuccess) {
        c = cudaMemcpyAsync(on_0, fresh, bytes, cudaMemcpyHostToDevice, s);
        c_done = cudaStreamSynchronize(s);
      }
      std::printf(
          "%s, on a thread that only used device 0:\n"
          "  copy from the block pinned by device 0: %s / %s\n"
          "  copy from the block pinned by device 1: %s / %s\n"
          "  a kernel: %s / %s\n"
          "  a new pinned block: %s, a copy from it: %s / %s\n",
          when, name(a), name(a_done), name(b), name(b_done), name(k), name(k_done), name(f),
          name(c), name(c_done));
    }).join();
  };
  device_0_work("before device 1's fault");

  cudaSetDevice(1);
  wild_write<<<1, 1>>>(on_1);
  std::printf("device 1 after its wild write: launch %s, synchronize %s\n",
              name(cudaGetLastError()), name(cudaDeviceSynchronize()));
  device_0_work("after device 1's fault");
  return 0;
}
