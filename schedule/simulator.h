// Event-driven simulation of a pipeline schedule: per rank one compute stream and two
// communication streams (send, receive), compute times from a StageCostTable, transfer times from
// the cost model's communication model, memory per rank. Given per-rank op orders it reports the
// makespan, the bubble fraction, each rank's peak memory and utilisation, and op start/end times.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/schedule_kind.h"
#include "costmodel/cost_model.h"
#include "schedule/stage_costs.h"

namespace packpipe::schedule {

namespace part = ::packpipe::partition;
namespace pl = ::packpipe::plan;

/// Everything the schedules and the simulator need about one iteration: the per-(micro-batch,
/// virtual stage) costs, the rank count and the boundary transfer times.
struct SimProblem {
  StageCostTable costs;
  std::int64_t ranks = 1;
  /// [mb * vstages + v]: ms to move the activation of (mb, v) to v + 1 (the gradient coming back
  /// has the same size and time); 0 when v and v + 1 share a rank, and for the last stage.
  std::vector<double> transfer_ms;
  double memory_limit_bytes = 0;  ///< per rank; 0: unlimited
  /// Per schedule kind, how much longer it runs than simulated on the machine that trains
  /// (costmodel::Calibration::schedule_factor, at least 1; 1 without one): the search ranks a kind
  /// by its simulated makespan times its factor, and `simulate` stretches its timeline's starts
  /// by it.
  std::array<double, kScheduleKinds> kind_factor = filled_factors(1.0);
  double factor(ScheduleKind k) const { return kind_factor[static_cast<std::size_t>(k)]; }
  static constexpr std::array<double, kScheduleKinds> filled_factors(double x) {
    std::array<double, kScheduleKinds> a{};
    for (auto& v : a) v = x;
    return a;
  }
  /// Slices (docs/design/015-long-context.md): (prev, next) pairs of micro-batches holding
  /// consecutive slices of one sample. On every virtual stage F(prev) runs before F(next), and the
  /// backward (B, or I) of next before prev's: next's backward adds into the gradients of the keys
  /// and values prev produced. Empty without slices.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> slice_edges;
  bool has_slices() const { return !slice_edges.empty(); }
  std::int64_t microbatches() const { return costs.microbatches; }
  std::int64_t vstages() const { return costs.vstages; }
  std::int64_t rank_of(std::int64_t v) const { return v % ranks; }
};

/// A problem from a cost table: transfers p2p_ms(send_bytes) of `comm`, inter-node when the two
/// ranks fall in different nodes of `ranks_per_node` pipeline ranks (gpus_per_node / tp, at least
/// 1), zero between virtual stages of one rank. `memory_limit_bytes` 0: unlimited. Throws
/// InvalidArgument when the table's sizes disagree or ranks does not divide its virtual stages.
SimProblem make_sim_problem(StageCostTable costs, std::int64_t ranks, const cm::CommModel& comm,
                            std::int64_t ranks_per_node, double memory_limit_bytes);
/// A problem from the cost model and the pipeline shape (shape.memory_limit_mb, or the device's
/// memory when 0; comm and gpus_per_node from the cost model's device; the schedule factors of a
/// calibrated model's calibration).
SimProblem make_sim_problem(StageCostTable costs, const cm::CostModel& cost, const part::PipelineShape& shape);

/// A schedule before simulation: per-rank op orders and, for synchronous (barrier) schedules, the
/// cycle of every op (an op of cycle c starts after every op of cycle c - 1 has ended).
struct RankOrder {
  std::vector<std::vector<pl::ScheduledOp>> ops;      ///< ops[rank] in execution order
  std::vector<std::vector<std::uint32_t>> cycle;  ///< empty, or cycle[rank][i] nondecreasing per rank
  void clear() {
    for (auto& r : ops) r.clear();
    for (auto& r : cycle) r.clear();
  }
};

/// What one simulation measured.
struct SimResult {
  double makespan_ms = 0;
  double bubble_fraction = 0;      ///< idle compute / (ranks x makespan)
  std::vector<double> peak_bytes;  ///< per rank: static + stored in flight + the running op's peak
  std::vector<double> busy_ms;     ///< per rank
  std::vector<double> utilization; ///< per rank: busy / makespan
  bool within_memory = true;       ///< every peak <= the problem's limit (or no limit)
  bool aborted = false;            ///< stopped early (makespan above the bound or memory exceeded)
  double max_peak_bytes() const;
};

/// Reusable simulator for one problem (holds a reference: the problem must outlive it). Buffers
/// are sized once, so repeated runs allocate nothing. Not thread-safe; one per thread.
class Simulator {
 public:
  explicit Simulator(const SimProblem& problem);
  /// Simulates `order` (every op on the rank of its virtual stage; per (mb, v) one F and either
  /// one B or one I and one W) and writes each op's start/end into it. Stored activations are
  /// released at the end of B, or of W (which still needs the layer inputs) when split. Stops
  /// early, with result.aborted, once simulated time (or a rank's clock plus the work it has not
  /// started) passes `abort_above_ms` or, when
  /// `abort_on_memory`, a rank exceeds the memory limit. Throws InvalidArgument naming the rank
  /// and op for an op on the wrong rank, a repeated or missing op, a deadlock (an op whose
  /// inputs can never arrive), or an order that breaks a slice edge (SimProblem::slice_edges). O(ops x ranks) time (a scan of the ranks per event; S is small).
  void run(RankOrder& order, SimResult& result, double abort_above_ms = std::numeric_limits<double>::infinity(),
           bool abort_on_memory = false);
  /// Makespan only (same rules); infinity when aborted.
  double makespan(RankOrder& order, double abort_above_ms = std::numeric_limits<double>::infinity(),
                  bool abort_on_memory = false);
  const SimProblem& problem() const { return p_; }

