// Private to schedule/: the schedule builders with per-problem precomputation and reusable
// scratch, so the search builds thousands of orders without allocating. build_order() makes a
// throw-away one; the search keeps one per problem.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "schedule/schedules.h"
#include "schedule/simulator.h"

namespace packpipe::schedule::detail {

class OrderBuilder {
 public:
  /// Holds a reference to `problem` (it must outlive the builder). Not thread-safe.
  explicit OrderBuilder(const SimProblem& problem);

  /// As build_order(kind, problem, order, options, out); checks the arguments the same way.
  void build(ScheduleKind kind, const std::vector<std::uint32_t>& order, const ScheduleOptions& options,
             RankOrder& out);

  /// Zero-bubble: builds the order into `out` (unchecked `order`: a permutation) and, since the
  /// greedy is itself an event-driven simulation, also writes each op's start and end, every
  /// rank's peak memory into `peak_bytes` and returns the makespan. Stops early and returns
  /// infinity (leaving `out` partial) once its clock, or a rank's clock plus the work it has not
  /// started, passes `abort_above_ms` or, with
  /// `abort_on_memory` and a limit, a rank's peak passes the limit. When exact_times() these are
  /// bit-identical to Simulator::run on `out` (same event order and arithmetic).
  double zero_bubble(const std::vector<std::uint32_t>& order, const ScheduleOptions& options, RankOrder& out,
                     std::vector<double>& peak_bytes,
                     double abort_above_ms = std::numeric_limits<double>::infinity(), bool abort_on_memory = false);

  /// Every forward, input-gradient and weight-gradient duration is positive: then no two events of
  /// the greedy and of the simulator can tie in a different order, and zero_bubble's times are the
  /// simulator's.
  bool exact_times() const { return exact_; }

 private:
  void check(ScheduleKind kind, const std::vector<std::uint32_t>& order);
  void build_cyclic(const std::vector<std::uint32_t>& order, const ScheduleOptions& opt, RankOrder& out);

  const SimProblem& p_;
  std::int64_t S_, V_, m_, c_;
  bool exact_ = true;
  std::vector<double> mb_stored_;  ///< [mb * S + r]: stored bytes of mb over all chunks of rank r
  std::vector<double> mb_peak_;    ///< [mb * S + r]: largest transient peak of mb on rank r
  std::vector<double> rank_work_;  ///< per rank: every F, I and W duration of its virtual stages
  std::vector<std::uint8_t> seen_;
  // Slices: the backward sequence of the order being built, forward positions, per micro-batch its
  // slice predecessors and successors, and per (mb, v) whether its F / its B (or I) has been emitted.
  std::vector<std::uint32_t> back_;
  std::vector<std::int64_t> pos_;
  std::vector<std::vector<std::uint32_t>> slice_prev_, slice_next_;
  std::vector<std::uint8_t> f_emitted_, b_emitted_;
  std::vector<std::int64_t> open_;  ///< zero-bubble, per rank: slice edges whose prev is admitted there and next is not
  /// Slices: whether F(mb, v) may run (every previous slice's F on v has), and B/I(mb, v) (every
  /// next slice's B/I on v has).
  bool forward_free(std::uint32_t mb, std::int64_t v) const;
  bool backward_free(std::uint32_t mb, std::int64_t v) const;
  void reset_emitted();

  // Cyclic scratch.
  std::vector<std::vector<std::uint32_t>> fq_, bq_;
  struct Produced {
    std::uint8_t backward;
    std::uint32_t pos;
    std::int64_t v;
  };
  std::vector<Produced> produced_;
  std::vector<double> stored_sum_, peak_max_;

  // Zero-bubble scratch.
  struct Cand {
    double arrive;
    std::uint32_t pos;
    std::uint32_t v;
  };
  struct Running {
    pl::OpKind kind;
    std::uint32_t pos, v;
  };
  std::vector<std::vector<Cand>> fcand_, fcand_later_, icand_;  ///< sorted by priority
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> wq_;
  std::vector<std::size_t> whead_;
  std::vector<double> send_free_, recv_free_, mem_, reserved_, max_peak_;
  std::vector<double> left_;  ///< per rank: work not started yet
  std::vector<double> done_at_, decide_at_;  ///< per rank: pending completion, pending decision (inf: none)
  std::vector<std::int64_t> holding_, cap_, w_left_;
  std::vector<std::uint8_t> busy_;
  std::vector<Running> running_;
};

}  // namespace packpipe::schedule::detail
