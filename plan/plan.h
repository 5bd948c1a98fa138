// A plan: what every pipeline rank executes in one training iteration. A header (stage-to-rank
// map, micro-batches with their samples, shapes, loss weights, recompute modes, memory figures)
// and one instruction stream per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "common/sample_ref.h"
#include "plan/instructions.h"
#include "plan/timeline.h"

namespace packpipe::plan {

/// Element type of a tensor. Values are part of the binary format.
enum class Dtype : std::uint8_t { F16 = 0, BF16 = 1, F32 = 2, I32 = 3, I64 = 4 };
/// Bytes per element.
std::uint32_t dtype_size(Dtype d);
/// The one name table: "fp16", "bf16", "fp32", "int32", "int64".
inline constexpr EnumName<Dtype> kDtypeNames[] = {
    {Dtype::F16, "fp16"}, {Dtype::BF16, "bf16"}, {Dtype::F32, "fp32"}, {Dtype::I32, "int32"}, {Dtype::I64, "int64"}};
/// The dtype's name in kDtypeNames.
constexpr const char* dtype_name(Dtype d) { return enum_name(kDtypeNames, d); }
/// Dtype from its name; throws InvalidArgument listing the names.
inline Dtype dtype_from_name(const std::string& name) { return enum_from_name(kDtypeNames, name, "dtype"); }

/// What crosses a stage boundary (or is loaded): a tensor rows x seq x hidden, plus, when enc_seq
/// > 0, the encoder output rows x enc_seq x hidden (decoder stages of encoder-decoder models).
struct TensorShape {
  std::uint32_t rows = 0;
  std::uint32_t seq = 0;
  std::uint32_t hidden = 0;
  std::uint32_t enc_seq = 0;
  Dtype dtype = Dtype::BF16;
  /// rows x (seq + enc_seq) x hidden x dtype size.
  std::uint64_t bytes() const;
  bool operator==(const TensorShape& o) const {
    return rows == o.rows && seq == o.seq && hidden == o.hidden && enc_seq == o.enc_seq && dtype == o.dtype;
  }
  bool operator!=(const TensorShape& o) const { return !(*this == o); }
  bool operator<(const TensorShape& o) const;
};
/// "4x512x4096 bf16 (+ enc 4x1024)".
std::string to_string(const TensorShape& s);

/// A sample of a multi-task dataset: (task, index in the task), as the sampler names it.
using ::packpipe::SampleRef;

/// One micro-batch as the trainer needs it.
struct PlanMicroBatch {
  std::vector<std::uint32_t> samples;      ///< ids into the global batch, in row order
  std::vector<SampleRef> refs;             ///< (task, index) per sample when known, else empty
  std::vector<std::uint32_t> row_offsets;  ///< packed rows (CSR into samples); empty: one row per sample
  std::uint32_t rows = 0;
  std::uint32_t padded_len = 0;      ///< encoder (or whole-sample) tokens per row
  std::uint32_t padded_dec_len = 0;  ///< decoder tokens per row (encoder-decoder), else 0
  std::uint64_t tokens = 0;          ///< real tokens, input plus target
  double loss_weight = 0;            ///< tokens / Plan::global_tokens (not 1 / micro-batches)
  bool operator==(const PlanMicroBatch& o) const;
};

/// The op kind of a compute opcode (FWD, BWD, BWD_I, BWD_W); is_compute(op) must hold.
constexpr OpKind compute_kind(Opcode op) {
  return op == Opcode::Forward          ? OpKind::Forward
         : op == Opcode::Backward       ? OpKind::Backward
         : op == Opcode::BackwardInput  ? OpKind::BackwardInput
                                        : OpKind::BackwardWeight;
}

/// One iteration's plan.
struct Plan {
  std::uint64_t iteration = 0;
  std::uint32_t ranks = 0;                ///< pipeline ranks S
  std::uint32_t vstages = 0;              ///< virtual stages V = S x chunks
  std::vector<std::uint32_t> stage_rank;  ///< [V]: rank running each virtual stage
  std::uint32_t dp = 1;                   ///< data-parallel replicas (ReduceGrad's group size)
  std::uint32_t replica = 0;              ///< which data-parallel replica runs this plan (0 .. dp - 1)
  std::string schedule;                   ///< schedule name ("1f1b", "zero-bubble", ...)
  std::uint64_t global_tokens = 0;        ///< tokens of the global batch over all dp replicas (loss weights' denominator)
  std::vector<PlanMicroBatch> microbatches;
  std::vector<std::uint8_t> recompute;       ///< [mb x V + v]: costmodel::Recompute
  std::vector<std::uint64_t> stored_bytes;   ///< [mb x V + v]: activations kept from forward to backward
  std::vector<std::uint64_t> peak_bytes;     ///< [mb x V + v]: transient peak while the op runs
  std::vector<std::uint64_t> static_bytes;   ///< [ranks]: parameters, gradients, optimizer state
  std::uint64_t memory_limit_bytes = 0;      ///< per rank; 0: unchecked
  std::vector<TensorShape> shapes;           ///< shape table referenced by Instruction::shape
  std::vector<std::uint32_t> buffer_slots;   ///< [ranks]: buffer slots each stream uses
  std::vector<std::vector<Instruction>> streams;  ///< [ranks]
  double makespan_ms = 0;                          ///< simulated (0 when unknown)
  std::vector<std::vector<ScheduledOp>> timeline;  ///< [ranks] simulated compute ops (optional; for traces)

  std::size_t microbatch_count() const { return microbatches.size(); }
  /// Index of (mb, v) in the per-(micro-batch, stage) tables.
  std::size_t at(std::size_t mb, std::size_t v) const { return mb * vstages + v; }
  /// Total instructions over all ranks.
  std::size_t instruction_count() const;
  bool operator==(const Plan& o) const;
  bool operator!=(const Plan& o) const { return !(*this == o); }
};

}  // namespace packpipe::plan
