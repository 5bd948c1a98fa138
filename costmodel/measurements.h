// Measured op durations of executed iterations: what calibration (costmodel/calibration.h) fits
// and `packpipe costmodel validate --measured` checks. In memory a MeasurementSet; on disk the
// "packpipe-measurements" format v1, JSON Lines (docs/design/013-calibration.md):
//
//   {"format":"packpipe-measurements","version":1,"model":"gpt-6.7b","device":"A100-40GB","source":"..."}
//   {"op":"F","encoder_layers":4,"decoder_layers":0,"embedding":true,"postprocess":false,"tp":1,
//    "rows":2,"seq":512,"dec_seq":0,"recompute":"none","bytes":0,"ms":12.5,"iteration":0,
//    (varlen rows add "attention":[self, dec_self, cross], the sums of costmodel::AttentionWork)
//    "replica":0,"rank":0,"stage":0,"mb":3,"index":17,"start_ms":40.1,"peer":-1}
//   {"op":"iteration","iteration":0,"replica":0,"measured_ms":812.0,"predicted_ms":790.5,"schedule":"1f1b"}
//   ("schedule", the plan's kind, may be absent: unknown)
//
// planner/measure.h makes them from a plan and the executor's records.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/enum_names.h"
#include "common/schedule_kind.h"
#include "costmodel/cost_model.h"

