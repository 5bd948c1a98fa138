// The partitioner's types that the layers above share: the pipeline shape, its virtual stages,
// a global batch's lengths and micro-batches. (Per-stage costs: schedule/stage_costs.h; scheduled
// operations: plan/timeline.h.)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/layout.h"
#include "costmodel/cost_model.h"

namespace packpipe::partition {

namespace cm = ::packpipe::costmodel;
using ::packpipe::Layout;

/// Largest stages, chunks, dp and tp accepted (each): far above any real job, small enough that the
/// sizes derived from them (per-rank tables, GPU counts) neither overflow nor exhaust memory.
constexpr std::int64_t kMaxPipelineSize = std::int64_t{1} << 16;
/// Largest memory limit accepted, MB (1 PB per device): keeps every byte count an exact integer.
constexpr double kMaxMemoryLimitMb = 1e9;
/// Largest entry of PipelineShape::stage_layers accepted: far above any model, small enough that
/// their sum never overflows.
constexpr std::int64_t kMaxStageLayers = std::int64_t{1} << 20;

/// Shape of one training job's pipeline.
struct PipelineShape {
  std::int64_t stages = 1;            ///< S: pipeline ranks
  std::int64_t chunks = 1;            ///< c: virtual stages per rank (interleaved schedules)
  std::int64_t layers_per_stage = 0;  ///< transformer layers per virtual stage; 0: model layers / (S c)
  std::int64_t dp = 1;                ///< data-parallel ranks
  std::int64_t tp = 1;                ///< tensor-parallel ranks
  int zero_stage = 1;                 ///< ZeRO stage of the optimizer (0-3)
  double memory_limit_mb = 0;         ///< per device, MB = 1e6 bytes; 0: the device's memory
  /// Layers of each virtual stage in pipeline order (an uneven split, e.g. planner::balanced_stage_layers);
  /// empty: layers_per_stage, or the model's layers split evenly. Encoder-decoder models: the first
  /// half are encoder stages, the second decoder stages.
  std::vector<std::int64_t> stage_layers;
  /// S c
  std::int64_t vstages() const { return stages * chunks; }
};

/// One virtual stage in pipeline order: its index, the rank that runs it and its layers.
struct VirtualStage {
  std::int64_t index = 0;
  std::int64_t rank = 0;
  cm::StageLayout layout;
};

/// The virtual stages of `shape` for `model`: decoder-only layers split evenly (embedding on the
/// first stage, LM head and loss on the last); encoder-decoder models place the encoder on the
/// first half of the virtual stages and the decoder on the second (DynaPipe's placement; with one
/// stage both run on it). Virtual stage v runs on rank v mod S. Throws InvalidArgument naming the
/// field, the value and the limit (check_shape) when a size is out of range, when tp does not divide
/// the model's heads, when the layers do not divide, or when layers_per_stage asks for more layers
/// than the model has: S x chunks x layers_per_stage may be fewer than the model's layers (a slice of
/// the model, e.g. to study a deeper pipeline on fewer layers) but never more (encoder-decoder: each
/// half of the virtual stages against the encoder and the decoder layers).
std::vector<VirtualStage> virtual_stages(const cm::ModelSpec& model, const PipelineShape& shape);

/// Checks the sizes of `shape` before anything is allocated from them: stages, chunks, dp and tp in
/// [1, kMaxPipelineSize], layers_per_stage >= 0, zero_stage 0-3, memory_limit_mb finite in [0,
/// kMaxMemoryLimitMb], stage_layers empty or one entry in [1, kMaxStageLayers] per virtual stage
/// (whether the model has that many layers is virtual_stages' check). Throws InvalidArgument naming
/// the field (as Python and the CLI spell it), the value and the limit.
void check_shape(const PipelineShape& shape);

/// Sample lengths of one global batch (tokens): input (encoder, or the whole sample for
/// decoder-only) and target (decoder side; empty for decoder-only).
struct BatchLengths {
  std::vector<std::uint32_t> input;
  std::vector<std::uint32_t> target;
  /// Per sample: the tokens that carry loss (optional; the partitioner ignores it, the planner
  /// derives a default when empty: decoder-only n - 1, encoder-decoder the target).
  std::vector<std::uint32_t> loss;
  bool encoder_decoder() const { return !target.empty(); }
  std::size_t size() const { return input.size(); }
};

/// The tokens [begin, begin + length) of a sample that one entry of a micro-batch holds: a slice
/// when they are not the whole sample (docs/design/015-long-context.md). A slice attends to the
/// sample's `begin` tokens before it (kept from earlier micro-batches) and its positions continue
/// from `begin`.
struct Span {
  std::uint32_t begin = 0;
  std::uint32_t length = 0;
  bool operator==(const Span& o) const { return begin == o.begin && length == o.length; }
};

/// A micro-batch: some samples of the global batch, their layout, padded shape and recompute mode.
struct MicroBatch {
  std::vector<std::uint32_t> samples;      ///< indices into BatchLengths, in row order
  /// Slices (layout Packed, decoder-only): per entry of `samples`, the tokens it holds; empty: every
  /// sample whole. A sliced sample's entries sit in micro-batches of increasing index, its spans
  /// back to back from token 0 (the micro-batch order is the slices' forward order).
  std::vector<Span> spans;
  std::vector<std::uint32_t> row_offsets;  ///< packed rows as CSR offsets into samples (rows + 1 entries); empty: one row per sample
  Layout layout = Layout::Padded;          ///< Padded: no row_offsets; Packed: one row of every sample; PackedMask: rows
  std::int64_t padded_len = 0;             ///< every row padded to this many tokens (encoder, or whole sample); Packed: the row's tokens
  std::int64_t padded_dec_len = 0;         ///< decoder tokens per row (encoder-decoder), else 0
  cm::AttentionWork attention;             ///< Packed: the segments' attention sums; other layouts: none (dense rows)
  std::uint64_t tokens = 0;                ///< real tokens, input plus target
  cm::Recompute recompute = cm::Recompute::None;
  double time_ms = 0;    ///< predicted forward + backward (+ recompute) time of its slowest stage
  double stored_mb = 0;  ///< activations stored per in-flight copy on its largest stage (MB = 1e6 bytes)
  double peak_mb = 0;    ///< transient peak on its largest stage
  /// Rows (sequences) of the micro-batch.
  std::int64_t rows() const {
    return row_offsets.empty() ? static_cast<std::int64_t>(samples.size())
                               : static_cast<std::int64_t>(row_offsets.size()) - 1;
  }
  /// The shape the cost model is asked about.
  cm::MicroShape shape() const { return {rows(), padded_len, padded_dec_len, attention}; }
  /// Whether an entry holds part of a sample only.
  bool has_slices() const { return !spans.empty(); }
};

/// The slice links of micro-batches in index order: (prev, next) for every two micro-batches that
/// hold consecutive slices of one sample (the schedule's SimProblem::slice_edges), sorted and
/// without repeats; empty without slices. Throws InvalidArgument naming the sample when its spans
/// do not cover it back to back in increasing micro-batch order (`lengths`: each sample's tokens).
std::vector<std::pair<std::uint32_t, std::uint32_t>> slice_edges(const std::vector<MicroBatch>& mbs,
                                                                 const std::vector<std::uint32_t>& lengths);

}  // namespace packpipe::partition
