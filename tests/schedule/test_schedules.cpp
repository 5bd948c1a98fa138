// Schedules: each order matches its definition on small cases (GPipe, 1F1B warm-up, Megatron's
// interleaved order, cyclic cycles, zero-bubble I/W split and memory), argument checks.
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "schedule/detail/order_builder.h"
#include "schedule/schedules.h"

#include "tests/support/schedule_problems.h"

using namespace packpipe::schedule;
using namespace packpipe::plan;
namespace cm = packpipe::costmodel;

namespace {

using packpipe::test::uniform_problem;

std::vector<std::uint32_t> iota_order(std::int64_t m) {
  std::vector<std::uint32_t> o(static_cast<std::size_t>(m));
  for (std::size_t i = 0; i < o.size(); ++i) o[i] = static_cast<std::uint32_t>(i);
  return o;
}

std::size_t forwards_before_first_backward(const std::vector<ScheduledOp>& ops) {
  std::size_t n = 0;
  for (const auto& op : ops) {
    if (op.kind != OpKind::Forward) break;
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("schedules: names round-trip, unknown names and unsupported shapes are refused", "[interface][negative]") {
  for (ScheduleKind k : all_schedule_kinds()) CHECK(schedule_kind_from_name(schedule_kind_name(k)) == k);
  REQUIRE_THROWS_AS(schedule_kind_from_name("pipedream"), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(schedule_kind_from_name("pipedream"), Catch::Matchers::Contains("unknown schedule 'pipedream'"));
  std::string why;
  CHECK_FALSE(schedule_supports(ScheduleKind::OneFOneB, 4, 2, 8, &why));
  CHECK_THAT(why, Catch::Matchers::Contains("interleaved-1f1b"));
  CHECK_FALSE(schedule_supports(ScheduleKind::Interleaved1F1B, 4, 1, 8));
  CHECK_FALSE(schedule_supports(ScheduleKind::Interleaved1F1B, 4, 2, 6, &why));
  CHECK_THAT(why, Catch::Matchers::Contains("multiple of 4 micro-batches"));
  const SimProblem p = uniform_problem(4, 2, 2);
  REQUIRE_THROWS_WITH(build_order(ScheduleKind::OneFOneB, p, iota_order(4)), Catch::Matchers::Contains("chunks 1, found 2"));
  REQUIRE_THROWS_WITH(build_order(ScheduleKind::GPipe, p, {0, 1, 1, 3}), Catch::Matchers::Contains("not a permutation"));
  REQUIRE_THROWS_WITH(build_order(ScheduleKind::GPipe, p, {0, 1}), Catch::Matchers::Contains("must list 4 micro-batches"));
}

TEST_CASE("schedules: GPipe runs every forward before any backward", "[interface]") {
  for (std::int64_t c : {1, 2}) {
    const SimProblem p = uniform_problem(5, 3, c);
    std::vector<std::uint32_t> order = {3, 1, 4, 0, 2};
    const RankOrder o = build_order(ScheduleKind::GPipe, p, order);
    for (const auto& ops : o.ops) {
      REQUIRE(ops.size() == 2 * 5 * static_cast<std::size_t>(c));
      CHECK(forwards_before_first_backward(ops) == 5 * static_cast<std::size_t>(c));
      for (std::size_t i = 0; i < 5; ++i) CHECK(ops[i].mb == order[i]);  // micro-batch order respected
    }
  }
}

TEST_CASE("schedules: 1F1B warms up with S - rank - 1 forwards, then alternates", "[interface]") {
  for (std::int64_t S : {1, 2, 4, 8}) {
    for (std::int64_t m : {1, 3, 8, 13}) {
      const SimProblem p = uniform_problem(m, S, 1);
      const RankOrder o = build_order(ScheduleKind::OneFOneB, p, iota_order(m));
      for (std::int64_t r = 0; r < S; ++r) {
        const auto& ops = o.ops[static_cast<std::size_t>(r)];
        const std::int64_t w = std::min(S - r - 1, m);
        CHECK(warmup_forwards(ScheduleKind::OneFOneB, S, r, 1, m, 0) == w);
        // warm-up, then the steady phase starts with one more forward (if any remain)
        CHECK(static_cast<std::int64_t>(forwards_before_first_backward(ops)) == std::min(w + 1, m));
        // steady phase alternates F, B
        for (std::int64_t k = 0; k < m - w; ++k) {
          CHECK(ops[static_cast<std::size_t>(w + 2 * k)].kind == OpKind::Forward);
          CHECK(ops[static_cast<std::size_t>(w + 2 * k + 1)].kind == OpKind::Backward);
          CHECK(ops[static_cast<std::size_t>(w + 2 * k + 1)].mb == static_cast<std::uint32_t>(k));
        }
      }
    }
  }
}

TEST_CASE("schedules: interleaved 1F1B matches Megatron's chunk and micro-batch formulas", "[interface]") {
  // Megatron-LM's classic get_model_chunk_id: chunk = (k mod (S c)) / S (reversed for backward),
  // micro-batch = (k / (S c)) S + k mod S, for m a multiple of S.
  for (std::int64_t S : {2, 4}) {
    for (std::int64_t c : {2, 3}) {
      for (std::int64_t m : {S, 2 * S, 3 * S}) {
        const SimProblem p = uniform_problem(m, S, c);
        const RankOrder o = build_order(ScheduleKind::Interleaved1F1B, p, iota_order(m));
        for (std::int64_t r = 0; r < S; ++r) {
          const auto& ops = o.ops[static_cast<std::size_t>(r)];
          REQUIRE(static_cast<std::int64_t>(ops.size()) == 2 * m * c);
          std::int64_t kf = 0, kb = 0;
          for (const auto& op : ops) {
            const std::int64_t k = op.kind == OpKind::Forward ? kf++ : kb++;
            std::int64_t chunk = (k % (S * c)) / S;
            if (op.kind == OpKind::Backward) chunk = c - 1 - chunk;
            const std::int64_t mb = (k / (S * c)) * S + k % S;
            CHECK(op.vstage == static_cast<std::uint32_t>(chunk * S + r));
            CHECK(op.mb == static_cast<std::uint32_t>(mb));
          }
          const std::int64_t w = m == S ? m * c : std::min(m * c, 2 * (S - r - 1) + (c - 1) * S);
          CHECK(warmup_forwards(ScheduleKind::Interleaved1F1B, S, r, c, m, 0) == w);
          CHECK(static_cast<std::int64_t>(forwards_before_first_backward(ops)) == std::min(w + 1, m * c));
        }
      }
    }
  }
  // Megatron's table with a last partial group.
  const auto t = interleaved_table(5, 2, 2);
  const std::vector<std::pair<std::uint32_t, std::uint32_t>> want = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0},
                                                                      {3, 0}, {2, 1}, {3, 1}, {4, 0}, {4, 1}};
  CHECK(t == want);
}

TEST_CASE("schedules: interleaved orders with any group size dividing m are deadlock-free", "[boundary]") {
  for (std::int64_t S : {2, 3, 4}) {
    for (std::int64_t c : {2, 3}) {
      for (std::int64_t m : {S, 2 * S, 3 * S, 4 * S}) {
        for (std::int64_t g = S; g <= m; ++g) {
          if (m % g != 0) continue;
          const SimProblem p = uniform_problem(m, S, c);
          ScheduleOptions o;
          o.group_size = g;
          INFO("S " << S << " c " << c << " m " << m << " group " << g);
          const Schedule s = make_schedule(ScheduleKind::Interleaved1F1B, p, {}, o);
          CHECK(s.makespan_ms >= makespan_lower_bounds(p).value() - 1e-9);
        }
      }
    }
  }
  ScheduleOptions bad;
  bad.group_size = 3;
  REQUIRE_THROWS_WITH(build_order(ScheduleKind::Interleaved1F1B, uniform_problem(8, 4, 2), iota_order(8), bad),
                      Catch::Matchers::Contains("group size 3 must be at least 4 ranks"));
}

TEST_CASE("schedules: cyclic runs at most one backward and one forward per stage per cycle, backward first",
          "[interface]") {
  std::mt19937_64 rng(9);
  for (std::int64_t c : {1, 2}) {
    const SimProblem p = uniform_problem(7, 3, c);
    const RankOrder o = build_order(ScheduleKind::Cyclic, p, {6, 5, 4, 3, 2, 1, 0});
    REQUIRE(o.cycle.size() == 3);
    for (std::size_t r = 0; r < 3; ++r) {
      std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<OpKind>> per;  // (cycle, vstage)
      for (std::size_t i = 0; i < o.ops[r].size(); ++i) {
        if (i > 0) CHECK(o.cycle[r][i] >= o.cycle[r][i - 1]);
        per[{o.cycle[r][i], o.ops[r][i].vstage}].push_back(o.ops[r][i].kind);
      }
      for (const auto& [key, kinds] : per) {
        CHECK(kinds.size() <= 2);
        if (kinds.size() == 2) {
          CHECK(kinds[0] == OpKind::Backward);
          CHECK(kinds[1] == OpKind::Forward);
        }
      }
    }
    // Micro-batches enter stage 0 in the given order.
    std::vector<std::uint32_t> entered;
    for (const auto& op : o.ops[0]) {
      if (op.kind == OpKind::Forward && op.vstage == 0) entered.push_back(op.mb);
    }
    CHECK(entered == std::vector<std::uint32_t>{6, 5, 4, 3, 2, 1, 0});
    const RankOrder wf = build_order(ScheduleKind::WaitFreeCyclic, p, {6, 5, 4, 3, 2, 1, 0});
    CHECK(wf.cycle.empty());
  }
}

TEST_CASE("schedules: memory-aware cyclic and zero-bubble stay within the limit", "[interface]") {
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  for (int trial = 0; trial < 10; ++trial) {
    const std::int64_t S = 4, m = 12;
    SimProblem p = uniform_problem(m, S, 1, 1.0, 2.0, 0.8, 0.0);
    for (auto& s : p.costs.stored_bytes) s = u(rng) * 1e6;
    for (std::size_t i = 0; i < p.costs.peak_bytes.size(); ++i) p.costs.peak_bytes[i] = 1.2 * p.costs.stored_bytes[i];
    p.memory_limit_bytes = 6e6;  // room for about 3 micro-batches
    for (ScheduleKind k : {ScheduleKind::Cyclic, ScheduleKind::WaitFreeCyclic, ScheduleKind::ZeroBubble}) {
      const Schedule s = make_schedule(k, p);
      INFO(schedule_kind_name(k));
      for (double b : s.peak_bytes) CHECK(b <= p.memory_limit_bytes);
    }
    // Without the memory check GPipe overflows.
    const Schedule g = make_schedule(ScheduleKind::GPipe, p);
    CHECK(*std::max_element(g.peak_bytes.begin(), g.peak_bytes.end()) > p.memory_limit_bytes);
  }
}

TEST_CASE("schedules: zero-bubble splits every backward, W after I, no more memory than 1F1B", "[interface]") {
  for (std::int64_t S : {2, 4, 8}) {
    for (std::int64_t m : {S, 2 * S + 1}) {
      const SimProblem p = uniform_problem(m, S, 1, 1.0, 2.0, 1.0, 100.0);
      const Schedule z = make_schedule(ScheduleKind::ZeroBubble, p);
      const Schedule one = make_schedule(ScheduleKind::OneFOneB, p);
      for (std::size_t r = 0; r < z.ops.size(); ++r) {
        std::set<std::uint32_t> inputs;
        std::size_t nw = 0;
        for (const auto& op : z.ops[r]) {
          CHECK(op.kind != OpKind::Backward);
          if (op.kind == OpKind::BackwardInput) inputs.insert(op.mb);
          if (op.kind == OpKind::BackwardWeight) {
            CHECK(inputs.count(op.mb) == 1);  // W after the I of the same micro-batch
            ++nw;
          }
        }
        CHECK(nw == static_cast<std::size_t>(m));
        CHECK(z.peak_bytes[r] <= one.peak_bytes[r] + 1e-9);
      }
      // Deferred weight gradients fill the bubbles: never slower than 1F1B on uniform costs.
      CHECK(z.makespan_ms <= one.makespan_ms + 1e-9);
      if (m > S) CHECK(z.bubble_fraction < one.bubble_fraction);
    }
  }
}

TEST_CASE("schedules: every kind is deadlock-free for small shapes", "[boundary]") {
  for (std::int64_t S = 1; S <= 5; ++S) {
    for (std::int64_t c = 1; c <= 3; ++c) {
      for (std::int64_t m = 1; m <= 2 * S + 2; ++m) {
        const SimProblem p = uniform_problem(m, S, c, 1.0, 2.0, 0.7);
        for (ScheduleKind k : all_schedule_kinds()) {
          if (!schedule_supports(k, S, c, m)) continue;
          INFO(schedule_kind_name(k) << " S " << S << " c " << c << " m " << m);
          const Schedule s = make_schedule(k, p);
          std::size_t n = 0;
          for (const auto& r : s.ops) n += r.size();
          CHECK(n == static_cast<std::size_t>((k == ScheduleKind::ZeroBubble ? 3 : 2) * m * S * c));
        }
      }
    }
  }
}

TEST_CASE("schedules: the zero-bubble greedy's own timing is bit-identical to the simulator's", "[interface][stress]") {
  std::mt19937_64 rng(31);
  std::uniform_real_distribution<double> u(0.2, 3.0), frac(0.1, 0.6), bytes(1e6, 5e6);
  for (int trial = 0; trial < 60; ++trial) {
    const std::int64_t S = 1 + static_cast<std::int64_t>(rng() % 6);
    const std::int64_t c = 1 + static_cast<std::int64_t>(rng() % 3);
    const std::int64_t m = 1 + static_cast<std::int64_t>(rng() % 24);
    StageCostTable t;
    t.microbatches = m;
    t.vstages = S * c;
    for (std::int64_t mb = 0; mb < m; ++mb) {
      const double scale = u(rng);
      for (std::int64_t v = 0; v < S * c; ++v) {
        const double f = scale * u(rng) * 0.5;
        t.forward_ms.push_back(f);
        t.backward_ms.push_back(2 * f);
        const double wf = frac(rng);
        t.backward_weight_ms.push_back(2 * f * wf);
        const double st = scale * bytes(rng);
        t.stored_bytes.push_back(st);
        t.peak_bytes.push_back(1.5 * st);
        const double sb = scale * bytes(rng);
        t.send_bytes.push_back(sb);
      }
    }
    t.static_bytes.assign(static_cast<std::size_t>(S), 1e7);
    cm::CommModel comm;
    comm.intra_latency_ms = 0.01;
    comm.intra_bytes_per_ms = 5e6;
    comm.inter_latency_ms = 0.02;
    comm.inter_bytes_per_ms = 1e6;
    const double limit = trial % 2 == 0 ? 0.0 : 1e7 + 4e6 * static_cast<double>(c * (1 + trial % 5));
    const SimProblem p = make_sim_problem(std::move(t), S, comm, 2, limit);
    std::vector<std::uint32_t> order = iota_order(m);
    std::shuffle(order.begin(), order.end(), rng);
    INFO("trial " << trial << " S " << S << " c " << c << " m " << m);
    detail::OrderBuilder b(p);
    REQUIRE(b.exact_times());
    RankOrder o;
    std::vector<double> peak;
    const double ms = b.zero_bubble(order, {}, o, peak);
    RankOrder replay = o;
    Simulator sim(p);
    SimResult res;
    sim.run(replay, res);
    CHECK(ms == res.makespan_ms);
    CHECK(peak == res.peak_bytes);
    bool same_times = true;
    for (std::size_t r = 0; r < o.ops.size(); ++r) {
      for (std::size_t i = 0; i < o.ops[r].size(); ++i) {
        same_times = same_times && o.ops[r][i].start_ms == replay.ops[r][i].start_ms &&
                     o.ops[r][i].end_ms == replay.ops[r][i].end_ms;
      }
    }
    CHECK(same_times);
    // The same order as build_order's; early exit above a bound below the makespan, none at it.
    const RankOrder plain = build_order(ScheduleKind::ZeroBubble, p, order);
    for (std::size_t r = 0; r < o.ops.size(); ++r) {
      REQUIRE(plain.ops[r].size() == o.ops[r].size());
      for (std::size_t i = 0; i < o.ops[r].size(); ++i) {
        CHECK((plain.ops[r][i].mb == o.ops[r][i].mb && plain.ops[r][i].kind == o.ops[r][i].kind &&
               plain.ops[r][i].vstage == o.ops[r][i].vstage));
      }
    }
    CHECK(b.zero_bubble(order, {}, o, peak, ms) == ms);
    CHECK(b.zero_bubble(order, {}, o, peak, ms * 0.9) == std::numeric_limits<double>::infinity());
  }
  // Zero durations (a weight-gradient share of 0) make ties the two may order differently.
  CHECK_FALSE(detail::OrderBuilder(uniform_problem(4, 2, 1)).exact_times());
}
