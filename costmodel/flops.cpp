#include "costmodel/flops.h"

#include "common/errors.h"

namespace packpipe::costmodel {

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::Embedding: return "embedding";
    case LayerKind::Encoder: return "encoder";
    case LayerKind::Decoder: return "decoder";
    case LayerKind::PostProcess: return "postprocess";
  }
  return "?";
}

LayerKind layer_kind_from_name(const std::string& name) {
  for (auto k : {LayerKind::Embedding, LayerKind::Encoder, LayerKind::Decoder, LayerKind::PostProcess}) {
    if (name == layer_kind_name(k)) return k;
  }
  PACKPIPE_THROW(InvalidArgument, "unknown layer kind '{}' (expected embedding, encoder, decoder, postprocess)", name);
}

FlopsShape flops_shape(const ModelSpec& m, LayerKind kind, std::int64_t seq, std::int64_t dec_seq) {
  const bool enc_dec = m.arch == Architecture::EncoderDecoder;
  const double h = static_cast<double>(m.hidden);
  const double q = static_cast<double>(m.heads * m.head_dim);
  const double kv = static_cast<double>(m.kv_heads * m.head_dim);
  const double mlp = (m.gated_mlp ? 3.0 : 2.0) * h * static_cast<double>(m.ffn_hidden);
  FlopsShape f;
  f.kind = kind;
  f.h = h;
  f.q = q;
  // The per-row formulas are in FlopsShape::at; the factors kept here are the parenthesized
  // sub-expressions of forward_flops' formulas, so that at(b) rounds exactly as they do (tested).
  switch (kind) {
    case LayerKind::Embedding:
      PACKPIPE_CHECK_ARG(seq > 0, "sequence length must be positive, found {}", seq);
      break;  // a gather, no multiply-adds
    case LayerKind::Encoder: {
      PACKPIPE_CHECK_ARG(seq > 0, "sequence length must be positive, found {}", seq);
      f.s = static_cast<double>(seq);
      f.tok = h * (q + 2 * kv) + q * h + mlp;  // f.matmul = 2 b s (h (q + 2 kv) + q h + mlp)
      break;                                     // f.attention = 2 2 b s s q
    }
    case LayerKind::Decoder: {
      PACKPIPE_CHECK_ARG(enc_dec, "model '{}' is decoder-only: it has no decoder layers with cross-attention", m.name);
      PACKPIPE_CHECK_ARG(seq > 0 && dec_seq > 0, "encoder and decoder lengths must be positive, found {} and {}",
                         seq, dec_seq);
      const double s = static_cast<double>(seq), d = static_cast<double>(dec_seq);
      f.s = s;
      f.d = d;
      // self-attention on d tokens, cross-attention (queries from d, keys/values from s), MLP on d:
      // f.matmul = 2 b d (h (q + 2 kv) + q h) + 2 b (d (h q + q h) + s h 2 kv) + 2 b d mlp
      f.tok = h * (q + 2 * kv) + q * h;
      f.cross = d * (h * q + q * h) + s * h * 2 * kv;
      f.mlp = mlp;
      break;  // f.attention = 2 2 b d d q + 2 2 b d s q
    }
    case LayerKind::PostProcess: {
      const std::int64_t t = enc_dec ? dec_seq : seq;
      PACKPIPE_CHECK_ARG(t > 0, "{} length must be positive, found {}", enc_dec ? "decoder" : "sequence", t);
      f.post_len = static_cast<double>(t);  // f.matmul = 2 b t h vocab
      f.vocab = static_cast<double>(m.vocab);
      break;
    }
  }
  return f;
}

LayerFlops forward_flops(const ModelSpec& m, LayerKind kind, std::int64_t mbs, std::int64_t seq,
                         std::int64_t dec_seq) {
  PACKPIPE_CHECK_ARG(mbs > 0, "micro-batch size must be positive, found {}", mbs);
  const bool enc_dec = m.arch == Architecture::EncoderDecoder;
  const double b = static_cast<double>(mbs);
  const double h = static_cast<double>(m.hidden);
  const double q = static_cast<double>(m.heads * m.head_dim);
  const double kv = static_cast<double>(m.kv_heads * m.head_dim);
  const double mlp = (m.gated_mlp ? 3.0 : 2.0) * h * static_cast<double>(m.ffn_hidden);
  LayerFlops f;
  switch (kind) {
    case LayerKind::Embedding:
      PACKPIPE_CHECK_ARG(seq > 0, "sequence length must be positive, found {}", seq);
      f.matmul = 0;  // a gather, no multiply-adds
      break;
    case LayerKind::Encoder: {
      PACKPIPE_CHECK_ARG(seq > 0, "sequence length must be positive, found {}", seq);
      const double s = static_cast<double>(seq);
      f.matmul = 2.0 * b * s * (h * (q + 2 * kv) + q * h + mlp);
      f.attention = 2.0 * 2.0 * b * s * s * q;
      break;
    }
    case LayerKind::Decoder: {
      PACKPIPE_CHECK_ARG(enc_dec, "model '{}' is decoder-only: it has no decoder layers with cross-attention", m.name);
      PACKPIPE_CHECK_ARG(seq > 0 && dec_seq > 0, "encoder and decoder lengths must be positive, found {} and {}",
                         seq, dec_seq);
      const double s = static_cast<double>(seq), d = static_cast<double>(dec_seq);
      // self-attention on d tokens, cross-attention (queries from d, keys/values from s), MLP on d.
      f.matmul = 2.0 * b * d * (h * (q + 2 * kv) + q * h) + 2.0 * b * (d * (h * q + q * h) + s * h * 2 * kv) +
                 2.0 * b * d * mlp;
      f.attention = 2.0 * 2.0 * b * d * d * q + 2.0 * 2.0 * b * d * s * q;
      break;
    }
    case LayerKind::PostProcess: {
      const std::int64_t t = enc_dec ? dec_seq : seq;
      PACKPIPE_CHECK_ARG(t > 0, "{} length must be positive, found {}", enc_dec ? "decoder" : "sequence", t);
      f.matmul = 2.0 * b * static_cast<double>(t) * h * static_cast<double>(m.vocab);
      break;
    }
  }
  return f;
}

double training_flops(const ModelSpec& m, std::int64_t mbs, std::int64_t seq, std::int64_t dec_seq) {
  double fwd = 0;
  if (m.arch == Architecture::DecoderOnly) {
    fwd = static_cast<double>(m.num_layers) * forward_flops(m, LayerKind::Encoder, mbs, seq).total() +
          forward_flops(m, LayerKind::PostProcess, mbs, seq).total();
  } else {
    fwd = static_cast<double>(m.encoder_layers) * forward_flops(m, LayerKind::Encoder, mbs, seq).total() +
          static_cast<double>(m.decoder_layers) * forward_flops(m, LayerKind::Decoder, mbs, seq, dec_seq).total() +
          forward_flops(m, LayerKind::PostProcess, mbs, seq, dec_seq).total();
  }
  return 3.0 * fwd;
}

}  // namespace packpipe::costmodel
