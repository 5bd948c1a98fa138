// Timelines: the compute operations of one iteration per pipeline rank, in execution order, with
// start and end times. A schedule's simulation produces one (planned), the runtime records one
// (measured); plans keep the planned one, and traces draw either.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace packpipe::plan {

/// Compute operations a schedule orders.
enum class OpKind : std::uint8_t {
  Forward,
  Backward,        ///< full backward (input and weight gradients)
  BackwardInput,   ///< input gradients only (zero-bubble schedules)
  BackwardWeight,  ///< weight gradients only, after BackwardInput of the same (mb, stage)
};
/// "F", "B", "I", "W" (PyTorch's action tokens).
const char* op_kind_token(OpKind k);

/// One compute operation of a rank, with its simulated start and end.
struct ScheduledOp {
  OpKind kind = OpKind::Forward;
  std::uint32_t mb = 0;
  std::uint32_t vstage = 0;
  double start_ms = 0;
  double end_ms = 0;
};

/// Per-rank ordered operations of one iteration and what the simulator measured.
struct Schedule {
  std::string name;  ///< "gpipe", "1f1b", "interleaved-1f1b", "cyclic", "wait-free-cyclic", "zero-bubble"
  std::int64_t ranks = 0;
  std::int64_t vstages = 0;
  std::int64_t microbatches = 0;
  std::vector<std::vector<ScheduledOp>> ops;  ///< ops[rank], in execution order
  std::vector<std::uint32_t> order;           ///< micro-batch order used (a permutation)
  double makespan_ms = 0;
  double bubble_fraction = 0;                 ///< idle compute time / (ranks x makespan)
  std::vector<double> peak_bytes;             ///< per rank, static + activations
  std::vector<double> utilization;            ///< per rank, busy / makespan
};

}  // namespace packpipe::plan
