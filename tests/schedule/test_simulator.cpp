// Simulator: hand-computable makespans and bubbles, memory accounting, transfers, deadlock and
// malformed orders, properties of every schedule on random cost tables, Chrome trace export.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <tuple>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "schedule/schedules.h"
#include "schedule/simulator.h"
#include "plan/trace.h"
#include "tests/support/schedule_problems.h"

using namespace packpipe::partition;
using namespace packpipe::schedule;
using namespace packpipe::plan;
namespace cm = packpipe::costmodel;

namespace {

using packpipe::test::uniform_problem;

SimProblem random_problem(std::mt19937_64& rng, std::int64_t m, std::int64_t S, std::int64_t c) {
  std::uniform_real_distribution<double> u(0.2, 3.0);
  std::uniform_real_distribution<double> frac(0.1, 0.6);
  std::uniform_real_distribution<double> bytes(1e6, 5e6);
  StageCostTable t;
  t.microbatches = m;
  t.vstages = S * c;
  const auto n = static_cast<std::size_t>(m * S * c);
  for (std::int64_t mb = 0; mb < m; ++mb) {
    const double scale = u(rng);  // the micro-batch's size
    for (std::int64_t v = 0; v < S * c; ++v) {
      const double f = scale * u(rng) * 0.5;
      t.forward_ms.push_back(f);
      const double b = 2 * f;
      t.backward_ms.push_back(b);
      const double wf = frac(rng);
      t.backward_weight_ms.push_back(b * wf);
      const double st = scale * bytes(rng);
      t.stored_bytes.push_back(st);
      const double pk = st * 1.5;
      t.peak_bytes.push_back(pk);
      const double sb = scale * bytes(rng);
      t.send_bytes.push_back(sb);
    }
  }
  REQUIRE(t.forward_ms.size() == n);
  t.static_bytes.assign(static_cast<std::size_t>(S), 1e7);
  cm::CommModel comm;
  comm.intra_latency_ms = 0.01;
  comm.intra_bytes_per_ms = 5e6;
  comm.inter_latency_ms = 0.02;
  comm.inter_bytes_per_ms = 1e6;
  return make_sim_problem(std::move(t), S, comm, 2, 0.0);
}

std::vector<std::uint32_t> iota_order(std::int64_t m) {
  std::vector<std::uint32_t> o(static_cast<std::size_t>(m));
  for (std::size_t i = 0; i < o.size(); ++i) o[i] = static_cast<std::uint32_t>(i);
  return o;
}

// Independent checks of a simulated schedule: completeness, dependencies in time, no overlap.
void check_schedule(const SimProblem& p, const Schedule& s) {
  const std::int64_t V = p.vstages();
  using Key = std::tuple<int, std::uint32_t, std::uint32_t>;
  std::map<Key, const ScheduledOp*> ops;
  for (std::size_t r = 0; r < s.ops.size(); ++r) {
    double last_end = 0;
    for (const auto& op : s.ops[r]) {
      REQUIRE(static_cast<std::int64_t>(op.vstage % p.ranks) == static_cast<std::int64_t>(r));
      REQUIRE(op.start_ms >= last_end - 1e-9);  // one op at a time per rank
      REQUIRE(op.end_ms >= op.start_ms);
      last_end = op.end_ms;
      REQUIRE(ops.emplace(Key{static_cast<int>(op.kind), op.mb, op.vstage}, &op).second);  // exactly once
      REQUIRE(op.end_ms <= s.makespan_ms + 1e-9);
    }
  }
  auto get = [&](OpKind k, std::int64_t mb, std::int64_t v) -> const ScheduledOp* {
    auto it = ops.find(Key{static_cast<int>(k), static_cast<std::uint32_t>(mb), static_cast<std::uint32_t>(v)});
    return it == ops.end() ? nullptr : it->second;
  };
  for (std::int64_t mb = 0; mb < p.microbatches(); ++mb) {
    for (std::int64_t v = 0; v < V; ++v) {
      const auto i = static_cast<std::size_t>(mb * V + v);
      const ScheduledOp* f = get(OpKind::Forward, mb, v);
      REQUIRE(f != nullptr);
      if (v > 0) REQUIRE(f->start_ms >= get(OpKind::Forward, mb, v - 1)->end_ms + p.transfer_ms[i - 1] - 1e-9);
      const ScheduledOp* b = get(OpKind::Backward, mb, v);
      const ScheduledOp* in = get(OpKind::BackwardInput, mb, v);
      const ScheduledOp* w = get(OpKind::BackwardWeight, mb, v);
      REQUIRE(((b != nullptr) != (in != nullptr && w != nullptr)));
      REQUIRE((in == nullptr) == (w == nullptr));
      const ScheduledOp* back = b ? b : in;
      REQUIRE(back->start_ms >= f->end_ms - 1e-9);
      if (v + 1 < V) {
        const ScheduledOp* up = get(OpKind::Backward, mb, v + 1);
        if (!up) up = get(OpKind::BackwardInput, mb, v + 1);
        REQUIRE(back->start_ms >= up->end_ms + p.transfer_ms[i] - 1e-9);
      }
      if (w) REQUIRE(w->start_ms >= in->end_ms - 1e-9);
    }
  }
  const MakespanBounds lb = makespan_lower_bounds(p);
  REQUIRE(s.makespan_ms >= lb.rank_work_ms * (1 - 1e-12));
  REQUIRE(s.makespan_ms >= lb.critical_path_ms * (1 - 1e-12));
  REQUIRE(s.makespan_ms >= lb.release_ms * (1 - 1e-12));
  REQUIRE(lb.release_ms >= lb.rank_work_ms * (1 - 1e-12));  // (its release 0 holds every op)
}

// Memory peaks recomputed from the op order alone.
std::vector<double> replay_memory(const SimProblem& p, const Schedule& s) {
  const StageCostTable& t = p.costs;
  std::vector<double> peak(s.ops.size());
  for (std::size_t r = 0; r < s.ops.size(); ++r) {
    double cur = t.static_bytes[r];
    peak[r] = cur;
    for (const auto& op : s.ops[r]) {
      const std::size_t i = t.at(op.mb, op.vstage);
      if (op.kind == OpKind::Forward) {
        peak[r] = std::max(peak[r], cur + t.stored_bytes[i] + t.peak_bytes[i]);
        cur += t.stored_bytes[i];
      } else {
        peak[r] = std::max(peak[r], cur + t.peak_bytes[i]);
        if (op.kind != OpKind::BackwardInput) cur -= t.stored_bytes[i];
      }
    }
  }
  return peak;
}

}  // namespace

