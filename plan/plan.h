// A plan: what every pipeline rank executes in one training iteration. A header (stage-to-rank
// map, micro-batches with their samples, shapes, loss weights, recompute modes, memory figures)
// and one instruction stream per rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "common/layout.h"
#include "common/sample_ref.h"
#include "plan/instructions.h"
#include "plan/timeline.h"

namespace packpipe::plan {

/// Element type of a tensor. Values are part of the binary format.
enum class Dtype : std::uint8_t { F16 = 0, BF16 = 1, F32 = 2, I32 = 3, I64 = 4, F64 = 5 };
/// Whether activations and gradients may have the dtype (the floating ones).
constexpr bool is_float(Dtype d) { return d != Dtype::I32 && d != Dtype::I64; }
/// Bytes per element.
std::uint32_t dtype_size(Dtype d);
/// The one name table: "fp16", "bf16", "fp32", "int32", "int64", "fp64".
inline constexpr EnumName<Dtype> kDtypeNames[] = {
    {Dtype::F16, "fp16"}, {Dtype::BF16, "bf16"}, {Dtype::F32, "fp32"}, {Dtype::I32, "int32"}, {Dtype::I64, "int64"}, {Dtype::F64, "fp64"}};
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
  /// (task, index, offset) per sample when known, else empty. offset > 0 (format 4, decoder-only
  /// plans): the sample is a chunk of a dataset sample split at the context length, its tokens
  /// [offset, offset + lengths[i]) of the dataset sample's input then target tokens.
  std::vector<SampleRef> refs;
  std::vector<std::uint32_t> row_offsets;  ///< packed rows (CSR into samples); empty: one row per sample
  /// How the samples are laid out (common/layout.h; format 3, older plans: packed-mask when
  /// row_offsets are given, else padded): Padded, one sample a row and no row_offsets; Packed, one
  /// row of every sample back to back, padded_len (padded_dec_len) its tokens, attended apart by
  /// varlen attention; PackedMask, rows under a block mask.
  Layout layout = Layout::Padded;
  std::uint32_t rows = 0;
  std::uint32_t padded_len = 0;      ///< encoder (or whole-sample) tokens per row
  std::uint32_t padded_dec_len = 0;  ///< decoder tokens per row (encoder-decoder), else 0
  std::uint64_t tokens = 0;          ///< real tokens, input plus target
  /// Plan::loss_tokens / Plan::global_loss_tokens when the plan counts loss tokens (format 2),
  /// else tokens / Plan::global_tokens (not 1 / micro-batches).
  double loss_weight = 0;
  /// Per sample, in `samples` order (format 2; empty in older plans): the tokens the sample
  /// occupies in its row (decoder-only: the first lengths[i] tokens of input followed by target, so
  /// a truncated sample keeps its first tokens; a chunk, lengths[i] tokens from refs[i].offset on;
  /// encoder-decoder: the first lengths[i] input tokens,
  /// an empty input planned as one pad token) and, for encoder-decoder models, its decoder tokens
  /// (the first target_lengths[i] targets; an empty target counts one token, as planned). Row r
  /// holds samples row_offsets[r] .. row_offsets[r + 1] - 1 back to back from position 0.
  std::vector<std::uint32_t> lengths, target_lengths;
  /// Tokens of this micro-batch that carry loss (Plan::loss_mode; format 2, else 0): its labels
  /// (decoder-only) or decoder labels (encoder-decoder) other than ignore_index.
  std::uint64_t loss_tokens = 0;
  /// Slices (format 6; docs/design/015-long-context.md), per sample in `samples` order, or both
  /// empty when the micro-batch holds no slice after a first one. prefix[i]: tokens of the same
  /// sample before this entry that it attends to (their keys and values kept from earlier
  /// micro-batches; positions continue from it); 0 for a whole sample, a chunk or a first slice.
  /// prev[i]: the micro-batch holding the previous slice of the sample (kNoSlice for none). Whether
  /// an entry continues in a later micro-batch follows from the links (slice_next).
  std::vector<std::uint32_t> prefix, prev;
  /// Whether any entry is a slice after a first one (prefix and prev are filled).
  bool has_slices() const { return !prev.empty(); }
  /// prefix[i], or 0 without slices.
  std::uint32_t prefix_of(std::size_t i) const { return prefix.empty() ? 0 : prefix[i]; }
  bool operator==(const PlanMicroBatch& o) const;
};

/// No previous slice (PlanMicroBatch::prev).
inline constexpr std::uint32_t kNoSlice = 0xFFFFFFFFu;

