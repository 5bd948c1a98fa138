// Generation of per-rank instruction streams from a simulated schedule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/pipeline.h"
#include "scheduler/plan.h"

namespace packpipe::scheduler {

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
};

/// Builds the plan of one iteration: per rank, the schedule's compute ops in order with loads,
/// sends, receives, waits and frees around them. Send and receive starts on every channel (sender,
/// receiver, activation or gradient) appear in the same order on both sides by construction: the
/// receiver posts receives in the sender's order, each at the simulated instant the sender sends
/// (never after its consumer); receive waits sit just before the consumer; send waits sit before
/// the sender's first op that starts after the consumer started (or at the end); buffer slots come
/// from a per-rank free list (lowest id first). Same-rank adjacent virtual stages hand buffers over
/// without communication. `costs` (optional) fills the memory fields. Throws InvalidArgument
/// naming the op when the schedule is inconsistent with `vstages` or `mbs`. Deterministic;
/// thread-safe (no shared state).
Plan build_plan(const Schedule& schedule, const std::vector<MicroBatch>& mbs, const std::vector<VirtualStage>& vstages,
                const StageCostTable* costs, const PlanOptions& options);

namespace synthetic {

/// Per-rank compute orders of classic schedules for tests, examples and benchmarks (the real
/// schedules and their simulator belong to the schedule search). `kind`: "gpipe", "1f1b" (interleaved when
/// chunks > 1, Megatron's order) or "zero-bubble" (1F1B with I and W apart, W deferred while the
/// next forward is not ready). Times are filled by `assign_times`.
Schedule order(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches);
/// Event-driven list scheduling of `schedule`'s per-rank orders: each op starts when its rank is
/// free and its inputs have arrived (plus `comm_ms` across ranks); sets start/end and makespan.
/// Throws InvalidArgument if the orders deadlock.
void assign_times(Schedule& schedule, const StageCostTable& costs, double comm_ms);
/// A random but valid test case: micro-batches with random rows and lengths (seeded; same seed,
/// same result), costs from a simple analytic formula, the schedule's times, and the plan.
/// `same_shape`: every micro-batch gets one shape (exportable to PyTorch).
/// `encoder_decoder`: the first half of the virtual stages is an encoder.
Plan random_plan(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
                 std::uint64_t seed, bool same_shape = false, bool encoder_decoder = false);

/// The parts random_plan builds, for tests that change one of them.
struct Case {
  std::vector<VirtualStage> vstages;
  std::vector<MicroBatch> mbs;
  StageCostTable costs;
  Schedule schedule;
  PlanOptions options;
};
/// The test case behind random_plan.
Case random_case(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
                 std::uint64_t seed, bool same_shape = false, bool encoder_decoder = false);

}  // namespace synthetic

}  // namespace packpipe::scheduler
