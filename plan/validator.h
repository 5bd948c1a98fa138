// The plan validator: checks any plan (built here, or read from a file) without running it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace packpipe::plan {

/// One problem found in a plan.
struct Violation {
  std::string kind;            ///< "header", "field", "count", "order", "dataflow", "channel", "buffer", "deadlock", "memory"
  std::int64_t rank = -1;      ///< -1: the header
  std::int64_t index = -1;     ///< instruction index in the rank's stream, -1: none
  std::string message;         ///< what was expected versus what was found
};
/// "rank 2, instruction 17 (FWD mb=3 stage=2 ...): [dataflow] ..." (one line).
std::string to_string(const Violation& v, const Plan* plan = nullptr);

struct ValidateOptions {
  /// Count live communication buffers (shape bytes) towards the memory limit, on top of static
  /// memory, stored activations and the running op's transient peak (the simulator's model).
  bool count_buffers = false;
  /// Stop after this many violations (0: no limit).
  std::size_t max_violations = 1000;
};

/// What the validator measured besides the violations.
struct ValidationReport {
  std::vector<Violation> violations;
  std::vector<std::uint64_t> peak_bytes;         ///< per rank: static + stored + running op's peak
  std::vector<std::uint64_t> peak_buffer_bytes;  ///< per rank: live communication buffers at most
  std::vector<std::uint32_t> peak_buffers;       ///< per rank: live buffer slots at most
  bool ok() const { return violations.empty(); }
};

/// Checks `plan`:
///  1. header: sizes of the tables, the stage-to-rank map (every rank runs a stage), loss weights;
///  2. fields: every instruction's micro-batch, stage (run by this rank), peer, buffer slot and
///     shape in range;
///  3. counts (PyTorch's rules): per (mb, stage) exactly one forward and either one backward or one
///     input- and one weight-gradient half; ReduceGrad once per stage after its last backward;
///     OptStep at most once, after everything it depends on;
///  4. channels: per (sender, receiver, activation | gradient), the i-th send start and the i-th
///     receive start name the same micro-batch, adjacent stages and an identical shape;
///  5. deadlock and order: every rank executes its stream; RecvWait blocks until the matching send
///     was posted, SendWait until the matching receive was posted (a rendezvous, the stricter NCCL
///     model); everything else proceeds. Compute reads only buffers holding the right data
///     (activation of (mb, v - 1), gradient of (mb, v + 1), loaded inputs) after their wait, so
///     forward and backward dependencies hold. Ranks stuck forever are reported with the wait
///     they block on;
///  6. buffers: allocated into a free slot, used only while live, freed once, not freed while a send
///     from it is pending, none live at the end;
///  7. memory: static + stored activations in flight + the running op's peak (+ buffers if asked)
///     within memory_limit_bytes (when > 0).
/// Never throws on a malformed plan (every index is checked); deterministic.
ValidationReport validate(const Plan& plan, const ValidateOptions& options = {});
/// Checks the plans of one iteration's data-parallel replicas against each other (`replicas[k]` is
/// replica k, as a plan file holds them): one iteration, replicas 0 .. dp - 1 all present, one
/// pipeline (ranks, stages, stage map), one global batch (global tokens, the replicas' tokens
/// summing to it), and every sample (by global-batch id and by dataset reference) in one replica
/// only. Violations (kind "replicas") name the replica as `rank` (-1: the iteration). Never throws.
std::vector<Violation> validate_replicas(const std::vector<Plan>& replicas);
/// validate(plan); throws packpipe::Error listing the first violations if any.
void validate_or_throw(const Plan& plan, const ValidateOptions& options = {});

}  // namespace packpipe::plan
