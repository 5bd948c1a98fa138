#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <tuple>

#include "common/errors.h"
#include "common/rng.h"
#include "costmodel/stage_ops.h"
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
  out.reserve(p.ranks[replica].size());
  for (auto i : p.ranks[replica]) out.push_back(p.microbatches[i]);
  return out;
}

std::size_t replicas(const part::Partition& p) { return p.ranks.empty() ? 1 : p.ranks.size(); }

/// Whether replica_microbatches(p, replica) is every micro-batch of `p` in its order.
bool whole_replica(const part::Partition& p, std::size_t replica) {
  if (p.ranks.empty()) return replica == 0;
  const auto& list = p.ranks[replica];
  if (list.size() != p.microbatches.size()) return false;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i] != i) return false;
  }
  return true;
}

/// The slice links of one replica's micro-batches (its list keeps their order), for the schedule.
std::vector<std::pair<std::uint32_t, std::uint32_t>> microbatch_slice_edges(const std::vector<part::MicroBatch>& mbs,
                                                                            const part::Partition& split) {
  const bool sliced = std::any_of(mbs.begin(), mbs.end(), [](const part::MicroBatch& mb) { return mb.has_slices(); });
  if (!sliced) return {};
  PACKPIPE_ASSERT(!split.lengths.input.empty());
  return part::slice_edges(mbs, split.lengths.input);
}

/// A problem for one replica's micro-batches.
sched::SimProblem replica_problem(const std::vector<part::MicroBatch>& mbs, const cm::CostModel& cost,
                           const std::vector<part::VirtualStage>& vstages, const part::PipelineShape& shape,
                           const part::Partition& split) {
  sched::SimProblem p = sched::make_sim_problem(sched::stage_cost_table(cost, shape, vstages, mbs), cost, shape);
  p.slice_edges = microbatch_slice_edges(mbs, split);
  return p;
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

}  // namespace

void check_planner_options(const PlannerOptions& o) {
  part::check_shape(o.shape);
  PACKPIPE_CHECK_ARG(std::isfinite(o.min_gain) && o.min_gain >= 0 && o.min_gain < 1,
                     "min_gain: packpipe's least gain over the best baseline is a fraction in [0, 1), found {}",
                     o.min_gain);
  PACKPIPE_CHECK_ARG(pl::is_float(o.dtype), "dtype (--dtype): activations are fp16, bf16, fp32 or fp64, found {}",
                     pl::dtype_name(o.dtype));
  for (std::size_t i = 0; i < o.baseline_mbs.size(); ++i) {
    PACKPIPE_CHECK_ARG(o.baseline_mbs[i] >= 1 && o.baseline_mbs[i] <= kMaxBaselineMbs,
                       "baseline micro-batch size {} (entry {} of baseline_mbs / --baseline-mbs) must be in [1, {}]",
                       o.baseline_mbs[i], i, kMaxBaselineMbs);
  }
  for (std::size_t i = 0; i < o.baseline_rows.size(); ++i) {
    PACKPIPE_CHECK_ARG(o.baseline_rows[i] >= 1 && o.baseline_rows[i] <= kMaxBaselineMbs,
                       "baseline rows per micro-batch {} (entry {} of baseline_rows / --baseline-rows) must be in "
                       "[1, {}]",
                       o.baseline_rows[i], i, kMaxBaselineMbs);
  }
  if (o.schedule != "search") {
    const sched::ScheduleKind k = sched::schedule_kind_from_name(o.schedule);
    PACKPIPE_CHECK_ARG(o.allow_split_backward || k != sched::ScheduleKind::ZeroBubble,
                       "schedule 'zero-bubble' splits the backward, which split_backward=False (--no-split-backward) "
                       "forbids; allow a split backward or name another schedule");
    PACKPIPE_CHECK_ARG(in_family(k, o.family),
                       "schedule '{}' is not in the required family '{}' (schedule_family / --schedule-family)",
                       o.schedule, enum_name(kScheduleFamilyNames, o.family));
  }
  PACKPIPE_CHECK_ARG(!allowed_schedules(o).empty(), "no schedule is allowed: the family '{}' (schedule_family / "
                     "--schedule-family){} and the search's candidates leave none",
                     enum_name(kScheduleFamilyNames, o.family),
                     o.allow_split_backward ? "" : " without a split backward (split_backward=False / "
                                                   "--no-split-backward)");
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
    const sched::SimProblem prob = replica_problem(mbs, cost, vstages, shape, p);
    sched::ScheduleKind k = kind;
    if (!sched::schedule_supports(k, prob)) {
      k = sched::ScheduleKind::GPipe;  // e.g. interleaving with a partial group: fall back, as a user must
    }
    const pl::Schedule s = sched::make_schedule(k, prob);
    account(s, shape, prob.memory_limit_bytes, f);
  }
}

std::uint32_t sample_loss_tokens(const part::BatchLengths& lengths, std::uint32_t s) {
  if (!lengths.loss.empty()) return lengths.loss[s];
  if (lengths.encoder_decoder()) return lengths.target[s];
  return lengths.input[s] > 0 ? lengths.input[s] - 1 : 0;
}

std::uint32_t slice_loss_tokens(const part::BatchLengths& lengths, std::uint32_t s, std::uint32_t begin,
                                std::uint32_t length) {
  // A decoder-only sample's loss positions are the suffix [L - 1 - loss, L - 2] of its L tokens in
  // either loss mode (every next token, or the target tokens after the input; truncation and chunks
  // keep it a suffix): a slice trains those inside [begin, begin + length).
  const std::int64_t L = lengths.input[s], loss = sample_loss_tokens(lengths, s);
  const std::int64_t lo = std::max<std::int64_t>(L - 1 - loss, begin);
  const std::int64_t hi = std::min<std::int64_t>(L - 1, std::int64_t{begin} + length);  // exclusive
  return hi > lo ? static_cast<std::uint32_t>(hi - lo) : 0;
}

