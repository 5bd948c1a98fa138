#include "planner/measure.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/stats.h"
#include "costmodel/calibration.h"
#include "plan/dry_run.h"
#include "schedule/simulator.h"
#include "schedule/stage_costs.h"

namespace packpipe::planner {

namespace {

namespace sched = ::packpipe::schedule;
using OJson = nlohmann::ordered_json;

cm::MeasuredOp measured_op(pl::OpKind k) {
  switch (k) {
    case pl::OpKind::Forward: return cm::MeasuredOp::Forward;
    case pl::OpKind::Backward: return cm::MeasuredOp::Backward;
    case pl::OpKind::BackwardInput: return cm::MeasuredOp::BackwardInput;
    case pl::OpKind::BackwardWeight: return cm::MeasuredOp::BackwardWeight;
  }
  return cm::MeasuredOp::Forward;
}

pl::OpKind op_kind(cm::MeasuredOp op) {
  switch (op) {
    case cm::MeasuredOp::Backward: return pl::OpKind::Backward;
    case cm::MeasuredOp::BackwardInput: return pl::OpKind::BackwardInput;
    case cm::MeasuredOp::BackwardWeight: return pl::OpKind::BackwardWeight;
    default: return pl::OpKind::Forward;
  }
}

// The shape of (mb, stage) of `plan` in a measurement (op and times left to the caller).
cm::Measurement shape_of(const pl::Plan& plan, std::uint32_t mb, std::uint32_t stage, std::int64_t tp) {
  const pl::StageSpec& s = plan.stages[stage];
  const pl::PlanMicroBatch& b = plan.microbatches[mb];
  cm::Measurement m;
  m.layout.encoder_layers = s.encoder_layers;
  m.layout.decoder_layers = s.decoder_layers;
  m.layout.has_embedding = s.embedding;
  m.layout.has_postprocess = s.head;
  m.tp = tp;
  m.rows = b.rows;
  m.seq = b.padded_len;
  m.dec_seq = b.padded_dec_len;
  if (b.layout == Layout::Packed) {
    const bool encdec = !b.target_lengths.empty();
    for (std::size_t i = 0; i < b.lengths.size(); ++i) {
      if (b.prefix_of(i) > 0) {  // a later slice: its queries attend to the kept prefix too, as planned
        m.attention.add_slice(static_cast<std::int64_t>(b.lengths[i]), static_cast<std::int64_t>(b.prefix_of(i)));
        continue;
      }
      m.attention.add(static_cast<std::int64_t>(packed_tokens(b.lengths[i], encdec)),
                      encdec ? static_cast<std::int64_t>(packed_tokens(b.target_lengths[i], true)) : 0);
    }
  }
  const std::size_t at = plan.at(mb, stage);
  m.recompute = at < plan.recompute.size() ? static_cast<cm::Recompute>(plan.recompute[at]) : cm::Recompute::None;
  m.iteration = plan.iteration;
  m.replica = plan.replica;
  m.stage = stage;
  m.mb = mb;
  return m;
}

// The wait that completes each START of a rank's stream: [start index] -> wait index (-1: none).
std::vector<std::int64_t> waits_of(const std::vector<pl::Instruction>& stream) {
  std::vector<std::int64_t> wait(stream.size(), -1);
  // (start opcode, mb, stage, peer) -> starts not yet waited, in posting order
  std::map<std::tuple<int, std::uint32_t, std::uint32_t, std::uint32_t>, std::deque<std::size_t>> open;
  for (std::size_t i = 0; i < stream.size(); ++i) {
    const pl::Instruction& ins = stream[i];
    switch (ins.op) {
      case pl::Opcode::SendActStart:
      case pl::Opcode::RecvActStart:
      case pl::Opcode::SendGradStart:
      case pl::Opcode::RecvGradStart:
        open[{static_cast<int>(ins.op), ins.mb, ins.stage, ins.peer}].push_back(i);
        break;
      case pl::Opcode::SendActWait:
      case pl::Opcode::RecvActWait:
      case pl::Opcode::SendGradWait:
      case pl::Opcode::RecvGradWait: {
        // Every wait's opcode follows its start's.
        auto& q = open[{static_cast<int>(ins.op) - 1, ins.mb, ins.stage, ins.peer}];
        if (q.empty()) break;
        wait[q.front()] = static_cast<std::int64_t>(i);
        q.pop_front();
        break;
      }
      default: break;
    }
  }
  return wait;
}

double ns_to_ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

struct ErrorStats {
  double median_abs = 0, p90_abs = 0, bias = 0;
};

ErrorStats error_stats(const std::vector<double>& rel) {
  std::vector<double> a;
  a.reserve(rel.size());
  for (double r : rel) a.push_back(std::abs(r));
  return {median(a), quantile(a, 0.9), median(rel)};
}

std::string shape_text(const cm::Measurement& m) {
  return fmt::format("{} encoder + {} decoder layers{}{}, tp {}, rows {}, seq {}, dec_seq {}{}, recompute {}",
                     m.layout.encoder_layers, m.layout.decoder_layers, m.layout.has_embedding ? ", embedding" : "",
                     m.layout.has_postprocess ? ", LM head" : "", m.tp, m.rows, m.seq, m.dec_seq,
                     m.attention.varlen()
                         ? fmt::format(", varlen attention [{}, {}, {}]{}", m.attention.self, m.attention.dec_self,
                                       m.attention.cross,
                                       m.attention.prefix_tokens != 0
                                           ? fmt::format(" with kept prefixes [{}, {}]", m.attention.prefix,
                                                         m.attention.prefix_tokens)
                                           : std::string())
                         : std::string(),
                     cm::recompute_name(m.recompute));
}

bool same_shape(const cm::Measurement& a, const cm::Measurement& b) {
  return a.layout.encoder_layers == b.layout.encoder_layers && a.layout.decoder_layers == b.layout.decoder_layers &&
         a.layout.has_embedding == b.layout.has_embedding && a.layout.has_postprocess == b.layout.has_postprocess &&
         a.tp == b.tp && a.rows == b.rows && a.seq == b.seq && a.dec_seq == b.dec_seq && a.recompute == b.recompute &&
         a.attention == b.attention;
}

// Re-simulates the compute ops `idx` of one (iteration, replica) of `set` (see validate_measurements).
double resimulate(const cm::CostModel& cost, const cm::MeasurementSet& set, const std::vector<std::size_t>& idx,
                  const std::string& what) {
  std::uint32_t S = 0, V = 0, N = 0;
  for (std::size_t i : idx) {
    const cm::Measurement& m = set.ops[i];
    S = std::max(S, m.rank + 1);
    V = std::max(V, m.stage + 1);
    N = std::max(N, m.mb + 1);
  }
  PACKPIPE_CHECK_ARG(V % S == 0, "{}: inconsistent: {} virtual stages measured on {} ranks (the simulator places "
                     "stage v on rank v mod ranks)", what, V, S);
  const std::size_t n = static_cast<std::size_t>(N) * V;
  std::vector<std::int64_t> first(n, -1);
  std::vector<std::array<int, 4>> count(n, {0, 0, 0, 0});
  for (std::size_t i : idx) {
    const cm::Measurement& m = set.ops[i];
    PACKPIPE_CHECK_ARG(m.stage % S == m.rank, "{}: inconsistent: {} has stage {} on rank {}, not on rank {} (stage mod "
                       "{} ranks) as the simulator places it", what, cm::describe_measurement(m, i), m.stage, m.rank,
                       m.stage % S, S);
    const std::size_t k = static_cast<std::size_t>(m.mb) * V + m.stage;
    if (first[k] < 0) {
      first[k] = static_cast<std::int64_t>(i);
    } else {
      const cm::Measurement& f = set.ops[static_cast<std::size_t>(first[k])];
      PACKPIPE_CHECK_ARG(same_shape(f, m), "{}: inconsistent: micro-batch {} stage {} has two shapes: {} ({}) and {} ({})",
                         what, m.mb, m.stage, shape_text(f), cm::describe_measurement(f, static_cast<std::size_t>(first[k])),
                         shape_text(m), cm::describe_measurement(m, i));
    }
    ++count[k][static_cast<std::size_t>(m.op)];
  }
  sched::StageCostTable t = sched::empty_stage_cost_table(cost, N, V, S);
  for (std::uint32_t mb = 0; mb < N; ++mb) {
    for (std::uint32_t v = 0; v < V; ++v) {
      const std::size_t k = static_cast<std::size_t>(mb) * V + v;
      const auto& c = count[k];
      const bool full = c[0] == 1 && c[1] == 1 && c[2] == 0 && c[3] == 0;
      const bool split = c[0] == 1 && c[1] == 0 && c[2] == 1 && c[3] == 1;
      PACKPIPE_CHECK_ARG(full || split, "{}: incomplete: micro-batch {} stage {} has {} F, {} B, {} I and {} W "
                         "measured (expected one F and either one B or one I and one W)", what, mb, v, c[0], c[1], c[2],
                         c[3]);
      const cm::Measurement& m = set.ops[static_cast<std::size_t>(first[k])];
      sched::set_stage_cost(t, k, cost, m.layout, m.tp, m.shape(), m.recompute);
    }
  }
  const std::int64_t tp = set.ops[idx.front()].tp;
  const std::int64_t per_node = std::max<std::int64_t>(1, cost.device().gpus_per_node / std::max<std::int64_t>(1, tp));
  const sched::SimProblem problem = sched::make_sim_problem(std::move(t), S, cost.comm(), per_node, 0.0);
  sched::RankOrder order;
  order.ops.resize(S);
  std::vector<std::size_t> sorted = idx;
  std::sort(sorted.begin(), sorted.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(set.ops[a].rank, set.ops[a].index) < std::tie(set.ops[b].rank, set.ops[b].index);
  });
  for (std::size_t i : sorted) {
    const cm::Measurement& m = set.ops[i];
    pl::ScheduledOp op;
    op.kind = op_kind(m.op);
    op.mb = m.mb;
    op.vstage = m.stage;
    order.ops[m.rank].push_back(op);
  }
  sched::Simulator sim(problem);
  sched::SimResult r;
  try {
    sim.run(order, r);
  } catch (const InvalidArgument& e) {
    PACKPIPE_THROW(InvalidArgument, "{}: the measured op order cannot be re-simulated: {}", what, e.what());
  }
  return r.makespan_ms;
}

}  // namespace

