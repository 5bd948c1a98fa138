// Schedules of micro-batches that hold slices of one sample (docs/design/015-long-context.md): every
// kind keeps F(prev) before F(next) and next's backward before prev's on every stage; the search
// repairs its orders; the simulator refuses an order that breaks an edge.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/errors.h"
#include "schedule/schedules.h"
#include "schedule/search.h"
#include "schedule/simulator.h"
#include "tests/support/schedule_problems.h"

using namespace packpipe::schedule;
namespace pl = packpipe::plan;

namespace {

// A random problem: m micro-batches with random times, chains of slices over increasing indices
// (a micro-batch may hold the tail of one sample's chain and the head of another's).
SimProblem random_sliced(std::mt19937_64& rng, std::int64_t S, std::int64_t c, std::int64_t m, double limit = 0) {
  SimProblem p = packpipe::test::uniform_problem(m, S, c, 1.0, 2.0, 0.5, 10.0, 0.1);
  std::uniform_real_distribution<double> t(0.5, 4.0);
  for (std::size_t i = 0; i < p.costs.forward_ms.size(); ++i) {
    p.costs.forward_ms[i] = t(rng);
    p.costs.backward_ms[i] = 2 * p.costs.forward_ms[i];
    p.costs.backward_weight_ms[i] = 0.4 * p.costs.forward_ms[i];
  }
  p.memory_limit_bytes = limit;
  // chains: walk the micro-batches, start a chain with some probability, extend it to a later one
  std::uniform_int_distribution<std::int64_t> len(2, 4), gap(1, 3);
  std::uniform_real_distribution<double> coin(0, 1);
  for (std::int64_t start = 0; start < m; ++start) {
    if (coin(rng) > 0.3) continue;
    std::int64_t at = start;
    const std::int64_t n = len(rng);
    for (std::int64_t k = 1; k < n; ++k) {
      const std::int64_t next = at + gap(rng);
      if (next >= m) break;
      p.slice_edges.emplace_back(static_cast<std::uint32_t>(at), static_cast<std::uint32_t>(next));
      at = next;
    }
  }
  return p;
}

// Every slice edge holds on every stage in `o`.
void check_edges(const SimProblem& p, const RankOrder& o) {
  const std::int64_t V = p.vstages();
  std::vector<std::int64_t> fpos(static_cast<std::size_t>(p.microbatches() * V), -1), bpos = fpos;
  for (const auto& ops : o.ops) {
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const auto i = static_cast<std::size_t>(ops[k].mb * V + ops[k].vstage);
      if (ops[k].kind == pl::OpKind::Forward) fpos[i] = static_cast<std::int64_t>(k);
      if (ops[k].kind == pl::OpKind::Backward || ops[k].kind == pl::OpKind::BackwardInput) bpos[i] = static_cast<std::int64_t>(k);
    }
  }
  for (const auto& [a, b] : p.slice_edges) {
    for (std::int64_t v = 0; v < V; ++v) {
      const auto ia = static_cast<std::size_t>(a * V + v), ib = static_cast<std::size_t>(b * V + v);
      REQUIRE(fpos[ia] >= 0);
      CHECK(fpos[ia] < fpos[ib]);
      CHECK(bpos[ib] < bpos[ia]);
    }
  }
}

}  // namespace

TEST_CASE("every kind keeps the slice order on every stage, and simulates without deadlock", "[interface][stress]") {
  std::mt19937_64 rng(15);
  std::int64_t with_edges = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t S = 1 + trial % 6, c = 1 + (trial / 6) % 2, m = 2 + trial % 11;
    const SimProblem p = random_sliced(rng, S, c, m);
    with_edges += p.has_slices();
    std::vector<std::uint32_t> order(static_cast<std::size_t>(m));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
    std::shuffle(order.begin(), order.end(), rng);
    order = slice_order(p, order);
    REQUIRE(respects_slices(p, order));
    for (const ScheduleKind k : all_schedule_kinds()) {
      if (!schedule_supports(k, p)) {
        if (p.has_slices()) CHECK((k != ScheduleKind::Interleaved1F1B || c == 1 || p.has_slices()));
        continue;
      }
      INFO("trial " << trial << " kind " << schedule_kind_name(k) << " S " << S << " c " << c << " m " << m);
      const RankOrder o = build_order(k, p, order);
      check_edges(p, o);
      const pl::Schedule s = simulate(p, o, schedule_kind_name(k), order);
      CHECK(s.makespan_ms > 0);
    }
  }
  CHECK(with_edges > 100);
}