std::vector<pl::StageInfo> stage_infos(const std::vector<part::VirtualStage>& vstages, std::int64_t ranks) {
  std::vector<pl::StageInfo> stages(vstages.size());
  std::uint32_t enc = 0, dec = 0;
  for (std::size_t v = 0; v < vstages.size(); ++v) {
    const part::VirtualStage& vs = vstages[v];
    PACKPIPE_CHECK_ARG(vs.index == static_cast<std::int64_t>(v), "build_plan: virtual stage {} has index {}", v, vs.index);
    PACKPIPE_CHECK_ARG(vs.rank >= 0 && vs.rank < ranks, "build_plan: virtual stage {} on rank {} of {}", v, vs.rank,
                       ranks);
    pl::StageInfo& st = stages[v];
    st.rank = static_cast<std::uint32_t>(vs.rank);
    st.encoder_begin = enc;
    st.encoder_layers = static_cast<std::uint32_t>(vs.layout.encoder_layers);
    st.decoder_begin = dec;
    st.decoder_layers = static_cast<std::uint32_t>(vs.layout.decoder_layers);
    // The decoder of an encoder-decoder model embeds its own inputs on its first stage.
    st.embedding = vs.layout.has_embedding || (vs.layout.decoder_layers > 0 && dec == 0 && enc > 0);
    st.head = vs.layout.has_postprocess;
    enc += st.encoder_layers;
    dec += st.decoder_layers;
  }
  return stages;
}

pl::Plan make_plan(const pl::Schedule& schedule, const std::vector<part::MicroBatch>& mbs,
                   const std::vector<part::VirtualStage>& vstages, const part::BatchLengths& lengths,
                   const sched::StageCostTable* costs, const pl::PlanOptions& options) {
  const std::vector<pl::StageInfo> stages = stage_infos(vstages, schedule.ranks);
  PACKPIPE_CHECK_ARG(lengths.loss.empty() || lengths.loss.size() == lengths.size(),
                     "build_plan: {} loss token counts for {} samples", lengths.loss.size(), lengths.size());
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
    mb.layout = in.layout;
    mb.rows = static_cast<std::uint32_t>(in.rows());
    mb.padded_len = static_cast<std::uint32_t>(in.padded_len);
    mb.padded_dec_len = static_cast<std::uint32_t>(in.padded_dec_len);
    mb.tokens = in.tokens;
    PACKPIPE_CHECK_ARG(!in.has_slices() || in.spans.size() == in.samples.size(),
                       "build_plan: micro-batch {} has {} spans for {} samples", m, in.spans.size(), in.samples.size());
    for (std::size_t i = 0; i < in.samples.size(); ++i) {
      const std::uint32_t s = in.samples[i];
      PACKPIPE_CHECK_ARG(s < lengths.size(), "build_plan: micro-batch {} names sample {} of a batch of {}", m, s,
                         lengths.size());
      if (in.has_slices()) {
        const part::Span sp = in.spans[i];
        mb.lengths.push_back(sp.length);
        mb.loss_tokens += slice_loss_tokens(lengths, s, sp.begin, sp.length);
        continue;
      }
      mb.lengths.push_back(lengths.input[s]);
      if (lengths.encoder_decoder()) mb.target_lengths.push_back(lengths.target[s]);
      mb.loss_tokens += sample_loss_tokens(lengths, s);
    }
    recompute[m] = in.recompute;
  }
  // Slices: each entry's prefix and the micro-batch (in this list) holding its sample's previous
  // slice; micro-batches without a later slice keep empty tables.
  std::map<std::uint32_t, std::pair<std::uint32_t, std::uint64_t>> last;  // sample -> (micro-batch, end)
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    const part::MicroBatch& in = mbs[m];
    if (!in.has_slices()) continue;
    pl::PlanMicroBatch& mb = out[m];
    std::vector<std::uint32_t> prefix(in.samples.size(), 0), prev(in.samples.size(), pl::kNoSlice);
    bool linked = false;
    for (std::size_t i = 0; i < in.samples.size(); ++i) {
      const part::Span sp = in.spans[i];
      if (sp.begin == 0 && sp.length == lengths.input[in.samples[i]]) continue;  // a whole sample
      prefix[i] = sp.begin;
      if (sp.begin > 0) {
        const auto it = last.find(in.samples[i]);
        PACKPIPE_CHECK_ARG(it != last.end() && it->second.second == sp.begin,
                           "build_plan: micro-batch {}: the slice of sample {} from token {} follows no slice ending "
                           "there in an earlier micro-batch",
                           m, in.samples[i], sp.begin);
        prev[i] = it->second.first;
        linked = true;
      }
      last[in.samples[i]] = {static_cast<std::uint32_t>(m), std::uint64_t{sp.begin} + sp.length};
    }
    if (linked) {
      mb.prefix = std::move(prefix);
      mb.prev = std::move(prev);
    }
  }
  if (costs == nullptr) return pl::build_plan(schedule, std::move(out), recompute, stages, nullptr, options);
  PACKPIPE_CHECK_ARG(costs->microbatches == static_cast<std::int64_t>(mbs.size()) &&
                         costs->vstages == static_cast<std::int64_t>(vstages.size()),
                     "build_plan: cost table is {} micro-batches x {} stages, expected {} x {}", costs->microbatches,
                     costs->vstages, mbs.size(), vstages.size());
  const pl::MemoryFigures memory{costs->stored_bytes, costs->peak_bytes, costs->static_bytes};
  return pl::build_plan(schedule, std::move(out), recompute, stages, &memory, options);
}

part::BatchLengths trained_lengths(const part::BatchLengths& lengths, const part::Partition& split) {
  part::BatchLengths t = split.lengths;
  if (t.input.size() != lengths.size()) t = lengths;  // a partition that keeps no lengths (evaluate_partition)
  t.loss.resize(lengths.size());
  for (std::uint32_t s = 0; s < lengths.size(); ++s) {
    std::uint32_t l = sample_loss_tokens(lengths, s);
    if (lengths.encoder_decoder()) {
      l = std::min(l, t.target[s]);
    } else if (t.input[s] < lengths.input[s]) {
      // Truncation cuts k tokens off the end; each took one loss position with it (its label, or
      // the previous position's), in either loss mode.
      const std::uint32_t k = lengths.input[s] - t.input[s];
      l = l > k ? l - k : 0;
    }
    t.loss[s] = l;
  }
  return t;
}

