// The epoch planner: every iteration of an epoch of a multi-task dataset, planned in parallel and
// delivered in order. It owns the one rule that turns a sampled global batch into the lengths the
// partitioner sees (batch_lengths), so `packpipe plan`, `packpipe partition --manifest`, Python's
// plan_epoch() and the PyTorch loader all see the same tokens for the same batch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "costmodel/cost_model.h"
#include "dataloader/multitask.h"
#include "dataloader/sampler.h"
#include "plan/format.h"
#include "planner/context.h"
#include "planner/planner.h"

namespace packpipe::planner {

namespace dl = ::packpipe::dataloader;

/// The lengths of one sampled global batch, in batch order, as planning sees them: decoder-only
/// models train each sample as one sequence of input + target tokens; encoder-decoder models take
/// (input, target) with an empty side counted as one token (a decoder-only task's samples get a
/// one-token target, as DynaPipe's supervised mode pads it). The context length `context` applies
/// (append_sample, planner/context.h): a sample over it is truncated, left out (listed in `report`
/// by its position in `batch`) or, decoder-only, split into chunks that are samples of their own
/// (their refs carry each chunk's first token). `refs` (optional) receives each entry's (task,
/// index, offset); `report` (optional) what the context length did. Throws InvalidArgument naming
/// the iteration, the task and the dataset sample when a decoder-only sample has 2^32 tokens or
/// more, and as check_context_length for a context length the model cannot take.
/// Each entry's loss tokens go to BatchLengths::loss under `loss` (decoder_only_loss: all tokens
/// n - 1, targets only the target's; encoder-decoder, the real target tokens kept).
part::BatchLengths batch_lengths(const dl::MultiTaskDataset& data, const dl::GlobalBatch& batch, bool encoder_decoder,
                                 std::uint64_t iteration, std::vector<SampleRef>* refs = nullptr,
                                 pl::LossMode loss = pl::LossMode::AllTokens, const ContextLength& context = {},
                                 ContextReport* report = nullptr);

/// The lengths of the samples `refs` name before any context length, as batch_lengths counts them
/// without one (a chunk: its whole sample's), in the refs' order, without loss tokens.
part::BatchLengths sample_lengths(const dl::MultiTaskDataset& data, const std::vector<SampleRef>& refs,
                                  bool encoder_decoder);

/// What to plan: how the global batches are sampled and which iterations of which epoch.
struct EpochSpec {
  dl::SamplerConfig sampler;          ///< seed, split, global batch tokens or samples, task weights
  std::uint64_t epoch = 0;
  std::uint64_t first_iteration = 0;  ///< start here (resumption; at most the epoch's iterations)
  std::uint64_t iterations = 0;       ///< plan at most this many (0: to the end of the epoch)
};

/// How to plan them. Results never depend on these settings.
struct EpochOptions {
  int threads = 0;           ///< planning threads (0: every core)
  /// next(): planned iterations held ready for the consumer (0: twice the threads), besides the
  /// up to twice-the-threads iterations the pipeline has in flight; run() ignores it.
  std::size_t depth = 0;
  bool encode = false;       ///< also encode every plan (PlannedIteration::blobs), in the planning threads
  pl::EncodeOptions encoding;
};

/// One sampled global batch as planning sees it.
struct SampledBatch {
  std::uint64_t iteration = 0;   ///< the batch's index in its epoch
  /// By batch_lengths(): after the context length (a split sample is one entry per chunk, a dropped
  /// one has none), before the memory oversize policy; the partitioner's input.
  part::BatchLengths lengths;
  std::vector<SampleRef> refs;   ///< each entry's (task, index, offset), in the lengths' order
  /// Each entry's sample before the context length (sample_lengths(); a chunk: its whole sample's).
  part::BatchLengths sample_lengths;
  ContextReport context;         ///< what the context length did (dropped: positions in the sampled batch)
};

/// One iteration as the epoch planner delivers it.
struct PlannedIteration : SampledBatch {
  IterationResult result;                        ///< partition, plans (one per replica), schedules, figures
  std::vector<std::vector<std::uint8_t>> blobs;  ///< encoded plans, one per replica (EpochOptions::encode)
};

/// Plans the iterations of one epoch in parallel (oneTBB pipeline: sampling in order, planning in
/// parallel with one PartitionCache per thread, delivery in order). Deterministic: the same inputs
/// give bit-identical plans whatever the threads or the depth. Holds references to `data` and
/// `cost`, which must outlive it. One consumer at a time.
class EpochPlanner {
 public:
  /// Checks the options and the sampler settings (InvalidArgument) and counts the iterations; planning starts with
  /// the first next() or run().
  EpochPlanner(const dl::MultiTaskDataset& data, const cm::CostModel& cost, PlannerOptions options, EpochSpec spec,
               EpochOptions epoch_options = {});
  /// Stops the background planning (iterations in flight are dropped) and joins.
  ~EpochPlanner();
  EpochPlanner(const EpochPlanner&) = delete;
  EpochPlanner& operator=(const EpochPlanner&) = delete;