/// Which tokens carry loss. Values are part of the binary format.
enum class LossMode : std::uint8_t {
  /// Every next-token prediction inside a sample: labels are the inputs shifted left, the last
  /// position of each sample and padding are ignore_index (decoder-only: n - 1 per sample;
  /// encoder-decoder: every real decoder target token).
  AllTokens = 0,
  /// Target tokens only: decoder-only samples predict only their target part (the positions whose
  /// next token is a target token); encoder-decoder: every real target token.
  Targets = 1,
};
/// The one name table: "all", "targets".
inline constexpr EnumName<LossMode> kLossModeNames[] = {{LossMode::AllTokens, "all"}, {LossMode::Targets, "targets"}};
constexpr const char* loss_mode_name(LossMode m) { return enum_name(kLossModeNames, m); }
inline LossMode loss_mode_from_name(const std::string& name) { return enum_from_name(kLossModeNames, name, "loss mode"); }

/// The tensors a stage's LOAD_MB brings, as bits of StageSpec::loads. Every one is int64 of shape
/// [rows, padded length] (decoder tensors: [rows, padded decoder length]); packed rows carry several
/// samples, whose boundaries (cu_seqlens, segment ids) follow from PlanMicroBatch::lengths. The
/// token rule (planner/loader.h assembles it): a decoder-only sample is its input then its target
/// tokens, the first lengths[i] kept; padding is pad_id in inputs and ignore_index in labels.
enum LoadTensor : std::uint8_t {
  kLoadInputIds = 1,         ///< token ids of the encoder (or whole-sample) side; an empty encoder input is one pad_id
  kLoadPositionIds = 2,      ///< position within the sample, restarting at each packed sample, 0 on padding
                             ///< (encoder side in encoder-decoder plans)
  /// next-token labels (decoder-only): label[p] = the sample's token p + 1, ignore_index at each
  /// sample's last position and padding; LossMode::Targets also where the next token is an input token
  kLoadLabels = 4,
  /// decoder inputs: [decoder_start_id, target[0], ..., target[t - 2]] for t = target_lengths[i]
  kLoadDecoderInputIds = 8,
  /// decoder labels: target[0 .. t - 1], ignore_index at padding and for an empty target's one token
  kLoadDecoderLabels = 16,
};
/// "input_ids", "position_ids", "labels", "decoder_input_ids", "decoder_labels".
inline constexpr EnumName<LoadTensor> kLoadTensorNames[] = {{kLoadInputIds, "input_ids"},
                                                            {kLoadPositionIds, "position_ids"},
                                                            {kLoadLabels, "labels"},
                                                            {kLoadDecoderInputIds, "decoder_input_ids"},
                                                            {kLoadDecoderLabels, "decoder_labels"}};

/// What a virtual stage holds (format 2): its layers, whether it holds the token embedding and the
/// LM head with the loss, and what its LOAD_MB brings. Layers are numbered per side: a decoder-only
/// model's layers 0 .. L-1; an encoder-decoder model's encoder layers 0 .. E-1 and decoder layers
/// 0 .. D-1. On decoder stages of an encoder-decoder model the boundary tensor (activation and
/// gradient) is rows x (seq + enc_seq) x hidden: the decoder's hidden states [rows, seq, hidden]
/// followed along the sequence by the encoder's output [rows, enc_seq, hidden].
struct StageSpec {
  std::uint32_t encoder_begin = 0, encoder_layers = 0;  ///< encoder (or decoder-only) layers [begin, begin + count)
  std::uint32_t decoder_begin = 0, decoder_layers = 0;  ///< decoder layers of an encoder-decoder model
  bool embedding = false;  ///< holds the token embedding (the first stage of each side that embeds)
  bool head = false;       ///< holds the LM head and the loss (the last stage)
  std::uint8_t loads = 0;  ///< LoadTensor bits its LOAD_MB brings (0: it loads nothing)
  bool operator==(const StageSpec& o) const {
    return encoder_begin == o.encoder_begin && encoder_layers == o.encoder_layers && decoder_begin == o.decoder_begin &&
           decoder_layers == o.decoder_layers && embedding == o.embedding && head == o.head && loads == o.loads;
  }
  bool operator!=(const StageSpec& o) const { return !(*this == o); }
};

/// The op kind of a compute opcode (FWD, BWD, BWD_I, BWD_W); is_compute(op) must hold.
constexpr OpKind compute_kind(Opcode op) {
  return op == Opcode::Forward          ? OpKind::Forward
         : op == Opcode::Backward       ? OpKind::Backward
         : op == Opcode::BackwardInput  ? OpKind::BackwardInput
                                        : OpKind::BackwardWeight;
}

