// Schedule search: determinism, fast search never worse than the exhaustive reference, order
// candidates, memory limit, recompute fallback, lower bounds.
#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "schedule/schedules.h"
#include "schedule/search.h"

using namespace packpipe::partition;
using namespace packpipe::schedule;
using namespace packpipe::plan;
namespace cm = packpipe::costmodel;

namespace {

// Micro-batches of a long-tailed multi-task batch priced by the analytic GPT model.
std::vector<MicroBatch> random_microbatches(std::mt19937_64& rng, std::size_t n) {
  std::vector<MicroBatch> mbs(n);
  for (auto& mb : mbs) {
    const std::int64_t len = 64 << (rng() % 6);  // 64 .. 2048
    const std::int64_t rows = std::max<std::int64_t>(1, 4096 / len - static_cast<std::int64_t>(rng() % 2));
    mb.samples.resize(static_cast<std::size_t>(rows));
    mb.padded_len = len;
  }
  return mbs;
}

struct Setup {
  cm::AnalyticCostModel cost{cm::load_model("gpt-1.3b"), cm::load_device("A100-40GB")};
  PipelineShape shape;
  std::vector<VirtualStage> vs;
  std::vector<MicroBatch> mbs;
  SimProblem problem;
  Setup(std::mt19937_64& rng, std::int64_t stages, std::int64_t chunks, std::size_t n, double memory_mb = 0) {
    shape.stages = stages;
    shape.chunks = chunks;
    shape.layers_per_stage = 2;
    shape.memory_limit_mb = memory_mb;
    vs = virtual_stages(cost.model(), shape);
    mbs = random_microbatches(rng, n);
    problem = make_sim_problem(stage_cost_table(cost, shape, vs, mbs), cost, shape);
  }
  StageCostTable table(cm::Recompute rc) const {
    auto m = mbs;
    for (auto& x : m) x.recompute = rc;
    return stage_cost_table(cost, shape, vs, m);
  }
};

bool same_schedule(const Schedule& a, const Schedule& b) {
  if (a.name != b.name || a.order != b.order || a.makespan_ms != b.makespan_ms || a.ops.size() != b.ops.size()) {
    return false;
  }
  for (std::size_t r = 0; r < a.ops.size(); ++r) {
    if (a.ops[r].size() != b.ops[r].size()) return false;
    for (std::size_t i = 0; i < a.ops[r].size(); ++i) {
      const auto &x = a.ops[r][i], &y = b.ops[r][i];
      if (x.kind != y.kind || x.mb != y.mb || x.vstage != y.vstage || x.start_ms != y.start_ms || x.end_ms != y.end_ms) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

TEST_CASE("search: reference orders are DynaPipe's candidate set, deterministic per seed", "[interface]") {
  std::mt19937_64 rng(1);
  for (std::size_t n : {1u, 3u, 4u, 5u, 12u, 21u, 40u}) {
    Setup s(rng, 2, 1, n);
    const auto a = reference_orders(s.problem, 7);
    const auto b = reference_orders(s.problem, 7);
    CHECK(a == b);
    REQUIRE(!a.empty());
    CHECK(a.size() <= 25);
    if (n > 20) CHECK(a.size() <= 7);
    std::vector<std::uint32_t> id(n);
    for (std::size_t i = 0; i < n; ++i) id[i] = static_cast<std::uint32_t>(i);
    CHECK(a.front() == id);
    std::set<std::vector<std::uint32_t>> uniq(a.begin(), a.end());
    CHECK(uniq.size() == a.size());
    for (auto o : a) {
      std::sort(o.begin(), o.end());
      CHECK(o == id);
    }
    if (n <= 4) {
      std::size_t fact = 1;
      for (std::size_t i = 2; i <= n; ++i) fact *= i;
      CHECK(a.size() == fact);
    }
  }
}

TEST_CASE("search: same inputs and seed give a bit-identical schedule", "[interface]") {
  std::mt19937_64 rng(2);
  Setup s(rng, 4, 1, 24);
  SearchOptions o;
  o.seed = 99;
  const SearchResult a = search_schedule(s.problem, o);
  const SearchResult b = search_schedule(s.problem, o);
  CHECK(same_schedule(a.best, b.best));
  CHECK(a.simulations == b.simulations);
  const SearchResult ra = reference_search(s.problem, o);
  const SearchResult rb = reference_search(s.problem, o);
  CHECK(same_schedule(ra.best, rb.best));
}

TEST_CASE("search: fast search is never worse than the exhaustive reference", "[interface][stress]") {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 12; ++trial) {
    const std::int64_t S = 2 + static_cast<std::int64_t>(rng() % 3) * 2;
    const std::int64_t c = (trial % 3 == 2) ? 2 : 1;
    const std::size_t n = 3 + static_cast<std::size_t>(rng() % 30);
    Setup s(rng, S, c, n);
    SearchOptions o;
    o.seed = static_cast<std::uint64_t>(trial);
    const SearchResult fast = search_schedule(s.problem, o);
    const SearchResult ref = reference_search(s.problem, o);
    INFO("S " << S << " c " << c << " m " << n);
    REQUIRE(fast.feasible);
    REQUIRE(ref.feasible);
    CHECK(fast.best.makespan_ms <= ref.best.makespan_ms);
    CHECK(fast.best.makespan_ms >= fast.lower_bound_ms * (1 - 1e-12));
    // The reported schedule is what re-simulating its kind and order gives.
    const Schedule again = make_schedule(fast.kind, s.problem, fast.best.order);
    CHECK(again.makespan_ms == fast.best.makespan_ms);
    CHECK(fast.best.name == schedule_kind_name(fast.kind));
    // The reference simulates every candidate in full.
    CHECK(ref.early_exits == 0);
  }
}

TEST_CASE("search: restricted to one schedule, it still beats or ties every reference order of it", "[interface]") {
  std::mt19937_64 rng(4);
  Setup s(rng, 4, 1, 30);
  SearchOptions o;
  o.schedules = {ScheduleKind::OneFOneB};
  const SearchResult r = search_schedule(s.problem, o);
  CHECK(r.kind == ScheduleKind::OneFOneB);
  for (const auto& ord : reference_orders(s.problem, 0)) {
    CHECK(r.best.makespan_ms <= make_schedule(ScheduleKind::OneFOneB, s.problem, ord).makespan_ms);
  }
  SearchOptions bad;
  bad.schedules = {ScheduleKind::Interleaved1F1B};
  REQUIRE_THROWS_AS(search_schedule(s.problem, bad), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(search_schedule(s.problem, bad), Catch::Matchers::Contains("no candidate schedule supports"));
}

TEST_CASE("search: the winner fits the memory limit, or falls back to uniform recompute", "[interface][boundary]") {
  std::mt19937_64 rng(5);
  Setup s(rng, 4, 1, 16);
  const Schedule loose = make_schedule(ScheduleKind::GPipe, s.problem);
  const double gpipe_peak = *std::max_element(loose.peak_bytes.begin(), loose.peak_bytes.end());
  // Between one micro-batch in flight and GPipe's all of them.
  SimProblem p = s.problem;
  const Schedule one = make_schedule(ScheduleKind::OneFOneB, s.problem);
  p.memory_limit_bytes = *std::max_element(one.peak_bytes.begin(), one.peak_bytes.end());
  CHECK(p.memory_limit_bytes < gpipe_peak);
  for (auto fn : {&search_schedule, &reference_search}) {
    const SearchResult r = fn(p, SearchOptions{});
    REQUIRE(r.feasible);
    for (double b : r.best.peak_bytes) CHECK(b <= p.memory_limit_bytes);
    CHECK(r.recompute == "given");
  }
  // A limit that only full recompute meets.
  const StageCostTable full = s.table(cm::Recompute::Full);
  SimProblem pf = s.problem;
  pf.costs = full;
  double need_full = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    double st = full.static_bytes[r], pk = 0;
    for (std::int64_t mb = 0; mb < 16; ++mb) pk = std::max(pk, full.peak_bytes[full.at(mb, static_cast<std::int64_t>(r))] + full.stored_bytes[full.at(mb, static_cast<std::int64_t>(r))]);
    need_full = std::max(need_full, st + pk);
  }
  SimProblem tight = s.problem;
  tight.memory_limit_bytes = need_full * 1.000001;
  SearchOptions o;
  o.recompute_table = [&](cm::Recompute rc) { return s.table(rc); };
  const SearchResult fr = search_schedule(tight, o);
  const SearchResult rr = reference_search(tight, o);
  if (rr.feasible) {
    REQUIRE(fr.feasible);
    CHECK(rr.recompute != "given");
    CHECK(fr.best.makespan_ms <= rr.best.makespan_ms);
    for (double b : fr.best.peak_bytes) CHECK(b <= tight.memory_limit_bytes);
  }
  // Nothing fits: reported as infeasible, with the least-memory candidate.
  SimProblem none = s.problem;
  none.memory_limit_bytes = 1.0;
  const SearchResult nr = search_schedule(none, SearchOptions{});
  CHECK_FALSE(nr.feasible);
  CHECK(nr.best.makespan_ms > 0);
  // A fallback table of the wrong shape is refused.
  SearchOptions wrong;
  wrong.recompute_table = [&](cm::Recompute) { return StageCostTable{}; };
  REQUIRE_THROWS_WITH(search_schedule(none, wrong), Catch::Matchers::Contains("recompute_table(selective) returned"));
}

TEST_CASE("search: constructive orders are permutations with short micro-batches at the ends", "[interface]") {
  std::mt19937_64 rng(6);
  Setup s(rng, 4, 1, 11);
  const auto orders = constructive_orders(s.problem);
  REQUIRE(orders.size() >= 3);
  std::vector<double> tot(11, 0.0);
  for (std::int64_t mb = 0; mb < 11; ++mb) {
    for (std::int64_t v = 0; v < 4; ++v) {
      tot[static_cast<std::size_t>(mb)] += s.problem.costs.forward_ms[s.problem.costs.at(mb, v)] +
                                           s.problem.costs.backward_ms[s.problem.costs.at(mb, v)];
    }
  }
  for (const auto& o : orders) {
    auto sorted = o;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size(); ++i) CHECK(sorted[i] == i);
  }
  CHECK(tot[orders[0].front()] == *std::max_element(tot.begin(), tot.end()));  // longest first
  CHECK(tot[orders[1].front()] == *std::min_element(tot.begin(), tot.end()));  // shortest first
}

TEST_CASE("search: never worse than the reference under memory limits, interleaved shapes and local budgets",
          "[interface][stress]") {
  std::mt19937_64 rng(8);
  for (int trial = 0; trial < 10; ++trial) {
    const std::int64_t S = 2 + static_cast<std::int64_t>(rng() % 3) * 2;
    const std::int64_t c = trial % 2 == 1 ? 2 : 1;
    const std::size_t n = static_cast<std::size_t>(S) * (1 + rng() % 5);
    Setup s(rng, S, c, n);
    // A limit between the least and the largest peak of the reference candidates.
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::ZeroBubble, ScheduleKind::Cyclic}) {
      const Schedule sc = make_schedule(k, s.problem);
      const double pk = *std::max_element(sc.peak_bytes.begin(), sc.peak_bytes.end());
      lo = std::min(lo, pk);
      hi = std::max(hi, pk);
    }
    SimProblem p = s.problem;
    p.memory_limit_bytes = lo + (hi - lo) * static_cast<double>(trial % 4) / 4.0;
    SearchOptions o;
    o.seed = static_cast<std::uint64_t>(trial) * 11;
    o.local_evaluations = trial % 3 == 0 ? 1 : 0;
    o.local_rounds = trial % 5 == 0 ? 2 : 1;
    INFO("S " << S << " c " << c << " m " << n << " limit " << p.memory_limit_bytes);
    const SearchResult fast = search_schedule(p, o);
    const SearchResult ref = reference_search(p, o);
    REQUIRE(fast.feasible == ref.feasible);
    if (ref.feasible) {
      CHECK(fast.best.makespan_ms <= ref.best.makespan_ms);
      for (double b : fast.best.peak_bytes) CHECK(b <= p.memory_limit_bytes);
    }
    const SearchResult again = search_schedule(p, o);
    CHECK(same_schedule(again.best, fast.best));
    CHECK(again.simulations == fast.simulations);
    // The winner re-simulated from its kind and order.
    CHECK(make_schedule(fast.kind, p, fast.best.order).makespan_ms == fast.best.makespan_ms);
  }
}