  /// Iterations this run plans: exact (arithmetic for sample-count batches, a dry run of a copy of
  /// the sampler for token budgets), after first_iteration and capped by `iterations`.
  std::uint64_t iterations() const { return count_; }
  /// Iterations the epoch holds from its start, whatever first_iteration and iterations say (token
  /// budgets capped by `iterations`: a dry run of the sampler over the rest of the epoch, once).
  std::uint64_t epoch_iterations() const;
  /// The virtual stages planned for.
  const std::vector<part::VirtualStage>& vstages() const { return vstages_; }
  const PlannerOptions& options() const { return options_; }
  const EpochSpec& spec() const { return spec_; }
  /// The dataset it plans.
  const dl::MultiTaskDataset& data() const { return data_; }
  /// The iteration next() delivers next: first_iteration plus the iterations next() delivered (for
  /// the consumer's thread).
  std::uint64_t position() const { return spec_.first_iteration + delivered_; }

  /// The next iteration in order, planned ahead in a background thread; false after the last (and
  /// on every later call). Rethrows the first planning error (naming the iteration) on this and
  /// every later call. A call while another thread is inside next() throws InvalidArgument.
  bool next(PlannedIteration& out);
  /// Plans every iteration on the calling thread's oneTBB pipeline, calling `sink` for each in
  /// iteration order (from one thread at a time); stops at the first error or exception of the
  /// sink, which it rethrows. Use either run() or next(), once.
  void run(const std::function<void(PlannedIteration&)>& sink);

 private:
  struct Impl;
  void pipeline(const std::function<bool(PlannedIteration&)>& sink, const std::function<bool()>& stopped);
  const dl::MultiTaskDataset& data_;
  const cm::CostModel& cost_;
  PlannerOptions options_;
  EpochSpec spec_;
  EpochOptions eo_;
  std::vector<part::VirtualStage> vstages_;
  bool encdec_ = false;
  std::uint64_t count_ = 0, epoch_count_ = 0;
  bool epoch_counted_ = true;                  ///< epoch_count_ is the whole epoch's (else a cap)
  mutable std::once_flag whole_epoch_once_;    ///< epoch_iterations' dry run to the end
  mutable std::uint64_t whole_epoch_count_ = 0;
  dl::SamplerState first_state_;  ///< the sampler where spec_.first_iteration starts
  std::uint64_t delivered_ = 0;  ///< iterations next() delivered
  std::unique_ptr<Impl> impl_;
};

/// The global batch `index` of `spec.epoch` sampled with `spec.sampler`, through batch_lengths()
/// under `context`.
/// Throws InvalidArgument when the epoch has no batch `index`.
SampledBatch sample_batch(const dl::MultiTaskDataset& data, const EpochSpec& spec, std::uint64_t index,
                          bool encoder_decoder, pl::LossMode loss = pl::LossMode::AllTokens,
                          const ContextLength& context = {});

}  // namespace packpipe::planner
