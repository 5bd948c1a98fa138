// Timelines: the compute operations of one iteration per pipeline rank, in execution order, with
// start and end times. A schedule's simulation produces one (planned), the runtime records one
// (measured); plans keep the planned one, and traces draw either.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/enum_names.h"

namespace packpipe::plan {

/// Compute operations a schedule orders.
enum class OpKind : std::uint8_t {
  Forward,
  Backward,        ///< full backward (input and weight gradients)
  BackwardInput,   ///< input gradients only (zero-bubble schedules)
  BackwardWeight,  ///< weight gradients only, after BackwardInput of the same (mb, stage)
};
/// The one token table: "F", "B", "I", "W" (PyTorch's action tokens).
inline constexpr EnumName<OpKind> kOpKindTokens[] = {
    {OpKind::Forward, "F"}, {OpKind::Backward, "B"}, {OpKind::BackwardInput, "I"}, {OpKind::BackwardWeight, "W"}};
/// The kind's token in kOpKindTokens.
constexpr const char* op_kind_token(OpKind k) { return enum_name(kOpKindTokens, k); }
/// The kind of a token; throws InvalidArgument listing the tokens.
inline OpKind op_kind_from_token(std::string_view token) { return enum_from_name(kOpKindTokens, token, "op kind"); }

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