// Times are ns on a steady clock: with every one in [0, 2^62], no difference of two overflows.
constexpr std::int64_t kMaxTimeNs = std::int64_t{1} << 62;

PlanMeasurements measurements_from(const pl::Plan& plan, const InstructionTimes& times, const MeasureOptions& options) {
  PACKPIPE_CHECK_ARG(options.tp >= 1 && options.tp <= cm::kMaxMeasuredSize, "measurements_from: tp must be in [1, {}], "
                     "found {}", cm::kMaxMeasuredSize, options.tp);
  PACKPIPE_CHECK_ARG(plan.has_stage_specs(), "measurements_from: plan of iteration {} replica {} has no stage layouts "
                     "(a format-1 plan): its ops' shapes are unknown", plan.iteration, plan.replica);
  PACKPIPE_CHECK_ARG(times.size() == plan.ranks, "measurements_from: plan of iteration {} replica {} has {} ranks, the "
                     "times {}", plan.iteration, plan.replica, plan.ranks, times.size());
  std::int64_t origin = std::numeric_limits<std::int64_t>::max(), last = std::numeric_limits<std::int64_t>::min();
  bool all = true;
  for (std::size_t r = 0; r < times.size(); ++r) {
    if (times[r].empty()) {
      all = false;
      continue;
    }
    PACKPIPE_CHECK_ARG(times[r].size() == plan.streams[r].size(), "measurements_from: rank {} has {} instructions in "
                       "the plan of iteration {} replica {}, {} times recorded", r, plan.streams[r].size(),
                       plan.iteration, plan.replica, times[r].size());
    for (std::size_t i = 0; i < times[r].size(); ++i) {
      const auto& [s, e] = times[r][i];
      PACKPIPE_CHECK_ARG(s >= 0 && e <= kMaxTimeNs, "measurements_from: rank {} instruction {} ({}) runs from {} to {} "
                         "ns: expected steady-clock times in [0, 2^62] ns", r, i, pl::opcode_name(plan.streams[r][i].op),
                         s, e);
      PACKPIPE_CHECK_ARG(e >= s, "measurements_from: rank {} instruction {} ({}) ends at {} ns, before its start at {} "
                         "ns", r, i, pl::opcode_name(plan.streams[r][i].op), e, s);
      origin = std::min(origin, s);
      last = std::max(last, e);
    }
  }
  PlanMeasurements out;
  if (origin > last) return out;  // nothing recorded
  auto rel_ms = [&](std::int64_t ns) { return ns_to_ms(ns - origin); };

  for (std::size_t r = 0; r < times.size(); ++r) {
    if (times[r].empty()) continue;
    for (std::size_t i = 0; i < plan.streams[r].size(); ++i) {
      const pl::Instruction& ins = plan.streams[r][i];
      if (!pl::is_compute(ins.op)) continue;
      cm::Measurement m = shape_of(plan, ins.mb, ins.stage, options.tp);
      m.op = measured_op(pl::compute_kind(ins.op));
      // at least the clock's resolution: an op timed at 0 ns took under one
      m.ms = ns_to_ms(std::max<std::int64_t>(1, times[r][i].second - times[r][i].first));
      m.rank = static_cast<std::uint32_t>(r);
      m.index = i;
      m.start_ms = rel_ms(times[r][i].first);
      out.ops.push_back(m);
    }
  }

  // Transfers: the i-th send start of a channel matches its i-th receive start (the dry run's channels).
  const pl::DryRun dry(plan);
  std::vector<std::vector<std::int64_t>> waits(plan.ranks);
  for (std::size_t r = 0; r < plan.ranks; ++r) {
    if (!times[r].empty()) waits[r] = waits_of(plan.streams[r]);
  }
  for (const pl::ChannelState& ch : dry.channels()) {
    const auto s = static_cast<std::size_t>(ch.src), d = static_cast<std::size_t>(ch.dst);
    if (times[s].empty() || times[d].empty()) continue;
    const std::size_t n = std::min(ch.sends.size(), ch.recvs.size());
    for (std::size_t k = 0; k < n; ++k) {
      const auto si = static_cast<std::size_t>(ch.sends[k].index), ri = static_cast<std::size_t>(ch.recvs[k].index);
      const std::int64_t sw = waits[s][si], rw = waits[d][ri];
      if (sw < 0 || rw < 0) continue;
      const std::int64_t t0 = std::max(times[s][si].first, times[d][ri].first);
      const pl::Instruction& send = plan.streams[s][si];
      const pl::Instruction& recv = plan.streams[d][ri];
      const std::uint64_t bytes = plan.shapes[send.shape].bytes();
      auto end = [&](std::size_t rank, std::size_t start, std::int64_t wait, const pl::Instruction& ins,
                     cm::MeasuredOp op, std::size_t peer) {
        cm::Measurement m = shape_of(plan, ins.mb, ins.stage, options.tp);
        m.op = op;
        m.bytes = bytes;
        m.ms = ns_to_ms(std::max<std::int64_t>(0, times[rank][static_cast<std::size_t>(wait)].second - t0));
        m.rank = static_cast<std::uint32_t>(rank);
        m.index = start;
        m.start_ms = rel_ms(t0);
        m.peer = static_cast<std::int64_t>(peer);
        out.ops.push_back(m);
      };
      end(s, si, sw, send, cm::MeasuredOp::Send, d);
      end(d, ri, rw, recv, cm::MeasuredOp::Recv, s);
    }
  }
  std::sort(out.ops.begin(), out.ops.end(), [](const cm::Measurement& a, const cm::Measurement& b) {
    return std::tie(a.rank, a.index) < std::tie(b.rank, b.index);
  });
  const std::uint64_t number = options.iteration >= 0 ? static_cast<std::uint64_t>(options.iteration) : plan.iteration;
  for (auto& m : out.ops) m.iteration = number;
  if (all) {
    out.has_iteration = true;
    out.iteration.iteration = number;
    out.iteration.replica = plan.replica;
    out.iteration.measured_ms = ns_to_ms(last - origin);
    out.iteration.predicted_ms = plan.makespan_ms;
    if (enum_find(kScheduleKindNames, plan.schedule) != nullptr) out.iteration.schedule = plan.schedule;
  }
  return out;
}

