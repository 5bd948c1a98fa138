#include "schedule/simulator.h"

#include <algorithm>
#include <cmath>

#include "common/errors.h"
#include "costmodel/calibration.h"

namespace packpipe::schedule {

namespace part = ::packpipe::partition;
namespace pl = ::packpipe::plan;

namespace {

constexpr double kUnknown = -1.0;
constexpr double kNone = std::numeric_limits<double>::infinity();
constexpr std::uint8_t kF = 1, kB = 2, kI = 4, kW = 8;

std::string op_text(const pl::ScheduledOp& op) {
  return fmt::format("{}{} on virtual stage {}", pl::op_kind_token(op.kind), op.mb, op.vstage);
}

}  // namespace

double SimResult::max_peak_bytes() const {
  double m = 0;
  for (double b : peak_bytes) m = std::max(m, b);
  return m;
}

SimProblem make_sim_problem(StageCostTable costs, std::int64_t ranks, const cm::CommModel& comm,
                            std::int64_t ranks_per_node, double memory_limit_bytes) {
  PACKPIPE_CHECK_ARG(ranks >= 1, "ranks must be at least 1, found {}", ranks);
  PACKPIPE_CHECK_ARG(costs.vstages >= 1 && costs.vstages % ranks == 0,
                     "the cost table's {} virtual stages are not a multiple of {} ranks", costs.vstages, ranks);
  PACKPIPE_CHECK_ARG(costs.microbatches >= 1, "the cost table has no micro-batches");
  const auto n = static_cast<std::size_t>(costs.microbatches * costs.vstages);
  PACKPIPE_CHECK_ARG(costs.forward_ms.size() == n && costs.backward_ms.size() == n &&
                         costs.backward_weight_ms.size() == n && costs.stored_bytes.size() == n &&
                         costs.peak_bytes.size() == n && costs.send_bytes.size() == n,
                     "cost table arrays must hold {} x {} = {} entries", costs.microbatches, costs.vstages, n);
  PACKPIPE_CHECK_ARG(costs.backward_input_ms.empty() || costs.backward_input_ms.size() == n,
                     "cost table backward_input_ms must be empty or hold {} entries, found {}", n,
                     costs.backward_input_ms.size());
  PACKPIPE_CHECK_ARG(costs.static_bytes.size() == static_cast<std::size_t>(ranks),
                     "cost table static_bytes must hold {} ranks, found {}", ranks, costs.static_bytes.size());
  for (std::size_t i = 0; i < n; ++i) {
    PACKPIPE_CHECK_ARG(costs.forward_ms[i] >= 0 && costs.backward_ms[i] >= 0 && costs.backward_weight_ms[i] >= 0 &&
                           costs.backward_weight_ms[i] <= costs.backward_ms[i],
                       "cost table entry {} (micro-batch {}, stage {}): times must be non-negative with "
                       "backward_weight_ms <= backward_ms",
                       i, i / static_cast<std::size_t>(costs.vstages), i % static_cast<std::size_t>(costs.vstages));
    PACKPIPE_CHECK_ARG(costs.backward_input_ms.empty() || costs.backward_input_ms[i] >= 0,
                       "cost table entry {}: backward_input_ms must be non-negative, found {}", i,
                       costs.backward_input_ms.empty() ? 0.0 : costs.backward_input_ms[i]);
  }
  const std::int64_t per_node = std::max<std::int64_t>(1, ranks_per_node);
  SimProblem p;
  p.ranks = ranks;
  p.memory_limit_bytes = memory_limit_bytes;
  p.transfer_ms.assign(n, 0.0);
  const std::int64_t V = costs.vstages;
  for (std::int64_t mb = 0; mb < costs.microbatches; ++mb) {
    for (std::int64_t v = 0; v + 1 < V; ++v) {
      const std::int64_t a = v % ranks, b = (v + 1) % ranks;
      if (a == b) continue;
      const bool inter = a / per_node != b / per_node;
      const double bytes = costs.send_bytes[static_cast<std::size_t>(mb * V + v)];
      p.transfer_ms[static_cast<std::size_t>(mb * V + v)] = bytes > 0 ? comm.p2p_ms(bytes, inter) : 0.0;
    }
  }
  p.costs = std::move(costs);
  return p;
}

SimProblem make_sim_problem(StageCostTable costs, const cm::CostModel& cost, const part::PipelineShape& shape) {
  const double limit = shape.memory_limit_mb > 0 ? shape.memory_limit_mb * 1e6 : cost.device().memory_gb * 1e9;
  const std::int64_t per_node = std::max<std::int64_t>(1, cost.device().gpus_per_node / std::max<std::int64_t>(1, shape.tp));
  SimProblem p = make_sim_problem(std::move(costs), shape.stages, cost.comm(), per_node, limit);
  if (const cm::Calibration* cal = cost.calibration(); cal != nullptr) {
    for (std::size_t k = 0; k < kScheduleKinds; ++k) p.kind_factor[k] = cal->schedule_factor(static_cast<ScheduleKind>(k));
  }
  return p;
}

Simulator::Simulator(const SimProblem& problem) : p_(problem) {
  const auto n = static_cast<std::size_t>(p_.microbatches() * p_.vstages());
  const auto S = static_cast<std::size_t>(p_.ranks);
  f_in_.resize(n);
  g_in_.resize(n);
  f_done_.resize(n);
  i_done_.resize(n);
  state_.resize(n);
  rank_free_.resize(S);
  send_free_.resize(S);
  recv_free_.resize(S);
  cur_mem_.resize(S);
  next_.resize(S);
  busy_.resize(S);
  pending_.resize(S);
  left_.resize(S);
  scratch_.peak_bytes.resize(S);
  scratch_.busy_ms.resize(S);
  scratch_.utilization.resize(S);
}

double Simulator::makespan(RankOrder& order, double abort_above_ms, bool abort_on_memory) {
  run(order, scratch_, abort_above_ms, abort_on_memory);
  return scratch_.aborted ? std::numeric_limits<double>::infinity() : scratch_.makespan_ms;
}

namespace {

// Throws when an order breaks a slice edge: on a virtual stage, F(next) before F(prev), or the
// backward of prev before that of next. `fpos`, `bpos`: scratch.
void check_slice_order(const SimProblem& p, const RankOrder& order, std::vector<std::size_t>& fpos,
                       std::vector<std::size_t>& bpos) {
  const std::int64_t V = p.vstages(), M = p.microbatches();
  constexpr std::size_t kAbsent = std::numeric_limits<std::size_t>::max();
  fpos.assign(static_cast<std::size_t>(M * V), kAbsent);
  bpos.assign(static_cast<std::size_t>(M * V), kAbsent);
  for (const auto& ops : order.ops) {
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const pl::ScheduledOp& op = ops[k];
      if (op.mb >= M || op.vstage >= V) continue;  // refused by the simulation itself
      const std::size_t i = static_cast<std::size_t>(op.mb) * static_cast<std::size_t>(V) + op.vstage;
      if (op.kind == pl::OpKind::Forward) fpos[i] = k;
      if (op.kind == pl::OpKind::Backward || op.kind == pl::OpKind::BackwardInput) bpos[i] = k;
    }
  }
  for (const auto& [prev, next] : p.slice_edges) {
    PACKPIPE_CHECK_ARG(prev < M && next < M && prev != next,
                       "slice edge ({}, {}): expected two micro-batches below {}", prev, next, M);
    for (std::int64_t v = 0; v < V; ++v) {
      const std::size_t a = static_cast<std::size_t>(prev) * static_cast<std::size_t>(V) + static_cast<std::size_t>(v);
      const std::size_t b = static_cast<std::size_t>(next) * static_cast<std::size_t>(V) + static_cast<std::size_t>(v);
      PACKPIPE_CHECK_ARG(fpos[a] == kAbsent || fpos[b] == kAbsent || fpos[a] < fpos[b],
                         "rank {}: F{} on virtual stage {} comes before F{}, which holds the previous slice of one of "
                         "its samples (slices go forward in order)",
                         p.rank_of(v), next, v, prev);
      PACKPIPE_CHECK_ARG(bpos[a] == kAbsent || bpos[b] == kAbsent || bpos[b] < bpos[a],
                         "rank {}: the backward of micro-batch {} on virtual stage {} comes before that of micro-batch "
                         "{}, which holds the next slice of one of its samples (slices go backward in reverse order)",
                         p.rank_of(v), prev, v, next);
    }
  }
}

}  // namespace

