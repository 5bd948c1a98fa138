#include "schedule/search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/errors.h"
#include "schedule/detail/order_builder.h"
#include "common/rng.h"

namespace packpipe::schedule {

namespace pl = ::packpipe::plan;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<std::uint32_t> identity(std::int64_t m) {
  std::vector<std::uint32_t> o(static_cast<std::size_t>(m));
  std::iota(o.begin(), o.end(), 0u);
  return o;
}

void add_unique(std::vector<std::vector<std::uint32_t>>& list, std::vector<std::uint32_t> o) {
  for (const auto& e : list) {
    if (e == o) return;
  }
  list.push_back(std::move(o));
}

std::vector<double> total_time(const SimProblem& p) {
  const StageCostTable& t = p.costs;
  std::vector<double> tot(static_cast<std::size_t>(p.microbatches()), 0.0);
  for (std::int64_t mb = 0; mb < p.microbatches(); ++mb) {
    for (std::int64_t v = 0; v < p.vstages(); ++v) {
      const std::size_t i = t.at(mb, v);
      tot[static_cast<std::size_t>(mb)] += t.op_ms(pl::OpKind::Forward, i) + t.op_ms(pl::OpKind::Backward, i);
    }
  }
  return tot;
}

std::vector<ScheduleKind> candidate_kinds(const SimProblem& p, const SearchOptions& o) {
  const std::int64_t S = p.ranks, c = p.vstages() / p.ranks, m = p.microbatches();
  std::vector<ScheduleKind> out;
  const auto& from = o.schedules.empty() ? all_schedule_kinds() : o.schedules;
  for (ScheduleKind k : from) {
    if (schedule_supports(k, p)) out.push_back(k);
  }
  PACKPIPE_CHECK_ARG(!out.empty(), "no candidate schedule supports {} micro-batches on {} ranks x {} chunks{}", m, S, c,
                     p.has_slices() ? " with slices (interleaved 1F1B does not run them)" : "");
  return out;
}

// What the search ranks a candidate's simulated makespan by: its kind's factor
// (SimProblem::kind_factor), divided by 1 - margin unless it is the reference candidate (the
// reference kind over the given order, 0..m-1) or the reference kind is not a candidate.
class RankFactor {
 public:
  RankFactor(const SimProblem& p, const SearchOptions& o) : factor_(p.kind_factor), ref_(reference_kind(p)) {
    const auto kinds = candidate_kinds(p, o);
    if (o.margin > 0 && std::find(kinds.begin(), kinds.end(), ref_) != kinds.end()) penalty_ = 1.0 / (1.0 - o.margin);
  }
  /// The largest factor any candidate is ranked by.
  double largest() const { return *std::max_element(factor_.begin(), factor_.end()) * penalty_; }
  double operator()(ScheduleKind k, const std::vector<std::uint32_t>& order) const {
    const double f = factor_[static_cast<std::size_t>(k)];
    if (penalty_ == 1.0 || (k == ref_ && is_identity(order))) return f;
    return f * penalty_;
  }

 private:
  static bool is_identity(const std::vector<std::uint32_t>& order) {
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (order[i] != i) return false;
    }
    return true;
  }
  std::array<double, kScheduleKinds> factor_;
  ScheduleKind ref_;
  double penalty_ = 1.0;
};

struct Candidate {
  bool have = false;
  double makespan = kInf;
  ScheduleKind kind = ScheduleKind::OneFOneB;
  std::vector<std::uint32_t> order;
};

// The largest per-rank peak memory of an order (static + stored in flight + the running op's
// peak, with the simulator's arithmetic, so bit-identical to its peaks): memory depends only on
// each rank's op order, so no simulation is needed. Stops once a rank passes `stop_above`.
double order_peak_bytes(const SimProblem& p, const RankOrder& o, double stop_above = kInf) {
  const StageCostTable& t = p.costs;
  double most = 0;
  for (std::size_t r = 0; r < o.ops.size(); ++r) {
    double cur = t.static_bytes[r], peak = cur;
    for (const pl::ScheduledOp& op : o.ops[r]) {
      const std::size_t i = t.at(op.mb, op.vstage);
      double during = cur + t.peak_bytes[i];
      if (op.kind == pl::OpKind::Forward) {
        during += t.stored_bytes[i];
        cur += t.stored_bytes[i];
      } else if (op.kind != pl::OpKind::BackwardInput) {
        cur -= t.stored_bytes[i];
      }
      peak = std::max(peak, during);
    }
    most = std::max(most, peak);
    if (most > stop_above) return most;
  }
  return most;
}