TEST_CASE("search: schedule factors scale each kind's makespan, and the search ranks by the scaled one",
          "[interface]") {
  std::mt19937_64 rng(23);
  Setup s(rng, 4, 1, 12);
  // Unscaled: the search's winner and every kind's own best.
  const SearchResult plain = search_schedule(s.problem);
  std::map<ScheduleKind, double> own;
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Cyclic,
                         ScheduleKind::WaitFreeCyclic, ScheduleKind::ZeroBubble}) {
    SearchOptions o;
    o.schedules = {k};
    own[k] = search_schedule(s.problem, o).best.makespan_ms;
  }
  double others = std::numeric_limits<double>::infinity();
  for (const auto& [k, ms] : own) {
    if (k != plain.kind) others = std::min(others, ms);
  }
  REQUIRE(others < 2 * plain.best.makespan_ms);  // every kind is within 2x of the best here
  // The winner's kind made twice as slow: another kind wins, at its own best makespan.
  SimProblem scaled = s.problem;
  scaled.kind_factor[static_cast<std::size_t>(plain.kind)] = 2.0;
  const SearchResult r = search_schedule(scaled);
  CHECK(r.kind != plain.kind);
  CHECK(r.best.makespan_ms <= others * (1 + 1e-9));
  CHECK(r.best.makespan_ms >= makespan_lower_bounds(scaled).value());
  // A hair slower: the winner stays.
  SimProblem hair = s.problem;
  hair.kind_factor[static_cast<std::size_t>(plain.kind)] = 1 + 1e-12;
  CHECK(search_schedule(hair).kind == plain.kind);
  // A uniform factor changes no choice; the timeline's starts are stretched by it and every op
  // keeps its duration (what a replay sleeps), so the makespan is between the simulated one and
  // the factor times it.
  const double f = 1.25;
  SimProblem uniform = s.problem;
  uniform.kind_factor = SimProblem::filled_factors(f);
  const SearchResult u = search_schedule(uniform);
  CHECK(u.kind == plain.kind);
  CHECK(u.best.order == plain.best.order);
  REQUIRE(u.best.ops.size() == plain.best.ops.size());
  double last_end = 0, longest = 0;
  for (std::size_t rank = 0; rank < u.best.ops.size(); ++rank) {
    REQUIRE(u.best.ops[rank].size() == plain.best.ops[rank].size());
    for (std::size_t i = 0; i < u.best.ops[rank].size(); ++i) {
      const auto& a = plain.best.ops[rank][i];
      const auto& b = u.best.ops[rank][i];
      CHECK(b.start_ms == Approx(f * a.start_ms).epsilon(1e-12));
      CHECK(b.end_ms - b.start_ms == Approx(a.end_ms - a.start_ms).epsilon(1e-9));
      last_end = std::max(last_end, b.end_ms);
      longest = std::max(longest, a.end_ms - a.start_ms);
    }
  }
  CHECK(last_end == u.best.makespan_ms);
  CHECK(u.best.makespan_ms <= f * plain.best.makespan_ms * (1 + 1e-12));
  CHECK(u.best.makespan_ms >= f * plain.best.makespan_ms - (f - 1) * longest - 1e-9);
  CHECK(u.best.bubble_fraction > plain.best.bubble_fraction);
  // Every factor is at least 1, so the lower bounds hold unscaled.
  CHECK(makespan_lower_bounds(uniform).value() == makespan_lower_bounds(s.problem).value());
  CHECK(u.best.makespan_ms >= makespan_lower_bounds(uniform).value());
}

