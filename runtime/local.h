// Running every rank of a plan in this process: one thread per pipeline rank, each with its own
// executor, stage handler and in-process transport. The CLI's threads transport, the tests and the
// benchmarks use it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "plan/plan.h"
#include "runtime/executor.h"
#include "runtime/inprocess.h"

namespace packpipe::runtime {

/// Makes the stage handler of one rank (called on that rank's thread).
using HandlerFactory = std::function<std::unique_ptr<StageHandler>(std::uint32_t rank)>;
/// Makes the transport of one rank from the pipeline's in-process group (default: the group's);
/// tests wrap it to inject faults.
using TransportFactory = std::function<std::unique_ptr<Transport>(InProcessGroup& group, std::uint32_t rank)>;

/// What running one plan on threads gave.
struct LocalRun {
  std::vector<RankRecord> records;  ///< per rank
  std::uint64_t messages = 0;       ///< messages the transport completed
};

/// Runs every rank of `plan` on its own thread and joins them. All ranks share one clock epoch.
/// Throws packpipe::Error when any rank failed, listing every rank's error (the first failure
/// first); never hangs when the executor options have a timeout. With `copy`, the ranks exchange
/// Opaque buffers through it (InProcessGroup(ranks, copy)); otherwise host buffers.
LocalRun run_local(const plan::Plan& plan, const HandlerFactory& handlers, const ExecutorOptions& options = {},
                   const TransportFactory& transports = {}, const CopyFn& copy = {});

/// Runs the plans of one iteration's data-parallel replicas at once (`plans[k]` is replica k),
/// each replica a pipeline of threads; returns each replica's run. Throws as run_local.
std::vector<LocalRun> run_local_replicas(const std::vector<plan::Plan>& plans, const HandlerFactory& handlers,
                                         const ExecutorOptions& options = {});

}  // namespace packpipe::runtime
