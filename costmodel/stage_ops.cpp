#include "costmodel/stage_ops.h"

#include "costmodel/calibration.h"
#include "costmodel/flops.h"

namespace packpipe::costmodel {

LayerFlops stage_forward_flops(const ModelSpec& m, const StageLayout& layout, const MicroShape& shape) {
  LayerFlops s;
  auto add = [&](LayerKind kind, std::int64_t layers) {
    if (layers <= 0) return;
    const auto f = forward_flops(m, kind, shape);
    s.matmul += static_cast<double>(layers) * f.matmul;
    s.attention += static_cast<double>(layers) * f.attention;
  };
  add(LayerKind::Encoder, layout.encoder_layers);
  add(LayerKind::Decoder, layout.decoder_layers);
  if (layout.has_postprocess) add(LayerKind::PostProcess, 1);
  return s;
}

LayerFlops stage_forward_flops(const ModelSpec& m, const StageLayout& layout, const MicroShape& shape,
                               AttentionKernel kernel) {
  LayerFlops s;
  auto add = [&](LayerKind kind, std::int64_t layers) {
    if (layers <= 0) return;
    const auto f = forward_flops(m, kind, shape);
    const FlopsShape fs = flops_shape(m, kind, shape.seq, shape.dec_seq);
    s.matmul += static_cast<double>(layers) * f.matmul;
    s.attention +=
        static_cast<double>(layers) * executed_attention_flops(m, fs, static_cast<double>(shape.rows), shape.attention, kernel);
  };
  add(LayerKind::Encoder, layout.encoder_layers);
  add(LayerKind::Decoder, layout.decoder_layers);
  if (layout.has_postprocess) add(LayerKind::PostProcess, 1);
  return s;
}

double attention_share(const ModelSpec& m, const StageLayout& layout, const MicroShape& shape, AttentionKernel kernel) {
  const LayerFlops f = stage_forward_flops(m, layout, shape, kernel);
  return f.total() > 0 ? f.attention / f.total() : 0.0;
}

double shape_tokens(const ModelSpec& m, const MicroShape& shape) {
  const std::int64_t dec = m.arch == Architecture::EncoderDecoder ? shape.dec_seq : 0;
  return static_cast<double>(shape.rows) * static_cast<double>(shape.seq + dec);
}

StageOpTimes stage_op_times(const CostModel& cm, const LayerCost& stage, const StageLayout& layout,
                            const MicroShape& shape) {
  // Weight gradients redo the dense GEMMs once (dW = x^T dy); input gradients the GEMMs once
  // more plus twice the attention products, so the weight share of backward is
  // matmul / (2 (matmul + attention)) of the stage's forward FLOPs.
  const LayerFlops f = stage_forward_flops(cm.model(), layout, shape, cm.attention());
  const double w_share = f.total() > 0 ? f.matmul / (2.0 * f.total()) : 0.0;
  StageOpTimes t;
  t.forward_ms = stage.forward_ms;
  t.backward_ms = stage.backward_ms + stage.recompute_ms;
  t.backward_weight_ms = stage.backward_ms * w_share;
  t.backward_input_ms = t.backward_ms - t.backward_weight_ms;
  if (const Calibration* cal = cm.calibration()) {
    return cal->apply(t, shape_tokens(cm.model(), shape), f.total() > 0 ? f.attention / f.total() : 0.0);
  }
  return t;
}

StageOpTimes stage_op_times(const CostModel& cm, const StageLayout& layout, std::int64_t tp, const MicroShape& shape,
                            Recompute rc) {
  return stage_op_times(cm, stage_cost(cm, layout, tp, shape, rc), layout, shape);
}

double stage_time_delta_ms(const CostModel& cm, const LayerCost& stage, double tokens, double share) {
  const Calibration* cal = cm.calibration();
  if (cal == nullptr) return 0;
  const double backward = stage.backward_ms + stage.recompute_ms;
  return cal->stage_ms(tokens, stage.forward_ms, backward, share) - (stage.forward_ms + backward);
}

double stage_time_ms(const CostModel& cm, const LayerCost& stage, double tokens, double share) {
  return stage.total_ms() + stage_time_delta_ms(cm, stage, tokens, share);
}

}  // namespace packpipe::costmodel