// One search pass over a problem (one recompute table).
class Pass {
 public:
  Pass(const SimProblem& p, const SearchOptions& o, SearchResult& stats)
      : p_(p), o_(o), sim_(p), builder_(p), rank_(p, o), stats_(stats) {}

  // Evaluates (kind, order); with `prune`, stops once it passes the incumbent or the memory limit
  // (orders over the limit are rejected before simulating; zero-bubble is timed by its own greedy,
  // bit-identical to the simulator, when exact_times()). Returns true when it became the new
  // incumbent.
  bool eval(ScheduleKind kind, const std::vector<std::uint32_t>& candidate, bool prune) {
    // With slices every order is first made a valid forward order (slice_order: the candidate
    // itself when it is one).
    const std::vector<std::uint32_t>& order = p_.has_slices() ? (repaired_ = slice_order(p_, candidate)) : candidate;
    ++stats_.simulations;
    // The simulated makespan times the candidate's rank factor (RankFactor) is what is compared.
    const double f = rank_(kind, order);
    const bool cut = cutoff_rank < best.makespan;  // the caller's cutoff binds, not the incumbent
    const double bound = prune ? std::min(best.makespan, cutoff_rank) / f : kInf;
    const double limit = p_.memory_limit_bytes;
    double ms = kInf;
    if (prune && kind == ScheduleKind::ZeroBubble && builder_.exact_times()) {
      ms = builder_.zero_bubble(order, o_.schedule_options, ro_, peak_, bound, true);
      if (ms == kInf) return exit_early(kind, cut);
    } else {
      RankOrder& ro = built(kind, order);
      if (prune && limit > 0 && !fits_) return exit_early();
      // Wait-free cyclic is the cyclic order without its barriers.
      if (kind == ScheduleKind::WaitFreeCyclic) std::swap(ro.cycle, spare_cycle_);
      sim_.run(ro, res_, bound, prune);
      if (kind == ScheduleKind::WaitFreeCyclic) std::swap(ro.cycle, spare_cycle_);
      if (res_.aborted) return exit_early(kind, cut);
      if (!res_.within_memory) return false;
      ms = res_.makespan_ms;
    }
    ms *= f;
    finished[static_cast<std::size_t>(kind)] = 1;
    if (!(ms < best.makespan) || !(ms < cutoff_rank)) return false;
    best.have = true;
    best.makespan = ms;
    best.kind = kind;
    best.order = order;
    return true;
  }

  Candidate best;
  std::array<std::uint8_t, 8> finished{};  ///< per kind: some evaluation ran to the end within memory
  /// Ranks at or above this are of no use to the caller (SearchOptions::cutoff_ms x the largest rank
  /// factor); evaluations stop there, and none becomes the incumbent.
  double cutoff_rank = kInf;

 private:
  // `cut`: the caller's cutoff stopped it where the incumbent alone might not have; its kind is
  // kept for the later phases as the search without a cutoff might have kept it (an evaluation
  // run to the end). (Zero-bubble timed by its greedy stops alike over the memory limit; its kind
  // is then kept too, which costs evaluations only.)
  bool exit_early(ScheduleKind kind = ScheduleKind::OneFOneB, bool cut = false) {
    ++stats_.early_exits;
    if (cut) finished[static_cast<std::size_t>(kind)] = 1;
    return false;
  }
  // The order of `kind` for `order` (cyclic and wait-free cyclic share one build, kept with its
  // barriers) and fits_: whether it stays within the memory limit.
  RankOrder& built(ScheduleKind kind, const std::vector<std::uint32_t>& order) {
    const bool cyclic = kind == ScheduleKind::Cyclic || kind == ScheduleKind::WaitFreeCyclic;
    if (cyclic && have_cyclic_ && cyclic_order_ == order) {
      fits_ = cyclic_fits_;
      return cyclic_ro_;
    }
    RankOrder& ro = cyclic ? cyclic_ro_ : ro_;
    builder_.build(cyclic ? ScheduleKind::Cyclic : kind, order, o_.schedule_options, ro);
    fits_ = p_.memory_limit_bytes <= 0 || order_peak_bytes(p_, ro, p_.memory_limit_bytes) <= p_.memory_limit_bytes;
    if (cyclic) {
      have_cyclic_ = true;
      cyclic_order_ = order;
      cyclic_fits_ = fits_;
    }
    return ro;
  }

