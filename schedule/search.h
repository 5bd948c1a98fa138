// Schedule search: the schedule and micro-batch order with the smallest simulated makespan
// within the memory limit, deterministically. Two searches: a DynaPipe-like exhaustive reference
// (every schedule x DynaPipe's order candidates, each fully simulated) and the fast search used
// by the planner (the same candidates plus constructive orders and local improvement, pruned by
// early-exit simulation and lower bounds; never worse than the reference by construction).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "schedule/schedules.h"
#include "schedule/simulator.h"

namespace packpipe::schedule {

namespace pl = ::packpipe::plan;

/// A cutoff (SearchOptions::cutoff_ms) keeps candidates ranked up to this fraction over it: local
/// improvement may bring one of them under it.
constexpr double kCutoffSlack = 0.05;

struct SearchOptions {
  std::vector<ScheduleKind> schedules;  ///< candidates; empty: every kind the shape supports
  std::uint64_t seed = 0;               ///< shuffles inside order clusters, random swaps
  ScheduleOptions schedule_options;
  int local_rounds = 1;                 ///< fast search: rounds of order improvement (0: none)
  int local_evaluations = 0;            ///< fast search: random swaps per round (count, deterministic); 0: m / 4
  /// Optional: the cost table under one uniform recompute mode. When no candidate fits the memory
  /// limit with the given table, both searches retry with Selective, then Full (as DynaPipe tries
  /// uniform modes); must return a table of the same shape.
  std::function<StageCostTable(cm::Recompute)> recompute_table;
  /// In [0, 1): a candidate other than the reference (reference_kind: 1F1B, interleaved 1F1B with
  /// chunks, over the given order 0..m-1) wins only when ranked at least this fraction faster than
  /// the reference; ranking only (makespans are unchanged). 0: the least makespan wins. The planner
  /// sets its min_gain.
  double margin = 0;
  /// Fast search only: the caller keeps the result only when its makespan is below this. An
  /// evaluation stops once its rank passes cutoff x the largest rank factor x (1 + kCutoffSlack)
  /// (so none whose makespan is below the cutoff is cut short), and a search that finds none such
  /// returns found_below_cutoff false, without a schedule. infinity: no cutoff. Not with
  /// recompute_table.
  double cutoff_ms = std::numeric_limits<double>::infinity();
};

/// The schedule a user runs by default for the problem's shape: interleaved 1F1B with chunks, else 1F1B.
ScheduleKind reference_kind(const SimProblem& problem);

struct SearchResult {
  pl::Schedule best;                  ///< the winner, simulated (ops with times)
  ScheduleKind kind = ScheduleKind::OneFOneB;
  bool feasible = false;          ///< best fits the memory limit (else: the candidate of least peak memory)
  std::string recompute = "given";  ///< "given", or the uniform mode the fallback used ("selective", "full")
  std::int64_t simulations = 0;   ///< candidate evaluations (simulated, or timed by the zero-bubble greedy)
  std::int64_t early_exits = 0;   ///< of which stopped early (incumbent passed, or over the memory limit)
  double lower_bound_ms = 0;      ///< makespan_lower_bounds(problem).value()
  /// false: no candidate ranked under SearchOptions::cutoff_ms x the largest rank factor x (1 +
  /// kCutoffSlack) (best is empty). true does not mean best's makespan is under the cutoff: the
  /// caller compares.
  bool found_below_cutoff = true;
};

/// DynaPipe's order candidates, made deterministic: the given order 0..m-1, then, when m > k (k = 3
/// above 20 micro-batches, else 4), the k! orders of k clusters of a deterministic k-means (Lloyd's,
/// quantile initialisation) on (first-stage forward, last-stage forward, first-stage backward,
/// last-stage backward) times, each cluster's members shuffled by a splitmix64 stream from `seed`;
/// otherwise all m! permutations. Duplicates removed; at most 25 orders. With slices each is made a
/// valid forward order (slice_order), so some may coincide.
std::vector<std::vector<std::uint32_t>> reference_orders(const SimProblem& problem, std::uint64_t seed);
/// Constructive orders of the fast search: longest first, shortest first, short at both ends and
/// long in the middle (hides long micro-batches in the steady phase), and its mirror.
std::vector<std::vector<std::uint32_t>> constructive_orders(const SimProblem& problem);

/// Exhaustive reference: every schedule x reference_orders, each fully simulated; winner = least
/// makespan among those within memory (first in enumeration order on ties). Deterministic.
SearchResult reference_search(const SimProblem& problem, const SearchOptions& options = {});
/// Fast search: reference candidates first (so its result is never worse), then constructive
/// orders, then local improvement (adjacent swaps at the ends and a count of seeded random swaps)
/// of the best order, every evaluation stopped once it passes the incumbent (or a rank's clock
/// plus its unstarted work does) and orders over the memory limit rejected before simulating;
/// stops at the lower bound. Deterministic (no wall-clock budget).
SearchResult search_schedule(const SimProblem& problem, const SearchOptions& options = {});

}  // namespace packpipe::schedule