std::vector<OpErrors> op_errors(const cm::CostModel& cost, const std::vector<cm::Measurement>& ops,
                                std::vector<double>* predicted) {
  if (predicted != nullptr) predicted->assign(ops.size(), 0.0);
  std::map<cm::MeasuredOp, std::vector<double>> rel;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const cm::Measurement& m = ops[i];
    cm::check_measurement(m, cm::describe_measurement(m, i));
    double p = 0;
    try {
      p = cm::predict_ms(cost, m);
    } catch (const InvalidArgument& e) {
      PACKPIPE_THROW(InvalidArgument, "{}: the cost model ({}) refuses its shape ({}): {}", cm::describe_measurement(m, i),
                     cost.describe(), shape_text(m), e.what());
    }
    if (predicted != nullptr) (*predicted)[i] = p;
    auto& v = rel[m.op];  // the kind is listed even when all its transfers were hidden
    if (m.ms > 0) v.push_back((p - m.ms) / m.ms);
  }
  std::vector<OpErrors> out;
  for (const auto& [op, v] : rel) {
    OpErrors e;
    e.op = op;
    e.count = static_cast<std::int64_t>(v.size());
    const ErrorStats s = error_stats(v);
    e.median_abs = s.median_abs;
    e.p90_abs = s.p90_abs;
    e.bias = s.bias;
    out.push_back(e);
  }
  return out;
}