  const SimProblem& p_;
  const SearchOptions& o_;
  Simulator sim_;
  detail::OrderBuilder builder_;
  RankFactor rank_;
  RankOrder ro_, cyclic_ro_;
  std::vector<std::vector<std::uint32_t>> spare_cycle_;
  std::vector<std::uint32_t> cyclic_order_;
  bool have_cyclic_ = false, cyclic_fits_ = true, fits_ = true;
  std::vector<double> peak_;
  std::vector<std::uint32_t> repaired_;
  SimResult res_;
  SearchResult& stats_;
};

Candidate reference_pass(const SimProblem& p, const SearchOptions& o, SearchResult& stats) {
  Pass pass(p, o, stats);
  const auto kinds = candidate_kinds(p, o);
  const auto orders = reference_orders(p, o.seed);
  for (ScheduleKind k : kinds) {
    for (const auto& ord : orders) pass.eval(k, ord, false);
  }
  return pass.best;
}

// Returns the best candidate and whether the reference candidates alone had a feasible one.
Candidate fast_pass(const SimProblem& p, const SearchOptions& o, SearchResult& stats, bool& reference_feasible) {
  Pass pass(p, o, stats);
  if (o.cutoff_ms < kInf) pass.cutoff_rank = o.cutoff_ms * RankFactor(p, o).largest() * (1 + kCutoffSlack);
  // Likely winners first, so the incumbent prunes the rest early.
  std::vector<ScheduleKind> kinds = candidate_kinds(p, o);
  auto rank = [](ScheduleKind k) {
    switch (k) {
      case ScheduleKind::ZeroBubble: return 0;
      case ScheduleKind::WaitFreeCyclic: return 1;
      case ScheduleKind::Interleaved1F1B: return 2;
      case ScheduleKind::OneFOneB: return 3;
      case ScheduleKind::Cyclic: return 4;
      case ScheduleKind::GPipe: return 5;
    }
    return 6;
  };
  std::stable_sort(kinds.begin(), kinds.end(), [&](ScheduleKind a, ScheduleKind b) { return rank(a) < rank(b); });
  const double lb = makespan_lower_bounds(p).search_stop_ms() * (1 + 1e-12);
  auto done = [&]() { return pass.best.have && pass.best.makespan <= lb; };
  const auto ref = reference_orders(p, o.seed);
  // Phase 1: the reference candidates (orders outer, so every kind gets a first incumbent on the
  // given order), pruned by the incumbent; only a feasible candidate becomes the incumbent.
  for (const auto& ord : ref) {
    for (ScheduleKind k : kinds) {
      if (done()) break;
      pass.eval(k, ord, true);
    }
  }
  reference_feasible = pass.best.have;
  // Later phases only try kinds that finished some simulation within memory and at or below the
  // incumbent of the moment; the others were always slower or too large.
  kinds.erase(std::remove_if(kinds.begin(), kinds.end(),
                             [&](ScheduleKind k) { return !pass.finished[static_cast<std::size_t>(k)]; }),
              kinds.end());
  // Phase 2: constructive orders.
  std::vector<std::vector<std::uint32_t>> extra;
  for (auto& ord : constructive_orders(p)) {
    if (std::find(ref.begin(), ref.end(), ord) == ref.end()) add_unique(extra, std::move(ord));
  }
  for (const auto& ord : extra) {
    for (ScheduleKind k : kinds) {
      if (done()) break;
      pass.eval(k, ord, true);
    }
  }
  // Phase 3: local improvement of the incumbent's order under its schedule, within a deterministic
  // budget of evaluations: adjacent swaps at the very ends (the first and last max(1, S / 4)
  // positions: fill and drain), then seeded random swaps; every improvement is kept.
  if (!pass.best.have) return pass.best;
  const std::size_t m = static_cast<std::size_t>(p.microbatches());
  const std::size_t edge = std::max<std::size_t>(1, static_cast<std::size_t>(p.ranks) / 4);
  const std::size_t random_swaps = o.local_evaluations > 0 ? static_cast<std::size_t>(o.local_evaluations) : m / 4;
  SplitMix64 rng(o.seed ^ 0x5DEECE66Dull);
  for (int round = 0; round < o.local_rounds && m > 1 && !done(); ++round) {
    bool improved = false;
    std::vector<std::uint32_t> ord = pass.best.order;
    const ScheduleKind k = pass.best.kind;
    for (std::size_t i = 0; i + 1 < m && !done(); ++i) {
      if (i >= edge && i + 1 + edge < m) continue;
      std::swap(ord[i], ord[i + 1]);
      if (pass.eval(k, ord, true)) {
        improved = true;
      } else {
        std::swap(ord[i], ord[i + 1]);
      }
    }
    for (std::size_t s = 0; s < random_swaps && !done(); ++s) {
      const auto a = static_cast<std::size_t>(rng.below(m));
      const auto b = static_cast<std::size_t>(rng.below(m));
      if (a == b) continue;
      std::swap(ord[a], ord[b]);
      if (pass.eval(k, ord, true)) {
        improved = true;
      } else {
        std::swap(ord[a], ord[b]);
      }
    }
    if (!improved) break;
  }
  return pass.best;
}