void Simulator::run(RankOrder& order, SimResult& res, double abort_above_ms, bool abort_on_memory) {
  const StageCostTable& c = p_.costs;
  const std::int64_t V = p_.vstages();
  const std::int64_t M = p_.microbatches();
  const std::size_t S = static_cast<std::size_t>(p_.ranks);
  PACKPIPE_CHECK_ARG(order.ops.size() == S, "the order has {} ranks, the problem {}", order.ops.size(), S);
  const bool barriers = !order.cycle.empty();
  std::size_t total_ops = 0;
  std::uint32_t max_cycle = 0;
  for (std::size_t r = 0; r < S; ++r) {
    total_ops += order.ops[r].size();
    if (barriers) {
      PACKPIPE_CHECK_ARG(order.cycle.size() == S && order.cycle[r].size() == order.ops[r].size(),
                         "rank {}: the cycle list must match its {} ops", r, order.ops[r].size());
      if (!order.cycle[r].empty()) max_cycle = std::max(max_cycle, order.cycle[r].back());
    }
  }
  if (p_.has_slices()) check_slice_order(p_, order, fpos_, bpos_);
  std::fill(f_in_.begin(), f_in_.end(), kUnknown);
  std::fill(g_in_.begin(), g_in_.end(), kUnknown);
  std::fill(f_done_.begin(), f_done_.end(), kUnknown);
  std::fill(i_done_.begin(), i_done_.end(), kUnknown);
  std::fill(state_.begin(), state_.end(), 0);
  for (std::int64_t mb = 0; mb < M; ++mb) f_in_[static_cast<std::size_t>(mb * V)] = 0.0;
  std::fill(rank_free_.begin(), rank_free_.end(), 0.0);
  std::fill(send_free_.begin(), send_free_.end(), 0.0);
  std::fill(recv_free_.begin(), recv_free_.end(), 0.0);
  std::fill(next_.begin(), next_.end(), 0);
  std::fill(busy_.begin(), busy_.end(), 0);
  res.peak_bytes.resize(S);
  res.busy_ms.assign(S, 0.0);
  res.utilization.resize(S);
  for (std::size_t r = 0; r < S; ++r) {
    cur_mem_[r] = c.static_bytes[r];
    res.peak_bytes[r] = c.static_bytes[r];
  }
  if (barriers) {
    cycle_left_.assign(max_cycle + 1, 0);
    cycle_end_.assign(max_cycle + 1, 0.0);
    for (std::size_t r = 0; r < S; ++r) {
      for (std::uint32_t cy : order.cycle[r]) ++cycle_left_[cy];
    }
  }
  res.aborted = false;
  res.within_memory = true;
  // Early exit also when a rank's clock plus the work it has not started passes the bound (its ops
  // run one at a time); the margin covers the rounding of the running sums.
  const bool bounded = abort_above_ms < std::numeric_limits<double>::infinity();
  const double abort_at = abort_above_ms * (1 + 1e-9);
  if (bounded) {
    for (std::size_t r = 0; r < S; ++r) {
      double w = 0;
      for (const pl::ScheduledOp& op : order.ops[r]) {
        if (op.mb >= M || op.vstage >= V) continue;  // refused when it is reached
        const std::size_t i = static_cast<std::size_t>(op.mb) * static_cast<std::size_t>(V) + op.vstage;
        w += c.op_ms(op.kind, i);
      }
      left_[r] = w;
    }
  }
  const double limit = p_.memory_limit_bytes;
  std::fill(pending_.begin(), pending_.end(), kNone);
  std::size_t done_ops = 0;

  // Start rank r's next op if its inputs are known; returns false when it must wait.
  auto try_start = [&](std::size_t r) {
    if (busy_[r] || next_[r] >= order.ops[r].size()) return;
    pl::ScheduledOp& op = order.ops[r][next_[r]];
    PACKPIPE_CHECK_ARG(op.mb < M && op.vstage < V, "rank {} op {}: {} is outside {} micro-batches x {} stages", r,
                       next_[r], op_text(op), M, V);
    PACKPIPE_CHECK_ARG(static_cast<std::size_t>(p_.rank_of(op.vstage)) == r,
                       "rank {} op {}: {} belongs to rank {}", r, next_[r], op_text(op), p_.rank_of(op.vstage));
    const std::size_t i = static_cast<std::size_t>(op.mb) * static_cast<std::size_t>(V) + op.vstage;
    double ready = rank_free_[r];
    switch (op.kind) {
      case pl::OpKind::Forward:
        if (f_in_[i] < 0) return;
        ready = std::max(ready, f_in_[i]);
        break;
      case pl::OpKind::Backward:
      case pl::OpKind::BackwardInput:
        if (g_in_[i] < 0 || f_done_[i] < 0) return;
        ready = std::max(ready, g_in_[i]);
        break;
      case pl::OpKind::BackwardWeight:
        if (i_done_[i] < 0) return;
        ready = std::max(ready, i_done_[i]);
        break;
    }
    const double dur = c.op_ms(op.kind, i);
    if (barriers) {
      const std::uint32_t cy = order.cycle[r][next_[r]];
      if (cy > 0) {
        if (cycle_left_[cy - 1] != 0) return;
        ready = std::max(ready, cycle_end_[cy - 1]);
      }
    }
    // Memory: the running op's transient peak on top of what is stored; forward adds its stored
    // activations, B or W releases them at the end.
    // (peak_bytes is on top of the stage's own stored activations, which a forward is creating.)
    double during = cur_mem_[r] + c.peak_bytes[i];
    if (op.kind == pl::OpKind::Forward) during += c.stored_bytes[i];
    res.peak_bytes[r] = std::max(res.peak_bytes[r], during);
    op.start_ms = ready;
    op.end_ms = ready + dur;
    rank_free_[r] = op.end_ms;
    busy_[r] = 1;
    res.busy_ms[r] += dur;
    left_[r] -= dur;
    pending_[r] = op.end_ms;
  };

  auto deliver = [&](std::size_t from, std::size_t to, double t, double xfer) {
    if (from == to) return t;
    const double start = std::max(t, std::max(send_free_[from], recv_free_[to]));
    const double end = start + xfer;
    send_free_[from] = end;
    recv_free_[to] = end;
    return end;
  };

  for (std::size_t r = 0; r < S; ++r) try_start(r);
  double now = 0;
  for (;;) {
    // The next completion: least time, least rank on ties (a rank has at most one pending, so a
    // scan over the ranks replaces a heap).
    std::size_t r = 0;
    double first = pending_[0];
    for (std::size_t q = 1; q < S; ++q) {  // branch-free minimum (conditional moves)
      const double x = pending_[q];
      r = x < first ? q : r;
      first = x < first ? x : first;
    }
    if (first == kNone) break;
    now = first;
    pending_[r] = kNone;
    if (now > abort_above_ms || (bounded && now + left_[r] > abort_at)) {
      res.aborted = true;
      res.makespan_ms = now;
      return;
    }
    const pl::ScheduledOp& op = order.ops[r][next_[r]];
    const std::size_t i = static_cast<std::size_t>(op.mb) * static_cast<std::size_t>(V) + op.vstage;
    const std::int64_t v = op.vstage;
    std::uint8_t& st = state_[i];
    switch (op.kind) {
      case pl::OpKind::Forward: {
        PACKPIPE_CHECK_ARG(!(st & kF), "rank {} op {}: {} appears twice", r, next_[r], op_text(op));
        st |= kF;
        f_done_[i] = now;
        cur_mem_[r] += c.stored_bytes[i];
        if (v + 1 == V) {
          g_in_[i] = now;
        } else {
          const auto to = static_cast<std::size_t>(p_.rank_of(v + 1));
          f_in_[i + 1] = deliver(r, to, now, p_.transfer_ms[i]);
          if (to != r) try_start(to);
        }
        break;
      }
      case pl::OpKind::Backward:
      case pl::OpKind::BackwardInput: {
        PACKPIPE_CHECK_ARG(!(st & (kB | kI)), "rank {} op {}: the backward of micro-batch {} on virtual stage {} "
                           "appears twice", r, next_[r], op.mb, op.vstage);
        st |= op.kind == pl::OpKind::Backward ? kB : kI;
        i_done_[i] = now;
        if (op.kind == pl::OpKind::Backward) cur_mem_[r] -= c.stored_bytes[i];
        if (v > 0) {
          const auto to = static_cast<std::size_t>(p_.rank_of(v - 1));
          g_in_[i - 1] = deliver(r, to, now, p_.transfer_ms[i - 1]);
          if (to != r) try_start(to);
        }
        break;
      }
      case pl::OpKind::BackwardWeight:
        PACKPIPE_CHECK_ARG(!(st & kW) && !(st & kB), "rank {} op {}: {} repeats or follows a full backward", r,
                           next_[r], op_text(op));
        st |= kW;
        cur_mem_[r] -= c.stored_bytes[i];
        break;
    }
    bool cycle_closed = false;
    if (barriers) {
      const std::uint32_t cy = order.cycle[r][next_[r]];
      cycle_end_[cy] = std::max(cycle_end_[cy], now);
      cycle_closed = --cycle_left_[cy] == 0;
    }
    busy_[r] = 0;
    ++next_[r];
    ++done_ops;
    if (cycle_closed) {
      for (std::size_t q = 0; q < S; ++q) try_start(q);
    } else {
      try_start(r);
    }
    if (abort_on_memory && limit > 0 && res.peak_bytes[r] > limit) {
      res.aborted = true;
      res.within_memory = false;
      res.makespan_ms = now;
      return;
    }
  }
  if (done_ops < total_ops) {
    if (abort_on_memory && limit > 0) {
      for (std::size_t r = 0; r < S; ++r) {
        if (res.peak_bytes[r] > limit) {
          res.aborted = true;
          res.within_memory = false;
          res.makespan_ms = now;
          return;
        }
      }
    }
    for (std::size_t r = 0; r < S; ++r) {
      if (next_[r] >= order.ops[r].size()) continue;
      const pl::ScheduledOp& op = order.ops[r][next_[r]];
      const std::size_t i = static_cast<std::size_t>(op.mb) * static_cast<std::size_t>(V) + op.vstage;
      std::string why;
      if (op.kind == pl::OpKind::Forward) {
        why = fmt::format("the activation from F{} on virtual stage {}", op.mb, op.vstage - 1);
      } else if (op.kind == pl::OpKind::BackwardWeight) {
        why = fmt::format("I{} on virtual stage {}", op.mb, op.vstage);
      } else if (f_done_[i] < 0) {
        why = fmt::format("F{} on virtual stage {}", op.mb, op.vstage);
      } else {
        why = fmt::format("the gradient from the backward of micro-batch {} on virtual stage {}", op.mb, op.vstage + 1);
      }
      PACKPIPE_THROW(::packpipe::InvalidArgument, "deadlock: rank {} waits forever at op {} ({}) for {}", r, next_[r],
                     op_text(op), why);
    }
  }
  // Every (mb, v): one forward and one full backward, or one I and one W.
  for (std::int64_t i = 0; i < M * V; ++i) {
    const std::uint8_t st = state_[static_cast<std::size_t>(i)];
    const bool ok = (st & kF) && ((st & kB) || ((st & kI) && (st & kW)));
    PACKPIPE_CHECK_ARG(ok, "the order misses an op of micro-batch {} on virtual stage {} (has{}{}{}{})", i / V, i % V,
                       (st & kF) ? " F" : "", (st & kB) ? " B" : "", (st & kI) ? " I" : "", (st & kW) ? " W" : "");
  }
  res.makespan_ms = now;
  double busy = 0;
  for (std::size_t r = 0; r < S; ++r) {
    busy += res.busy_ms[r];
    res.utilization[r] = now > 0 ? res.busy_ms[r] / now : 0.0;
    if (limit > 0 && res.peak_bytes[r] > limit) res.within_memory = false;
  }
  res.bubble_fraction = now > 0 ? 1.0 - busy / (static_cast<double>(S) * now) : 0.0;
}