namespace packpipe::costmodel {

/// What was measured: a compute op of a stage (forward, full backward, its input- and
/// weight-gradient halves) or one end of a stage-boundary transfer.
enum class MeasuredOp : std::uint8_t { Forward, Backward, BackwardInput, BackwardWeight, Send, Recv };
/// The one name table: "F", "B", "I", "W" (the op kinds' tokens), "send", "recv".
inline constexpr EnumName<MeasuredOp> kMeasuredOpNames[] = {
    {MeasuredOp::Forward, "F"},       {MeasuredOp::Backward, "B"}, {MeasuredOp::BackwardInput, "I"},
    {MeasuredOp::BackwardWeight, "W"}, {MeasuredOp::Send, "send"}, {MeasuredOp::Recv, "recv"}};
/// The op's name in kMeasuredOpNames.
constexpr const char* measured_op_name(MeasuredOp op) { return enum_name(kMeasuredOpNames, op); }
/// MeasuredOp from its name; throws InvalidArgument listing the names.
inline MeasuredOp measured_op_from_name(std::string_view name) {
  return enum_from_name(kMeasuredOpNames, name, "measured op");
}
/// True for F, B, I and W.
constexpr bool is_compute(MeasuredOp op) { return op != MeasuredOp::Send && op != MeasuredOp::Recv; }

/// One measured op: the shape the cost model is asked about, the measured duration and where it
/// was measured.
struct Measurement {
  MeasuredOp op = MeasuredOp::Forward;
  StageLayout layout;            ///< the stage's layers (transfers: the sending or receiving stage's)
  std::int64_t tp = 1;
  std::int64_t rows = 1;         ///< micro-batch rows (mbs)
  std::int64_t seq = 1;          ///< padded tokens per row (encoder side of encoder-decoder models)
  std::int64_t dec_seq = 0;      ///< padded decoder tokens per row (encoder-decoder), else 0
  AttentionWork attention;       ///< varlen rows' attention sums (none: dense rows); file field "attention"
  Recompute recompute = Recompute::None;
  std::uint64_t bytes = 0;       ///< transfers: bytes moved (the plan's shape); compute ops: 0
  double ms = 0;                 ///< measured duration
  // provenance
  std::uint64_t iteration = 0;
  std::uint32_t replica = 0;
  std::uint32_t rank = 0;
  std::uint32_t stage = 0;       ///< virtual stage of the instruction
  std::uint32_t mb = 0;
  std::uint64_t index = 0;       ///< instruction index in its rank's stream
  double start_ms = 0;           ///< start, ms after the iteration's first instruction started
  std::int64_t peer = -1;        ///< transfers: the other rank; compute ops: -1
  /// rows x (seq + dec_seq).
  double tokens() const { return static_cast<double>(rows) * static_cast<double>(seq + dec_seq); }
  /// The micro-batch shape the cost model is asked about.
  MicroShape shape() const { return MicroShape{rows, seq, dec_seq, attention}; }
};

/// One iteration of one data-parallel replica: measured makespan (first start to last end over
/// its ranks) beside the plan's simulated one.
struct IterationMeasurement {
  std::uint64_t iteration = 0;
  std::uint32_t replica = 0;
  double measured_ms = 0;
  double predicted_ms = 0;  ///< the plan's makespan_ms (0: unknown)
  std::string schedule;     ///< the plan's schedule kind (kScheduleKindNames; empty: unknown)
};

/// What a measurement file says about itself (free text; empty when unknown).
struct MeasurementHeader {
  std::string model;   ///< the model the plans were made for
  std::string device;  ///< where they ran
  std::string source;  ///< how they were measured ("packpipe run --replay ...", a trainer)
};

/// The contents of one or more measurement files.
struct MeasurementSet {
  MeasurementHeader header;
  std::vector<Measurement> ops;
  std::vector<IterationMeasurement> iterations;
  /// Appends `other`'s ops and iterations (the header stays this one's).
  void append(const MeasurementSet& other);
};

/// Largest sizes a measurement may name (far above real shapes; the cost model has its own limits).
inline constexpr std::int64_t kMaxMeasuredSize = std::int64_t{1} << 31;
/// Durations a measurement may have: at least the clock's resolution (1 ns; transfers may be 0, a
/// wait that had nothing left to wait for) and at most 1e9 ms (11.6 days).
inline constexpr double kMinMeasuredMs = 1e-6;
inline constexpr double kMaxMeasuredMs = 1e9;

/// Throws InvalidArgument, prefixed by `where` (e.g. "measurements.jsonl line 7"), naming the
/// field and expected versus found, for a measurement that cannot be fitted: a non-finite or
/// negative duration, one above kMaxMeasuredMs or positive below kMinMeasuredMs (compute ops: not
/// at least kMinMeasuredMs), rows or seq below 1, a negative dec_seq or layer
/// count, tp below 1, a stage with no layers, a transfer of 0 bytes or without a peer (or to
/// itself), a compute op with bytes, or a size above kMaxMeasuredSize.
void check_measurement(const Measurement& m, std::string_view where);

/// How errors name measurement `i` of a list: "measurement 3 (F, iteration 0, replica 0, rank 1,
/// instruction 17)".
std::string describe_measurement(const Measurement& m, std::size_t i);

/// Throws InvalidArgument, prefixed by `where`, for an iteration line that cannot be used: an
/// iteration above 2^63 - 1, or a measured or predicted makespan that is neither 0 (unknown) nor in
/// [kMinMeasuredMs, kMaxMeasuredMs].
void check_iteration_measurement(const IterationMeasurement& it, std::string_view where);

/// Parses the "packpipe-measurements" v1 JSON Lines `text` read from `what` (a file name). Blank
/// lines are skipped; the first line must be the header. Throws Error naming `what`, the line and
/// the field with expected versus found for malformed JSON, a missing, unknown or mistyped field,
/// an unknown op or recompute mode, another format or version, and every check_measurement failure.
MeasurementSet parse_measurements(std::string_view text, const std::string& what);
/// parse_measurements of a regular file (common/file_io.h); throws Error naming the path.
MeasurementSet read_measurements(const std::string& path);
/// The file form of `set`: the header, one line per op, one per iteration. Deterministic.
std::string measurements_to_jsonl(const MeasurementSet& set);
/// Writes measurements_to_jsonl(set) to `path` atomically (common/file_io.h).
void write_measurements(const std::string& path, const MeasurementSet& set);

/// One line of the file form (for writers that stream).
std::string measurement_line(const Measurement& m);
std::string iteration_line(const IterationMeasurement& it);

}  // namespace packpipe::costmodel
