// The data path from a plan to token tensors: what a LOAD_MB of a plan brings, assembled from the
// plan's sample refs and the dataset it was planned from, and a loader that assembles one pipeline
// rank's loads iteration after iteration on a background thread, ahead of the trainer.
//
// Token conventions (the rule for every trainer; plan/plan.h LoadTensor names the tensors):
// - Decoder-only model (no virtual stage has decoder layers): a sample is its input tokens
//   followed by its target tokens, of which the first PlanMicroBatch::lengths[i] are kept (a
//   sample the context length or the oversize policy truncated keeps its first tokens); a chunk of
//   a sample split at the context length (SampleRef::offset o > 0) is its tokens [o, o + lengths[i])
//   and is a sample of its own from here on. input_ids are those tokens, pad_id on padding;
//   position_ids restart at 0 for each sample (and chunk), 0 on padding (as packing::row_tensors),
//   so they stay below the plan's max_seq_len; labels[p] is the sample's (chunk's) token p + 1,
//   ignore_index at its last position and on padding. LossMode::Targets keeps a label only where
//   the next token is a target token (its index in the whole sample >= the input length, so a
//   chunk that starts inside the target labels every next token).
// - Encoder-decoder model: the encoder side is the input tokens, the first lengths[i] kept (an
//   empty input is planned as one token: one pad_id). With t = target_lengths[i], the decoder side
//   is decoder_input_ids = [decoder_start_id, target[0], ..., target[t - 2]] and decoder_labels =
//   [target[0], ..., target[t - 1]] (an empty target is planned as one token: input
//   [decoder_start_id], label [ignore_index]); decoder padding is pad_id in the inputs and
//   ignore_index in the labels. position_ids are the encoder side's.
// - Loss tokens are the labels (decoder-only) or decoder labels (encoder-decoder) that are not
//   ignore_index: the count planner::batch_lengths and the planner record per micro-batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dataloader/multitask.h"
#include "plan/plan.h"
#include "planner/epoch.h"