TEST_CASE("simulator: uniform 1F1B and GPipe makespan (m + S - 1)(f + b) without communication", "[interface]") {
  for (std::int64_t S : {1, 2, 4, 8}) {
    for (std::int64_t m : {8, 9, 16}) {
      const double f = 1.0, b = 2.0;
      const SimProblem p = uniform_problem(m, S, 1, f, b);
      const Schedule one = make_schedule(ScheduleKind::OneFOneB, p);
      CHECK(one.makespan_ms == Approx((m + S - 1) * (f + b)));
      const Schedule gp = make_schedule(ScheduleKind::GPipe, p);
      CHECK(gp.makespan_ms == Approx((m + S - 1) * (f + b)));
      const double bubble = static_cast<double>(S - 1) / static_cast<double>(m + S - 1);
      CHECK(gp.bubble_fraction == Approx(bubble).margin(1e-12));
      CHECK(one.bubble_fraction == Approx(bubble).margin(1e-12));
      for (double u : gp.utilization) CHECK(u == Approx(1 - bubble));
    }
  }
}

TEST_CASE("simulator: one micro-batch through two ranks pays both transfers", "[interface]") {
  SimProblem p = uniform_problem(1, 2, 1, 1.0, 2.0, 0.0, 0.0, 0.25);
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, p);
  CHECK(s.makespan_ms == Approx(1 + 0.25 + 1 + 2 + 0.25 + 2));
  CHECK(s.ops[1][0].start_ms == Approx(1.25));
  CHECK(s.ops[0][1].start_ms == Approx(1.25 + 3 + 0.25));
}