ValidationReport validate_measurements(const cm::CostModel& cost, const cm::MeasurementSet& set) {
  PACKPIPE_CHECK_ARG(!set.ops.empty(), "validate_measurements: no op measurements to compare the cost model with "
                     "({} iteration lines, source '{}')", set.iterations.size(), set.header.source);
  ValidationReport rep;
  rep.cost_model = cost.describe();
  rep.ops = op_errors(cost, set.ops, &rep.predicted_ms);
  std::map<std::pair<std::uint64_t, std::uint32_t>, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < set.ops.size(); ++i) {
    if (cm::is_compute(set.ops[i].op)) groups[{set.ops[i].iteration, set.ops[i].replica}].push_back(i);
  }
  std::map<std::pair<std::uint64_t, std::uint32_t>, const cm::IterationMeasurement*> lines;
  for (const auto& it : set.iterations) {
    const auto [at, fresh] = lines.emplace(std::make_pair(it.iteration, it.replica), &it);
    PACKPIPE_CHECK_ARG(fresh || (at->second->measured_ms == it.measured_ms && at->second->predicted_ms == it.predicted_ms &&
                                 at->second->schedule == it.schedule),
                       "iteration {} replica {}: two iteration lines that disagree (measured {} and {} ms, predicted {} "
                       "and {} ms, schedule '{}' and '{}'): measurements of two runs?", it.iteration, it.replica,
                       at->second->measured_ms, it.measured_ms, at->second->predicted_ms, it.predicted_ms,
                       at->second->schedule, it.schedule);
  }
  std::vector<double> iter_rel;
  for (const auto& [key, idx] : groups) {
    IterationCheck c;
    c.iteration = key.first;
    c.replica = key.second;
    c.ops = static_cast<std::int64_t>(idx.size());
    c.predicted_ms = resimulate(cost, set, idx, fmt::format("iteration {} replica {}", key.first, key.second));
    const auto line = lines.find(key);
    if (line != lines.end()) {
      c.measured_ms = line->second->measured_ms;
      c.planned_ms = line->second->predicted_ms;
      c.schedule = line->second->schedule;
      if (!c.schedule.empty() && cost.calibration() != nullptr) {
        c.predicted_ms *= cost.calibration()->schedule_factor(schedule_kind_from_name(c.schedule));
      }
      if (c.measured_ms > 0) iter_rel.push_back((c.predicted_ms - c.measured_ms) / c.measured_ms);
    }
    rep.iterations.push_back(c);
  }
  rep.iterations_compared = static_cast<std::int64_t>(iter_rel.size());
  const ErrorStats s = error_stats(iter_rel);
  rep.iteration_median_abs = s.median_abs;
  rep.iteration_p90_abs = s.p90_abs;
  rep.iteration_bias = s.bias;
  return rep;
}

