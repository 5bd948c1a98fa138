// Durations of the compute ops of one micro-batch on one pipeline stage: forward, full backward
// and its input- and weight-gradient halves. The one arithmetic of op times: the schedule's cost
// table, the partitioner's stage times (partition/coster.cpp), layer balancing, calibration fits
// and measurement validation all form op times here, so a calibrated cost model changes every
// path at once (docs/design/013-calibration.md).
#pragma once

#include <cstdint>

#include "costmodel/cost_model.h"

namespace packpipe::costmodel {

/// Durations of a stage's compute ops for one micro-batch, ms.
struct StageOpTimes {
  double forward_ms = 0;
  double backward_ms = 0;         ///< full backward: input and weight gradients plus recompute
  double backward_input_ms = 0;   ///< the input-gradient half (BWD_I): before calibration, backward minus weight
  double backward_weight_ms = 0;  ///< the weight-gradient half (BWD_W), at most backward_ms
};

/// Weight-gradient share of a stage's backward (without recompute): weight gradients redo the
/// dense GEMMs once (dW = x^T dy), input gradients the GEMMs once more plus twice the attention
/// products, so the share is matmul / (2 (matmul + attention)) of the stage's forward FLOPs
/// (0 for a stage without GEMMs). Pure arithmetic; no checks beyond forward_flops'.
double weight_gradient_share(const ModelSpec& m, const StageLayout& layout, const MicroShape& shape);

/// Tokens of a micro-batch shape, the coordinate of calibration regions: rows x (seq + dec_seq),
/// dec_seq counted for encoder-decoder models only (what stage_cost queries).
double shape_tokens(const ModelSpec& m, const MicroShape& shape);

/// The op times of a stage from stage_cost's answer `stage` for that shape (forward; backward +
/// recompute; weight share x backward; the rest is the input half), calibrated when
/// cm.calibration() is set (Calibration::apply). Thread-safe; no allocation.
StageOpTimes stage_op_times(const CostModel& cm, const LayerCost& stage, const StageLayout& layout,
                            const MicroShape& shape);
/// stage_op_times of stage_cost(cm, layout, tp, shape, rc). Throws as stage_cost.
StageOpTimes stage_op_times(const CostModel& cm, const StageLayout& layout, std::int64_t tp, const MicroShape& shape,
                            Recompute rc);

/// Forward plus full backward of a stage (the partitioner's and layer balancing's stage time):
/// stage.total_ms() plus stage_time_delta_ms: bit for bit as before calibration existed for an
/// uncalibrated model or an identity calibration.
double stage_time_ms(const CostModel& cm, const LayerCost& stage, double tokens);
/// What calibration adds to a stage's forward plus full backward at `tokens` (shape_tokens): the
/// calibrated forward + backward minus the base's; exactly 0 for an uncalibrated model and for an
/// identity calibration (so sums of base times plus it keep their bits).
double stage_time_delta_ms(const CostModel& cm, const LayerCost& stage, double tokens);

}  // namespace packpipe::costmodel
