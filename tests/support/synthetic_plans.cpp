#include "tests/support/synthetic_plans.h"

#include <algorithm>
#include <deque>
#include <random>

#include <fmt/format.h>

#include "common/errors.h"
#include "common/rng.h"
#include "planner/planner.h"
#include "schedule/schedules.h"
#include "schedule/simulator.h"

namespace packpipe::test::synthetic {

namespace part = ::packpipe::partition;
namespace pl = ::packpipe::plan;
namespace sched = ::packpipe::schedule;
namespace cm = ::packpipe::costmodel;
using pl::OpKind;
using pl::Schedule;
using pl::ScheduledOp;
using part::MicroBatch;
using part::VirtualStage;
using sched::StageCostTable;

namespace {

constexpr std::uint32_t U32(std::int64_t v) { return static_cast<std::uint32_t>(v); }

// A problem of the right sizes and no costs: the textbook orders depend on sizes only.
sched::SimProblem sizes_only(std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches) {
  StageCostTable t;
  t.microbatches = microbatches;
  t.vstages = ranks * chunks;
  const auto n = static_cast<std::size_t>(microbatches * ranks * chunks);
  for (auto* v : {&t.forward_ms, &t.backward_ms, &t.backward_weight_ms, &t.stored_bytes, &t.peak_bytes, &t.send_bytes})
    v->assign(n, 0.0);
  t.static_bytes.assign(static_cast<std::size_t>(ranks), 0.0);
  return sched::make_sim_problem(std::move(t), ranks, cm::CommModel{}, 1, 0.0);
}

}  // namespace

Schedule order(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches) {
  PACKPIPE_CHECK_ARG(ranks >= 1 && chunks >= 1 && microbatches >= 1,
                     "synthetic::order: ranks, chunks and micro-batches must be positive ({}, {}, {})", ranks, chunks,
                     microbatches);
  const bool zb = kind == "zero-bubble";
  PACKPIPE_CHECK_ARG(kind == "gpipe" || kind == "1f1b" || zb,
                     "synthetic::order: unknown schedule '{}' (gpipe, 1f1b, zero-bubble)", kind);
  PACKPIPE_CHECK_ARG(kind == "gpipe" || chunks == 1 || microbatches % ranks == 0,
                     "synthetic::order: interleaved orders need micro-batches ({}) divisible by ranks ({})",
                     microbatches, ranks);
  const sched::ScheduleKind k = kind == "gpipe" ? sched::ScheduleKind::GPipe
                                : chunks == 1   ? sched::ScheduleKind::OneFOneB
                                                : sched::ScheduleKind::Interleaved1F1B;
  Schedule s;
  s.name = kind;
  s.ranks = ranks;
  s.vstages = ranks * chunks;
  s.microbatches = microbatches;
  for (std::int64_t m = 0; m < microbatches; ++m) s.order.push_back(U32(m));
  sched::RankOrder o = sched::build_order(k, sizes_only(ranks, chunks, microbatches), s.order);
  s.ops = std::move(o.ops);
  if (!zb) return s;
  // Each backward as its input-gradient half, the weight-gradient halves deferred by a budget of
  // S - 1 - rank (the last rank runs them at once).
  for (std::int64_t r = 0; r < ranks; ++r) {
    std::vector<ScheduledOp> split;
    std::deque<ScheduledOp> pending_w;
    const auto w_budget = static_cast<std::size_t>(ranks - 1 - r);
    for (ScheduledOp op : s.ops[r]) {
      if (op.kind != OpKind::Backward) {
        split.push_back(op);
        continue;
      }
      op.kind = OpKind::BackwardInput;
      split.push_back(op);
      op.kind = OpKind::BackwardWeight;
      pending_w.push_back(op);
      while (pending_w.size() > w_budget) {
        split.push_back(pending_w.front());
        pending_w.pop_front();
      }
    }
    for (const auto& w : pending_w) split.push_back(w);
    s.ops[r] = std::move(split);
  }
  return s;
}

void assign_times(Schedule& schedule, const StageCostTable& costs, double comm_ms) {
  const std::int64_t S = schedule.ranks, V = costs.vstages, N = costs.microbatches;
  PACKPIPE_CHECK_ARG(static_cast<std::int64_t>(schedule.ops.size()) == S, "assign_times: {} op lists for {} ranks",
                     schedule.ops.size(), S);
  const auto n = static_cast<std::size_t>(N * V);
  std::vector<double> f_end(n, -1), b_end(n, -1);  // b: Backward or BackwardInput
  std::vector<std::int64_t> rank_of_stage(static_cast<std::size_t>(V), -1);
  for (std::int64_t r = 0; r < S; ++r)
    for (const auto& o : schedule.ops[r]) {
      PACKPIPE_CHECK_ARG(o.mb < N && o.vstage < V, "assign_times: op {}{} of stage {} out of range",
                         op_kind_token(o.kind), o.mb, o.vstage);
      rank_of_stage[o.vstage] = r;
    }
  std::vector<std::size_t> pc(static_cast<std::size_t>(S), 0);
  std::vector<double> free_at(static_cast<std::size_t>(S), 0);
  double makespan = 0;
  bool progress = true;
  while (progress) {
    progress = false;
    for (std::int64_t r = 0; r < S; ++r) {
      auto& ops = schedule.ops[r];
      while (pc[r] < ops.size()) {
        ScheduledOp& o = ops[pc[r]];
        const std::size_t k = static_cast<std::size_t>(o.mb * V + o.vstage);
        double ready = free_at[r];
        auto dep = [&](double end, std::int64_t from_stage) {
          if (end < 0) return false;
          ready = std::max(ready, end + (rank_of_stage[from_stage] == r ? 0.0 : comm_ms));
          return true;
        };
        bool ok = true;
        switch (o.kind) {
          case OpKind::Forward:
            if (o.vstage > 0) ok = dep(f_end[k - 1], o.vstage - 1);
            break;
          case OpKind::Backward:
          case OpKind::BackwardInput:
            ok = dep(f_end[k], o.vstage);
            if (ok && o.vstage + 1 < V) ok = dep(b_end[k + 1], o.vstage + 1);
            break;
          case OpKind::BackwardWeight:
            ok = dep(b_end[k], o.vstage);
            break;
        }
        if (!ok) break;
        const double dur = costs.op_ms(o.kind, k);
        o.start_ms = ready;
        o.end_ms = ready + dur;
        free_at[r] = o.end_ms;
        makespan = std::max(makespan, o.end_ms);
        if (o.kind == OpKind::Forward) f_end[k] = o.end_ms;
        if (o.kind == OpKind::Backward || o.kind == OpKind::BackwardInput) b_end[k] = o.end_ms;
        ++pc[r];
        progress = true;
      }
    }
  }
  for (std::int64_t r = 0; r < S; ++r) {
    PACKPIPE_CHECK_ARG(pc[r] == schedule.ops[r].size(), "assign_times: schedule '{}' deadlocks at rank {} op {}",
                       schedule.name, r, pc[r]);
  }
  schedule.makespan_ms = makespan;
}

Case random_case(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
                 std::uint64_t seed, bool same_shape, bool encoder_decoder) {
  Case c;
  SplitMix64 rng(seed * 0x2545F4914F6CDD1Dull + 0x1234567ull);
  const std::int64_t V = ranks * chunks;
  PACKPIPE_CHECK_ARG(!encoder_decoder || V == 1 || V % 2 == 0,
                     "synthetic::random_case: encoder-decoder needs an even number of virtual stages, found {}", V);
  for (std::int64_t v = 0; v < V; ++v) {
    VirtualStage vs;
    vs.index = v;
    vs.rank = v % ranks;
    if (!encoder_decoder) {
      vs.layout.encoder_layers = 1;
    } else if (V == 1) {
      vs.layout.encoder_layers = vs.layout.decoder_layers = 1;
    } else if (v < V / 2) {
      vs.layout.encoder_layers = 1;
    } else {
      vs.layout.decoder_layers = 1;
    }
    c.vstages.push_back(vs);
  }
  c.vstages.front().layout.has_embedding = true;
  c.vstages.back().layout.has_postprocess = true;
  std::uint32_t sample = 0;
  const std::int64_t rows0 = rng.uniform(1, 8), len0 = 64 * rng.uniform(1, 32), dec0 = 32 * rng.uniform(1, 8);
  for (std::int64_t m = 0; m < microbatches; ++m) {
    MicroBatch mb;
    const std::int64_t rows = same_shape ? rows0 : rng.uniform(1, 8);
    mb.padded_len = same_shape ? len0 : 64 * rng.uniform(1, 32);
    mb.padded_dec_len = encoder_decoder ? (same_shape ? dec0 : 32 * rng.uniform(1, 8)) : 0;
    // Samples of random lengths within the padded row; the micro-batch's tokens are theirs.
    for (std::int64_t i = 0; i < rows; ++i) {
      mb.samples.push_back(sample++);
      const auto in = static_cast<std::uint32_t>(rng.uniform(1, mb.padded_len));
      c.lengths.input.push_back(in);
      mb.tokens += in;
      if (encoder_decoder) {
        const auto tg = static_cast<std::uint32_t>(rng.uniform(1, mb.padded_dec_len));
        c.lengths.target.push_back(tg);
        mb.tokens += tg;
      }
    }
    mb.recompute = static_cast<cm::Recompute>(rng.uniform(0, 2));
    c.mbs.push_back(mb);
  }
  const std::int64_t hidden = 1024;
  StageCostTable& t = c.costs;
  t.microbatches = microbatches;
  t.vstages = V;
  const auto n = static_cast<std::size_t>(microbatches * V);
  t.forward_ms.resize(n);
  t.backward_ms.resize(n);
  t.backward_weight_ms.resize(n);
  t.stored_bytes.resize(n);
  t.peak_bytes.resize(n);
  t.send_bytes.resize(n);
  t.static_bytes.assign(static_cast<std::size_t>(ranks), 2e9);
  for (std::int64_t m = 0; m < microbatches; ++m) {
    const auto& mb = c.mbs[m];
    const double tok = static_cast<double>(mb.rows() * (mb.padded_len + mb.padded_dec_len));
    for (std::int64_t v = 0; v < V; ++v) {
      const std::size_t i = t.at(m, v);
      const double jitter = 1.0 + 0.05 * static_cast<double>(rng.uniform(0, 10));
      t.forward_ms[i] = 1e-3 * tok * jitter;
      t.backward_ms[i] = 2.0 * t.forward_ms[i] * (mb.recompute == cm::Recompute::Full ? 1.5 : 1.0);
      t.backward_weight_ms[i] = 0.4 * t.backward_ms[i];
      const double rc = mb.recompute == cm::Recompute::Full ? 0.1 : mb.recompute == cm::Recompute::Selective ? 0.6 : 1.0;
      t.stored_bytes[i] = tok * static_cast<double>(hidden) * 2 * 16 * rc;
      t.peak_bytes[i] = tok * static_cast<double>(hidden) * 2 * 4;
      t.send_bytes[i] = tok * static_cast<double>(hidden) * 2;
    }
  }
  c.schedule = order(kind, ranks, chunks, microbatches);
  assign_times(c.schedule, c.costs, 0.05);
  c.options.hidden = hidden;
  c.options.iteration = seed;
  c.options.memory_limit_bytes = 80'000'000'000ull;
  return c;
}

pl::Plan build(const Case& c) {
  return planner::make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, c.options);
}

