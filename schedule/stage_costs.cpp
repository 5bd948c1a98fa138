#include "schedule/stage_costs.h"

#include "common/errors.h"

namespace packpipe::schedule {

namespace part = ::packpipe::partition;

StageCostTable stage_cost_table(const cm::CostModel& cost, const part::PipelineShape& shape,
                                const std::vector<part::VirtualStage>& vstages, const std::vector<part::MicroBatch>& mbs) {
  const cm::ModelSpec& model = cost.model();
  StageCostTable t;
  t.microbatches = static_cast<std::int64_t>(mbs.size());
  t.vstages = static_cast<std::int64_t>(vstages.size());
  const std::size_t n = mbs.size() * vstages.size();
  t.forward_ms.resize(n);
  t.backward_ms.resize(n);
  t.backward_weight_ms.resize(n);
  t.stored_bytes.resize(n);
  t.peak_bytes.resize(n);
  t.send_bytes.resize(n);
  t.static_bytes.assign(static_cast<std::size_t>(shape.stages), 0.0);
  for (const auto& vs : vstages) {
    t.static_bytes[static_cast<std::size_t>(vs.rank)] +=
        cm::stage_static_memory(model, vs.layout, shape.tp, shape.dp, shape.zero_stage).total();
  }
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    const part::MicroBatch& mb = mbs[m];
    PACKPIPE_CHECK_ARG(mb.rows() > 0 && mb.padded_len > 0, "micro-batch {} is empty (rows {}, padded length {})", m,
                       mb.rows(), mb.padded_len);
    for (const auto& vs : vstages) {
      const cm::LayerCost c = cm::stage_cost(cost, vs.layout, shape.tp, mb.rows(), mb.padded_len,
                                             mb.padded_dec_len, mb.recompute);
      // Weight gradients redo the dense GEMMs once (dW = x^T dy); input gradients the GEMMs once
      // more plus twice the attention products, so the weight share of backward is
      // matmul / (2 (matmul + attention)) of the stage's forward FLOPs.
      double matmul = 0, attention = 0;
      auto add = [&](cm::LayerKind kind, std::int64_t layers) {
        if (layers <= 0) return;
        const auto f = cm::forward_flops(model, kind, mb.rows(), mb.padded_len, mb.padded_dec_len);
        matmul += static_cast<double>(layers) * f.matmul;
        attention += static_cast<double>(layers) * f.attention;
      };
      add(cm::LayerKind::Encoder, vs.layout.encoder_layers);
      add(cm::LayerKind::Decoder, vs.layout.decoder_layers);
      if (vs.layout.has_postprocess) add(cm::LayerKind::PostProcess, 1);
      const double w_share = matmul + attention > 0 ? matmul / (2.0 * (matmul + attention)) : 0.0;
      const std::size_t i = t.at(static_cast<std::int64_t>(m), vs.index);
      t.forward_ms[i] = c.forward_ms;
      t.backward_ms[i] = c.backward_ms + c.recompute_ms;
      t.backward_weight_ms[i] = c.backward_ms * w_share;
      t.stored_bytes[i] = c.stored_bytes;
      t.peak_bytes[i] = c.peak_bytes;
      t.send_bytes[i] = c.boundary_bytes;
    }
  }
  return t;
}

}  // namespace packpipe::schedule
