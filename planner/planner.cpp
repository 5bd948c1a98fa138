#include "planner/planner.h"

#include <algorithm>
#include <chrono>

#include "common/errors.h"
#include "plan/builder.h"
#include "schedule/schedules.h"
#include "schedule/simulator.h"
#include "plan/validator.h"

namespace packpipe::planner {

namespace part = ::packpipe::partition;
namespace pl = ::packpipe::plan;
namespace sched = ::packpipe::schedule;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// The micro-batches of one data-parallel replica.
std::vector<part::MicroBatch> replica_microbatches(const part::Partition& p, std::size_t replica) {
  std::vector<part::MicroBatch> out;
  if (p.ranks.empty()) {
    if (replica == 0) out = p.microbatches;
    return out;
  }
  for (auto i : p.ranks[replica]) out.push_back(p.microbatches[i]);
  return out;
}

std::size_t replicas(const part::Partition& p) { return p.ranks.empty() ? 1 : p.ranks.size(); }

/// A problem for one replica's micro-batches.
sched::SimProblem replica_problem(const std::vector<part::MicroBatch>& mbs, const cm::CostModel& cost,
                           const std::vector<part::VirtualStage>& vstages, const part::PipelineShape& shape) {
  return sched::make_sim_problem(sched::stage_cost_table(cost, shape, vstages, mbs), cost, shape);
}

void account(const pl::Schedule& s, const part::PipelineShape& shape, double limit_bytes, MethodFigures& f) {
  f.iteration_ms = std::max(f.iteration_ms, s.makespan_ms);
  if (f.peak_mb.empty()) f.peak_mb.assign(static_cast<std::size_t>(shape.stages), 0.0);
  for (std::size_t r = 0; r < s.peak_bytes.size() && r < f.peak_mb.size(); ++r) {
    f.peak_mb[r] = std::max(f.peak_mb[r], s.peak_bytes[r] / 1e6);
    if (limit_bytes > 0 && s.peak_bytes[r] > limit_bytes) {
      f.feasible = false;
      f.why = fmt::format("rank {} peaks at {:.0f} MB, over the {:.0f} MB limit", r, s.peak_bytes[r] / 1e6,
                          limit_bytes / 1e6);
    }
  }
}

void partition_figures(const part::Partition& p, MethodFigures& f) {
  f.microbatches = static_cast<std::int64_t>(p.microbatches.size());
  f.efficiency = p.efficiency;
}

/// One baseline method over the grid of micro-batch sizes.
BaselineGrid baseline_grid(const part::BatchLengths& lengths, const cm::CostModel& cost,
                           const std::vector<part::VirtualStage>& vstages, const PlannerOptions& o,
                           part::PartitionMethod method, part::PartitionCache* cache) {
  BaselineGrid g;
  for (std::int64_t m : o.baseline_mbs) {
    MethodFigures f;
    part::PartitionOptions po = o.partition;
    po.method = method;
    po.microbatch_size = m;
    po.pack_windows = false;
    po.cache = cache;
    try {
      const part::Partition p = part::partition(lengths, cost, o.shape, vstages, po);
      partition_figures(p, f);
      simulate_method(lengths, p, cost, vstages, o.shape, sched::ScheduleKind::OneFOneB, f);
    } catch (const InvalidArgument& e) {
      f.feasible = false;
      f.iteration_ms = std::numeric_limits<double>::infinity();
      f.why = e.what();
    }
    g.mbs.push_back(m);
    g.figures.push_back(std::move(f));
  }
  return g;
}

}  // namespace

void check_planner_options(const PlannerOptions& o) {
  part::check_shape(o.shape);
  for (std::size_t i = 0; i < o.baseline_mbs.size(); ++i) {
    PACKPIPE_CHECK_ARG(o.baseline_mbs[i] >= 1 && o.baseline_mbs[i] <= kMaxBaselineMbs,
                       "baseline micro-batch size {} (entry {} of baseline_mbs) must be in [1, {}]", o.baseline_mbs[i],
                       i, kMaxBaselineMbs);
  }
  if (o.schedule != "search") (void)sched::schedule_kind_from_name(o.schedule);
}