TEST_CASE("simulator: 1F1B holds S - rank micro-batches at rank, GPipe all of them", "[interface]") {
  const std::int64_t S = 4, m = 10;
  const SimProblem p = uniform_problem(m, S, 1, 1.0, 2.0, 0.0, 1000.0);
  const Schedule one = make_schedule(ScheduleKind::OneFOneB, p);
  const Schedule gp = make_schedule(ScheduleKind::GPipe, p);
  for (std::int64_t r = 0; r < S; ++r) {
    CHECK(one.peak_bytes[static_cast<std::size_t>(r)] == Approx(1000.0 * static_cast<double>(S - r)));
    CHECK(gp.peak_bytes[static_cast<std::size_t>(r)] == Approx(1000.0 * m));
  }
}

TEST_CASE("simulator: memory peaks equal a replay of the op order on random tables", "[interface]") {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 20; ++trial) {
    const std::int64_t S = 1 + static_cast<std::int64_t>(rng() % 5);
    const std::int64_t m = S + static_cast<std::int64_t>(rng() % 7);
    const SimProblem p = random_problem(rng, m, S, 1);
    for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZeroBubble}) {
      const Schedule s = make_schedule(k, p);
      const auto peak = replay_memory(p, s);
      for (std::size_t r = 0; r < peak.size(); ++r) CHECK(s.peak_bytes[r] == Approx(peak[r]));
    }
  }
}

TEST_CASE("simulator: every schedule on random tables is complete, ordered in time and above the bounds",
          "[interface][stress]") {
  std::mt19937_64 rng(20261122);
  for (int trial = 0; trial < 60; ++trial) {
    const std::int64_t S = 1 + static_cast<std::int64_t>(rng() % 6);
    const std::int64_t c = 1 + static_cast<std::int64_t>(rng() % 3);
    const std::int64_t m = 1 + static_cast<std::int64_t>(rng() % 14);
    const SimProblem p = random_problem(rng, m, S, c);
    std::vector<std::uint32_t> order = iota_order(m);
    std::shuffle(order.begin(), order.end(), rng);
    for (ScheduleKind k : all_schedule_kinds()) {
      if (!schedule_supports(k, S, c, m)) continue;
      INFO(schedule_kind_name(k) << " S " << S << " c " << c << " m " << m);
      const Schedule s = make_schedule(k, p, order);
      check_schedule(p, s);
      double busy = 0;
      for (std::size_t r = 0; r < s.ops.size(); ++r) busy += s.utilization[r] * s.makespan_ms;
      CHECK(s.bubble_fraction == Approx(1 - busy / (static_cast<double>(S) * s.makespan_ms)).margin(1e-9));
      CHECK(s.order == order);
    }
  }
}

