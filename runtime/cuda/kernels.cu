// Device kernels of the CUDA replay: a spin of a given number of cycles, and the replay payload
// (the same words as runtime/replay.cpp's payload_word, computed on the device).
#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

namespace packpipe::runtime::cuda_kernels {

namespace {

__device__ std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void fill(std::uint8_t* p, std::uint64_t n, std::uint64_t key) {
  const std::uint64_t words = (n + 7) / 8;
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
    const std::uint64_t w = mix64(key + i * 0x9E3779B97F4A7C15ull);
    const std::uint64_t off = 8 * i;
    for (int b = 0; b < 8 && off + b < n; ++b) p[off + b] = static_cast<std::uint8_t>(w >> (8 * b));
  }
}

}  // namespace

cudaError_t launch_spin(long long cycles, cudaStream_t s) {
  spin<<<1, 1, 0, s>>>(cycles);
  return cudaGetLastError();
}

cudaError_t launch_fill(void* p, std::uint64_t n, std::uint64_t key, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>(((n + 7) / 8 + 255) / 256, 1024));
  fill<<<blocks, 256, 0, s>>>(static_cast<std::uint8_t*>(p), n, key);
  return cudaGetLastError();
}

}  // namespace packpipe::runtime::cuda_kernels