TEST_CASE("backward sequence: Seq1F1B's reversed slices; 1F1B runs a sample's slices forward before it goes back",
          "[interface]") {
  SimProblem p = packpipe::test::uniform_problem(5, 2, 1);
  p.slice_edges = {{0, 1}, {1, 2}};  // micro-batches 0, 1, 2: one sample's three slices
  const std::vector<std::uint32_t> order = {0, 1, 2, 3, 4};
  CHECK(backward_sequence(p, order) == std::vector<std::uint32_t>{2, 1, 0, 3, 4});
  const RankOrder o = build_order(ScheduleKind::OneFOneB, p, order);
  auto ops_of = [&](std::size_t r) {
    std::vector<std::string> out;
    for (const auto& op : o.ops[r]) out.push_back(std::string(op.kind == pl::OpKind::Forward ? "F" : "B") + std::to_string(op.mb));
    return out;
  };
  // last rank (no warm-up): the sample's slices forward, then a forward before each backward
  CHECK(ops_of(1) == std::vector<std::string>{"F0", "F1", "F2", "B2", "F3", "B1", "F4", "B0", "B3", "B4"});
  // first rank (one warm-up forward): a backward after the forwards up to one past it
  CHECK(ops_of(0) == std::vector<std::string>{"F0", "F1", "F2", "F3", "B2", "F4", "B1", "B0", "B3", "B4"});
  // interleaved 1F1B is not offered with slices; the reason is given
  SimProblem q = packpipe::test::uniform_problem(4, 2, 2);
  q.slice_edges = {{0, 1}};
  std::string why;
  CHECK_FALSE(schedule_supports(ScheduleKind::Interleaved1F1B, q, &why));
  CHECK(why.find("slices") != std::string::npos);
  q.slice_edges.clear();
  CHECK(schedule_supports(ScheduleKind::Interleaved1F1B, q, &why));
}

TEST_CASE("an order that breaks a slice edge is refused; slice_order repairs it stably", "[negative]") {
  SimProblem p = packpipe::test::uniform_problem(4, 2, 1);
  p.slice_edges = {{1, 3}};
  const std::vector<std::uint32_t> bad = {3, 0, 1, 2};
  CHECK_FALSE(respects_slices(p, bad));
  REQUIRE_THROWS_WITH(build_order(ScheduleKind::OneFOneB, p, bad), Catch::Matchers::Contains("previous slice"));
  CHECK(slice_order(p, bad) == std::vector<std::uint32_t>{0, 1, 3, 2});
  // a hand-made order with the backward of 1 before that of 3: the simulator says which edge
  RankOrder o = build_order(ScheduleKind::GPipe, p, {0, 1, 2, 3});
  auto& last = o.ops[1];
  auto b1 = std::find_if(last.begin(), last.end(), [](const pl::ScheduledOp& x) { return x.kind == pl::OpKind::Backward && x.mb == 1; });
  auto b3 = std::find_if(last.begin(), last.end(), [](const pl::ScheduledOp& x) { return x.kind == pl::OpKind::Backward && x.mb == 3; });
  std::iter_swap(b1, b3);
  Simulator sim(p);
  SimResult r;
  REQUIRE_THROWS_WITH(sim.run(o, r), Catch::Matchers::Contains("next slice") && Catch::Matchers::Contains("rank 1"));
  // edges forming a cycle have no order
  p.slice_edges = {{0, 1}, {1, 0}};
  REQUIRE_THROWS_WITH(slice_order(p, {0, 1, 2, 3}), Catch::Matchers::Contains("cycle"));
}

TEST_CASE("the search keeps the slice order, with and without a memory limit, and is never worse than the reference",
          "[interface][stress]") {
  std::mt19937_64 rng(29);
  for (int trial = 0; trial < 40; ++trial) {
    const std::int64_t S = 2 + trial % 4, m = 4 + trial % 9;
    const double limit = trial % 3 == 0 ? 200.0 : 0.0;
    const SimProblem p = random_sliced(rng, S, 1, m, limit);
    INFO("trial " << trial);
    SearchOptions o;
    o.seed = static_cast<std::uint64_t>(trial);
    const SearchResult fast = search_schedule(p, o);
    const SearchResult ref = reference_search(p, o);
    CHECK(respects_slices(p, fast.best.order));
    check_edges(p, build_order(fast.kind, p, fast.best.order));
    if (fast.feasible && ref.feasible) CHECK(fast.best.makespan_ms <= ref.best.makespan_ms * (1 + 1e-9));
    if (ref.feasible) CHECK(fast.feasible);
  }
}

TEST_CASE("1F1B with slices keeps the pipeline full: near 1F1B without them, never past GPipe", "[interface]") {
  // 24 micro-batches on 4 stages, equal costs, in chains of 4 consecutive slices (6 samples): the
  // backward of a sample's last slice waits for it to reach the last stage, and the warm-up's
  // forwards of what follows fill that wait, as Seq1F1B does.
  for (const std::int64_t chain : {2, 4, 8}) {
    SimProblem p = packpipe::test::uniform_problem(24, 4, 1);
    SimProblem plain = p;
    for (std::uint32_t a = 0; a + 1 < 24; ++a) {
      if ((a + 1) % chain != 0) p.slice_edges.emplace_back(a, a + 1);
    }
    std::vector<std::uint32_t> order(24);
    for (std::uint32_t i = 0; i < 24; ++i) order[i] = i;
    const double f1b = simulate(p, build_order(ScheduleKind::OneFOneB, p, order), "1f1b", order).makespan_ms;
    const double gpipe = simulate(p, build_order(ScheduleKind::GPipe, p, order), "gpipe", order).makespan_ms;
    const double ref = simulate(plain, build_order(ScheduleKind::OneFOneB, plain, order), "1f1b", order).makespan_ms;
    INFO("chain " << chain << ": 1F1B " << f1b << " GPipe " << gpipe << " unsliced 1F1B " << ref);
    CHECK(f1b <= gpipe * (1 + 1e-9));
    CHECK(f1b <= ref * 1.05);
  }
}
