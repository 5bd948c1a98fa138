// The NCCL transport: one process per GPU. Every channel (this rank -> peer, or peer -> this rank,
// per kind) has its own two-rank communicator split from the pipeline's and its own CUDA stream,
// so the per-channel order the validator checked is the order on the wire and a send never waits
// behind another channel's. The pipeline communicator comes from a unique id exchanged through a
// file (rank 0 writes it atomically) or from a communicator the trainer already owns. Waits poll
// the request's CUDA event and NCCL's asynchronous error with a deadline; an abort writes a file
// beside the id file that every rank's waits see, and aborts the communicators. Without NCCL the
// same API throws Unsupported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/transport.h"

namespace packpipe::runtime {

struct NcclOptions {
  int device = 0;            ///< this process's CUDA device
  double timeout_s = 300;    ///< communicator creation and the id file wait (0: forever)
  /// Where rank 0 writes the unique id (and where an abort is signalled, at <id_file>.abort). Use a
  /// fresh path per job (e.g. with the job's id): another rank could read a previous job's id.
  std::string id_file;
};

/// Creates the NCCL transport of `rank` of `ranks` from the id file in options (rank 0 creates the
/// id and writes it; the others wait for it up to the timeout). Throws Unsupported without NCCL,
/// Error (naming the rank and what failed) when the communicators cannot be made.
std::unique_ptr<Transport> nccl_transport(std::uint32_t rank, std::uint32_t ranks, const NcclOptions& options);

/// The NCCL transport over a communicator the trainer owns (an ncclComm_t of the pipeline's ranks,
/// on `device`); channels are split from it (collectively: every rank calls this in the same
/// order). The trainer keeps ownership of `comm`. `abort_file` (optional) is the shared abort signal.
std::unique_ptr<Transport> nccl_transport_from_comm(void* comm, int device, const std::string& abort_file = {});

/// The file beside `id_file` through which any rank signals an abort to the others (written and
/// removed by the transport; never name an input there).
std::string nccl_abort_file(const std::string& id_file);

/// True when this build has NCCL.
bool built_with_nccl();

}  // namespace packpipe::runtime