namespace {

// Loss tokens of every sample some micro-batch trains (dropped samples carry none; a sliced sample
// counts once).
std::uint64_t global_loss_tokens(const part::BatchLengths& trained, const part::Partition& split) {
  std::uint64_t n = 0;
  std::vector<char> seen(trained.size(), 0);
  for (const auto& mb : split.microbatches) {
    for (auto s : mb.samples) {
      if (s < seen.size() && seen[s]) continue;
      if (s < seen.size()) seen[s] = 1;
      n += trained.loss[s];
    }
  }
  return n;
}

}  // namespace

std::vector<sched::ScheduleKind> allowed_schedules(const PlannerOptions& o) {
  std::vector<sched::ScheduleKind> out;
  const auto& given = o.search.schedules;
  for (sched::ScheduleKind k : sched::all_schedule_kinds()) {
    if (!given.empty() && std::find(given.begin(), given.end(), k) == given.end()) continue;
    if (!o.allow_split_backward && k == sched::ScheduleKind::ZeroBubble) continue;
    if (!in_family(k, o.family)) continue;
    out.push_back(k);
  }
  return out;
}

bool in_family(sched::ScheduleKind k, ScheduleFamily f) {
  switch (f) {
    case ScheduleFamily::Any: return true;
    case ScheduleFamily::OneFOneB: return k == sched::ScheduleKind::OneFOneB || k == sched::ScheduleKind::Interleaved1F1B;
    case ScheduleFamily::GPipe: return k == sched::ScheduleKind::GPipe;
    case ScheduleFamily::Cyclic: return k == sched::ScheduleKind::Cyclic || k == sched::ScheduleKind::WaitFreeCyclic;
    case ScheduleFamily::ZeroBubble: return k == sched::ScheduleKind::ZeroBubble;
  }
  return false;
}

