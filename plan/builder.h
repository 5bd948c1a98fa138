// Generation of per-rank instruction streams from a simulated schedule: the plan builder. It takes
// plan-level inputs only (the schedule's timeline, the micro-batches as the plan records them, the
// stages' ranks and sides, optional memory figures), so the plan component needs neither the
// partitioner nor the cost model; planner::make_plan adapts their types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/recompute.h"
#include "plan/plan.h"
#include "plan/timeline.h"

namespace packpipe::plan {

/// What build_plan needs besides the schedule and the micro-batches.
struct PlanOptions {
  std::uint64_t iteration = 0;
  std::int64_t hidden = 0;        ///< model hidden size (elements per token of a boundary tensor); > 0
  Dtype dtype = Dtype::BF16;      ///< activation / gradient dtype
  std::uint32_t dp = 1;           ///< data-parallel replicas
  std::uint64_t global_tokens = 0;  ///< over all dp replicas; 0: the tokens of these micro-batches
  std::uint64_t memory_limit_bytes = 0;  ///< 0: unchecked
  const std::vector<SampleRef>* sample_refs = nullptr;  ///< [global batch sample] -> (task, index), optional
  bool iteration_markers = true;  ///< emit IterBegin / IterEnd
  bool reduce_and_step = true;    ///< emit ReduceGrad per stage and OptStep at the end
  bool keep_timeline = true;      ///< copy the simulated compute ops into Plan::timeline
  LossMode loss_mode = LossMode::AllTokens;  ///< recorded in the plan (the loss tokens come with the micro-batches)
  std::uint64_t global_loss_tokens = 0;      ///< over all dp replicas; 0: the loss tokens of these micro-batches
  bool tied_embedding = false;    ///< emit REDUCE_TIED between the first and the last stage's ranks
  std::uint32_t max_seq_len = 0;     ///< the context length planned for, recorded (Plan::max_seq_len)
  std::uint32_t max_target_len = 0;  ///< encoder-decoder: the decoder side's (Plan::max_target_len)
};

/// A virtual stage as the builder needs it: the rank that runs it, its layers on each side of the
/// model (decoder-only models: encoder, as the cost model counts their layers), and whether it holds
/// the embedding and the head. The builder adds what the stage loads (Plan::stages).
struct StageInfo {
  std::uint32_t rank = 0;
  std::uint32_t encoder_begin = 0, encoder_layers = 0;  ///< encoder (or decoder-only) layers
  std::uint32_t decoder_begin = 0, decoder_layers = 0;  ///< decoder layers of an encoder-decoder model
  bool embedding = false, head = false;
};

/// Memory figures of the plan's tables, in bytes as estimated (rounded to integers by the builder).
struct MemoryFigures {
  std::vector<double> stored_bytes;  ///< [mb x V + v]: activations kept from forward to backward
  std::vector<double> peak_bytes;    ///< [mb x V + v]: transient peak while the op runs
  std::vector<double> static_bytes;  ///< [ranks]: parameters, gradients, optimizer state
};

/// Builds the plan of one iteration: per rank, the schedule's compute ops in order with loads,
/// sends, receives, waits and frees around them. `microbatches` are the plan's micro-batches
/// (samples, row offsets, rows, padded lengths, tokens, per-sample lengths and loss tokens; the
/// builder sets loss weights and, from options.sample_refs, refs), `recompute` their modes, `stages`
/// the virtual stages in pipeline order. Loads bring int64 token tensors; each FWD carries its
/// recompute mode; with options.tied_embedding, REDUCE_TIED closes the first and the last stage's
/// gradients when they are on different ranks. Send and receive starts on every channel (sender, receiver, activation or gradient)
/// appear in the same order on both sides by construction: the receiver posts receives in the
/// sender's order, each at the simulated instant the sender sends (never after its consumer);
/// receive waits sit just before the consumer; send waits sit before the sender's first op that
/// starts after the consumer started (or at the end); buffer slots come from a per-rank free list
/// (lowest id first). Same-rank adjacent virtual stages hand buffers over without communication.
/// `memory` (optional) fills the memory fields. Throws InvalidArgument naming the op when the
/// schedule is inconsistent with `stages` or `microbatches`. Deterministic; thread-safe.
Plan build_plan(const Schedule& schedule, std::vector<PlanMicroBatch> microbatches,
                const std::vector<Recompute>& recompute, const std::vector<StageInfo>& stages,
                const MemoryFigures* memory, const PlanOptions& options);

}  // namespace packpipe::plan