TEST_CASE("search: with a margin, only a candidate that much faster replaces 1F1B over the given order",
          "[interface]") {
  int replaced = 0, kept = 0;
  for (std::uint64_t seed = 0; seed < 24; ++seed) {
    std::mt19937_64 rng(seed);
    const std::int64_t chunks = seed % 4 == 3 ? 2 : 1;
    Setup s(rng, 4, chunks, chunks > 1 ? 8 + 4 * (seed % 2) : 8 + seed % 9);
    const ScheduleKind ref = reference_kind(s.problem);
    CHECK(ref == (chunks > 1 ? ScheduleKind::Interleaved1F1B : ScheduleKind::OneFOneB));
    // The reference candidate: the reference kind over the given order, as a user runs it.
    const Schedule given = make_schedule(ref, s.problem);
    const SearchResult plain = reference_search(s.problem);
    const bool plain_is_reference = plain.kind == ref && plain.best.order == given.order;
    // Without the reference kind among the candidates there is no reference: the margin changes nothing.
    if (chunks == 1) {
      SearchOptions without, without_margin;
      without.schedules.push_back(ScheduleKind::WaitFreeCyclic);
      without.schedules.push_back(ScheduleKind::ZeroBubble);
      without_margin.schedules = without.schedules;
      without_margin.margin = 0.5;
      CHECK(same_schedule(search_schedule(s.problem, without_margin).best, search_schedule(s.problem, without).best));
      CHECK(same_schedule(reference_search(s.problem, without_margin).best,
                          reference_search(s.problem, without).best));
    }
    for (double m : {0.001, 0.01, 0.05, 0.2}) {
      SearchOptions o;
      o.margin = m;
      const SearchResult r = reference_search(s.problem, o);
      // The exhaustive search's rule, exactly: the reference stays unless the best other candidate
      // is more than the margin faster.
      const bool other_wins = !plain_is_reference && plain.best.makespan_ms < (1 - m) * given.makespan_ms;
      if (other_wins) {
        CHECK(r.best.makespan_ms == plain.best.makespan_ms);
        ++replaced;
      } else {
        CHECK(r.kind == ref);
        CHECK(r.best.order == given.order);
        CHECK(r.best.makespan_ms == given.makespan_ms);
        if (!plain_is_reference) ++kept;
      }
      // The fast search: anything but the reference is the margin faster than it (its first
      // phase simulates the reference, unless something already reached the lower bound).
      const SearchResult f = search_schedule(s.problem, o);
      if (!(f.kind == ref && f.best.order == given.order)) {
        CHECK(f.best.makespan_ms <= (1 - m) * given.makespan_ms * (1 + 1e-12));
      }
      CHECK(f.best.makespan_ms <= given.makespan_ms);
      CHECK(f.best.makespan_ms >= makespan_lower_bounds(s.problem).value());
    }
    // A margin larger than any gain keeps the reference.
    SearchOptions huge;
    huge.margin = 0.9;
    const SearchResult h = search_schedule(s.problem, huge);
    CHECK(h.kind == ref);
    CHECK(h.best.order == given.order);
  }
  // The sample holds both outcomes, so each branch above was checked.
  CHECK(replaced > 0);
  CHECK(kept > 0);
  // Outside [0, 1) (or NaN) is refused, naming the option.
  for (double bad : {-0.1, 1.0, std::numeric_limits<double>::quiet_NaN()}) {
    std::mt19937_64 rng(1);
    Setup s(rng, 2, 1, 4);
    SearchOptions o;
    o.margin = bad;
    CHECK_THROWS_WITH(search_schedule(s.problem, o), Catch::Matchers::Contains("margin"));
    CHECK_THROWS_WITH(reference_search(s.problem, o), Catch::Matchers::Contains("margin"));
  }
}