SimProblem with_table(const SimProblem& p, StageCostTable t, cm::Recompute rc) {
  PACKPIPE_CHECK_ARG(t.microbatches == p.microbatches() && t.vstages == p.vstages() &&
                         t.forward_ms.size() == p.costs.forward_ms.size() &&
                         t.static_bytes.size() == p.costs.static_bytes.size(),
                     "recompute_table({}) returned a {} x {} table, expected {} x {}", cm::recompute_name(rc),
                     t.microbatches, t.vstages, p.microbatches(), p.vstages());
  SimProblem q;
  q.ranks = p.ranks;
  q.slice_edges = p.slice_edges;
  q.transfer_ms = p.transfer_ms;
  q.memory_limit_bytes = p.memory_limit_bytes;
  q.kind_factor = p.kind_factor;
  q.costs = std::move(t);
  return q;
}

// The result for the chosen candidate; when nothing fits, the candidate of least peak memory
// among the reference candidates of `p`.
SearchResult finish(const SimProblem& p, const SearchOptions& o, Candidate c, SearchResult stats) {
  stats.lower_bound_ms = makespan_lower_bounds(p).value();
  stats.feasible = c.have;
  if (!c.have) {
    // Peaks from the op orders alone; only the candidates of least peak are simulated (least
    // makespan among them, first in enumeration order on ties).
    detail::OrderBuilder builder(p);
    RankOrder ro;
    const auto kinds = candidate_kinds(p, o);
    const auto orders = reference_orders(p, o.seed);
    std::vector<double> peaks;
    double least = kInf;
    for (ScheduleKind k : kinds) {
      for (const auto& ord : orders) {
        builder.build(k, ord, o.schedule_options, ro);  // reference_orders are valid with slices
        peaks.push_back(order_peak_bytes(p, ro));
        least = std::min(least, peaks.back());
      }
    }
    Simulator sim(p);
    const RankFactor rank(p, o);
    double least_ms = kInf;
    std::size_t n = 0;
    for (ScheduleKind k : kinds) {
      for (const auto& ord : orders) {
        if (peaks[n++] != least) continue;
        builder.build(k, ord, o.schedule_options, ro);
        const double ms = sim.makespan(ro) * rank(k, ord);
        ++stats.simulations;
        if (ms < least_ms) {
          least_ms = ms;
          c.kind = k;
          c.order = ord;
        }
      }
    }
  }
  stats.kind = c.kind;
  stats.best = simulate(p, build_order(c.kind, p, c.order, o.schedule_options), schedule_kind_name(c.kind), c.order);
  return stats;
}

}  // namespace

ScheduleKind reference_kind(const SimProblem& p) {
  return p.vstages() > p.ranks ? ScheduleKind::Interleaved1F1B : ScheduleKind::OneFOneB;
}

namespace {

// With slices, each order made a valid forward order (slice_order), duplicates removed.
std::vector<std::vector<std::uint32_t>> repaired(const SimProblem& p, std::vector<std::vector<std::uint32_t>> orders) {
  if (!p.has_slices()) return orders;
  std::vector<std::vector<std::uint32_t>> out;
  for (auto& o : orders) add_unique(out, slice_order(p, o));
  return out;
}

std::vector<std::vector<std::uint32_t>> reference_orders_of(const SimProblem& p, std::uint64_t seed);
std::vector<std::vector<std::uint32_t>> constructive_orders_of(const SimProblem& p);

}  // namespace

std::vector<std::vector<std::uint32_t>> reference_orders(const SimProblem& p, std::uint64_t seed) {
  return repaired(p, reference_orders_of(p, seed));
}

