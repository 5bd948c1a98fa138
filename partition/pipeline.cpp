#include "partition/pipeline.h"

#include <algorithm>
#include <cmath>

#include "common/errors.h"

namespace packpipe::partition {

void check_shape(const PipelineShape& shape) {
  auto size = [](const char* field, std::int64_t v) {
    PACKPIPE_CHECK_ARG(v >= 1 && v <= kMaxPipelineSize, "{} must be in [1, {}], found {}", field, kMaxPipelineSize, v);
  };
  size("stages", shape.stages);
  size("chunks", shape.chunks);
  size("dp", shape.dp);
  size("tp", shape.tp);
  PACKPIPE_CHECK_ARG(shape.layers_per_stage >= 0, "layers_per_stage must not be negative (0: the model's layers / "
                     "(stages x chunks)), found {}", shape.layers_per_stage);
  PACKPIPE_CHECK_ARG(shape.zero_stage >= 0 && shape.zero_stage <= 3, "ZeRO stage (zero / --zero) must be 0-3, found {}",
                     shape.zero_stage);
  PACKPIPE_CHECK_ARG(std::isfinite(shape.memory_limit_mb) && shape.memory_limit_mb >= 0 &&
                         shape.memory_limit_mb <= kMaxMemoryLimitMb,
                     "memory limit (memory_mb / --memory-mb) must be in [0, {:g}] MB (0: the device's memory), found "
                     "{} MB",
                     kMaxMemoryLimitMb, shape.memory_limit_mb);
  if (shape.stage_layers.empty()) return;
  PACKPIPE_CHECK_ARG(static_cast<std::int64_t>(shape.stage_layers.size()) == shape.vstages(),
                     "stage_layers (--layer-split) lists {} stages, the pipeline has {} virtual stages (stages {} x "
                     "chunks {})",
                     shape.stage_layers.size(), shape.vstages(), shape.stages, shape.chunks);
  for (std::size_t v = 0; v < shape.stage_layers.size(); ++v) {
    PACKPIPE_CHECK_ARG(shape.stage_layers[v] >= 1 && shape.stage_layers[v] <= kMaxStageLayers,
                       "stage_layers[{}] (--layer-split) must be in [1, {}], found {}", v, kMaxStageLayers,
                       shape.stage_layers[v]);
  }
}

namespace {

// An explicit uneven split (its count and range checked by check_shape): no side more layers than
// the model has.
void apply_stage_layers(const cm::ModelSpec& model, const PipelineShape& shape, std::vector<VirtualStage>& out) {
  const auto V = static_cast<std::int64_t>(out.size());
  PACKPIPE_ASSERT(static_cast<std::int64_t>(shape.stage_layers.size()) == V);
  const bool encdec = model.arch != cm::Architecture::DecoderOnly;
  PACKPIPE_CHECK_ARG(!encdec || V % 2 == 0, "encoder-decoder model '{}' needs an even number of virtual stages for "
                     "stage_layers, found {}", model.name, V);
  const std::int64_t half = encdec ? V / 2 : V;
  std::int64_t enc = 0, dec = 0;
  for (std::int64_t v = 0; v < V; ++v) {
    if (v < half) {
      out[v].layout.encoder_layers = shape.stage_layers[v];
      enc += shape.stage_layers[v];
    } else {
      out[v].layout.decoder_layers = shape.stage_layers[v];
      dec += shape.stage_layers[v];
    }
  }
  const std::int64_t enc_max = encdec ? model.encoder_layers : model.num_layers;
  PACKPIPE_CHECK_ARG(enc <= enc_max && dec <= model.decoder_layers,
                     "stage_layers (--layer-split) place {} {}layers{}, more than the {} of '{}'", enc,
                     encdec ? "encoder " : "", encdec ? fmt::format(" and {} decoder layers", dec) : std::string(),
                     encdec ? fmt::format("{} encoder and {} decoder layers", model.encoder_layers, model.decoder_layers)
                            : fmt::format("{} layers", model.num_layers),
                     model.name);
}

}  // namespace

std::vector<VirtualStage> virtual_stages(const cm::ModelSpec& model, const PipelineShape& shape) {
  check_shape(shape);
  PACKPIPE_CHECK_ARG(model.heads <= 0 || (model.heads % shape.tp == 0 && model.kv_heads % shape.tp == 0),
                     "tp {} must divide the attention heads ({}) and key/value heads ({}) of model '{}'; use a tp "
                     "that divides both",
                     shape.tp, model.heads, model.kv_heads, model.name);
  // The layers first, before anything is sized by stages x chunks: every virtual stage holds at
  // least one layer, and layers_per_stage never asks for more layers than the model has.
  const std::int64_t V = shape.vstages();
  const std::int64_t per_given = shape.layers_per_stage;
  if (model.arch == cm::Architecture::DecoderOnly) {
    PACKPIPE_CHECK_ARG(V <= model.num_layers,
                       "stages {} x chunks {} = {} virtual stages exceed the {} layers of '{}'; every virtual stage "
                       "needs at least one layer",
                       shape.stages, shape.chunks, V, model.num_layers, model.name);
    PACKPIPE_CHECK_ARG(per_given <= model.num_layers / V,
                       "layers_per_stage (--layers-per-stage) {} x {} virtual stages (stages {} x chunks {}) = {} layers, more than the {} "
                       "layers of '{}'; use layers_per_stage at most {} (0: all layers split evenly)",
                       per_given, V, shape.stages, shape.chunks, per_given * V, model.num_layers, model.name,
                       model.num_layers / V);
  } else {
    const std::int64_t half = V == 1 ? 1 : V / 2;
    const std::int64_t fewest = std::min(model.encoder_layers, model.decoder_layers);
    PACKPIPE_CHECK_ARG(half <= fewest,
                       "stages {} x chunks {} = {} virtual stages exceed what the {} encoder and {} decoder layers of "
                       "'{}' can fill (each half of the virtual stages needs one layer per stage)",
                       shape.stages, shape.chunks, V, model.encoder_layers, model.decoder_layers, model.name);
    PACKPIPE_CHECK_ARG(per_given <= fewest / half,
                       "layers_per_stage (--layers-per-stage) {} x {} stages per side = {} layers, more than the {} encoder / {} decoder "
                       "layers of '{}'; use layers_per_stage at most {} (0: all layers split evenly)",
                       per_given, half, per_given * half, model.encoder_layers, model.decoder_layers, model.name,
                       fewest / half);
  }
  std::vector<VirtualStage> out(static_cast<std::size_t>(V));
  for (std::int64_t v = 0; v < V; ++v) {
    out[v].index = v;
    out[v].rank = v % shape.stages;
  }
  if (!shape.stage_layers.empty()) {
    apply_stage_layers(model, shape, out);
  } else if (model.arch == cm::Architecture::DecoderOnly) {
    const std::int64_t per = shape.layers_per_stage > 0 ? shape.layers_per_stage : model.num_layers / V;
    PACKPIPE_CHECK_ARG(per >= 1 && (shape.layers_per_stage > 0 || model.num_layers % V == 0),
                       "{} layers of '{}' do not divide into {} virtual stages (stages {} x chunks {}); "
                       "set layers_per_stage (--layers-per-stage) or an uneven split (stage_layers / --layer-split)",
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
                       "{} encoder and {} decoder layers of '{}' do not divide into {} stages each; set "
                       "layers_per_stage (--layers-per-stage) or an uneven split (stage_layers / --layer-split)",
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

}  // namespace packpipe::partition
