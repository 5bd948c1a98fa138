// The planning job for one iteration: partition the global batch into micro-batches, search the
// pipeline schedule, build the per-rank instruction streams, and measure the same batch under the
// baselines a user would run (fixed micro-batch size with padding, and packing plus a fixed
// micro-batch size, both under 1F1B). `packpipe plan` runs it over every iteration of an epoch.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "partition/partition.h"
#include "partition/pipeline.h"
#include "plan/builder.h"
#include "plan/plan.h"
#include "planner/context.h"
#include "schedule/search.h"
#include "schedule/stage_costs.h"

namespace packpipe::planner {

namespace cm = ::packpipe::costmodel;
namespace part = ::packpipe::partition;
namespace pl = ::packpipe::plan;
namespace sched = ::packpipe::schedule;

/// Families of schedules a trainer may require (search and fallback choose within one).
enum class ScheduleFamily : std::uint8_t { Any, OneFOneB, GPipe, Cyclic, ZeroBubble };
/// The one name table: "any", "1f1b" (1F1B and interleaved 1F1B), "gpipe", "cyclic" (cyclic and
/// wait-free cyclic), "zero-bubble".
inline constexpr EnumName<ScheduleFamily> kScheduleFamilyNames[] = {{ScheduleFamily::Any, "any"},
                                                                    {ScheduleFamily::OneFOneB, "1f1b"},
                                                                    {ScheduleFamily::GPipe, "gpipe"},
                                                                    {ScheduleFamily::Cyclic, "cyclic"},
                                                                    {ScheduleFamily::ZeroBubble, "zero-bubble"}};
inline ScheduleFamily schedule_family_from_name(const std::string& name) {
  return enum_from_name(kScheduleFamilyNames, name, "schedule family");
}

/// The schedule the baselines are reported under (their plans are packpipe's candidates under the
/// schedule search either way). AsRun: as the systems a user runs schedule them: the named
/// schedule when PlannerOptions::schedule names one, else 1F1B (interleaved 1F1B with chunks) over
/// the partition's order, as Megatron-LM runs fixed micro-batches, packing and WLB-LLM, and
/// Seq1F1B its slices (the search where that schedule cannot run the micro-batch count, noted).
/// Search: the same schedule search as packpipe's plan, so a speed-up is the partition's alone.
enum class BaselineSchedule : std::uint8_t { AsRun, Search };
inline constexpr EnumName<BaselineSchedule> kBaselineScheduleNames[] = {{BaselineSchedule::AsRun, "as-run"},
                                                                        {BaselineSchedule::Search, "search"}};
inline BaselineSchedule baseline_schedule_from_name(const std::string& name) {
  return enum_from_name(kBaselineScheduleNames, name, "baseline schedule");
}

struct PlannerOptions {
  part::PipelineShape shape;
  part::PartitionOptions partition;       ///< method dp by default
  std::string schedule = "search";  ///< "search", or one schedule kind ("1f1b", "zero-bubble", ...)
  sched::SearchOptions search;             ///< candidates and seed of the search
  pl::Dtype dtype = pl::Dtype::BF16;        ///< activations and gradients on the wire
  bool validate = false;            ///< run the plan validator on every plan (throws on a violation)
  /// Report every baseline of the grid (part::baseline_grid) under `baseline_schedule`. Their
  /// plans are packpipe's candidates under the schedule search either way: a baseline's plan
  /// simulated faster than packpipe's partition becomes the plan (IterationResult::source names
  /// it), so packpipe is never simulated slower than one of them; a candidate whose makespan lower
  /// bound cannot beat the plan is not searched. The plans are the same with and without the report.
  bool baselines = true;
  BaselineSchedule baseline_schedule = BaselineSchedule::AsRun;  ///< what the report's baselines run
  /// packpipe's own partition is the plan only when it is simulated at least this fraction faster
  /// than the best baseline's plan (in [0, 1)): a gain inside the cost model's error is not worth
  /// leaving the plan a user would run anyway (measured: a 0.2% simulated gain ran 5% slower, 014).
  /// The plan is never simulated slower than a baseline's either way. The same margin holds for the
  /// schedule search (SearchOptions::margin): another kind or order replaces 1F1B (interleaved 1F1B
  /// with chunks) over the given order only when simulated at least min_gain faster, when that
  /// kind is among the allowed schedules.
  double min_gain = 0.02;
  std::vector<std::int64_t> baseline_mbs = {1, 2, 4, 8, 16, 32, 64};  ///< fixed: micro-batch sizes of the grid
  std::vector<std::int64_t> baseline_rows = {1, 2, 4, 8, 16};         ///< packing: rows per micro-batch of the grid
  /// The longest sample (tokens) the baselines' rows and budgets are sized for, as a user fixes
  /// one capacity for a run: 0, the batch's own longest (EpochPlanner sets its dataset's).
  std::uint64_t baseline_longest = 0;
  std::uint64_t baseline_longest_target = 0;  ///< encoder-decoder: the longest target, likewise
  /// Whether the baselines' sizes are left to the data (EpochPlanner then sets them).
  bool baselines_sized_by_data() const { return baseline_longest == 0 && baseline_longest_target == 0; }
  bool keep_timeline = true;        ///< store the simulated ops in the plans (for traces)
  /// Task names by SampleRef::task, naming a dataset sample in messages (e.g. one that does not
  /// fit); empty: tasks by number.
  std::vector<std::string> task_names;
  /// The dataset the sample refs index, recorded in the plans that have refs (Plan::dataset;
  /// EpochPlanner sets its dataset's); unknown: refs given without their dataset.
  pl::DatasetIdentity dataset;
  // ---- what the plans tell a trainer ----
  pl::LossMode loss_mode = pl::LossMode::AllTokens;  ///< recorded in the plans (loss tokens: BatchLengths::loss)
  /// The context length (planner/context.h), recorded in the plans (Plan::max_seq_len): applied by
  /// batch_lengths where a batch is sampled, and by plan_iteration to lengths given directly
  /// (truncate and drop), before the memory oversize policy (partition.oversize).
  ContextLength context;
  bool tied_embedding = false;      ///< the embedding and the LM head share a weight (REDUCE_TIED)
  // ---- which schedules a trainer accepts ----
  bool allow_split_backward = true;  ///< false: never zero-bubble's separate input and weight gradients
  ScheduleFamily family = ScheduleFamily::Any;  ///< the search (and a fallback) choose within it
  /// A named schedule that cannot run an iteration's micro-batch count (interleaved 1F1B needs a
  /// multiple of the stages) falls back to the search over the allowed schedules, with the reason in
  /// IterationResult::schedule_note, instead of an error.
  bool fallback = false;
};

/// Largest micro-batch size of the baselines' grid accepted.
constexpr std::int64_t kMaxBaselineMbs = std::int64_t{1} << 20;

/// Checks `options` before planning: the shape (check_shape), every baseline micro-batch size in
/// [1, kMaxBaselineMbs], the schedule name. Throws InvalidArgument naming the field and the value.
void check_planner_options(const PlannerOptions& options);

/// What one method achieves on one global batch (all data-parallel replicas).
struct MethodFigures {
  bool feasible = false;           ///< partitioned and every replica's schedule within memory
  std::int64_t microbatches = 0;
  double efficiency = 0;           ///< real tokens / padded tokens
  double iteration_ms = std::numeric_limits<double>::infinity();  ///< simulated, max over replicas
  std::vector<double> peak_mb;     ///< per pipeline rank, max over replicas (MB = 1e6 bytes)
  std::string schedule;            ///< the schedule used (of replica 0)
  std::string why;                 ///< why infeasible
};

/// One baseline of the grid on one global batch.
struct BaselineFigures {
  part::Baseline baseline;
  MethodFigures figures;  ///< under PlannerOptions::baseline_schedule
  bool scheduled = false; ///< false: its partition failed, or it cannot be run (figures.why)
  /// Its plan was a candidate for packpipe's: the dp method, and a layout PartitionOptions::layouts
  /// lists (the executor runs it). Otherwise reported only, and packpipe's plan may be slower.
  bool candidate = false;
};

/// The plans and figures of one iteration.
struct IterationResult {
  std::uint64_t iteration = 0;
  std::uint64_t samples = 0;
  std::uint64_t tokens = 0;         ///< real tokens of the global batch (as trained: see plan_iteration)
  std::uint64_t truncated = 0;      ///< samples the memory oversize policy truncated
  std::uint64_t dropped = 0;        ///< samples the memory oversize policy dropped
  /// What the context length did to the batch (PlannerOptions::context): applied by plan_iteration
  /// to the lengths it was given, or by batch_lengths when the batch was sampled (EpochPlanner).
  ContextReport context;
  /// Each sample of the lengths given, as trained: after the context length and the memory
  /// oversize policy (0 tokens and 0 loss tokens for a dropped sample): what the plans' micro-batches
  /// record (PlanMicroBatch::lengths, target_lengths, loss_tokens), in batch order.
  part::BatchLengths trained;
  double model_flops = 0;           ///< forward + backward FLOPs of the real samples (no padding, no recompute)
  part::Partition partition;        ///< packpipe's partition of the batch (every replica's micro-batches)
  std::vector<pl::Plan> plans;          ///< one per data-parallel replica (Plan::replica), in replica order
  std::vector<pl::Schedule> schedules;  ///< the simulated schedule of each replica (for traces)
  MethodFigures packpipe;
  /// Where the plan's micro-batches come from: the partition method's name ("dp": packpipe's), or
  /// the label of the baseline whose plan was simulated faster (Baseline::label).
  std::string source = "dp";
  /// Whether the plan is a baseline's (source is a baseline's label).
  bool from_baseline = false;
  std::vector<BaselineFigures> baselines;  ///< the grid (PlannerOptions::baselines), else empty
  double partition_ms = 0;          ///< wall time of packpipe's partition
  double schedule_ms = 0;           ///< wall time of the schedule search (all replicas)
  double candidates_ms = 0;         ///< wall time of the baselines' plans as candidates (and their report)
  double build_ms = 0;              ///< wall time of building (and validating) the plans
  double planning_ms = 0;           ///< the four together
  std::string schedule_note;        ///< why a named schedule was not used (PlannerOptions::fallback), else empty
};

/// The schedule kinds the search may choose under `options` (its search candidates, the family and
/// the split-backward setting), in all_schedule_kinds() order.
std::vector<sched::ScheduleKind> allowed_schedules(const PlannerOptions& options);
/// Whether kind `k` belongs to family `f`.
bool in_family(sched::ScheduleKind k, ScheduleFamily f);

/// Plans one global batch. `refs` (optional) names each sample as (task, index) in the plans;
/// `cache` (optional, one per thread) keeps micro-batch shape costs across the iterations a thread
/// plans. Thread-safe (the cost model is only queried); deterministic, with or without a cache.
/// Throws InvalidArgument when packpipe's own partition is impossible (e.g. a sample cannot fit
/// alone and options.partition.oversize is Error), naming the iteration and the sample as the user
/// knows it: its task and index in the dataset when `refs` are given. Under the truncate and drop
/// policies the plans, `samples` and `tokens` count what is trained (dropped samples out,
/// truncated ones at their new length). The context length (options.context) applies first
/// (limit_lengths: truncate or drop; a sample over it under split throws InvalidArgument); the
/// micro-batches' samples stay positions in `lengths` as given, a dropped sample in none of them.
IterationResult plan_iteration(const part::BatchLengths& lengths, const std::vector<SampleRef>* refs,
                               std::uint64_t iteration, const cm::CostModel& cost,
                               const std::vector<part::VirtualStage>& vstages, const PlannerOptions& options,
                               part::PartitionCache* cache = nullptr);

/// The plan of one iteration from the partitioner's micro-batches, the virtual stages and the
/// simulated schedule: plan::build_plan on their plan-level forms. `lengths` is the batch as
/// partitioned (the samples' lengths and loss tokens go into the plan); `costs` (optional) fills the
/// memory fields. Throws InvalidArgument as build_plan does, and naming a micro-batch whose padded
/// lengths do not fit 32 bits or a virtual stage out of order.
pl::Plan make_plan(const pl::Schedule& schedule, const std::vector<part::MicroBatch>& mbs,
                   const std::vector<part::VirtualStage>& vstages, const part::BatchLengths& lengths,
                   const sched::StageCostTable* costs, const pl::PlanOptions& options);
/// Tokens of sample `s` that carry loss: lengths.loss[s] when given, else decoder-only n - 1 and
/// encoder-decoder the target length.
std::uint32_t sample_loss_tokens(const part::BatchLengths& lengths, std::uint32_t s);
/// Loss tokens of the slice of sample `s` holding its tokens [begin, begin + length): its share of
/// sample_loss_tokens (decoder-only; the loss positions are a suffix of the sample's, so a sample's
/// slices sum to the whole's, and a slice's last token carries a loss when the sample continues).
std::uint32_t slice_loss_tokens(const part::BatchLengths& lengths, std::uint32_t s, std::uint32_t begin,
                                std::uint32_t length);
/// The batch as trained under `split` (the partition of `lengths`): the lengths after truncation
/// (split.lengths; `lengths` when the partition keeps none) and each sample's loss tokens. A
/// decoder-only sample truncated by k tokens keeps its first tokens and loses k loss tokens (never
/// below 0) in either loss mode; an encoder-decoder sample keeps at most its truncated target's.
part::BatchLengths trained_lengths(const part::BatchLengths& lengths, const part::Partition& split);

/// Simulated iteration time of given micro-batches under one schedule kind ("1f1b" for the
/// baselines), replicas as assigned; fills `figures` (feasible, iteration_ms, peak_mb).
void simulate_method(const part::BatchLengths& lengths, const part::Partition& partition, const cm::CostModel& cost,
                     const std::vector<part::VirtualStage>& vstages, const part::PipelineShape& shape, sched::ScheduleKind kind,
                     MethodFigures& figures);

/// An uneven layer split (PipelineShape::stage_layers) that balances the virtual stages' forward +
/// backward time of a micro-batch of `rows` rows of `seq` tokens (`dec_seq` decoder tokens) on
/// `cost`, the embedding counted on the first stage and the LM head and loss on the last, as
/// Megatron's pipeline layouts do by hand: the least maximum stage time over contiguous splits with
/// at least one layer a stage (each side of an encoder-decoder model over its half of the stages).
/// Uses every layer of the model; empty for one virtual stage of an encoder-decoder model (nothing to
/// balance). Deterministic. Throws InvalidArgument when the model has fewer layers than stages.
std::vector<std::int64_t> balanced_stage_layers(const cm::CostModel& cost, const part::PipelineShape& shape,
                                                std::int64_t rows, std::int64_t seq, std::int64_t dec_seq = 0);

/// Forward + backward FLOPs of the real samples (each at its own length, as model FLOPs count)
/// through the layers the pipeline's virtual stages hold (3 x forward, no recompute).
double batch_model_flops(const cm::ModelSpec& model, const std::vector<part::VirtualStage>& vstages,
                         const part::BatchLengths& lengths);

}  // namespace packpipe::planner