cm::Calibration fit_schedule_factors(std::shared_ptr<const cm::CostModel> base, cm::Calibration calibration,
                                     const cm::MeasurementSet& set) {
  calibration.schedules.clear();
  // Only the iterations whose line names a schedule and holds a measured makespan are re-simulated.
  std::set<std::pair<std::uint64_t, std::uint32_t>> named;
  cm::MeasurementSet used;
  used.header = set.header;
  for (const auto& it : set.iterations) {
    if (!it.schedule.empty() && it.measured_ms > 0) {
      named.emplace(it.iteration, it.replica);
      used.iterations.push_back(it);
    }
  }
  for (const auto& m : set.ops) {
    if (named.count({m.iteration, m.replica}) != 0) used.ops.push_back(m);
  }
  if (used.ops.empty()) return calibration;
  const cm::CalibratedCostModel ops_only(std::move(base), calibration);
  const ValidationReport rep = validate_measurements(ops_only, used);
  std::array<std::vector<double>, kScheduleKinds> ratios;
  for (const IterationCheck& c : rep.iterations) {
    if (c.schedule.empty() || !(c.measured_ms > 0) || !(c.predicted_ms > 0)) continue;
    ratios[static_cast<std::size_t>(schedule_kind_from_name(c.schedule))].push_back(c.measured_ms / c.predicted_ms);
  }
  for (std::size_t k = 0; k < kScheduleKinds; ++k) {
    std::vector<double>& v = ratios[k];
    if (static_cast<std::int64_t>(v.size()) < cm::kMinScheduleIterations) continue;
    const double m = median(v);
    if (!(m <= cm::kMaxScheduleFactor)) continue;  // not the schedule's overhead: the op fits are wrong
    cm::ScheduleFit f;
    f.schedule = kScheduleKindNames[k].name;
    f.iterations = static_cast<std::int64_t>(v.size());
    f.factor = std::max(m, cm::kMinScheduleFactor);
    std::vector<double> dev;
    for (double r : v) dev.push_back(std::abs(r - f.factor) / f.factor);
    f.spread = median(dev);
    calibration.schedules.push_back(std::move(f));
  }
  cm::check_calibration(calibration, "fit_schedule_factors");
  return calibration;
}