namespace packpipe::planner {

namespace dl = ::packpipe::dataloader;
namespace pl = ::packpipe::plan;

/// The token ids a loader writes where a sample gives none.
struct TokenOptions {
  std::int64_t ignore_index = -100;   ///< labels without loss (PyTorch's cross-entropy default)
  std::int64_t pad_id = 0;            ///< input padding, and the one token of an empty encoder input
  std::int64_t decoder_start_id = 0;  ///< first decoder input of every encoder-decoder sample
};

/// One side of a micro-batch's rows, in packing::row_tensors' conventions: cu_seqlens over all rows
/// (padding as a segment of its own), position_ids and segment_ids row-major [rows, seq], the
/// longest sample.
struct RowLayout {
  std::uint32_t rows = 0, seq = 0;
  std::vector<std::int32_t> cu_seqlens, position_ids, segment_ids;
  /// The longest segment of cu_seqlens (padding segments included: flash-attn's contract).
  std::int32_t max_seqlen = 0;
  /// The keys' side of each query segment (flash-attn varlen's cu_seqlens_k, max_seqlen_k): a slice
  /// attends to its prefix's kept keys and then its own, prefix + length keys (bottom-right causal);
  /// equal to cu_seqlens / max_seqlen without slices. Slices also continue their positions from
  /// their prefix.
  std::vector<std::int32_t> cu_seqlens_k;
  std::int32_t max_seqlen_k = 0;
  /// Per sample entry: its prefix (kept tokens before it) and whether it continues in a later
  /// micro-batch (its last token's label is the next token), from the plan's slice links.
  std::vector<std::uint32_t> prefix;
  std::vector<std::uint8_t> continues;
};

/// The rows of micro-batch `mb` of a format-2 plan: its encoder (or whole-sample) side over
/// PlanMicroBatch::lengths and padded_len, or with `decoder` its decoder side over target_lengths
/// and padded_dec_len (encoder-decoder plans only), through packing::row_tensors, with its slices'
/// prefixes (positions continue, keys' cu_seqlens_k) from the plan's slice links. Throws
/// OutOfRange for `mb`, InvalidArgument naming the iteration and micro-batch for a format-1 plan, a
/// decoder side the plan lacks, or rows that do not match the lengths.
RowLayout microbatch_layout(const pl::Plan& plan, std::size_t mb, bool decoder = false);

/// What plans record of `data` (Plan::dataset, a plan file's dataset record): its fingerprint
/// (dl::MultiTaskDataset::fingerprint) and its tasks' names and sample counts in task order.
pl::DatasetIdentity dataset_identity(const dl::MultiTaskDataset& data);

/// Throws InvalidArgument unless `planned` (what a plan or a plan file records) is unknown or is
/// `data`'s identity: the message names `what` (the plan file, or the plan's iteration), `data`'s
/// manifest and what differs, planned versus found (the tasks' names or order, a task's sample
/// count, or, when those agree, the fingerprint of the data behind them). Every loader calls it
/// before it loads tokens for a plan: refs into another dataset would load other tokens than planned.
void check_dataset(const pl::DatasetIdentity& planned, const dl::MultiTaskDataset& data, const std::string& what);

/// The tensors one LOAD_MB brings: int64, row-major [rows, seq] (decoder tensors [rows, dec_seq]);
/// a tensor the stage does not load is empty.
struct LoadedTensors {
  std::uint32_t mb = 0, stage = 0, rows = 0, seq = 0, dec_seq = 0;
  std::uint8_t loads = 0;  ///< plan::LoadTensor bits: which tensors are filled
  std::vector<std::int64_t> input_ids, position_ids, labels, decoder_input_ids, decoder_labels;
  /// Labels (decoder-only) or decoder labels (encoder-decoder) other than ignore_index over the
  /// micro-batch, whatever the stage loads.
  std::uint64_t loss_tokens = 0;
};

/// Assembles the tensors virtual stage `stage` loads for micro-batch `mb` of `plan` (StageSpec::loads)
/// from the tokens of the micro-batch's samples (PlanMicroBatch::refs) in `data`, by the conventions
/// at the top of this file. Throws OutOfRange for `mb` or `stage`; InvalidArgument for a plan of
/// another dataset (check_dataset), and naming the iteration, the micro-batch and the sample for a
/// format-1 plan, a plan without sample refs, a ref
/// the dataset does not hold, a planned length longer than the sample's tokens, or lengths that do
/// not fit the rows; Error when the assembled loss tokens differ from the plan's. Thread-safe.
LoadedTensors assemble_microbatch(const dl::MultiTaskDataset& data, const pl::Plan& plan, std::size_t mb,
                                  std::uint32_t stage, const TokenOptions& tokens = {});

/// The most iterations a RankLoader holds ready (each holds a plan and its token tensors).
inline constexpr std::size_t kMaxLoaderDepth = 1024;

/// Which plans a RankLoader follows and how far ahead it works.
struct RankLoaderOptions {
  std::uint32_t replica = 0;  ///< data-parallel replica
  std::int64_t rank = 0;      ///< pipeline rank; -1: every rank (a single-process trainer)
  std::size_t depth = 2;      ///< iterations held ready for the consumer, in [1, kMaxLoaderDepth]
  TokenOptions tokens;
  /// Plan files only: deliver the iterations an incomplete file holds (its writer declared more:
  /// the planning run stopped early). False: such a file is refused (PlanFileReader::require_complete).
  bool allow_incomplete = false;
};

/// One iteration as a RankLoader delivers it.
struct RankIteration {
  std::uint64_t iteration = 0;
  pl::Plan plan;  ///< the replica's plan
  /// One per LOAD_MB of the rank's stream, in stream order (rank -1: rank 0's, then rank 1's, ...).
  std::vector<LoadedTensors> loads;
};

/// Assembles the plan and the loads of one pipeline rank of one replica, iteration after iteration,
/// on a background thread up to `depth` iterations ahead of the consumer. Deterministic;
/// iterations before a failing one are delivered, then its error. Holds a reference to `data`,
/// which must outlive it (as must the planner's cost model). One consumer at a time.
class RankLoader {
 public:
  /// Takes over `planner` (planned over `data`) and delivers its iterations from the one it would
  /// deliver next, plans[options.replica] of each. Throws InvalidArgument for another dataset, a
  /// replica at least the planner's dp, a rank at least its stages or below -1, or depth 0.
  RankLoader(const dl::MultiTaskDataset& data, std::unique_ptr<EpochPlanner> planner, RankLoaderOptions options);
  /// Reads the plans (iteration, options.replica) of `plan_file` (plan/format.h) from iteration
  /// `first_iteration` on, `count` iterations (0: to the end of the file). Throws Error for a bad
  /// file or an incomplete one (unless options.allow_incomplete), InvalidArgument for a file
  /// planned from another dataset than `data` (check_dataset; a file that records none is read
  /// unchecked), a first iteration the file does not hold, a replica or rank the first plan does
  /// not have, or depth 0.
  RankLoader(const dl::MultiTaskDataset& data, const std::string& plan_file, std::uint64_t first_iteration,
             std::uint64_t count, RankLoaderOptions options);
  /// Stops the background work and joins (at most the iteration in flight finishes); never hangs.
  ~RankLoader();
  RankLoader(const RankLoader&) = delete;
  RankLoader& operator=(const RankLoader&) = delete;

  /// The next iteration, blocking until it is assembled; false after the last (and on every later
  /// call). Rethrows an error of planning, reading or assembly, naming the iteration, on this and
  /// every later call. A call while another thread is inside next() throws InvalidArgument.
  bool next(RankIteration& out);
  /// Iterations this loader yields in all.
  std::uint64_t iterations() const;
  /// The iteration number next() delivers next (one past the last one at the end).
  std::uint64_t position() const;

 private:
  struct Impl;
  void start();
  std::unique_ptr<Impl> impl_;
};

}  // namespace packpipe::planner