double batch_model_flops(const cm::ModelSpec& model, const std::vector<part::VirtualStage>& vstages,
                         const part::BatchLengths& lengths) {
  std::int64_t enc = 0, dec = 0, post = 0;
  for (const auto& v : vstages) {
    enc += v.layout.encoder_layers;
    dec += v.layout.decoder_layers;
    post += v.layout.has_postprocess ? 1 : 0;
  }
  const bool ed = model.arch == cm::Architecture::EncoderDecoder;
  double forward = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::int64_t in = std::max<std::int64_t>(1, lengths.input[i]);
    const std::int64_t tg = ed ? std::max<std::int64_t>(1, lengths.encoder_decoder() ? lengths.target[i] : 1) : 0;
    if (enc > 0) forward += static_cast<double>(enc) * cm::forward_flops(model, cm::LayerKind::Encoder, 1, in).total();
    if (dec > 0) forward += static_cast<double>(dec) * cm::forward_flops(model, cm::LayerKind::Decoder, 1, in, tg).total();
    if (post > 0) forward += static_cast<double>(post) * cm::forward_flops(model, cm::LayerKind::PostProcess, 1, in, tg).total();
  }
  return 3.0 * forward;
}

void simulate_method(const part::BatchLengths& lengths, const part::Partition& p, const cm::CostModel& cost,
                     const std::vector<part::VirtualStage>& vstages, const part::PipelineShape& shape, sched::ScheduleKind kind,
                     MethodFigures& f) {
  (void)lengths;
  f.feasible = true;
  f.iteration_ms = 0;
  f.schedule = sched::schedule_kind_name(kind);
  for (std::size_t r = 0; r < replicas(p); ++r) {
    const auto mbs = replica_microbatches(p, r);
    if (mbs.empty()) continue;
    const sched::SimProblem prob = replica_problem(mbs, cost, vstages, shape);
    sched::ScheduleKind k = kind;
    if (!sched::schedule_supports(k, shape.stages, shape.chunks, static_cast<std::int64_t>(mbs.size()))) {
      k = sched::ScheduleKind::GPipe;  // e.g. interleaving with a partial group: fall back, as a user must
    }
    const pl::Schedule s = sched::make_schedule(k, prob);
    account(s, shape, prob.memory_limit_bytes, f);
  }
}

pl::Plan make_plan(const pl::Schedule& schedule, const std::vector<part::MicroBatch>& mbs,
                   const std::vector<part::VirtualStage>& vstages, const sched::StageCostTable* costs,
                   const pl::PlanOptions& options) {
  std::vector<pl::StageInfo> stages(vstages.size());
  for (std::size_t v = 0; v < vstages.size(); ++v) {
    const part::VirtualStage& vs = vstages[v];
    PACKPIPE_CHECK_ARG(vs.index == static_cast<std::int64_t>(v), "build_plan: virtual stage {} has index {}", v, vs.index);
    PACKPIPE_CHECK_ARG(vs.rank >= 0 && vs.rank < schedule.ranks, "build_plan: virtual stage {} on rank {} of {}", v,
                       vs.rank, schedule.ranks);
    stages[v] = {static_cast<std::uint32_t>(vs.rank), vs.layout.encoder_layers > 0, vs.layout.decoder_layers > 0};
  }
  std::vector<pl::PlanMicroBatch> out(mbs.size());
  std::vector<Recompute> recompute(mbs.size());
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    const part::MicroBatch& in = mbs[m];
    PACKPIPE_CHECK_ARG(in.rows() > 0 && in.padded_len > 0 && in.padded_len <= 0xFFFFFFFFll && in.padded_dec_len >= 0 &&
                           in.padded_dec_len <= 0xFFFFFFFFll,
                       "build_plan: micro-batch {} is empty (rows {}, padded length {})", m, in.rows(), in.padded_len);
    pl::PlanMicroBatch& mb = out[m];
    mb.samples = in.samples;
    mb.row_offsets = in.row_offsets;
    mb.rows = static_cast<std::uint32_t>(in.rows());
    mb.padded_len = static_cast<std::uint32_t>(in.padded_len);
    mb.padded_dec_len = static_cast<std::uint32_t>(in.padded_dec_len);
    mb.tokens = in.tokens;
    recompute[m] = in.recompute;
  }
  if (costs == nullptr) return pl::build_plan(schedule, std::move(out), recompute, stages, nullptr, options);
  PACKPIPE_CHECK_ARG(costs->microbatches == static_cast<std::int64_t>(mbs.size()) &&
                         costs->vstages == static_cast<std::int64_t>(vstages.size()),
                     "build_plan: cost table is {} micro-batches x {} stages, expected {} x {}", costs->microbatches,
                     costs->vstages, mbs.size(), vstages.size());
  const pl::MemoryFigures memory{costs->stored_bytes, costs->peak_bytes, costs->static_bytes};
  return pl::build_plan(schedule, std::move(out), recompute, stages, &memory, options);
}