namespace {

constexpr double kInfMs = std::numeric_limits<double>::infinity();

/// Kinds by name, comma-separated.
std::string kind_names(const std::vector<sched::ScheduleKind>& kinds) {
  std::string out;
  for (sched::ScheduleKind k : kinds) out += (out.empty() ? "" : ", ") + std::string(sched::schedule_kind_name(k));
  return out;
}

/// The allowed kinds that run `o`'s shape (1F1B needs one chunk, interleaved 1F1B more).
std::vector<sched::ScheduleKind> usable_schedules(const PlannerOptions& o) {
  std::vector<sched::ScheduleKind> out;
  for (sched::ScheduleKind k : allowed_schedules(o)) {
    if (sched::schedule_supports(k, o.shape.stages, o.shape.chunks, o.shape.stages)) out.push_back(k);
  }
  return out;
}

/// One partition scheduled: per replica its micro-batches, cost table and schedule, and the figures.
struct Scheduled {
  std::vector<std::vector<part::MicroBatch>> replica_mbs;
  std::vector<sched::StageCostTable> tables;
  std::vector<pl::Schedule> schedules;
  MethodFigures figures;
  std::string note;        ///< why a named schedule was not used
  bool scheduled = false;  ///< false: a replica's lower bound reached `bound`, or it cannot be run
  /// Unscheduled because a lower bound of its work (makespan_lower_bounds) reached `bound`: the
  /// same micro-batches with more work (more recomputed) cannot beat it either.
  bool bounded = false;
};

/// Schedules every replica of `split` as the plan would be: the named schedule (PlannerOptions::
/// schedule) where it runs the replica's micro-batch count, else the search over the allowed
/// schedules (with PlannerOptions::fallback; without it a named schedule that cannot run is an
/// error for packpipe's own partition (`own`) and an unschedulable candidate otherwise). Stops,
/// unscheduled, at a replica whose makespan lower bound is at least `bound`, or whose search finds
/// no schedule under it (SearchOptions::cutoff_ms).
Scheduled schedule_partition(const part::Partition& split, const cm::CostModel& cost,
                             const std::vector<part::VirtualStage>& vstages, const PlannerOptions& o,
                             std::uint64_t iteration, double bound, bool own) {
  Scheduled out;
  const bool named = o.schedule != "search";
  const sched::ScheduleKind fixed_kind = named ? sched::schedule_kind_from_name(o.schedule) : sched::ScheduleKind::OneFOneB;
  sched::SearchOptions search_opts = o.search;
  search_opts.schedules = allowed_schedules(o);
  // The model's error margin holds for the schedule too: another kind or order replaces the
  // reference (1F1B, interleaved with chunks, over the given order) only when min_gain faster.
  search_opts.margin = o.min_gain;
  out.figures.feasible = true;
  out.figures.iteration_ms = 0;
  for (std::size_t k = 0; k < replicas(split); ++k) {
    // (a replica of every micro-batch in order is read in place until the bound is passed)
    std::vector<part::MicroBatch> copy;
    const bool whole = whole_replica(split, k);
    if (!whole) copy = replica_microbatches(split, k);
    const auto& view = whole ? split.microbatches : copy;
    if (bound < kInfMs && !view.empty()) {
      // (a candidate whose rank work alone reaches the bound stops after the entries that show it)
      std::optional<sched::StageCostTable> t = sched::stage_cost_table_below(cost, o.shape, vstages, view, bound);
      if (!t) {
        out.bounded = true;
        return out;
      }
      out.tables.push_back(std::move(*t));
    } else {
      out.tables.push_back(sched::stage_cost_table(cost, o.shape, vstages, view));
    }
    out.replica_mbs.push_back(whole ? split.microbatches : std::move(copy));
    const auto& mbs = out.replica_mbs.back();
    if (mbs.empty()) {
      // A replica without a sample (fewer micro-batches, or slice groups, than replicas) still
      // takes part in the step: its plan reduces zero gradients and steps (issue 30).
      pl::Schedule empty;
      empty.name = sched::schedule_kind_name(named ? fixed_kind : sched::ScheduleKind::OneFOneB);
      empty.ranks = static_cast<std::uint32_t>(o.shape.stages);
      empty.ops.resize(static_cast<std::size_t>(o.shape.stages));
      empty.peak_bytes.assign(out.tables.back().static_bytes.begin(), out.tables.back().static_bytes.end());
      account(empty, o.shape, 0, out.figures);
      out.schedules.push_back(std::move(empty));
      continue;
    }
    sched::SimProblem prob = sched::make_sim_problem(out.tables.back(), cost, o.shape);
    prob.slice_edges = microbatch_slice_edges(mbs, split);
    if (sched::makespan_lower_bounds(prob).value() >= bound) {
      out.bounded = true;
      return out;
    }
    std::string why;
    const bool fits = named && sched::schedule_supports(fixed_kind, prob, &why);
    if (!fits && !std::any_of(search_opts.schedules.begin(), search_opts.schedules.end(),
                              [&](sched::ScheduleKind kind) { return sched::schedule_supports(kind, prob); })) {
      // No allowed kind runs these micro-batches (a list of interleaved 1F1B only, and a count
      // that is not a multiple of the stages, or slices): packpipe's own is an error, a candidate
      // cannot run.
      const std::string msg = fmt::format(
          "iteration {}: no allowed schedule ({}) can run {} micro-batches on {} ranks x {} chunks{}", iteration,
          kind_names(usable_schedules(o)), mbs.size(), o.shape.stages, o.shape.chunks,
          prob.has_slices() ? " with slices (interleaved 1F1B does not run them)" : "");
      PACKPIPE_CHECK_ARG(!own, "{}", msg);
      out.figures.feasible = false;
      out.figures.why = msg;
      return out;
    }
    if (named && !fits && !o.fallback) {
      const std::string msg = fmt::format("iteration {}: schedule '{}' cannot run {} micro-batches: {} (allow a "
                                          "fallback to the search, schedule_fallback=True / --schedule-fallback, to "
                                          "plan such iterations with another schedule)",
                                          iteration, o.schedule, mbs.size(), why);
      PACKPIPE_CHECK_ARG(!own, "{}", msg);
      out.figures.feasible = false;
      out.figures.why = msg;
      return out;
    }
    pl::Schedule s;
    if (fits) {
      s = sched::make_schedule(fixed_kind, prob, {}, o.search.schedule_options);
    } else {
      if (named && out.note.empty()) {
        out.note = fmt::format("schedule '{}' cannot run {} micro-batches ({}): searched the allowed schedules "
                               "instead", o.schedule, mbs.size(), why);
      }
      // (a candidate must beat `bound`: the search stops every evaluation that cannot, and reports
      // when none could)
      search_opts.cutoff_ms = bound;
      sched::SearchResult found = sched::search_schedule(prob, search_opts);
      if (!found.found_below_cutoff) return out;
      s = std::move(found.best);
    }
    account(s, o.shape, prob.memory_limit_bytes, out.figures);
    if (k == 0) out.figures.schedule = s.name;
    out.schedules.push_back(std::move(s));
  }
  out.scheduled = true;
  return out;
}

/// A hash of a partition's micro-batches (samples, rows, layout, recompute) and its replicas:
/// two baselines with the same key are scheduled alike.
std::uint64_t partition_key(const part::Partition& p) {
  std::uint64_t h = kSplitMixGamma;
  auto mix = [&h](std::uint64_t x) { h = mix_combine(h, x); };
  for (const auto& mb : p.microbatches) {
    mix(mb.samples.size());
    for (auto s : mb.samples) mix(s);
    mix(mb.row_offsets.size());
    for (auto x : mb.row_offsets) mix(x);
    mix(mb.spans.size());
    for (const auto& sp : mb.spans) mix(std::uint64_t{sp.begin} << 32 | sp.length);
    mix(static_cast<std::uint64_t>(mb.layout) << 8 | static_cast<std::uint64_t>(mb.recompute));
  }
  for (const auto& rank : p.ranks) {
    mix(rank.size());
    for (auto m : rank) mix(m);
  }
  return h;
}

/// The options a baseline is scheduled under as its system runs it (BaselineSchedule::AsRun): the
/// named schedule, else 1F1B (interleaved 1F1B with chunks) over its order, with the search (noted)
/// where that cannot run the micro-batch count. A trainer that does not run 1F1B has its baselines
/// searched within what it runs, so packpipe's plan is never slower than one as run either.
PlannerOptions as_run_options(const PlannerOptions& o, const std::vector<part::VirtualStage>& vstages) {
  PlannerOptions run = o;
  const bool chunks = static_cast<std::int64_t>(vstages.size()) > o.shape.stages;
  const sched::ScheduleKind reference = chunks ? sched::ScheduleKind::Interleaved1F1B : sched::ScheduleKind::OneFOneB;
  const auto allowed = allowed_schedules(o);
  if (o.schedule == "search" && std::find(allowed.begin(), allowed.end(), reference) != allowed.end()) {
    run.schedule = sched::schedule_kind_name(reference);
    run.fallback = true;
  }
  return run;
}

/// A baseline's figures under `run` (as_run_options); of a slicing baseline's alternatives (the same
/// slices, more recomputed), the fastest that fits. `scheduled`: whether a schedule ran (false:
/// figures.why).
MethodFigures as_run_figures(const part::Partition& bp, const cm::CostModel& cost,
                             const std::vector<part::VirtualStage>& vstages, const PlannerOptions& run,
                             std::uint64_t iteration, bool& scheduled) {
  scheduled = false;
  auto figures = [&](const part::Partition& p) {
    Scheduled s = schedule_partition(p, cost, vstages, run, iteration, kInfMs, false);
    partition_figures(p, s.figures);
    scheduled = scheduled || s.scheduled;
    return s.figures;
  };
  MethodFigures out = figures(bp);
  for (const part::Partition& alt : bp.alternatives) {
    MethodFigures a = figures(alt);
    if (a.feasible && (!out.feasible || a.iteration_ms < out.iteration_ms)) out = std::move(a);
  }
  return out;
}

/// Whether a plan may hold slices under `o`'s schedules: the named one's, without the fallback;
/// else some of the `usable` kinds (usable_schedules) runs them.
bool slices_runnable(const PlannerOptions& o, const std::vector<sched::ScheduleKind>& usable) {
  if (o.schedule != "search" && !o.fallback) {
    return sched::schedule_runs_slices(sched::schedule_kind_from_name(o.schedule));
  }
  return std::any_of(usable.begin(), usable.end(), [](sched::ScheduleKind k) { return sched::schedule_runs_slices(k); });
}

/// The baseline grid's options from the planner's.
part::BaselineGridOptions baseline_grid_options(const PlannerOptions& o) {
  part::BaselineGridOptions g;
  g.microbatch_sizes = o.baseline_mbs;
  g.rows = o.baseline_rows;
  g.layouts = o.partition.layouts;
  g.round_multiple = o.partition.round_multiple;
  g.longest = o.baseline_longest;
  g.longest_target = o.baseline_longest_target;
  g.slicing = o.partition.slicing == part::SlicePolicy::Auto || o.partition.oversize == part::OversizePolicy::Slice;
  g.min_slice_tokens = o.partition.min_slice_tokens;
  return g;
}

}  // namespace

