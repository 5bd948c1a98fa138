// Always-built view of the CUDA devices: the same API with or without CUDA.
#pragma once

namespace packpipe::cuda {

/// True if this build was compiled with CUDA (PACKPIPE_HAS_CUDA).
bool built_with_cuda();
/// Number of usable CUDA devices; 0 without CUDA, without a driver or without a device. Thread-safe.
int device_count();

}  // namespace packpipe::cuda
