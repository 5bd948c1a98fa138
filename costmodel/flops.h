// Floating-point operations of transformer layers: the shape math both the analytic model and the
// profile interpolation (efficiency = time / FLOPs) rest on. Counts are multiply-adds x 2, for the
// whole layer across tensor-parallel ranks (divide by tp for one GPU); attention is counted
// dense (full s x s scores, as Megatron computes them).
#pragma once

#include <cstdint>
#include <string>

#include "common/enum_names.h"
#include "costmodel/model.h"

namespace packpipe::costmodel {

/// Which part of the model a cost refers to.
enum class LayerKind {
  Embedding,    ///< token (+ position) embedding of the first stage
  Encoder,      ///< a GPT/Llama layer, or a T5 encoder layer
  Decoder,      ///< a T5 decoder layer (self- and cross-attention)
  PostProcess,  ///< final norm, LM head and loss of the last stage
};
/// The one name table: "embedding", "encoder", "decoder", "postprocess".
inline constexpr EnumName<LayerKind> kLayerKindNames[] = {{LayerKind::Embedding, "embedding"},
                                                          {LayerKind::Encoder, "encoder"},
                                                          {LayerKind::Decoder, "decoder"},
                                                          {LayerKind::PostProcess, "postprocess"}};
/// The kind's name in kLayerKindNames.
constexpr const char* layer_kind_name(LayerKind k) { return enum_name(kLayerKindNames, k); }
/// LayerKind from its name; throws InvalidArgument listing the names.
inline LayerKind layer_kind_from_name(const std::string& name) {
  return enum_from_name(kLayerKindNames, name, "layer kind");
}

/// Attention work of a micro-batch whose rows hold packed samples attended apart (varlen
/// attention: cu_seqlens), as sums over its segments: `self` = sum of l_i^2 over the encoder (or
/// whole-sample) segments, `dec_self` = sum of d_i^2 over the decoder segments, `cross` = sum of
/// d_i x l_i (decoder queries against their own sample's encoder keys). A slice of a sample (its
/// tokens after p_i kept tokens of the same sample, docs/design/015-long-context.md) also attends
/// to those p_i keys: `prefix` = sum of l_i x p_i and `prefix_tokens` = sum of p_i over the row's
/// slices (0 without slices). All zero: dense attention over every row, as padded rows and rows
/// packed under a block mask run it (mbs x seq^2, mbs x dec_seq^2 and mbs x dec_seq x seq).
/// Nonzero: seq and dec_seq are the rows' tokens.
struct AttentionWork {
  std::int64_t self = 0;
  std::int64_t dec_self = 0;
  std::int64_t cross = 0;
  std::int64_t prefix = 0;
  std::int64_t prefix_tokens = 0;
  /// Whether any sum is set (the micro-batch is packed with varlen attention).
  bool varlen() const { return self != 0 || dec_self != 0 || cross != 0 || prefix != 0 || prefix_tokens != 0; }
  /// Adds one packed sample of `seq` encoder (or whole-sample) tokens and `dec` decoder tokens.
  void add(std::int64_t seq, std::int64_t dec) {
    self += seq * seq;
    dec_self += dec * dec;
    cross += dec * seq;
  }
  /// Adds one slice of `len` tokens after `kept` tokens of its sample (decoder-only).
  void add_slice(std::int64_t len, std::int64_t kept) {
    self += len * len;
    prefix += len * kept;
    prefix_tokens += kept;
  }
  bool operator==(const AttentionWork& o) const {
    return self == o.self && dec_self == o.dec_self && cross == o.cross && prefix == o.prefix &&
           prefix_tokens == o.prefix_tokens;
  }
  bool operator!=(const AttentionWork& o) const { return !(*this == o); }
};

/// A micro-batch's shape as every cost function takes it: `rows` rows of `seq` tokens (`dec_seq`
/// decoder tokens) and, for varlen rows, their attention sums.
struct MicroShape {
  std::int64_t rows = 1;
  std::int64_t seq = 0;
  std::int64_t dec_seq = 0;
  AttentionWork attention;
};

/// Forward FLOPs of one layer, split into dense matrix products and the quadratic attention part.
struct LayerFlops {
  double matmul = 0;     ///< GEMMs with weights (QKV, output projection, MLP, LM head)
  double attention = 0;  ///< score and context products (QK^T, AV), quadratic in sequence length
  double total() const { return matmul + attention; }
};

/// forward_flops of one layer kind and shape with the micro-batch size left open, for batch
/// queries over consecutive sizes: everything that does not depend on mbs is computed once.
/// forward_flops(m, kind, b, seq, dec_seq) is flops_shape(m, kind, seq, dec_seq).at(b).
struct FlopsShape {
  LayerKind kind = LayerKind::Embedding;
  double s = 0, d = 0, h = 0, q = 0, vocab = 0;
  double tok = 0;       ///< per-token GEMM terms (encoder; decoder self-attention)
  double cross = 0;     ///< decoder: cross-attention GEMM terms of one sample
  double mlp = 0;       ///< decoder: MLP GEMM terms of one token
  double post_len = 0;  ///< post-process: tokens per sample
  /// FLOPs of `b` dense rows (a positive micro-batch size as a double); no checks, no allocation.
  LayerFlops at(double b) const {
    LayerFlops f;
    switch (kind) {
      case LayerKind::Embedding: break;  // a gather, no multiply-adds
      case LayerKind::Encoder:
        f.matmul = 2.0 * b * s * tok;
        f.attention = 2.0 * 2.0 * b * s * s * q;
        break;
      case LayerKind::Decoder:
        f.matmul = 2.0 * b * d * tok + 2.0 * b * cross + 2.0 * b * d * mlp;
        f.attention = 2.0 * 2.0 * b * d * d * q + 2.0 * 2.0 * b * d * s * q;
        break;
      case LayerKind::PostProcess: f.matmul = 2.0 * b * post_len * h * vocab; break;
    }
    return f;
  }
  /// FLOPs of `b` rows whose attention is `w` (at(b) when w is not varlen): the GEMMs read the
  /// tokens, the attention products the sums of w instead of the dense rows' squares; a slice counts
  /// l^2 + 2 l p, its share of its sample's square, so a sliced sample's model FLOPs are the whole
  /// one's (the kernel's executed work: executed_attention_flops).
  LayerFlops at(double b, const AttentionWork& w) const {
    LayerFlops f = at(b);
    if (!w.varlen()) return f;
    switch (kind) {
      case LayerKind::Encoder:
        f.attention = 2.0 * 2.0 * (static_cast<double>(w.self) + 2.0 * static_cast<double>(w.prefix)) * q;
        break;
      case LayerKind::Decoder:
        f.attention = 2.0 * 2.0 * static_cast<double>(w.dec_self) * q + 2.0 * 2.0 * static_cast<double>(w.cross) * q;
        break;
      default: break;
    }
    return f;
  }
};

namespace detail {

/// Whether forward_flops accepts the lengths of (kind, seq, dec_seq).
inline bool flops_lengths_ok(const ModelSpec& m, LayerKind kind, std::int64_t seq, std::int64_t dec_seq) {
  const bool enc_dec = m.arch == Architecture::EncoderDecoder;
  switch (kind) {
    case LayerKind::Embedding:
    case LayerKind::Encoder: return seq > 0;
    case LayerKind::Decoder: return enc_dec && seq > 0 && dec_seq > 0;
    case LayerKind::PostProcess: return (enc_dec ? dec_seq : seq) > 0;
  }
  return true;
}

/// Throws the InvalidArgument forward_flops throws for arguments it refuses (out of line).
[[noreturn]] void refuse_flops(const ModelSpec& m, LayerKind kind, std::int64_t mbs, std::int64_t seq,
                               std::int64_t dec_seq);

/// The FlopsShape of lengths flops_lengths_ok accepts.
inline FlopsShape flops_shape_unchecked(const ModelSpec& m, LayerKind kind, std::int64_t seq, std::int64_t dec_seq) {
  const bool enc_dec = m.arch == Architecture::EncoderDecoder;
  const double h = static_cast<double>(m.hidden);
  const double q = static_cast<double>(m.heads * m.head_dim);
  const double kv = static_cast<double>(m.kv_heads * m.head_dim);
  const double mlp = (m.gated_mlp ? 3.0 : 2.0) * h * static_cast<double>(m.ffn_hidden);
  FlopsShape f;
  f.kind = kind;
  f.h = h;
  f.q = q;
  switch (kind) {
    case LayerKind::Embedding: break;
    case LayerKind::Encoder:
      // matmul = 2 b s (h (q + 2 kv) + q h + mlp); attention = 2 2 b s s q
      f.s = static_cast<double>(seq);
      f.tok = h * (q + 2 * kv) + q * h + mlp;
      break;
    case LayerKind::Decoder: {
      // self-attention on d tokens, cross-attention (queries from d, keys/values from s), MLP on d:
      // matmul = 2 b d (h (q + 2 kv) + q h) + 2 b (d (h q + q h) + s h 2 kv) + 2 b d mlp;
      // attention = 2 2 b d d q + 2 2 b d s q
      const double s = static_cast<double>(seq), d = static_cast<double>(dec_seq);
      f.s = s;
      f.d = d;
      f.tok = h * (q + 2 * kv) + q * h;
      f.cross = d * (h * q + q * h) + s * h * 2 * kv;
      f.mlp = mlp;
      break;
    }
    case LayerKind::PostProcess:
      // matmul = 2 b t h vocab, t the decoder length of an encoder-decoder model
      f.post_len = static_cast<double>(enc_dec ? dec_seq : seq);
      f.vocab = static_cast<double>(m.vocab);
      break;
  }
  return f;
}

}  // namespace detail

/// The FlopsShape of (kind, seq, dec_seq); throws InvalidArgument as forward_flops does for bad lengths.
inline FlopsShape flops_shape(const ModelSpec& m, LayerKind kind, std::int64_t seq, std::int64_t dec_seq = 0) {
  if (!detail::flops_lengths_ok(m, kind, seq, dec_seq)) detail::refuse_flops(m, kind, 1, seq, dec_seq);
  return detail::flops_shape_unchecked(m, kind, seq, dec_seq);
}

/// Forward FLOPs of one layer of `kind` for `mbs` samples of `seq` tokens (encoder side) and
/// `dec_seq` decoder tokens (encoder-decoder only; 0 otherwise). PostProcess of an
/// encoder-decoder model runs on dec_seq tokens. Throws InvalidArgument for non-positive sizes.
/// Inline: the profiled query evaluates it per row.
inline LayerFlops forward_flops(const ModelSpec& m, LayerKind kind, std::int64_t mbs, std::int64_t seq,
                                std::int64_t dec_seq = 0) {
  if (mbs <= 0 || !detail::flops_lengths_ok(m, kind, seq, dec_seq)) detail::refuse_flops(m, kind, mbs, seq, dec_seq);
  return detail::flops_shape_unchecked(m, kind, seq, dec_seq).at(static_cast<double>(mbs));
}

/// Forward FLOPs of one layer of `kind` for the micro-batch `shape` (varlen attention from its
/// sums); throws as forward_flops.
inline LayerFlops forward_flops(const ModelSpec& m, LayerKind kind, const MicroShape& shape) {
  if (shape.rows <= 0 || !detail::flops_lengths_ok(m, kind, shape.seq, shape.dec_seq)) {
    detail::refuse_flops(m, kind, shape.rows, shape.seq, shape.dec_seq);
  }
  return detail::flops_shape_unchecked(m, kind, shape.seq, shape.dec_seq)
      .at(static_cast<double>(shape.rows), shape.attention);
}

/// Whether layers of `kind` attend causally to themselves: a decoder-only model's layers and a T5
/// decoder's self-attention (not a T5 encoder, nor cross-attention).
inline bool causal_self_attention(const ModelSpec& m, LayerKind kind) {
  return kind == LayerKind::Decoder || (kind == LayerKind::Encoder && m.arch == Architecture::DecoderOnly);
}

/// Forward attention FLOPs (score and context products) the kernel `k` executes for one layer of
/// `b` rows of shape `f` with attention `w` (dense rows when w is not varlen): Eager the whole
/// square (rectangle, for slices: l (l + p)), Flash the causal part of causal self-attention
/// (l^2 / 2 + l p; the masked blocks are skipped) and the whole square otherwise.
inline double executed_attention_flops(const ModelSpec& m, const FlopsShape& f, double b, const AttentionWork& w,
                                       AttentionKernel k) {
  const bool flash = k == AttentionKernel::Flash;
  // Written as FlopsShape::at writes the model FLOPs, so the eager kernel's dense and whole-sample
  // rows give the same bits.
  switch (f.kind) {
    case LayerKind::Encoder: {
      const double half = flash && causal_self_attention(m, f.kind) ? 0.5 : 1.0;
      if (!w.varlen()) return 2.0 * 2.0 * b * f.s * f.s * f.q * half;
      return 2.0 * 2.0 * (static_cast<double>(w.self) * half + static_cast<double>(w.prefix)) * f.q;
    }
    case LayerKind::Decoder: {
      const double half = flash ? 0.5 : 1.0;
      if (!w.varlen()) return 2.0 * 2.0 * b * f.d * f.d * f.q * half + 2.0 * 2.0 * b * f.d * f.s * f.q;
      return 2.0 * 2.0 * static_cast<double>(w.dec_self) * f.q * half + 2.0 * 2.0 * static_cast<double>(w.cross) * f.q;
    }
    default: return 0;
  }
}

/// Model FLOPs of one training iteration (forward + backward = 3 x forward, no recompute) over
/// `tokens_enc` x `seq` shapes summed by the caller; convenience for MFU: 3 x forward_flops sums.
double training_flops(const ModelSpec& m, std::int64_t mbs, std::int64_t seq, std::int64_t dec_seq = 0);

}  // namespace packpipe::costmodel