namespace {

// plan_iteration of a batch within the context length; `positions` (optional) gives each sample's
// position in the batch as the caller gave it, for messages.
IterationResult plan_within_context(const part::BatchLengths& lengths, const std::vector<SampleRef>* refs,
                                    std::uint64_t iteration, const cm::CostModel& cost,
                                    const std::vector<part::VirtualStage>& vstages, const PlannerOptions& o,
                                    part::PartitionCache* cache, const std::vector<std::uint32_t>* positions) {
  PACKPIPE_CHECK_ARG(!o.tied_embedding || cost.model().arch == cm::Architecture::DecoderOnly || vstages.size() == 1,
                     "a tied embedding is supported for decoder-only models (an encoder-decoder model ties three "
                     "weights across its pipeline); plan without tied_embedding (--tied-embedding)");
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
  const std::vector<sched::ScheduleKind> usable = usable_schedules(o);
  if (o.schedule != "search" ? sched::schedule_kind_from_name(o.schedule) == sched::ScheduleKind::Interleaved1F1B
                             : usable.size() == 1 && usable.front() == sched::ScheduleKind::Interleaved1F1B) {
    // Interleaved 1F1B (named, or the only allowed kind that runs the chunks, as for the 1F1B
    // family with chunks) runs a multiple of the stages on every replica: the partition's count
    // belongs in the search, not in a fallback (with dp > 1 the replicas receive equal counts).
    popt.count_multiple = o.shape.stages * o.shape.dp;
  }
  // Slices are a planning choice, never forced: not one the schedules the plan may use cannot run
  // (interleaved 1F1B, named without the fallback or the only kind usable). Then a sample that
  // fits only sliced is refused, and the message says why.
  const bool no_slices = !slices_runnable(o, usable) && cost.model().arch != cm::Architecture::EncoderDecoder;
  if (no_slices) {
    popt.slices_refused = "are not run by interleaved-1f1b, the only schedule this plan may use: allow others, or "
                          "the fallback with --schedule-fallback / schedule_fallback=True";
  }
  if (!popt.describe_sample) {
    // A sample as the user knows it: its task and index in the dataset, not its place in the batch.
    popt.describe_sample = [&](std::uint32_t s) {
      if (refs == nullptr) {
        return fmt::format("iteration {}, sample {} of the global batch", iteration,
                           positions != nullptr ? (*positions)[s] : s);
      }
      const SampleRef& ref = (*refs)[s];
      const std::string task = ref.task < o.task_names.size() ? fmt::format("task '{}'", o.task_names[ref.task])
                                                              : fmt::format("task {}", ref.task);
      return fmt::format("iteration {}, {}, dataset sample {}{}", iteration, task, ref.index,
                         ref.offset > 0 ? fmt::format(" (its chunk from token {})", ref.offset) : std::string());
    };
  }
  // A sample packpipe's own slicing cannot fit (its finer cuts keep more of the sample's keys and
  // values) may still fit under a slicing baseline's longer slices: with candidates, their grid
  // gets the batch before the refusal stands (it is raised when none plans it).
  const bool candidates_may_plan =
      o.partition.method == part::PartitionMethod::DP && o.partition.oversize == part::OversizePolicy::Slice;
  part::Partition split;
  std::optional<InvalidArgument> own_refused;
  try {
    split = part::partition(lengths, cost, o.shape, vstages, popt);
  } catch (const InvalidArgument& e) {
    if (!candidates_may_plan) throw;
    own_refused.emplace(e);
  }
  r.partition_ms = ms_since(t0);
  r.source = part::partition_method_name(o.partition.method);
  // Every sample dropped by the oversize policy: nothing to plan (a plan of 0 tokens, which its own
  // validator refuses, was written with exit status 0).
  PACKPIPE_CHECK_ARG(own_refused || split.dropped.size() < lengths.size(),
                     "iteration {}: every sample of the global batch was dropped by {} drop: none fits in the memory "
                     "limit alone; use more stages or tp, a larger memory limit, recompute, or {} slice or truncate",
                     iteration, o.partition.oversize_option, o.partition.oversize_option);

  // 2. Schedule per data-parallel replica.
  t0 = std::chrono::steady_clock::now();
  Scheduled best;
  best.figures.feasible = false;
  if (!own_refused) best = schedule_partition(split, cost, vstages, o, iteration, kInfMs, true);
  // The dp method's other candidates (other micro-batch counts, sliced or not): its objective is
  // the 1F1B bound, and a schedule that fills bubbles may run another of them faster. The fastest
  // simulated is packpipe's plan (a candidate whose makespan lower bound cannot beat it is pruned).
  std::vector<part::Partition> alternatives = std::move(split.alternatives);
  split.alternatives.clear();
  // (When the plan's own micro-batches do not fit the schedule's memory, a feasible alternative, such
  // as the same slices recomputed more, replaces them.)
  for (auto& alt : alternatives) {
    const bool feasible = best.scheduled && best.figures.feasible;
    Scheduled c = schedule_partition(alt, cost, vstages, o, iteration, feasible ? best.figures.iteration_ms : kInfMs,
                                     false);
    if (c.scheduled && c.figures.feasible && (!feasible || c.figures.iteration_ms < best.figures.iteration_ms)) {
      best = std::move(c);
      split = std::move(alt);
    }
  }
  r.schedule_note = best.note;
  r.schedule_ms = ms_since(t0);

  // 3. The baselines' plans: candidates for the plan under the same schedule search (a faster one is
  // the plan: never slower than a baseline on the cost model, by construction), and the report's
  // figures under baseline_schedule.
  t0 = std::chrono::steady_clock::now();
  // (Only for packpipe's own method: a method the user names is the plan's.)
  const bool candidates = o.partition.method == part::PartitionMethod::DP;
  // The searched report schedules every setting fully; otherwise the candidates are scheduled as
  // without a report (pruned by what they must beat) and the report takes each setting as run.
  const bool searched_report = o.baselines && o.baseline_schedule == BaselineSchedule::Search;
  std::map<std::uint64_t, Scheduled> scheduled_partitions;  // by partition_key
  std::map<std::uint64_t, BaselineFigures> as_run;          // by partition_key: the as-run report's figures
  std::optional<PlannerOptions> run;                        // the as-run report's options, once per batch
  if (o.baselines && !searched_report) run = as_run_options(o, vstages);
  for (const part::Baseline& b : part::baseline_grid(lengths, baseline_grid_options(o))) {
    const bool candidate = candidates && has_layout(o.partition.layouts, b.layout);
    if (!o.baselines && !candidate) continue;
    BaselineFigures f;
    f.baseline = b;
    f.candidate = candidate;
    f.figures.feasible = false;
    part::Partition bp;
    part::PartitionOptions bo = b.options(popt);
    // Without a report, a slicing baseline's recompute variants are made only once its own slices
    // pass the lower bounds (more recompute, more work: a pruned one prunes its variants).
    const bool lazy_variants = !o.baselines && b.method == part::PartitionMethod::Slicing;
    if (lazy_variants) bo.recompute_variants = false;
    try {
      bp = part::partition(lengths, cost, o.shape, vstages, bo);
    } catch (const InvalidArgument& e) {
      f.figures.why = e.what();
      if (o.baselines) r.baselines.push_back(std::move(f));
      continue;
    }
    const std::uint64_t key = partition_key(bp);
    const auto same = scheduled_partitions.find(key);
    if (!searched_report && o.baselines) {  // as run: the figure of the first setting with these micro-batches
      const auto [it, fresh] = as_run.try_emplace(key);
      if (fresh) it->second.figures = as_run_figures(bp, cost, vstages, *run, iteration, it->second.scheduled);
      f.scheduled = it->second.scheduled;
      f.figures = it->second.figures;
      r.baselines.push_back(std::move(f));
    }
    // Without the searched report, a candidate whose micro-batches another setting gave already is
    // not scheduled again (its schedules would be the same), nor any other setting.
    if (!searched_report && (!candidate || same != scheduled_partitions.end())) continue;
    // What a baseline must beat: another baseline's makespan, or packpipe's own discounted by min_gain.
    const double to_beat = !best.figures.feasible ? kInfMs
                           : r.from_baseline      ? best.figures.iteration_ms
                                                  : best.figures.iteration_ms / (1.0 - o.min_gain);
    Scheduled c;
    if (same != scheduled_partitions.end()) {
      c = same->second;
    } else {
      // In full for the searched report, else only while its lower bound can beat the plan; a slicing
      // baseline's same slices with more of them recomputed are tried too, and the fastest is its plan.
      const double bound = searched_report ? kInfMs : to_beat;
      c = schedule_partition(bp, cost, vstages, o, iteration, bound, false);
      if (lazy_variants && !c.bounded) {
        bo.recompute_variants = true;
        bp.alternatives = part::partition(lengths, cost, o.shape, vstages, bo).alternatives;
      }
      std::vector<part::Partition> alts = std::move(bp.alternatives);
      bp.alternatives.clear();
      for (part::Partition& alt : alts) {
        const double beat = c.scheduled && c.figures.feasible ? std::min(bound, c.figures.iteration_ms) : bound;
        Scheduled a = schedule_partition(alt, cost, vstages, o, iteration, beat, false);
        if (a.scheduled && a.figures.feasible && (!c.scheduled || !c.figures.feasible ||
                                                  a.figures.iteration_ms < c.figures.iteration_ms)) {
          c = std::move(a);
          bp = std::move(alt);
        }
      }
      scheduled_partitions.emplace(key, searched_report ? c : Scheduled{});
    }
    if (searched_report) {
      f.scheduled = c.scheduled;
      f.figures = c.figures;
      partition_figures(bp, f.figures);
      r.baselines.push_back(std::move(f));
    }
    // A baseline's plan is a candidate when its layout is one the executor runs (layouts).
    if (candidate && c.scheduled && c.figures.feasible && c.figures.iteration_ms < to_beat) {
      best = std::move(c);
      split = std::move(bp);
      r.source = b.label();
      r.from_baseline = true;
    }
  }
  r.candidates_ms = ms_since(t0);
  if (own_refused && !r.from_baseline) throw *own_refused;  // no candidate planned the batch either
  r.packpipe = best.figures;
  partition_figures(split, r.packpipe);
  if (r.from_baseline) r.schedule_note = best.note;
  if (!split.truncated.empty() || !split.dropped.empty()) {
    // The oversize policy changed the batch: count what is trained (the partition's lengths).
    r.samples = lengths.size() - split.dropped.size();
    r.truncated = split.truncated.size();
    r.dropped = split.dropped.size();
    r.tokens = split.input_tokens + split.target_tokens;
    part::BatchLengths kept;
    std::vector<char> seen(lengths.size(), 0);
    for (const auto& mb : split.microbatches) {
      for (auto s : mb.samples) {
        if (seen[s]) continue;  // a sliced sample once
        seen[s] = 1;
        kept.input.push_back(split.lengths.input.empty() ? lengths.input[s] : split.lengths.input[s]);
        if (lengths.encoder_decoder()) {
          kept.target.push_back(split.lengths.target.empty() ? lengths.target[s] : split.lengths.target[s]);
        }
      }
    }
    r.model_flops = batch_model_flops(cost.model(), vstages, kept);
  }
  part::BatchLengths trained = trained_lengths(lengths, split);
  for (const std::uint32_t s : split.dropped) {  // trains nothing
    trained.input[s] = 0;
    if (trained.encoder_decoder()) trained.target[s] = 0;
    trained.loss[s] = 0;
  }

  // 4. Instruction streams.
  t0 = std::chrono::steady_clock::now();
  for (std::size_t k = 0; k < best.schedules.size(); ++k) {
    pl::PlanOptions po;
    po.iteration = iteration;
    po.hidden = cost.model().hidden;
    po.dtype = o.dtype;
    po.dp = static_cast<std::uint32_t>(o.shape.dp);
    po.global_tokens = r.tokens;
    // (the limit make_sim_problem sets; a replica without a micro-batch has no problem to make)
    po.memory_limit_bytes = static_cast<std::uint64_t>(
        o.shape.memory_limit_mb > 0 ? o.shape.memory_limit_mb * 1e6 : cost.device().memory_gb * 1e9);
    po.sample_refs = refs;
    po.keep_timeline = o.keep_timeline;
    po.loss_mode = o.loss_mode;
    po.global_loss_tokens = global_loss_tokens(trained, split);
    po.tied_embedding = o.tied_embedding;
    po.max_seq_len = o.context.max_seq_len;
    po.max_target_len = lengths.encoder_decoder() ? o.context.target_limit() : 0;
    pl::Plan plan = make_plan(best.schedules[k], best.replica_mbs[k], vstages, trained, &best.tables[k], po);
    plan.replica = static_cast<std::uint32_t>(k);
    if (refs != nullptr) plan.dataset = o.dataset;
    if (o.validate) pl::validate_or_throw(plan);
    r.plans.push_back(std::move(plan));
  }
  r.build_ms = ms_since(t0);
  r.schedules = std::move(best.schedules);
  r.planning_ms = r.partition_ms + r.schedule_ms + r.candidates_ms + r.build_ms;
  r.partition = std::move(split);
  r.trained = std::move(trained);
  return r;
}

// Renumbers the samples of `r` (planned from the samples kept[0], kept[1], ... of a batch of
// `size`) to their positions in that batch; the others are trained as 0 tokens.
void renumber_samples(IterationResult& r, const std::vector<std::uint32_t>& kept, std::size_t size) {
  auto ids = [&](std::vector<std::uint32_t>& v) {
    for (auto& s : v) s = kept[s];
  };
  for (auto& plan : r.plans) {
    for (auto& mb : plan.microbatches) ids(mb.samples);
  }
  part::Partition& p = r.partition;
  for (auto& mb : p.microbatches) ids(mb.samples);
  ids(p.order);
  ids(p.truncated);
  ids(p.dropped);
  auto spread = [&](part::BatchLengths& b) {
    const bool encdec = b.encoder_decoder();
    part::BatchLengths out;
    out.input.assign(size, 0);
    if (encdec) out.target.assign(size, 0);
    if (!b.loss.empty()) out.loss.assign(size, 0);
    for (std::size_t k = 0; k < kept.size() && k < b.size(); ++k) {
      out.input[kept[k]] = b.input[k];
      if (encdec) out.target[kept[k]] = b.target[k];
      if (!b.loss.empty()) out.loss[kept[k]] = b.loss[k];
    }
    b = std::move(out);
  };
  if (!p.lengths.input.empty()) spread(p.lengths);
  spread(r.trained);
}

}  // namespace

