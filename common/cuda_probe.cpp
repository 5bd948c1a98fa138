#include "common/cuda_probe.h"

#include "common/config.h"

#if PACKPIPE_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace packpipe::cuda {

bool built_with_cuda() { return PACKPIPE_HAS_CUDA != 0; }

int device_count() {
#if PACKPIPE_HAS_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

}  // namespace packpipe::cuda