IterationResult plan_iteration(const part::BatchLengths& lengths, const std::vector<SampleRef>* refs,
                               std::uint64_t iteration, const cm::CostModel& cost,
                               const std::vector<part::VirtualStage>& vstages, const PlannerOptions& o,
                               part::PartitionCache* cache) {
  check_planner_options(o);
  PACKPIPE_CHECK_ARG(lengths.size() > 0, "iteration {}: the global batch is empty", iteration);
  PACKPIPE_CHECK_ARG(lengths.target.empty() || lengths.target.size() == lengths.input.size(),
                     "iteration {}: {} target lengths for {} input lengths (encoder-decoder batches give one of each "
                     "per sample)", iteration, lengths.target.size(), lengths.input.size());
  PACKPIPE_CHECK_ARG(refs == nullptr || refs->size() == lengths.size(),
                     "iteration {}: {} sample refs for a global batch of {} samples", iteration,
                     refs ? refs->size() : 0, lengths.size());
  IterationResult r;
  r.iteration = iteration;
  r.samples = lengths.size();
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    r.tokens += lengths.input[i] + (lengths.encoder_decoder() ? lengths.target[i] : 0);
  }
  r.model_flops = batch_model_flops(cost.model(), vstages, lengths);

  // 1. Partition.
  auto t0 = std::chrono::steady_clock::now();
  part::PartitionOptions popt = o.partition;
  popt.cache = cache;
  if (!popt.describe_sample) {
    // A sample as the user knows it: its task and index in the dataset, not its place in the batch.
    popt.describe_sample = [&](std::uint32_t s) {
      if (refs == nullptr) return fmt::format("iteration {}, sample {} of the global batch", iteration, s);
      const SampleRef& ref = (*refs)[s];
      const std::string task = ref.task < o.task_names.size() ? fmt::format("task '{}'", o.task_names[ref.task])
                                                              : fmt::format("task {}", ref.task);
      return fmt::format("iteration {}, {}, dataset sample {}", iteration, task, ref.index);
    };
  }
  part::Partition split = part::partition(lengths, cost, o.shape, vstages, popt);
  r.partition_ms = ms_since(t0);
  if (!split.truncated.empty() || !split.dropped.empty()) {
    // The oversize policy changed the batch: count what is trained.
    r.samples = lengths.size() - split.dropped.size();
    r.truncated = split.truncated.size();
    r.dropped = split.dropped.size();
    r.tokens = split.input_tokens + split.target_tokens;
    part::BatchLengths trained;
    for (const auto& mb : split.microbatches) {
      for (auto s : mb.samples) {
        trained.input.push_back(std::min<std::uint32_t>(lengths.input[s], static_cast<std::uint32_t>(mb.padded_len)));
        if (lengths.encoder_decoder()) {
          trained.target.push_back(
              std::min<std::uint32_t>(lengths.target[s], static_cast<std::uint32_t>(mb.padded_dec_len)));
        }
      }
    }
    r.model_flops = batch_model_flops(cost.model(), vstages, trained);
  }
  partition_figures(split, r.packpipe);

  // 2. Schedule per data-parallel replica.
  t0 = std::chrono::steady_clock::now();
  const bool search = o.schedule == "search";
  const sched::ScheduleKind fixed_kind = search ? sched::ScheduleKind::OneFOneB : sched::schedule_kind_from_name(o.schedule);
  std::vector<pl::Schedule> schedules;
  std::vector<sched::StageCostTable> tables;
  std::vector<std::vector<part::MicroBatch>> replica_mbs;
  r.packpipe.feasible = true;
  r.packpipe.iteration_ms = 0;
  for (std::size_t k = 0; k < replicas(split); ++k) {
    replica_mbs.push_back(replica_microbatches(split, k));
    const auto& mbs = replica_mbs.back();
    PACKPIPE_CHECK_ARG(!mbs.empty(), "iteration {}: data-parallel replica {} of {} received no micro-batch "
                                     "({} micro-batches in all); use a larger global batch or a smaller --dp",
                       iteration, k, replicas(split), split.microbatches.size());
    tables.push_back(sched::stage_cost_table(cost, o.shape, vstages, mbs));
    const sched::SimProblem prob = sched::make_sim_problem(tables.back(), cost, o.shape);
    pl::Schedule s;
    if (search) {
      s = sched::search_schedule(prob, o.search).best;
    } else {
      std::string why;
      PACKPIPE_CHECK_ARG(sched::schedule_supports(fixed_kind, o.shape.stages, o.shape.chunks,
                                           static_cast<std::int64_t>(mbs.size()), &why),
                         "iteration {}: schedule '{}' cannot run {} micro-batches: {}", iteration, o.schedule,
                         mbs.size(), why);
      s = sched::make_schedule(fixed_kind, prob, {}, o.search.schedule_options);
    }
    account(s, o.shape, prob.memory_limit_bytes, r.packpipe);
    if (k == 0) r.packpipe.schedule = s.name;
    schedules.push_back(std::move(s));
  }
  r.schedule_ms = ms_since(t0);

  // 3. Instruction streams.
  t0 = std::chrono::steady_clock::now();
  std::vector<SampleRef> none;
  for (std::size_t k = 0; k < schedules.size(); ++k) {
    pl::PlanOptions po;
    po.iteration = iteration;
    po.hidden = cost.model().hidden;
    po.dtype = o.dtype;
    po.dp = static_cast<std::uint32_t>(o.shape.dp);
    po.global_tokens = r.tokens;
    po.memory_limit_bytes = static_cast<std::uint64_t>(sched::make_sim_problem(tables[k], cost, o.shape).memory_limit_bytes);
    po.sample_refs = refs;
    po.keep_timeline = o.keep_timeline;
    pl::Plan plan = make_plan(schedules[k], replica_mbs[k], vstages, &tables[k], po);
    plan.replica = static_cast<std::uint32_t>(k);
    if (o.validate) pl::validate_or_throw(plan);
    r.plans.push_back(std::move(plan));
  }
  r.build_ms = ms_since(t0);
  r.schedules = std::move(schedules);
  r.planning_ms = r.partition_ms + r.schedule_ms + r.build_ms;

  // 4. Baselines on the same batch.
  if (o.baselines) {
    r.fixed = baseline_grid(lengths, cost, vstages, o, part::PartitionMethod::Fixed, cache);
    r.packing = baseline_grid(lengths, cost, vstages, o, part::PartitionMethod::Packing, cache);
  }
  r.partition = std::move(split);
  return r;
}

}  // namespace packpipe::planner