namespace {

// plan_within_context; where recompute 'auto' gives a plan over the memory limit, the batch planned
// again with full recompute, kept when that fits. The partition sizes micro-batches by 1F1B's
// in-flight count, which a schedule holding more of them (GPipe: all) passes: full recompute keeps
// the least (a gpt-350m plan at 43 GB over a 30 GB limit where full recompute fits, 29.9 GB).
IterationResult plan_fitting(const part::BatchLengths& lengths, const std::vector<SampleRef>* refs,
                             std::uint64_t iteration, const cm::CostModel& cost,
                             const std::vector<part::VirtualStage>& vstages, const PlannerOptions& o,
                             part::PartitionCache* cache, const std::vector<std::uint32_t>* positions) {
  IterationResult r = plan_within_context(lengths, refs, iteration, cost, vstages, o, cache, positions);
  if (r.packpipe.feasible || o.partition.recompute != part::RecomputePolicy::Auto) return r;
  PlannerOptions full = o;
  full.partition.recompute = part::RecomputePolicy::Full;
  try {
    IterationResult f = plan_within_context(lengths, refs, iteration, cost, vstages, full, cache, positions);
    if (!f.packpipe.feasible) return r;
    f.schedule_note = fmt::format("recompute auto gave a plan over the memory limit ({}); planned with full "
                                  "recompute, which fits", r.packpipe.why.empty() ? "memory" : r.packpipe.why);
    return f;
  } catch (const InvalidArgument&) {
    return r;
  }
}

}  // namespace