 private:
  const SimProblem& p_;
  std::vector<double> f_in_, g_in_, f_done_, i_done_;
  std::vector<std::uint8_t> state_;
  std::vector<double> rank_free_, send_free_, recv_free_, cur_mem_;
  std::vector<std::size_t> next_;
  std::vector<std::uint8_t> busy_;
  std::vector<std::uint32_t> cycle_left_;
  std::vector<double> cycle_end_;
  std::vector<double> left_;     ///< per rank: work not started yet (early exit)
  std::vector<double> pending_;  ///< per rank: end of the running op, infinity when idle
  std::vector<std::size_t> fpos_, bpos_;  ///< slices: per (mb, v) the position of F and of B/I in its rank's order
  SimResult scratch_;
};

/// Simulates `order` and returns the Schedule (name, ops with times, makespan, bubble, peaks,
/// utilisation); `mb_order` is recorded as Schedule::order. For a `name` of a schedule kind whose
/// factor f is not 1, every op starts at f x its simulated start and keeps its duration (the
/// schedule's own cost is waiting), and the makespan, bubble and utilisation follow. Throws as
/// Simulator::run.
pl::Schedule simulate(const SimProblem& problem, RankOrder order, const std::string& name,
                  const std::vector<std::uint32_t>& mb_order);

/// Lower bounds on any schedule's makespan: the busiest rank's total compute; the longest single
/// micro-batch critical path (every F, then every backward, plus transfers); and each rank as one
/// machine whose ops cannot start before their inputs can arrive (F of (mb, v) after the forwards
/// and transfers of stages before v; its backward after the whole forward and the input-gradient
/// chain back from the last stage): max over release times t of t + the work released at or after
/// t (which subsumes the rank's total, at t = 0, and adds the pipeline's fill). They hold for
/// every kind, split backward or not, with slices, and for a kind's stretched schedule (its
/// factor is at least 1).
struct MakespanBounds {
  double rank_work_ms = 0;
  double critical_path_ms = 0;
  double release_ms = 0;
  /// The three together: what the planner prunes candidates with.
  double value() const { return search_stop_ms() > release_ms ? search_stop_ms() : release_ms; }
  /// The first two: where the schedule search stops (a schedule that reaches the release bound is
  /// optimal too, but stopping there would keep it over one of equal makespan that the search
  /// finds later, which is the plan the search returned before the bound existed).
  double search_stop_ms() const { return rank_work_ms > critical_path_ms ? rank_work_ms : critical_path_ms; }
};
MakespanBounds makespan_lower_bounds(const SimProblem& problem);

}  // namespace packpipe::schedule
