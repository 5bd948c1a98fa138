// Internal: the one status-to-exception macro of the CUDA runtime API (only with CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include "common/errors.h"

/// Evaluates a cudaError_t expression once; throws packpipe::Error naming the call and CUDA's error.
#define PACKPIPE_CHECK_CUDA(expr)                                                                   \
  do {                                                                                              \
    const cudaError_t packpipe_cuda_status_ = (expr);                                               \
    if (packpipe_cuda_status_ != cudaSuccess) {                                                     \
      PACKPIPE_THROW(::packpipe::Error, "{} failed: {} ({})", #expr,                                \
                     cudaGetErrorString(packpipe_cuda_status_), cudaGetErrorName(packpipe_cuda_status_)); \
    }                                                                                               \
  } while (0)