IterationResult plan_iteration(const part::BatchLengths& lengths, const std::vector<SampleRef>* refs,
                               std::uint64_t iteration, const cm::CostModel& cost,
                               const std::vector<part::VirtualStage>& vstages, const PlannerOptions& o,
                               part::PartitionCache* cache) {
  check_planner_options(o);
  check_context_length(o.context, cost.model().arch == cm::Architecture::EncoderDecoder);
  // A sample's loss tokens are some of its tokens.
  if (lengths.loss.size() == lengths.size()) {
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      const std::uint64_t tokens =
          std::uint64_t{lengths.input[s]} + (lengths.encoder_decoder() ? std::uint64_t{lengths.target[s]} : 0);
      PACKPIPE_CHECK_ARG(lengths.loss[s] <= tokens, "iteration {}: loss_tokens[{}] is {}, more than the {} tokens of "
                         "sample {}", iteration, s, lengths.loss[s], tokens, s);
    }
  }
  if (!over_context_length(lengths, o.context)) {
    return plan_fitting(lengths, refs, iteration, cost, vstages, o, cache, nullptr);
  }
  // Lengths given directly (plan_batch): truncate or drop to the context length first.
  part::BatchLengths limited = lengths;
  std::vector<SampleRef> limited_refs;
  if (refs != nullptr) limited_refs = *refs;
  std::vector<std::uint32_t> kept;
  const ContextReport context =
      limit_lengths(limited, refs != nullptr ? &limited_refs : nullptr, o.context, iteration, &kept);
  PACKPIPE_CHECK_ARG(limited.size() > 0, "iteration {}: every sample of the global batch is over {} {} ({} '{}')",
                     iteration, o.context.max_seq_len_option, o.context.max_seq_len, o.context.policy_option,
                     seq_policy_name(o.context.policy));
  IterationResult r = plan_fitting(limited, refs != nullptr ? &limited_refs : nullptr, iteration, cost, vstages, o,
                                   cache, &kept);
  if (context.dropped > 0) renumber_samples(r, kept, lengths.size());
  r.context = context;
  return r;
}

