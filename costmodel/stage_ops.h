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

/// Forward FLOPs of a stage (its encoder, decoder and post-process layers) for one micro-batch shape:
/// model FLOPs (the dense convention of MFU) without a kernel; with one, the attention products it
/// executes (executed_attention_flops: flash skips the causal half).
LayerFlops stage_forward_flops(const ModelSpec& m, const StageLayout& layout, const MicroShape& shape);
LayerFlops stage_forward_flops(const ModelSpec& m, const StageLayout& layout, const MicroShape& shape,
                               AttentionKernel kernel);

/// The attention share of a stage's executed forward FLOPs under `kernel` for a shape: attention /
/// (matmul + attention), in [0, 1] (0 for a stage without layers). The coordinate of calibration's
/// attention term (013): a packed varlen row has a smaller share than a padded row of the same
/// tokens, and a flash kernel's causal rows half the eager kernel's attention.
double attention_share(const ModelSpec& m, const StageLayout& layout, const MicroShape& shape,
                       AttentionKernel kernel);

/// Tokens of a micro-batch shape, the coordinate of calibration regions: rows x (seq + dec_seq),
/// dec_seq counted for encoder-decoder models only (what stage_cost queries).
double shape_tokens(const ModelSpec& m, const MicroShape& shape);

/// The op times of a stage from stage_cost's answer `stage` for that shape (forward; backward +
/// recompute; the weight-gradient share x backward, that share being matmul / (2 (matmul +
/// attention)) of the stage's forward FLOPs; the rest is the input half), calibrated when
/// cm.calibration() is set (Calibration::apply, with the shape's attention_share). Thread-safe; no
/// allocation.
StageOpTimes stage_op_times(const CostModel& cm, const LayerCost& stage, const StageLayout& layout,
                            const MicroShape& shape);
/// stage_op_times of stage_cost(cm, layout, tp, shape, rc). Throws as stage_cost.
StageOpTimes stage_op_times(const CostModel& cm, const StageLayout& layout, std::int64_t tp, const MicroShape& shape,
                            Recompute rc);

/// Forward plus full backward of a stage (the partitioner's and layer balancing's stage time):
/// stage.total_ms() plus stage_time_delta_ms: bit for bit as before calibration existed for an
/// uncalibrated model or an identity calibration.
/// `share` is the stage's attention_share for the shape.
double stage_time_ms(const CostModel& cm, const LayerCost& stage, double tokens, double share);
/// What calibration adds to a stage's forward plus full backward at `tokens` (shape_tokens) and
/// attention share `share` (attention_share): the calibrated forward + backward minus the base's;
/// exactly 0 for an uncalibrated model and for an identity calibration (so sums of base times plus
/// it keep their bits).
double stage_time_delta_ms(const CostModel& cm, const LayerCost& stage, double tokens, double share);

}  // namespace packpipe::costmodel