pl::Schedule simulate(const SimProblem& problem, RankOrder order, const std::string& name,
                  const std::vector<std::uint32_t>& mb_order) {
  Simulator sim(problem);
  SimResult r;
  sim.run(order, r);
  pl::Schedule s;
  s.name = name;
  s.ranks = problem.ranks;
  s.vstages = problem.vstages();
  s.microbatches = problem.microbatches();
  s.ops = std::move(order.ops);
  s.order = mb_order;
  s.makespan_ms = r.makespan_ms;
  s.bubble_fraction = r.bubble_fraction;
  s.peak_bytes = r.peak_bytes;
  s.utilization = r.utilization;
  const auto* kind = enum_find(kScheduleKindNames, name);
  const double f = kind != nullptr ? problem.factor(kind->value) : 1.0;
  if (f != 1.0) {
    // The schedule's own cost (f >= 1) is time between ops: every start is scaled, every op keeps
    // its duration (what a replay sleeps and a report compares), so every dependency still holds.
    double last = 0;
    for (auto& rank_ops : s.ops) {
      for (auto& op : rank_ops) {
        const double d = op.end_ms - op.start_ms;
        op.start_ms *= f;
        op.end_ms = op.start_ms + d;
        last = std::max(last, op.end_ms);
      }
    }
    s.makespan_ms = last;
    double busy = 0;
    for (std::size_t k = 0; k < r.busy_ms.size() && k < s.utilization.size(); ++k) {
      busy += r.busy_ms[k];
      s.utilization[k] = last > 0 ? r.busy_ms[k] / last : 0.0;
    }
    s.bubble_fraction = last > 0 ? 1.0 - busy / (static_cast<double>(problem.ranks) * last) : 0.0;
  }
  return s;
}

