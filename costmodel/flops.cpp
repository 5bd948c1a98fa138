#include "costmodel/flops.h"

#include "common/errors.h"

namespace packpipe::costmodel {

namespace detail {

void refuse_flops(const ModelSpec& m, LayerKind kind, std::int64_t mbs, std::int64_t seq, std::int64_t dec_seq) {
  PACKPIPE_CHECK_ARG(mbs > 0, "micro-batch size must be positive, found {}", mbs);
  const bool enc_dec = m.arch == Architecture::EncoderDecoder;
  switch (kind) {
    case LayerKind::Embedding:
    case LayerKind::Encoder:
      PACKPIPE_CHECK_ARG(seq > 0, "sequence length must be positive, found {}", seq);
      break;
    case LayerKind::Decoder:
      PACKPIPE_CHECK_ARG(enc_dec, "model '{}' is decoder-only: it has no decoder layers with cross-attention", m.name);
      PACKPIPE_CHECK_ARG(seq > 0 && dec_seq > 0, "encoder and decoder lengths must be positive, found {} and {}",
                         seq, dec_seq);
      break;
    case LayerKind::PostProcess: {
      const std::int64_t t = enc_dec ? dec_seq : seq;
      PACKPIPE_CHECK_ARG(t > 0, "{} length must be positive, found {}", enc_dec ? "decoder" : "sequence", t);
      break;
    }
  }
  PACKPIPE_THROW(InvalidArgument, "forward FLOPs of {} (mbs {}, seq {}, dec_seq {}) refused without a reason",
                 layer_kind_name(kind), mbs, seq, dec_seq);
}

}  // namespace detail

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
