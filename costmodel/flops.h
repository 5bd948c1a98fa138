// Floating-point operations of transformer layers: the shape math both the analytic model and the
// profile interpolation (efficiency = time / FLOPs) rest on. Counts are multiply-adds x 2, for the
// whole layer across tensor-parallel ranks (divide by tp for one GPU); attention is counted
// dense (full s x s scores, as Megatron computes them).
#pragma once

#include <cstdint>

#include "costmodel/model.h"

namespace packpipe::costmodel {

/// Which part of the model a cost refers to.
enum class LayerKind {
  Embedding,    ///< token (+ position) embedding of the first stage
  Encoder,      ///< a GPT/Llama layer, or a T5 encoder layer
  Decoder,      ///< a T5 decoder layer (self- and cross-attention)
  PostProcess,  ///< final norm, LM head and loss of the last stage
};
/// "embedding", "encoder", "decoder", "postprocess".
const char* layer_kind_name(LayerKind k);
/// LayerKind from its name; throws InvalidArgument.
LayerKind layer_kind_from_name(const std::string& name);

/// Forward FLOPs of one layer, split into dense matrix products and the quadratic attention part.
struct LayerFlops {
  double matmul = 0;     ///< GEMMs with weights (QKV, output projection, MLP, LM head)
  double attention = 0;  ///< score and context products (QK^T, AV), quadratic in sequence length
  double total() const { return matmul + attention; }
};

/// Forward FLOPs of one layer of `kind` for `mbs` samples of `seq` tokens (encoder side) and
/// `dec_seq` decoder tokens (encoder-decoder only; 0 otherwise). PostProcess of an
/// encoder-decoder model runs on dec_seq tokens. Throws InvalidArgument for non-positive sizes.
LayerFlops forward_flops(const ModelSpec& m, LayerKind kind, std::int64_t mbs, std::int64_t seq,
                         std::int64_t dec_seq = 0);

/// Model FLOPs of one training iteration (forward + backward = 3 x forward, no recompute) over
/// `tokens_enc` x `seq` shapes summed by the caller; convenience for MFU: 3 x forward_flops sums.
double training_flops(const ModelSpec& m, std::int64_t mbs, std::int64_t seq, std::int64_t dec_seq = 0);

}  // namespace packpipe::costmodel