TEST_CASE("search: a cutoff stops what cannot be kept, and keeps what the search without it finds",
          "[interface][boundary]") {
  int same = 0, faster = 0, missed = 0, none = 0;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    std::mt19937_64 rng(100 + seed);
    const std::int64_t chunks = seed % 5 == 4 ? 2 : 1;
    const std::int64_t S = chunks > 1 ? 4 : 2 + static_cast<std::int64_t>(seed % 3);
    const std::size_t n = chunks > 1 ? 8 + 4 * (seed % 3) : 3 + static_cast<std::size_t>(rng() % 28);
    Setup s(rng, S, chunks, n, seed % 3 == 0 ? 30000 : 0);
    SearchOptions o;
    o.seed = seed;
    o.margin = seed % 2 == 0 ? 0.02 : 0;
    const double largest = 1 / (1 - o.margin);  // the largest rank factor (no schedule factors here)
    const SearchResult plain = search_schedule(s.problem, o);
    if (!plain.feasible) continue;
    const double u = plain.best.makespan_ms;
    INFO("seed " << seed << " S " << S << " chunks " << chunks << " m " << n << " unbounded " << u);
    // A cutoff above what the search finds without it: the same schedule, or (kinds its later phases
    // try that the search without it dropped) a faster one; never none (a first phase that ends over
    // the cutoff is searched again without it: improving a schedule over the cutoff may get under it).
    for (double f : {1.0 + 1e-9, 1.03, 1.5}) {
      SearchOptions c = o;
      c.cutoff_ms = u * f;
      const SearchResult r = search_schedule(s.problem, c);
      if (!r.found_below_cutoff) {
        CHECK(r.best.ops.empty());
        ++missed;
        continue;
      }
      REQUIRE(r.feasible);
      CHECK(r.best.makespan_ms <= u);
      if (same_schedule(r.best, plain.best)) {
        ++same;
      } else {
        ++faster;
        CHECK(r.best.makespan_ms < u);
      }
    }
    // At or under it: nothing, or a schedule ranked under the cutoff times the largest factor and
    // the slack.
    for (double f : {1.0, 0.97, 0.9}) {
      SearchOptions c = o;
      c.cutoff_ms = u * f;
      const SearchResult r = search_schedule(s.problem, c);
      if (r.found_below_cutoff) {
        CHECK(r.best.makespan_ms < c.cutoff_ms * largest * (1 + kCutoffSlack));
      } else {
        CHECK(r.best.ops.empty());
        ++none;
      }
    }
    // Under the lower bound (over the factors and the slack) nothing can be kept, and no
    // evaluation runs to its end.
    SearchOptions c = o;
    c.cutoff_ms = plain.lower_bound_ms * 0.99 / (largest * (1 + kCutoffSlack));
    const SearchResult r = search_schedule(s.problem, c);
    CHECK_FALSE(r.found_below_cutoff);
    CHECK(r.early_exits == r.simulations);
    CHECK(r.simulations > 0);
  }
  CHECK(none > 0);
  CHECK(missed == 0);
  CHECK(same > 10 * faster);  // (the same schedule, with few exceptions)
  WARN("cutoff above the unbounded result: same " << same << ", faster " << faster << ", missed " << missed
                                                   << "; at or under it, none found " << none);
  // A cutoff must be a positive number of milliseconds, and is not combined with the recompute fallback.
  std::mt19937_64 rng(1);
  Setup s(rng, 2, 1, 4);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    SearchOptions o;
    o.cutoff_ms = bad;
    CHECK_THROWS_WITH(search_schedule(s.problem, o), Catch::Matchers::Contains("cutoff"));
  }
  SearchOptions o;
  o.cutoff_ms = 1e9;
  o.recompute_table = [&](cm::Recompute rc) { return s.table(rc); };
  CHECK_THROWS_WITH(search_schedule(s.problem, o), Catch::Matchers::Contains("cutoff"));
}
