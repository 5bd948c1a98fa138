// The CUDA single-device transport and replay: the ranks of a pipeline as CUDA streams of one
// device, messages moved by device-to-device copies ordered by events, compute replayed by spin
// kernels of the planned durations. A multi-stage plan runs on one GPU. The API is the same in
// every build: without CUDA (or without a device) constructing a group throws Unsupported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/handler.h"
#include "runtime/local.h"
#include "runtime/replay.h"
#include "runtime/transport.h"

namespace packpipe::runtime {

/// The shared state of one pipeline's ranks on one device. Thread-safe; outlives its transports.
class CudaGroup {
 public:
  /// `ranks` ranks on CUDA device `device`: a compute stream per rank, a copy stream per channel.
  /// Throws Unsupported when built without CUDA, Error when the device cannot be used.
  CudaGroup(std::uint32_t ranks, int device = 0);
  ~CudaGroup();
  CudaGroup(const CudaGroup&) = delete;
  CudaGroup& operator=(const CudaGroup&) = delete;
  /// The transport of `rank` (device buffers; control messages in host memory).
  std::unique_ptr<Transport> transport(std::uint32_t rank);
  /// The compute stream of `rank` (a cudaStream_t) for its stage handler.
  void* stream(std::uint32_t rank) const;
  int device() const;
  std::uint32_t ranks() const;
  void abort(const std::string& why) noexcept;
  std::string abort_reason() const;
  std::uint64_t messages() const;
  /// Spin-kernel cycles per millisecond on this device (measured once with events).
  double cycles_per_ms() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

/// A stage handler that replays on the group's device: device buffers (payload-capped), payloads
/// filled by a kernel and checked on receipt (copied back), each compute op a spin kernel of its
/// planned duration timed by CUDA events on the rank's stream.
std::unique_ptr<StageHandler> cuda_replay_handler(CudaGroup& group, std::uint32_t rank, ReplayOptions options);

/// Runs every rank of `plan` on device `device` (one host thread per rank driving its stream),
/// replaying it; as run_local. Throws Unsupported without CUDA.
LocalRun run_cuda_replay(const plan::Plan& plan, int device, const ReplayOptions& replay,
                         const ExecutorOptions& options = {});

}  // namespace packpipe::runtime