std::string validation_plot_json(const ValidationReport& report, const cm::MeasurementSet& set) {
  PACKPIPE_CHECK_ARG(report.predicted_ms.size() == set.ops.size(), "validation_plot_json: the report has {} "
                     "predictions for {} measurements (a report of another set?)", report.predicted_ms.size(),
                     set.ops.size());
  auto number = [](double x) { return std::isfinite(x) ? OJson(x) : OJson(nullptr); };
  OJson j;
  j["format"] = "packpipe-validation-plot";
  j["version"] = 1;
  j["cost_model"] = report.cost_model;
  OJson ops = OJson::array();
  for (const auto& [op, name] : cm::kMeasuredOpNames) {
    OJson tokens = OJson::array(), bytes = OJson::array(), pred = OJson::array(), meas = OJson::array();
    for (std::size_t i = 0; i < set.ops.size(); ++i) {
      const cm::Measurement& m = set.ops[i];
      if (m.op != op) continue;
      tokens.push_back(m.tokens());
      if (!cm::is_compute(op)) bytes.push_back(m.bytes);
      pred.push_back(report.predicted_ms[i]);
      meas.push_back(m.ms);
    }
    if (tokens.empty()) continue;
    OJson o;
    o["op"] = name;
    o["tokens"] = tokens;
    if (!cm::is_compute(op)) o["bytes"] = bytes;
    o["predicted_ms"] = pred;
    o["measured_ms"] = meas;
    ops.push_back(o);
  }
  j["ops"] = ops;
  OJson its = OJson::array();
  for (const auto& c : report.iterations) {
    its.push_back(OJson{{"iteration", c.iteration},
                        {"replica", c.replica},
                        {"ops", c.ops},
                        {"predicted_ms", c.predicted_ms},
                        {"measured_ms", number(c.measured_ms)},
                        {"planned_ms", number(c.planned_ms)}});
  }
  j["iterations"] = its;
  return j.dump() + "\n";
}

}  // namespace packpipe::planner