namespace {

// Splits `layers` over `stages` stages whose time with n layers is time(v, n) (non-decreasing in n):
// the least maximum time, found by bisection over the candidate times with a greedy check.
std::vector<std::int64_t> min_max_split(std::int64_t layers, std::int64_t stages,
                                        const std::function<double(std::int64_t, std::int64_t)>& time) {
  PACKPIPE_CHECK_ARG(layers >= stages, "{} layers cannot fill {} stages with one layer each", layers, stages);
  std::vector<double> candidates;
  for (std::int64_t v = 0; v < stages; ++v) {
    for (std::int64_t n = 1; n <= layers - stages + 1; ++n) candidates.push_back(time(v, n));
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  auto split_under = [&](double cap, std::vector<std::int64_t>* out) {
    std::int64_t left = layers;
    std::vector<std::int64_t> counts;
    for (std::int64_t v = 0; v < stages; ++v) {
      const std::int64_t room = left - (stages - v - 1);  // leave one layer for each later stage
      std::int64_t n = v + 1 == stages ? left : 0;
      if (v + 1 < stages) {
        while (n < room && time(v, n + 1) <= cap) ++n;
      }
      if (n < 1 || time(v, n) > cap) return false;
      counts.push_back(n);
      left -= n;
    }
    if (out != nullptr) *out = std::move(counts);
    return true;
  };
  std::size_t lo = 0, hi = candidates.size() - 1;  // candidates[hi] (the largest) always fits
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (split_under(candidates[mid], nullptr)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  std::vector<std::int64_t> out;
  split_under(candidates[lo], &out);
  return out;
}

}  // namespace

std::vector<std::int64_t> balanced_stage_layers(const cm::CostModel& cost, const part::PipelineShape& shape,
                                                std::int64_t rows, std::int64_t seq, std::int64_t dec_seq) {
  part::check_shape(shape);
  const cm::ModelSpec& model = cost.model();
  const std::int64_t V = shape.vstages();
  const bool encdec = model.arch == cm::Architecture::EncoderDecoder;
  PACKPIPE_CHECK_ARG(rows >= 1 && seq >= 1, "balanced_stage_layers: rows and seq must be at least 1, found {} and {}",
                     rows, seq);
  if (encdec && V == 1) return {};  // one stage holds both sides: nothing to balance
  PACKPIPE_CHECK_ARG(!encdec || V % 2 == 0, "encoder-decoder model '{}' needs an even number of virtual stages, found {}",
                     model.name, V);
  std::map<std::tuple<int, std::int64_t, bool, bool>, double> memo;
  auto stage_time = [&](bool decoder, std::int64_t n, bool embedding, bool head) {
    const auto key = std::make_tuple(decoder ? 1 : 0, n, embedding, head);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    cm::StageLayout l;
    (decoder ? l.decoder_layers : l.encoder_layers) = n;
    l.has_embedding = embedding;
    l.has_postprocess = head;
    const std::int64_t dec = encdec ? std::max<std::int64_t>(dec_seq, 1) : 0;
    const cm::MicroShape ms{rows, seq, dec, {}};
    const double t = cm::stage_time_ms(cost, cm::stage_cost(cost, l, shape.tp, ms, Recompute::None),
                                       cm::shape_tokens(model, ms), cm::attention_share(model, l, ms, cost.attention()));
    memo.emplace(key, t);
    return t;
  };
  if (!encdec) {
    return min_max_split(model.num_layers, V, [&](std::int64_t v, std::int64_t n) {
      return stage_time(false, n, v == 0, v == V - 1);
    });
  }
  const std::int64_t half = V / 2;
  std::vector<std::int64_t> out = min_max_split(model.encoder_layers, half, [&](std::int64_t v, std::int64_t n) {
    return stage_time(false, n, v == 0, false);
  });
  const std::vector<std::int64_t> dec = min_max_split(model.decoder_layers, half, [&](std::int64_t v, std::int64_t n) {
    return stage_time(true, n, false, v == half - 1);
  });
  out.insert(out.end(), dec.begin(), dec.end());
  return out;
}

}  // namespace packpipe::planner
