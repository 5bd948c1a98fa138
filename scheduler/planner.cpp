#include "scheduler/planner.h"

#include <algorithm>
#include <chrono>

#include "common/errors.h"
#include "scheduler/plan_builder.h"
#include "scheduler/schedules.h"
#include "scheduler/simulator.h"
#include "scheduler/validator.h"

namespace packpipe::scheduler {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// The micro-batches of one data-parallel replica.
std::vector<MicroBatch> replica_microbatches(const Partition& p, std::size_t replica) {
  std::vector<MicroBatch> out;
  if (p.ranks.empty()) {
    if (replica == 0) out = p.microbatches;
    return out;
  }
  for (auto i : p.ranks[replica]) out.push_back(p.microbatches[i]);
  return out;
}

std::size_t replicas(const Partition& p) { return p.ranks.empty() ? 1 : p.ranks.size(); }

/// A problem for one replica's micro-batches.
SimProblem replica_problem(const std::vector<MicroBatch>& mbs, const cm::CostModel& cost,
                           const std::vector<VirtualStage>& vstages, const PipelineShape& shape) {
  return make_sim_problem(stage_cost_table(cost, shape, vstages, mbs), cost, shape);
}

void account(const Schedule& s, const PipelineShape& shape, double limit_bytes, MethodFigures& f) {
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

void partition_figures(const Partition& p, MethodFigures& f) {
  f.microbatches = static_cast<std::int64_t>(p.microbatches.size());
  f.efficiency = p.efficiency;
}

/// One baseline method over the grid of micro-batch sizes.
BaselineGrid baseline_grid(const BatchLengths& lengths, const cm::CostModel& cost,
                           const std::vector<VirtualStage>& vstages, const PlannerOptions& o,
                           PartitionMethod method, PartitionCache* cache) {
  BaselineGrid g;
  for (std::int64_t m : o.baseline_mbs) {
    MethodFigures f;
    PartitionOptions po = o.partition;
    po.method = method;
    po.microbatch_size = m;
    po.pack_windows = false;
    po.cache = cache;
    try {
      const Partition p = partition(lengths, cost, o.shape, vstages, po);
      partition_figures(p, f);
      simulate_method(lengths, p, cost, vstages, o.shape, ScheduleKind::OneFOneB, f);
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
  check_shape(o.shape);
  for (std::size_t i = 0; i < o.baseline_mbs.size(); ++i) {
    PACKPIPE_CHECK_ARG(o.baseline_mbs[i] >= 1 && o.baseline_mbs[i] <= kMaxBaselineMbs,
                       "baseline micro-batch size {} (entry {} of baseline_mbs) must be in [1, {}]", o.baseline_mbs[i],
                       i, kMaxBaselineMbs);
  }
  if (o.schedule != "search") (void)schedule_kind_from_name(o.schedule);
}

double batch_model_flops(const cm::ModelSpec& model, const std::vector<VirtualStage>& vstages,
                         const BatchLengths& lengths) {
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

void simulate_method(const BatchLengths& lengths, const Partition& p, const cm::CostModel& cost,
                     const std::vector<VirtualStage>& vstages, const PipelineShape& shape, ScheduleKind kind,
                     MethodFigures& f) {
  (void)lengths;
  f.feasible = true;
  f.iteration_ms = 0;
  f.schedule = schedule_kind_name(kind);
  for (std::size_t r = 0; r < replicas(p); ++r) {
    const auto mbs = replica_microbatches(p, r);
    if (mbs.empty()) continue;
    const SimProblem prob = replica_problem(mbs, cost, vstages, shape);
    ScheduleKind k = kind;
    if (!schedule_supports(k, shape.stages, shape.chunks, static_cast<std::int64_t>(mbs.size()))) {
      k = ScheduleKind::GPipe;  // e.g. interleaving with a partial group: fall back, as a user must
    }
    const Schedule s = make_schedule(k, prob);
    account(s, shape, prob.memory_limit_bytes, f);
  }
}

IterationResult plan_iteration(const BatchLengths& lengths, const std::vector<SampleRef>* refs,
                               std::uint64_t iteration, const cm::CostModel& cost,
                               const std::vector<VirtualStage>& vstages, const PlannerOptions& o,
                               PartitionCache* cache) {
  check_planner_options(o);
  PACKPIPE_CHECK_ARG(lengths.size() > 0, "iteration {}: the global batch is empty", iteration);
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
  PartitionOptions popt = o.partition;
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
  const Partition part = partition(lengths, cost, o.shape, vstages, popt);
  r.partition_ms = ms_since(t0);
  if (!part.truncated.empty() || !part.dropped.empty()) {
    // The oversize policy changed the batch: count what is trained.
    r.samples = lengths.size() - part.dropped.size();
    r.truncated = part.truncated.size();
    r.dropped = part.dropped.size();
    r.tokens = part.input_tokens + part.target_tokens;
    BatchLengths trained;
    for (const auto& mb : part.microbatches) {
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
  partition_figures(part, r.packpipe);

  // 2. Schedule per data-parallel replica.
  t0 = std::chrono::steady_clock::now();
  const bool search = o.schedule == "search";
  const ScheduleKind fixed_kind = search ? ScheduleKind::OneFOneB : schedule_kind_from_name(o.schedule);
  std::vector<Schedule> schedules;
  std::vector<StageCostTable> tables;
  std::vector<std::vector<MicroBatch>> replica_mbs;
  r.packpipe.feasible = true;
  r.packpipe.iteration_ms = 0;
  for (std::size_t k = 0; k < replicas(part); ++k) {
    replica_mbs.push_back(replica_microbatches(part, k));
    const auto& mbs = replica_mbs.back();
    PACKPIPE_CHECK_ARG(!mbs.empty(), "iteration {}: data-parallel replica {} of {} received no micro-batch "
                                     "({} micro-batches in all); use a larger global batch or a smaller --dp",
                       iteration, k, replicas(part), part.microbatches.size());
    tables.push_back(stage_cost_table(cost, o.shape, vstages, mbs));
    const SimProblem prob = make_sim_problem(tables.back(), cost, o.shape);
    Schedule s;
    if (search) {
      s = search_schedule(prob, o.search).best;
    } else {
      std::string why;
      PACKPIPE_CHECK_ARG(schedule_supports(fixed_kind, o.shape.stages, o.shape.chunks,
                                           static_cast<std::int64_t>(mbs.size()), &why),
                         "iteration {}: schedule '{}' cannot run {} micro-batches: {}", iteration, o.schedule,
                         mbs.size(), why);
      s = make_schedule(fixed_kind, prob, {}, o.search.schedule_options);
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
    PlanOptions po;
    po.iteration = iteration;
    po.hidden = cost.model().hidden;
    po.dtype = o.dtype;
    po.dp = static_cast<std::uint32_t>(o.shape.dp);
    po.global_tokens = r.tokens;
    po.memory_limit_bytes = static_cast<std::uint64_t>(make_sim_problem(tables[k], cost, o.shape).memory_limit_bytes);
    po.sample_refs = refs;
    po.keep_timeline = o.keep_timeline;
    Plan plan = build_plan(schedules[k], replica_mbs[k], vstages, &tables[k], po);
    plan.replica = static_cast<std::uint32_t>(k);
    if (o.validate) validate_or_throw(plan);
    r.plans.push_back(std::move(plan));
  }
  r.build_ms = ms_since(t0);
  r.schedules = std::move(schedules);
  r.planning_ms = r.partition_ms + r.schedule_ms + r.build_ms;

  // 4. Baselines on the same batch.
  if (o.baselines) {
    r.fixed = baseline_grid(lengths, cost, vstages, o, PartitionMethod::Fixed, cache);
    r.packing = baseline_grid(lengths, cost, vstages, o, PartitionMethod::Packing, cache);
  }
  return r;
}

}  // namespace packpipe::scheduler