std::vector<std::vector<std::uint32_t>> constructive_orders(const SimProblem& p) {
  return repaired(p, constructive_orders_of(p));
}

namespace {

std::vector<std::vector<std::uint32_t>> reference_orders_of(const SimProblem& p, std::uint64_t seed) {
  const std::int64_t m = p.microbatches(), V = p.vstages();
  const StageCostTable& t = p.costs;
  std::vector<std::vector<std::uint32_t>> out;
  out.push_back(identity(m));
  const std::int64_t k = m > 20 ? 3 : 4;
  if (m <= k) {
    std::vector<std::uint32_t> perm = identity(m);
    do {
      add_unique(out, perm);
    } while (std::next_permutation(perm.begin(), perm.end()));
    return out;
  }
  // Deterministic k-means on the four times DynaPipe clusters by.
  const auto M = static_cast<std::size_t>(m);
  const auto K = static_cast<std::size_t>(k);
  std::vector<std::array<double, 4>> x(M);
  for (std::size_t i = 0; i < M; ++i) {
    const auto mb = static_cast<std::int64_t>(i);
    x[i] = {t.forward_ms[t.at(mb, 0)], t.forward_ms[t.at(mb, V - 1)], t.backward_ms[t.at(mb, 0)],
            t.backward_ms[t.at(mb, V - 1)]};
  }
  std::vector<std::uint32_t> by_sum = identity(m);
  auto sum = [&](std::size_t i) { return x[i][0] + x[i][1] + x[i][2] + x[i][3]; };
  std::stable_sort(by_sum.begin(), by_sum.end(), [&](std::uint32_t a, std::uint32_t b) { return sum(a) < sum(b); });
  std::vector<std::array<double, 4>> centre(K);
  for (std::size_t j = 0; j < K; ++j) centre[j] = x[by_sum[(2 * j + 1) * M / (2 * K)]];
  std::vector<std::size_t> label(M, K);
  for (int it = 0; it < 100; ++it) {
    bool changed = false;
    for (std::size_t i = 0; i < M; ++i) {
      std::size_t best = 0;
      double best_d = kInf;
      for (std::size_t j = 0; j < K; ++j) {
        double d = 0;
        for (int f = 0; f < 4; ++f) d += (x[i][f] - centre[j][f]) * (x[i][f] - centre[j][f]);
        if (d < best_d) {
          best_d = d;
          best = j;
        }
      }
      if (label[i] != best) {
        label[i] = best;
        changed = true;
      }
    }
    if (!changed) break;
    for (std::size_t j = 0; j < K; ++j) {
      std::array<double, 4> s{0, 0, 0, 0};
      std::size_t n = 0;
      for (std::size_t i = 0; i < M; ++i) {
        if (label[i] != j) continue;
        for (int f = 0; f < 4; ++f) s[f] += x[i][f];
        ++n;
      }
      if (n == 0) continue;
      for (int f = 0; f < 4; ++f) centre[j][f] = s[f] / static_cast<double>(n);
    }
  }
  std::vector<std::size_t> perm(K);
  std::iota(perm.begin(), perm.end(), std::size_t{0});
  std::uint64_t index = 0;
  do {
    SplitMix64 rng(seed ^ (kSplitMixGamma * (index + 1)));
    ++index;
    std::vector<std::uint32_t> ord;
    ord.reserve(M);
    for (std::size_t j : perm) {
      const std::size_t lo = ord.size();
      for (std::size_t i = 0; i < M; ++i) {
        if (label[i] == j) ord.push_back(static_cast<std::uint32_t>(i));
      }
      shuffle_range(ord, lo, ord.size(), rng);
    }
    add_unique(out, std::move(ord));
  } while (std::next_permutation(perm.begin(), perm.end()));
  return out;
}

std::vector<std::vector<std::uint32_t>> constructive_orders_of(const SimProblem& p) {
  const std::int64_t m = p.microbatches();
  const auto tot = total_time(p);
  std::vector<std::uint32_t> asc = identity(m);
  std::stable_sort(asc.begin(), asc.end(), [&](std::uint32_t a, std::uint32_t b) { return tot[a] < tot[b]; });
  std::vector<std::uint32_t> desc(asc.rbegin(), asc.rend());
  auto ends_in = [&](const std::vector<std::uint32_t>& sorted) {
    std::vector<std::uint32_t> o(sorted.size());
    std::size_t lo = 0, hi = sorted.size();
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      if (i % 2 == 0) {
        o[lo++] = sorted[i];
      } else {
        o[--hi] = sorted[i];
      }
    }
    return o;
  };
  std::vector<std::vector<std::uint32_t>> out;
  add_unique(out, desc);
  add_unique(out, asc);
  add_unique(out, ends_in(asc));   // short at both ends, long in the middle
  add_unique(out, ends_in(desc));  // long at both ends
  return out;
}

}  // namespace

