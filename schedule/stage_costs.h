// The per-(micro-batch, virtual stage) costs a schedule is simulated with, from the cost model.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "costmodel/cost_model.h"
#include "partition/pipeline.h"
#include "plan/timeline.h"

namespace packpipe::schedule {

namespace cm = ::packpipe::costmodel;
namespace part = ::packpipe::partition;
namespace pl = ::packpipe::plan;

/// Costs of every (micro-batch, virtual stage) for the simulator, row-major [mb * vstages + v].
struct StageCostTable {
  std::int64_t microbatches = 0;
  std::int64_t vstages = 0;
  std::vector<double> forward_ms;
  std::vector<double> backward_ms;         ///< input and weight gradients plus recompute
  std::vector<double> backward_weight_ms;  ///< the weight-gradient share of backward_ms (deferrable)
  /// The input-gradient half of each entry when it is not backward minus weight (a calibrated cost
  /// model fits the halves on their own: costmodel/calibration.h); empty: backward - weight.
  std::vector<double> backward_input_ms;
  std::vector<double> stored_bytes;        ///< activations kept from forward to backward
  std::vector<double> peak_bytes;          ///< transient peak while the stage runs
  std::vector<double> send_bytes;          ///< activation bytes sent to the next virtual stage
  std::vector<double> static_bytes;        ///< per rank: parameters, gradients, optimizer state
  std::size_t at(std::int64_t mb, std::int64_t v) const { return static_cast<std::size_t>(mb * vstages + v); }
  /// Duration of one compute op of entry i = at(mb, v): forward, full backward, its input-gradient
  /// half (backward minus the weight share) or its weight-gradient half. The one arithmetic of op
  /// times: the simulator, the schedule builders, the search and the lower bounds time ops with it
  /// (the plan's timeline, which the replay follows, is the simulator's).
  double op_ms(pl::OpKind kind, std::size_t i) const {
    switch (kind) {
      case pl::OpKind::Forward: return forward_ms[i];
      case pl::OpKind::Backward: return backward_ms[i];
      case pl::OpKind::BackwardInput:
        return backward_input_ms.empty() ? backward_ms[i] - backward_weight_ms[i] : backward_input_ms[i];
      case pl::OpKind::BackwardWeight: return backward_weight_ms[i];
    }
    return 0;
  }
  /// The least time any schedule spends on entry i's backward: B whole, or I then W split (the
  /// lesser, when a calibrated table fits the halves apart). The lower bounds' backward work.
  double least_backward_ms(std::size_t i) const {
    if (backward_input_ms.empty()) return backward_ms[i];
    const double split = backward_input_ms[i] + backward_weight_ms[i];
    return split < backward_ms[i] ? split : backward_ms[i];
  }
  /// The least time from the start of entry i's backward until its input gradient is out: I split,
  /// B whole (the lesser, when calibrated). The lower bounds' gradient chain.
  double least_input_ms(std::size_t i) const {
    const double input = op_ms(pl::OpKind::BackwardInput, i);
    return input < backward_ms[i] ? input : backward_ms[i];
  }
  /// What follows least_input_ms in least_backward_ms: W uncalibrated (the two sum to B).
  double least_weight_ms(std::size_t i) const {
    return backward_input_ms.empty() ? backward_weight_ms[i] : least_backward_ms(i) - least_input_ms(i);
  }
};

/// Queries the cost model for every (micro-batch, virtual stage): each micro-batch's shape
/// (MicroBatch::shape: rows x padded lengths, varlen sums for the packed layout) under its
/// recompute mode. The op times are costmodel::stage_op_times': the
/// weight-gradient share is the dense-GEMM part of the backward FLOPs (weights' gradients), the
/// rest (input gradients, attention, recompute) must run before the previous stage can continue;
/// a calibrated cost model's times are calibrated (and backward_input_ms is filled).
StageCostTable stage_cost_table(const cm::CostModel& cost, const part::PipelineShape& shape,
                                const std::vector<part::VirtualStage>& vstages, const std::vector<part::MicroBatch>& mbs);

/// stage_cost_table, or nullopt as soon as the entries built so far make some rank's forward plus
/// least backward work (least_backward_ms) reach `stop_at_ms`: the rank work of
/// makespan_lower_bounds, summed in its order, so the whole table's lower bound would reach it too
/// (a pruned candidate costs only a prefix).
std::optional<StageCostTable> stage_cost_table_below(const cm::CostModel& cost, const part::PipelineShape& shape,
                                                     const std::vector<part::VirtualStage>& vstages,
                                                     const std::vector<part::MicroBatch>& mbs, double stop_at_ms);

/// An empty table of `microbatches` x `vstages` entries and `ranks` static figures (all zero),
/// with backward_input_ms sized when `cost` is calibrated; set_stage_cost fills the entries.
StageCostTable empty_stage_cost_table(const cm::CostModel& cost, std::int64_t microbatches, std::int64_t vstages,
                                      std::int64_t ranks);
/// Entry `i` of `t` for one micro-batch shape on a stage of `layout`: the arithmetic of
/// stage_cost_table (which calls it), for tables built from other sources (measurements).
/// Throws as costmodel::stage_cost.
void set_stage_cost(StageCostTable& t, std::size_t i, const cm::CostModel& cost, const cm::StageLayout& layout,
                    std::int64_t tp, const cm::MicroShape& shape, cm::Recompute rc);

}  // namespace packpipe::schedule