TEST_CASE("simulator: the release bound adds the pipeline's fill to the busiest rank, and holds for any order",
          "[interface][stress]") {
  // Uniform stages (F f, B 2f, no transfers): the last rank's forwards arrive after S - 1 others,
  // so no schedule ends before (S - 1) f + m (f + 2f).
  for (std::int64_t S : {2, 4}) {
    for (std::int64_t m : {4, 8}) {
      StageCostTable t;
      t.microbatches = m;
      t.vstages = S;
      const auto n = static_cast<std::size_t>(m * S);
      t.forward_ms.assign(n, 1.0);
      t.backward_ms.assign(n, 2.0);
      t.backward_weight_ms.assign(n, 1.0);
      t.stored_bytes.assign(n, 1.0);
      t.peak_bytes.assign(n, 1.0);
      t.send_bytes.assign(n, 0.0);
      t.static_bytes.assign(static_cast<std::size_t>(S), 0.0);
      const SimProblem p = make_sim_problem(std::move(t), S, cm::CommModel{}, S, 0.0);
      const MakespanBounds lb = makespan_lower_bounds(p);
      INFO("S " << S << " m " << m);
      CHECK(lb.rank_work_ms == Approx(3.0 * static_cast<double>(m)));
      CHECK(lb.release_ms == Approx(static_cast<double>(S - 1) + 3.0 * static_cast<double>(m)));
      // (1F1B also drains: (S - 1) (f + 2f) + 3 m f, above the bound)
      CHECK(make_schedule(ScheduleKind::OneFOneB, p, iota_order(m)).makespan_ms ==
            Approx(3.0 * static_cast<double>(S - 1 + m)));
    }
  }
  // Random tables with transfers, chunks and shuffled orders: every kind's makespan is above it.
  std::mt19937_64 rng(29);
  int tighter = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const std::int64_t S = 1 + static_cast<std::int64_t>(rng() % 5);
    const std::int64_t c = 1 + static_cast<std::int64_t>(rng() % 2);
    const std::int64_t m = 1 + static_cast<std::int64_t>(rng() % 12);
    const SimProblem p = random_problem(rng, m, S, c);
    const MakespanBounds lb = makespan_lower_bounds(p);
    tighter += lb.release_ms > std::max(lb.rank_work_ms, lb.critical_path_ms) * (1 + 1e-9) ? 1 : 0;
    std::vector<std::uint32_t> order = iota_order(m);
    for (int k = 0; k < 3; ++k) {
      std::shuffle(order.begin(), order.end(), rng);
      for (ScheduleKind kind : all_schedule_kinds()) {
        if (!schedule_supports(kind, S, c, m)) continue;
        INFO(schedule_kind_name(kind) << " S " << S << " c " << c << " m " << m);
        CHECK(make_schedule(kind, p, order).makespan_ms >= lb.release_ms * (1 - 1e-12));
      }
    }
  }
  CHECK(tighter >= 10);  // (it adds to the older bounds on many of them: 18 of these 80)
  // A calibrated table fits the halves apart: I + W under B (zero-bubble runs the halves: the rank
  // work and the release jobs count the lesser), or I over B (a whole backward sends its gradient
  // after B: the gradient chains take the lesser). Every kind stays at or above every bound.
  int split_under = 0, input_over = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const std::int64_t S = 2 + static_cast<std::int64_t>(rng() % 3);
    const std::int64_t c = 1 + static_cast<std::int64_t>(trial % 2);
    const std::int64_t m = S + static_cast<std::int64_t>(rng() % 8);
    SimProblem p = random_problem(rng, m, S, c);
    StageCostTable& t = p.costs;
    const double f = trial % 4 < 2 ? 0.3 : 1.9;  // I = f (B - W): the split under B, or I over B
    t.backward_input_ms.resize(t.backward_ms.size());
    for (std::size_t i = 0; i < t.backward_ms.size(); ++i) {
      t.backward_input_ms[i] = f * (t.backward_ms[i] - t.backward_weight_ms[i]);
      split_under += t.backward_input_ms[i] + t.backward_weight_ms[i] < t.backward_ms[i] ? 1 : 0;
      input_over += t.backward_input_ms[i] > t.backward_ms[i] ? 1 : 0;
    }
    const MakespanBounds lb = makespan_lower_bounds(p);
    std::vector<std::uint32_t> order = iota_order(m);
    for (int k = 0; k < 2; ++k) {
      for (ScheduleKind kind : all_schedule_kinds()) {
        if (!schedule_supports(kind, S, c, m)) continue;
        INFO(schedule_kind_name(kind) << " S " << S << " c " << c << " m " << m << " I = " << f << " (B - W)");
        const double ms = make_schedule(kind, p, order).makespan_ms;
        CHECK(ms >= lb.rank_work_ms * (1 - 1e-12));
        CHECK(ms >= lb.critical_path_ms * (1 - 1e-12));
        CHECK(ms >= lb.release_ms * (1 - 1e-12));
      }
      std::shuffle(order.begin(), order.end(), rng);
    }
  }
  CHECK(split_under > 100);
  CHECK(input_over > 100);
}