static void check_margin(const SearchOptions& o) {
  PACKPIPE_CHECK_ARG(std::isfinite(o.margin) && o.margin >= 0 && o.margin < 1,
                     "search margin (the least gain of another kind or order over the reference schedule) is a fraction in "
                     "[0, 1), found {}", o.margin);
}

SearchResult reference_search(const SimProblem& problem, const SearchOptions& options) {
  check_margin(options);
  SearchResult stats;
  Candidate c = reference_pass(problem, options, stats);
  if (c.have || !options.recompute_table) return finish(problem, options, std::move(c), std::move(stats));
  for (cm::Recompute rc : {cm::Recompute::Selective, cm::Recompute::Full}) {
    SimProblem q = with_table(problem, options.recompute_table(rc), rc);
    Candidate d = reference_pass(q, options, stats);
    if (d.have) {
      stats.recompute = cm::recompute_name(rc);
      return finish(q, options, std::move(d), std::move(stats));
    }
  }
  return finish(problem, options, std::move(c), std::move(stats));
}

SearchResult search_schedule(const SimProblem& problem, const SearchOptions& options) {
  check_margin(options);
  PACKPIPE_CHECK_ARG(!std::isnan(options.cutoff_ms) && options.cutoff_ms > 0,
                     "search cutoff (the makespan a schedule must beat to be kept) must be positive, found {}",
                     options.cutoff_ms);
  PACKPIPE_CHECK_ARG(options.cutoff_ms == kInf || !options.recompute_table,
                     "a search cutoff cannot be combined with a recompute_table fallback");
  SearchResult stats;
  bool ref_ok = false;
  Candidate c = fast_pass(problem, options, stats, ref_ok);
  if (options.cutoff_ms < kInf && !c.have) {
    // Nothing ranked under the cutoff in the passes' first phases: the search without a cutoff may
    // still bring its best below it by local improvement (which starts from that best). So the
    // result never depends on the cutoff: the search is run again without one, and its best kept
    // when it ranks under the cutoff (with an incumbent under the cutoff, the two searches go alike).
    // (Where the problem's lower bound at the least rank factor reaches the cutoff, nothing can.)
    const double cutoff_rank = options.cutoff_ms * RankFactor(problem, options).largest() * (1 + kCutoffSlack);
    stats.lower_bound_ms = makespan_lower_bounds(problem).value();
    const double least = *std::min_element(problem.kind_factor.begin(), problem.kind_factor.end());
    Candidate d;
    bool ok = false;
    if (stats.lower_bound_ms * least < cutoff_rank) {
      SearchOptions uncut = options;
      uncut.cutoff_ms = kInf;
      d = fast_pass(problem, uncut, stats, ok);
    }
    if (!d.have || !(d.makespan < cutoff_rank)) {  // nothing the caller would keep
      stats.found_below_cutoff = false;
      return stats;
    }
    c = std::move(d);
    ref_ok = ok;
  }
  if (ref_ok || !options.recompute_table) return finish(problem, options, std::move(c), std::move(stats));
  // The reference would fall back: try the same modes and keep the best of everything seen, so the
  // result is never worse than the reference's.
  const SimProblem* best_p = &problem;
  std::string best_rc = "given";
  SimProblem qs[2];
  int n = 0;
  for (cm::Recompute rc : {cm::Recompute::Selective, cm::Recompute::Full}) {
    qs[n] = with_table(problem, options.recompute_table(rc), rc);
    bool ok = false;
    Candidate d = fast_pass(qs[n], options, stats, ok);
    if (d.have && (!c.have || d.makespan < c.makespan)) {
      c = std::move(d);
      best_p = &qs[n];
      best_rc = cm::recompute_name(rc);
    }
    ++n;
    if (ok) break;
  }
  if (!c.have) return finish(problem, options, std::move(c), std::move(stats));
  stats.recompute = best_rc;
  return finish(*best_p, options, std::move(c), std::move(stats));
}

}  // namespace packpipe::schedule
