#include "scheduler/pipeline.h"

#include <algorithm>

#include "common/errors.h"

namespace packpipe::scheduler {

const char* op_kind_token(OpKind k) {
  switch (k) {
    case OpKind::Forward: return "F";
    case OpKind::Backward: return "B";
    case OpKind::BackwardInput: return "I";
    case OpKind::BackwardWeight: return "W";
  }
  return "?";
}

std::vector<VirtualStage> virtual_stages(const cm::ModelSpec& model, const PipelineShape& shape) {
  PACKPIPE_CHECK_ARG(shape.stages >= 1, "stages must be at least 1, found {}", shape.stages);
  PACKPIPE_CHECK_ARG(shape.chunks >= 1, "chunks must be at least 1, found {}", shape.chunks);
  PACKPIPE_CHECK_ARG(shape.tp >= 1 && shape.dp >= 1, "tp and dp must be at least 1, found {} and {}", shape.tp,
                     shape.dp);
  const std::int64_t V = shape.vstages();
  std::vector<VirtualStage> out(static_cast<std::size_t>(V));
  for (std::int64_t v = 0; v < V; ++v) {
    out[v].index = v;
    out[v].rank = v % shape.stages;
  }
  if (model.arch == cm::Architecture::DecoderOnly) {
    const std::int64_t per = shape.layers_per_stage > 0 ? shape.layers_per_stage : model.num_layers / V;
    PACKPIPE_CHECK_ARG(per >= 1 && (shape.layers_per_stage > 0 || model.num_layers % V == 0),
                       "{} layers of '{}' do not divide into {} virtual stages (stages {} x chunks {}); "
                       "pass layers_per_stage",
                       model.num_layers, model.name, V, shape.stages, shape.chunks);
    for (auto& vs : out) vs.layout.encoder_layers = per;
  } else if (V == 1) {
    out[0].layout.encoder_layers = shape.layers_per_stage > 0 ? shape.layers_per_stage : model.encoder_layers;
    out[0].layout.decoder_layers = shape.layers_per_stage > 0 ? shape.layers_per_stage : model.decoder_layers;
  } else {
    PACKPIPE_CHECK_ARG(V % 2 == 0, "encoder-decoder model '{}' needs an even number of virtual stages, found {}",
                       model.name, V);
    const std::int64_t half = V / 2;
    const std::int64_t enc = shape.layers_per_stage > 0 ? shape.layers_per_stage : model.encoder_layers / half;
    const std::int64_t dec = shape.layers_per_stage > 0 ? shape.layers_per_stage : model.decoder_layers / half;
    PACKPIPE_CHECK_ARG(enc >= 1 && dec >= 1 &&
                           (shape.layers_per_stage > 0 ||
                            (model.encoder_layers % half == 0 && model.decoder_layers % half == 0)),
                       "{} encoder and {} decoder layers of '{}' do not divide into {} stages each; pass "
                       "layers_per_stage",
                       model.encoder_layers, model.decoder_layers, model.name, half);
    for (std::int64_t v = 0; v < V; ++v) {
      if (v < half) {
        out[v].layout.encoder_layers = enc;
      } else {
        out[v].layout.decoder_layers = dec;
      }
    }
  }
  out.front().layout.has_embedding = true;
  out.back().layout.has_postprocess = true;
  return out;
}

StageCostTable stage_cost_table(const cm::CostModel& cost, const PipelineShape& shape,
                                const std::vector<VirtualStage>& vstages, const std::vector<MicroBatch>& mbs) {
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
    const MicroBatch& mb = mbs[m];
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

}  // namespace packpipe::scheduler