TEST_CASE("simulator: cyclic barriers never beat the wait-free replay without communication", "[interface]") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    const std::int64_t S = 2 + static_cast<std::int64_t>(rng() % 4);
    const std::int64_t m = 1 + static_cast<std::int64_t>(rng() % 12);
    SimProblem p = random_problem(rng, m, S, 1);
    std::fill(p.transfer_ms.begin(), p.transfer_ms.end(), 0.0);
    const Schedule cyc = make_schedule(ScheduleKind::Cyclic, p);
    const Schedule wf = make_schedule(ScheduleKind::WaitFreeCyclic, p);
    CHECK(wf.makespan_ms <= cyc.makespan_ms + 1e-9);
    for (std::size_t r = 0; r < cyc.ops.size(); ++r) {
      REQUIRE(cyc.ops[r].size() == wf.ops[r].size());
      for (std::size_t i = 0; i < cyc.ops[r].size(); ++i) {
        CHECK(cyc.ops[r][i].mb == wf.ops[r][i].mb);
        CHECK(cyc.ops[r][i].kind == wf.ops[r][i].kind);
      }
    }
  }
}

TEST_CASE("simulator: a crossed order deadlocks with the rank and op named", "[negative]") {
  const SimProblem p = uniform_problem(2, 2, 1, 1.0, 2.0);
  RankOrder o;
  auto op = [](OpKind k, std::uint32_t mb, std::uint32_t v) {
    ScheduledOp x;
    x.kind = k;
    x.mb = mb;
    x.vstage = v;
    return x;
  };
  o.ops = {{op(OpKind::Forward, 0, 0), op(OpKind::Backward, 0, 0), op(OpKind::Forward, 1, 0), op(OpKind::Backward, 1, 0)},
           {op(OpKind::Forward, 1, 1), op(OpKind::Backward, 1, 1), op(OpKind::Forward, 0, 1), op(OpKind::Backward, 0, 1)}};
  Simulator sim(p);
  SimResult r;
  REQUIRE_THROWS_AS(sim.run(o, r), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(sim.run(o, r), Catch::Matchers::Contains("deadlock: rank 0 waits forever at op 1 (B0"));
  // A backward before its own forward on one rank.
  const SimProblem q = uniform_problem(1, 1, 1, 1.0, 2.0);
  RankOrder bad;
  bad.ops = {{op(OpKind::Backward, 0, 0), op(OpKind::Forward, 0, 0)}};
  Simulator sq(q);
  REQUIRE_THROWS_WITH(sq.run(bad, r), Catch::Matchers::Contains("deadlock") && Catch::Matchers::Contains("F0"));
}

TEST_CASE("simulator: ops on the wrong rank, repeated or missing ops are refused", "[negative]") {
  const SimProblem p = uniform_problem(1, 2, 1, 1.0, 2.0);
  auto op = [](OpKind k, std::uint32_t mb, std::uint32_t v) {
    ScheduledOp x;
    x.kind = k;
    x.mb = mb;
    x.vstage = v;
    return x;
  };
  Simulator sim(p);
  SimResult r;
  RankOrder wrong;
  wrong.ops = {{op(OpKind::Forward, 0, 0), op(OpKind::Forward, 0, 1)}, {}};
  REQUIRE_THROWS_WITH(sim.run(wrong, r), Catch::Matchers::Contains("belongs to rank 1"));
  RankOrder missing;
  missing.ops = {{op(OpKind::Forward, 0, 0), op(OpKind::Backward, 0, 0)},
                 {op(OpKind::Forward, 0, 1), op(OpKind::BackwardInput, 0, 1)}};
  REQUIRE_THROWS_AS(sim.run(missing, r), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(sim.run(missing, r), Catch::Matchers::Contains("misses an op of micro-batch 0 on virtual stage 1"));
  RankOrder twice;
  twice.ops = {{op(OpKind::Forward, 0, 0), op(OpKind::Forward, 0, 0), op(OpKind::Backward, 0, 0)},
               {op(OpKind::Forward, 0, 1), op(OpKind::Backward, 0, 1)}};
  REQUIRE_THROWS_WITH(sim.run(twice, r), Catch::Matchers::Contains("appears twice"));
  RankOrder out_of_range;
  out_of_range.ops = {{op(OpKind::Forward, 3, 0)}, {}};
  REQUIRE_THROWS_WITH(sim.run(out_of_range, r), Catch::Matchers::Contains("outside 1 micro-batches"));
  RankOrder ranks;
  ranks.ops = {{}};
  REQUIRE_THROWS_WITH(sim.run(ranks, r), Catch::Matchers::Contains("the order has 1 ranks, the problem 2"));
}

TEST_CASE("simulator: early exit above a bound, buffers reused across runs", "[boundary]") {
  std::mt19937_64 rng(3);
  const SimProblem p = random_problem(rng, 12, 4, 1);
  RankOrder o = build_order(ScheduleKind::OneFOneB, p, iota_order(12));
  Simulator sim(p);
  SimResult a, b, c;
  sim.run(o, a);
  sim.run(o, b, a.makespan_ms * 0.5);
  CHECK(b.aborted);
  CHECK(std::isinf(sim.makespan(o, a.makespan_ms * 0.5)));
  sim.run(o, c);
  CHECK_FALSE(c.aborted);
  CHECK(c.makespan_ms == a.makespan_ms);
  CHECK(c.peak_bytes == a.peak_bytes);
  CHECK(sim.makespan(o, a.makespan_ms) == a.makespan_ms);  // equal to the bound is not above it
  // A memory limit below the first forward's need aborts when asked to.
  SimProblem tight = p;
  tight.memory_limit_bytes = 1.0;
  Simulator st(tight);
  SimResult d;
  st.run(o, d, std::numeric_limits<double>::infinity(), true);
  CHECK(d.aborted);
  CHECK_FALSE(d.within_memory);
  st.run(o, d);
  CHECK_FALSE(d.aborted);
  CHECK_FALSE(d.within_memory);
}

TEST_CASE("simulator: problem from the cost model uses intra- and inter-node transfers", "[interface]") {
  const cm::AnalyticCostModel cost(cm::load_model("gpt-6.7b"), cm::load_device("A100-40GB"));
  PipelineShape shape;
  shape.stages = 4;
  shape.tp = 4;  // 8 GPUs per node / tp 4: two pipeline ranks per node
  const auto vs = virtual_stages(cost.model(), shape);
  MicroBatch mb;
  mb.samples = {0, 1};
  mb.padded_len = 1024;
  SimProblem p = make_sim_problem(stage_cost_table(cost, shape, vs, {mb}), cost, shape);
  CHECK(p.memory_limit_bytes == Approx(cost.device().memory_gb * 1e9));
  const double bytes = p.costs.send_bytes[0];
  CHECK(p.transfer_ms[0] == Approx(cost.comm().p2p_ms(bytes, false)));
  CHECK(p.transfer_ms[1] == Approx(cost.comm().p2p_ms(p.costs.send_bytes[1], true)));
  CHECK(p.transfer_ms[1] > p.transfer_ms[0]);
  CHECK(p.transfer_ms[3] == 0.0);
  // One rank, two chunks: the hand-over between its virtual stages is free.
  PipelineShape one;
  one.stages = 1;
  one.chunks = 2;
  const auto vs1 = virtual_stages(cost.model(), one);
  SimProblem q = make_sim_problem(stage_cost_table(cost, one, vs1, {mb}), cost, one);
  CHECK(q.transfer_ms[0] == 0.0);
  shape.memory_limit_mb = 1234;
  CHECK(make_sim_problem(stage_cost_table(cost, shape, vs, {mb}), cost, shape).memory_limit_bytes == Approx(1234e6));
}

TEST_CASE("simulator: malformed cost tables are refused", "[negative]") {
  SimProblem p = uniform_problem(2, 2, 1, 1.0, 2.0);
  StageCostTable t = p.costs;
  t.forward_ms.pop_back();
  cm::CommModel comm;
  REQUIRE_THROWS_WITH(make_sim_problem(t, 2, comm, 1, 0), Catch::Matchers::Contains("must hold 2 x 2 = 4 entries"));
  REQUIRE_THROWS_WITH(make_sim_problem(p.costs, 3, comm, 1, 0), Catch::Matchers::Contains("not a multiple of 3 ranks"));
  StageCostTable neg = p.costs;
  neg.backward_weight_ms[1] = 5.0;
  REQUIRE_THROWS_AS(make_sim_problem(neg, 2, comm, 1, 0), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(make_sim_problem(neg, 2, comm, 1, 0), Catch::Matchers::Contains("backward_weight_ms <= backward_ms"));
}

TEST_CASE("trace: valid Chrome trace JSON, one track per rank, no overlap within a track", "[interface]") {
  std::mt19937_64 rng(11);
  const SimProblem p = random_problem(rng, 6, 3, 1);
  for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::ZeroBubble}) {
    const Schedule s = make_schedule(k, p);
    const auto j = nlohmann::json::parse(chrome_trace_json(s));
    REQUIRE(j.contains("traceEvents"));
    std::map<int, std::vector<std::pair<double, double>>> tracks;
    std::size_t x = 0;
    for (const auto& e : j["traceEvents"]) {
      REQUIRE(e.contains("ph"));
      REQUIRE(e.contains("pid"));
      REQUIRE(e.contains("tid"));
      REQUIRE(e.contains("name"));
      if (e["ph"] != "X") continue;
      ++x;
      REQUIRE(e["ts"].get<double>() >= 0);
      REQUIRE(e["dur"].get<double>() >= 0);
      const std::string name = e["name"];
      const std::string tok = e["args"]["kind"];
      CHECK(name == tok + std::to_string(e["args"]["mb"].get<int>()));
      CHECK(e["args"]["vstage"].get<int>() % 3 == e["tid"].get<int>());
      tracks[e["tid"].get<int>()].emplace_back(e["ts"].get<double>(), e["dur"].get<double>());
    }
    std::size_t total = 0;
    for (const auto& r : s.ops) total += r.size();
    CHECK(x == total);
    CHECK(tracks.size() == 3);
    for (auto& [tid, ev] : tracks) {
      std::sort(ev.begin(), ev.end());
      for (std::size_t i = 1; i < ev.size(); ++i) CHECK(ev[i].first >= ev[i - 1].first + ev[i - 1].second - 1e-6);
    }
    CHECK(j["otherData"]["makespan_ms"].get<double>() == Approx(s.makespan_ms));
  }
  TraceOptions o;
  o.rank_names = {"a"};
  REQUIRE_THROWS_WITH(chrome_trace_json(make_schedule(ScheduleKind::GPipe, p), o),
                      Catch::Matchers::Contains("must name 3 ranks"));
}

TEST_CASE("simulator: the early exit never cuts a schedule that ends at or below the bound", "[boundary][stress]") {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 30; ++trial) {
    const std::int64_t S = 1 + static_cast<std::int64_t>(rng() % 5);
    const std::int64_t c = 1 + static_cast<std::int64_t>(rng() % 2);
    const std::int64_t m = S * (1 + static_cast<std::int64_t>(rng() % 4));
    const SimProblem p = random_problem(rng, m, S, c);
    Simulator sim(p);
    for (ScheduleKind k : all_schedule_kinds()) {
      if (!schedule_supports(k, S, c, m)) continue;
      INFO(schedule_kind_name(k) << " S " << S << " c " << c << " m " << m);
      RankOrder o = build_order(k, p, iota_order(m));
      const double full = sim.makespan(o);
      CHECK(sim.makespan(o, full) == full);
      CHECK(sim.makespan(o, full * (1 + 1e-6)) == full);
      // Below the makespan it stops, and from the work left it usually stops early.
      CHECK(std::isinf(sim.makespan(o, full * (1 - 1e-6))));
    }
  }
}