std::vector<KindPlan> real_schedule_plans(std::uint64_t seed, std::string* shape) {
  std::mt19937_64 rng(seed);
  const std::int64_t S = 1 + static_cast<std::int64_t>(rng() % 8);
  const std::int64_t C = 1 + static_cast<std::int64_t>(rng() % 2);
  const std::int64_t N = C > 1 ? S * (1 + static_cast<std::int64_t>(rng() % 3)) : 1 + static_cast<std::int64_t>(rng() % 24);
  const bool encdec = rng() % 4 == 0 && (S * C == 1 || (S * C) % 2 == 0);
  const std::uint64_t case_seed = rng();
  const Case c = random_case("gpipe", S, C, N, case_seed, false, encdec);
  cm::CommModel comm;
  comm.intra_latency_ms = 0.01;
  comm.intra_bytes_per_ms = 1e8;
  comm.inter_latency_ms = 0.02;
  comm.inter_bytes_per_ms = 1e7;
  const double limit = rng() % 2 ? 0.0 : 2e10;
  const sched::SimProblem prob = sched::make_sim_problem(c.costs, S, comm, 1 + static_cast<std::int64_t>(rng() % 8), limit);
  std::vector<std::uint32_t> order(static_cast<std::size_t>(N));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  if (shape != nullptr) *shape = fmt::format("S={} chunks={} mbs={} encdec={}", S, C, N, encdec);
  std::vector<KindPlan> out;
  for (sched::ScheduleKind k : sched::all_schedule_kinds()) {
    if (!sched::schedule_supports(k, S, C, N)) continue;
    const Schedule s = sched::make_schedule(k, prob, order);
    out.push_back(KindPlan{sched::schedule_kind_name(k), planner::make_plan(s, c.mbs, c.vstages, c.lengths, &c.costs, c.options)});
  }
  return out;
}

pl::Plan random_plan(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
                     std::uint64_t seed, bool same_shape, bool encoder_decoder) {
  return build(random_case(kind, ranks, chunks, microbatches, seed, same_shape, encoder_decoder));
}

}  // namespace packpipe::test::synthetic