/// One task of the dataset a plan's sample refs index, as a plan file records it.
struct DatasetTask {
  std::string name;
  std::uint64_t samples = 0;  ///< the task's sample count (its refs' indexes are below it)
  bool operator==(const DatasetTask& o) const { return name == o.name && samples == o.samples; }
};

/// The dataset a plan's sample refs index: what every loader checks before it loads tokens
/// (planner::check_dataset). The fingerprint is the dataset's own identity
/// (dataloader::MultiTaskDataset::fingerprint: its tasks in order, files, counts, sampled lengths,
/// weights and split); the tasks say what differs when another dataset is given. A plan (format 5)
/// stores the fingerprint, a plan file (format 3) the fingerprint and the tasks, once.
struct DatasetIdentity {
  std::uint64_t fingerprint = 0;  ///< 0: unknown (an older plan, or refs given without their dataset)
  /// The tasks in task order, shared by every plan of an epoch; null: not recorded.
  std::shared_ptr<const std::vector<DatasetTask>> tasks;
  bool known() const { return fingerprint != 0; }
  /// The recorded tasks; empty when none are recorded.
  const std::vector<DatasetTask>& task_list() const;
};

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

  // ---- what a trainer needs (format 2; older plans have none: stages empty) ----
  /// [V]: each virtual stage's layers, embedding and head, and loads (empty: a format-1 plan).
  std::vector<StageSpec> stages;
  Dtype dtype = Dtype::BF16;               ///< activations and gradients between stages
  LossMode loss_mode = LossMode::AllTokens;
  std::uint64_t global_loss_tokens = 0;    ///< loss tokens of the global batch over all replicas
  /// The token embedding and the LM head share one weight: REDUCE_TIED sums its gradient between
  /// the ranks of the first and the last stage.
  bool tied_embedding = false;
  /// Where the pipeline's ranks sit among all ranks: world rank = replica x ranks + rank (the only
  /// layout, 0); REDUCE_GRAD of a stage sums over the world ranks {k x ranks + r : k < dp} of its
  /// rank r, REDUCE_TIED over {replica x ranks + r_first, replica x ranks + r_last}.
  std::uint8_t rank_layout = 0;
  /// The context length planned for (format 4; 0: none or an older plan): every lengths[i] is at
  /// most max_seq_len, so a model with max_seq_len positions never indexes past its table (position
  /// ids restart at 0 for each sample and chunk).
  std::uint32_t max_seq_len = 0;
  /// Encoder-decoder plans: the decoder side's limit (format 4; 0: none): every target_lengths[i]
  /// is at most it. 0 in decoder-only plans.
  std::uint32_t max_target_len = 0;
  /// The dataset its sample refs index (format 5; unknown in older plans and in plans without refs
  /// or whose refs came without their dataset). Plans compare equal by its fingerprint.
  DatasetIdentity dataset;

  std::size_t microbatch_count() const { return microbatches.size(); }
  /// Whether any micro-batch holds a slice after a first one (format 6).
  bool has_slices() const;
  /// Index of (mb, v) in the per-(micro-batch, stage) tables.
  std::size_t at(std::size_t mb, std::size_t v) const { return mb * vstages + v; }
  /// Total instructions over all ranks.
  std::size_t instruction_count() const;
  /// The world rank of pipeline rank `rank` of replica `replica` (rank_layout 0).
  std::uint32_t world_rank(std::uint32_t replica, std::uint32_t rank) const { return replica * ranks + rank; }
  /// True for a plan with the trainer's tables (format 2).
  bool has_stage_specs() const { return !stages.empty(); }
  bool operator==(const Plan& o) const;
  bool operator!=(const Plan& o) const { return !(*this == o); }
};

/// One entry of a micro-batch: (micro-batch, index in its samples).
struct EntryRef {
  std::uint32_t mb = kNoSlice;
  std::uint32_t entry = kNoSlice;
  bool valid() const { return mb != kNoSlice; }
};
/// The slice links of a plan resolved to entries, per micro-batch and entry (empty per micro-batch
/// without samples): `prev` the entry of the previous slice, `next` the entry of the next one
/// (invalid: none). An entry's previous slice is the entry of micro-batch prev[i] with the same
/// sample id (the first such); a link that names no such entry stays invalid (the validator reports
/// it). O(entries).
struct SliceLinks {
  std::vector<std::vector<EntryRef>> prev, next;
  /// Whether entry (mb, i) continues in a later micro-batch: its last token's label is the next token.
  bool continues(std::size_t mb, std::size_t i) const { return next[mb][i].valid(); }
};
SliceLinks slice_links(const Plan& plan);

}  // namespace packpipe::plan