MakespanBounds makespan_lower_bounds(const SimProblem& p) {
  const StageCostTable& c = p.costs;
  const std::int64_t V = p.vstages();
  MakespanBounds b;
  std::vector<double> work(static_cast<std::size_t>(p.ranks), 0.0);
  // (A calibrated table fits a backward's halves apart: each bound takes the least a schedule
  // spends, whole or split: StageCostTable::least_backward_ms, least_input_ms, least_weight_ms.)
  for (std::int64_t mb = 0; mb < p.microbatches(); ++mb) {
    // Every forward and transfer, then the input-gradient chain back to some stage v and its
    // weight gradient (a full backward is I + W).
    double path = 0, tail = 0, best_tail = 0;
    for (std::int64_t v = 0; v < V; ++v) {
      const auto i = static_cast<std::size_t>(mb * V + v);
      work[static_cast<std::size_t>(p.rank_of(v))] += c.op_ms(pl::OpKind::Forward, i) + c.least_backward_ms(i);
      path += c.op_ms(pl::OpKind::Forward, i) + 2 * p.transfer_ms[i];
    }
    for (std::int64_t v = V - 1; v >= 0; --v) {
      const auto i = static_cast<std::size_t>(mb * V + v);
      tail += c.least_input_ms(i);
      best_tail = std::max(best_tail, tail + c.least_weight_ms(i));
    }
    path += best_tail;
    b.critical_path_ms = std::max(b.critical_path_ms, path);
  }
  for (double w : work) b.rank_work_ms = std::max(b.rank_work_ms, w);
  // Per rank, its ops as jobs with release times (the earliest their inputs can arrive): F(mb, v)
  // after the forwards and transfers before v; the backward of (mb, v) (B, or I then W: both
  // parts after the same release) after the whole forward and the input gradients from the last
  // stage back to v + 1 with their transfers.
  std::vector<std::vector<std::pair<double, double>>> jobs(static_cast<std::size_t>(p.ranks));
  for (auto& j : jobs) j.reserve(static_cast<std::size_t>(2 * p.microbatches() * V / p.ranks + 2));
  for (std::int64_t mb = 0; mb < p.microbatches(); ++mb) {
    double t = 0;
    for (std::int64_t v = 0; v < V; ++v) {
      const auto i = static_cast<std::size_t>(mb * V + v);
      jobs[static_cast<std::size_t>(p.rank_of(v))].emplace_back(t, c.op_ms(pl::OpKind::Forward, i));
      t += c.op_ms(pl::OpKind::Forward, i) + (v + 1 < V ? p.transfer_ms[i] : 0.0);
    }
    for (std::int64_t v = V - 1; v >= 0; --v) {
      const auto i = static_cast<std::size_t>(mb * V + v);
      jobs[static_cast<std::size_t>(p.rank_of(v))].emplace_back(t, c.least_backward_ms(i));
      if (v > 0) t += c.least_input_ms(i) + p.transfer_ms[i - 1];
    }
  }
  for (auto& j : jobs) {
    std::sort(j.begin(), j.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    double after = 0;
    for (const auto& [release, ms] : j) {
      after += ms;
      b.release_ms = std::max(b.release_ms, release + after);
    }
  }
  return b;
}

}  // namespace packpipe::schedule
