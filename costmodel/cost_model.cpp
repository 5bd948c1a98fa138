#include "costmodel/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "common/errors.h"

namespace packpipe::costmodel {

StaticMemory static_memory(double params, std::int64_t dp, int zero_stage) {
  PACKPIPE_CHECK_ARG(params >= 0 && std::isfinite(params), "params must be a finite non-negative number, found {}",
                     params);
  PACKPIPE_CHECK_ARG(dp >= 1, "dp (data-parallel size) must be at least 1, found {}", dp);
  PACKPIPE_CHECK_ARG(zero_stage >= 0 && zero_stage <= 3, "ZeRO stage (zero / --zero) must be 0, 1, 2 or 3, found {}",
                     zero_stage);
  const double n = static_cast<double>(dp);
  StaticMemory s;
  s.params_bytes = 2 * params / (zero_stage >= 3 ? n : 1.0);
  s.grads_bytes = 2 * params / (zero_stage >= 2 ? n : 1.0);
  s.optimizer_bytes = 12 * params / (zero_stage >= 1 ? n : 1.0);
  return s;
}

// ---- batch queries ------------------------------------------------------------------------------

void query_limits_failed(const Query& q, std::int64_t mbs) {
  PACKPIPE_CHECK_ARG(mbs <= kMaxQueryMbs, "mbs (micro-batch size) {} is above the limit {}", mbs, kMaxQueryMbs);
  PACKPIPE_CHECK_ARG(q.seq <= kMaxQuerySeq && q.dec_seq <= kMaxQuerySeq,
                     "seq {} / dec_seq {}: a sequence length is above the limit {}", q.seq, q.dec_seq, kMaxQuerySeq);
  PACKPIPE_CHECK_ARG(q.num_layers <= kMaxQueryLayers, "num_layers {} is above the limit {}", q.num_layers,
                     kMaxQueryLayers);
  PACKPIPE_CHECK_ARG(q.tp <= kMaxQueryTp, "tp {} is above the limit {}", q.tp, kMaxQueryTp);
  PACKPIPE_THROW(InvalidArgument, "mbs {} x (seq {} + dec_seq {}) tokens is above the limit {}", mbs, q.seq,
                 q.dec_seq, kMaxQueryTokens);
}

void attention_work_failed(const Query& q) {
  const AttentionWork& a = q.attention;
  PACKPIPE_THROW(InvalidArgument,
                 "attention sums (self {}, dec_self {}, cross {}, prefix {}, prefix_tokens {}) are impossible for {} "
                 "row(s) of {} tokens and {} decoder tokens: each sum lies between the tokens it covers and the dense "
                 "rows' (mbs x seq^2, mbs x dec_seq^2, mbs x dec_seq x seq), the decoder sums are set exactly when "
                 "there are decoder tokens, and the slices' sums are both 0 or 1 <= prefix_tokens <= prefix <= "
                 "tokens x {} (decoder-only rows)",
                 a.self, a.dec_self, a.cross, a.prefix, a.prefix_tokens, q.mbs, q.seq, q.dec_seq, kMaxQuerySeq);
}

void check_query_rows(const Query& q, std::int64_t count, const LayerCost* out) {
  PACKPIPE_CHECK_ARG(count >= 0, "query_rows: count must not be negative, found {}", count);
  PACKPIPE_CHECK_ARG(count == 0 || out != nullptr, "query_rows: out is null for {} rows", count);
  PACKPIPE_CHECK_ARG(count <= 1 || !q.attention.varlen(),
                     "query_rows: a varlen query's attention sums belong to one micro-batch; ask {} rows one at a "
                     "time", count);
  PACKPIPE_CHECK_ARG(count == 0 || q.mbs <= std::numeric_limits<std::int64_t>::max() - (count - 1),
                     "query_rows: mbs {} + {} rows overflows", q.mbs, count);
  if (count > 0) check_query_limits(q, q.mbs + (count - 1));  // the largest row
}

LengthUse CostModel::lengths_used(LayerKind) const { return {}; }

double CostModel::layer_param_bytes(LayerKind, std::int64_t) const { return std::numeric_limits<double>::quiet_NaN(); }

std::int64_t CostModel::memory_rows(const Query& q, std::int64_t count, LayerCost* out) const {
  return query_rows(q, count, out);
}

std::int64_t CostModel::query_rows(const Query& q, std::int64_t count, LayerCost* out) const {
  check_query_rows(q, count, out);
  Query r = q;
  for (std::int64_t k = 0; k < count; ++k) {
    r.mbs = q.mbs + k;
    try {
      out[k] = query(r);
    } catch (const InvalidArgument&) {
      return k;
    }
  }
  return count;
}

// ---- communication ----------------------------------------------------------------------------

CommModel CommModel::from_device(const DeviceSpec& d) {
  validate(d);
  CommModel c;
  c.intra_latency_ms = d.intra_node_latency_us / 1000.0;
  c.intra_bytes_per_ms = d.intra_node_gbps * 1e6;  // GB/s = 1e9 B / 1e3 ms
  c.inter_latency_ms = d.inter_node_latency_us / 1000.0;
  c.inter_bytes_per_ms = d.inter_node_gbps * 1e6;
  return c;
}

namespace {

void check_comm(double bytes, std::int64_t n) {
  PACKPIPE_CHECK_ARG(bytes >= 0 && std::isfinite(bytes), "bytes must be a finite non-negative number, found {}", bytes);
  PACKPIPE_CHECK_ARG(n >= 1, "number of ranks must be at least 1, found {}", n);
}

}  // namespace

double CommModel::p2p_ms(double bytes, bool inter_node) const {
  check_comm(bytes, 1);
  if (bytes == 0) return 0;
  return inter_node ? inter_latency_ms + bytes / inter_bytes_per_ms : intra_latency_ms + bytes / intra_bytes_per_ms;
}

void CommModel::refuse(double bytes, std::int64_t n) {
  check_comm(bytes, n);
  PACKPIPE_THROW(InvalidArgument, "communication of {} bytes over {} ranks refused without a reason", bytes, n);
}

double CommModel::all_gather_ms(double bytes, std::int64_t n, bool inter_node) const {
  check_comm(bytes, n);
  if (n == 1 || bytes == 0) return 0;
  const double steps = static_cast<double>(n - 1);
  const double chunk = bytes / static_cast<double>(n);
  return steps * (inter_node ? inter_latency_ms + chunk / inter_bytes_per_ms : intra_latency_ms + chunk / intra_bytes_per_ms);
}

double CommModel::reduce_scatter_ms(double bytes, std::int64_t n, bool inter_node) const {
  return all_gather_ms(bytes, n, inter_node);
}

// ---- stage composition --------------------------------------------------------------------------

Query shape_query(const ModelSpec& m, LayerKind kind, std::int64_t num_layers, std::int64_t tp, const MicroShape& shape,
                  Recompute rc) {
  Query q;
  q.kind = kind;
  q.num_layers = num_layers;
  q.tp = tp;
  q.mbs = shape.rows;
  q.seq = shape.seq;
  q.dec_seq = m.arch == Architecture::EncoderDecoder ? shape.dec_seq : 0;
  q.recompute = rc;
  q.attention = shape.attention;
  return q;
}

Query packed_query(const ModelSpec& m, const std::vector<std::int64_t>& segments,
                   const std::vector<std::int64_t>& dec_segments, const std::string& what,
                   const std::vector<std::int64_t>& prefix) {
  const bool encdec = m.arch == Architecture::EncoderDecoder;
  PACKPIPE_CHECK_ARG(!segments.empty(), "{}: a packed row needs at least one segment", what);
  PACKPIPE_CHECK_ARG(encdec || dec_segments.empty(), "{}: model '{}' is decoder-only: no decoder lengths", what,
                     m.name);
  PACKPIPE_CHECK_ARG(!encdec || dec_segments.size() == segments.size(),
                     "{}: encoder-decoder model '{}' needs one decoder length per segment ({} for {} segments)", what,
                     m.name, dec_segments.size(), segments.size());
  Query q;
  q.seq = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const std::int64_t l = segments[i], d = encdec ? dec_segments[i] : 0;
    PACKPIPE_CHECK_ARG(l >= 1 && l <= kMaxQuerySeq && (!encdec || (d >= 1 && d <= kMaxQuerySeq)),
                       "{}: segment {} has length {}{}, expected lengths in [1, {}]", what, i, l,
                       encdec ? fmt::format(" + {}", d) : std::string(), kMaxQuerySeq);
    q.seq += l;
    q.dec_seq += d;
    PACKPIPE_CHECK_ARG(q.seq <= kMaxQuerySeq && q.dec_seq <= kMaxQuerySeq, "{}: the row holds more than {} tokens",
                       what, kMaxQuerySeq);
    q.attention.add(l, d);
  }
  if (!prefix.empty()) {
    PACKPIPE_CHECK_ARG(!encdec, "{}: slices (a prefix per segment) are for decoder-only models; model '{}' is "
                       "encoder-decoder", what, m.name);
    PACKPIPE_CHECK_ARG(prefix.size() == segments.size(),
                       "{}: {} prefixes for {} segments; give one per segment (0 for a whole sample)", what,
                       prefix.size(), segments.size());
    for (std::size_t i = 0; i < prefix.size(); ++i) {
      PACKPIPE_CHECK_ARG(prefix[i] >= 0 && prefix[i] <= kMaxQuerySeq - segments[i],
                         "{}: segment {} keeps {} tokens before its {}; expected 0 to {} (prefix + segment at most {})",
                         what, i, prefix[i], segments[i], kMaxQuerySeq - segments[i], kMaxQuerySeq);
      q.attention.prefix += segments[i] * prefix[i];
      q.attention.prefix_tokens += prefix[i];
    }
  }
  return q;
}

LayerCost add_prefix_cost(LayerCost base, const LayerCost& with, const LayerCost& without) {
  auto more = [](double a, double b) { return a > b ? a - b : 0.0; };
  base.forward_ms += more(with.forward_ms, without.forward_ms);
  base.backward_ms += more(with.backward_ms, without.backward_ms);
  base.recompute_ms += more(with.recompute_ms, without.recompute_ms);
  base.stored_bytes += more(with.stored_bytes, without.stored_bytes);
  base.peak_bytes += more(with.peak_bytes, without.peak_bytes);
  return base;
}

DenseShape dense_equivalent(const ModelSpec& m, const Query& q) {
  const double rows = static_cast<double>(q.mbs);
  DenseShape e{rows, static_cast<double>(q.seq), static_cast<double>(q.dec_seq)};
  if (!q.attention.varlen()) return e;
  const bool enc_dec = m.arch == Architecture::EncoderDecoder;
  const double enc_tokens = rows * static_cast<double>(q.seq), dec_tokens = rows * static_cast<double>(q.dec_seq);
  if (q.kind == LayerKind::Decoder || (enc_dec && q.kind == LayerKind::PostProcess)) {
    e.dec_seq = static_cast<double>(q.attention.dec_self) / dec_tokens;
    e.rows = dec_tokens / e.dec_seq;
    e.seq = enc_tokens / e.rows;
  } else {
    e.seq = static_cast<double>(q.attention.self) / enc_tokens;
    e.rows = enc_tokens / e.seq;
    e.dec_seq = dec_tokens > 0 ? static_cast<double>(q.attention.dec_self) / dec_tokens : 0.0;
  }
  return e;
}

LayerCost stage_cost(const CostModel& cm, const StageLayout& layout, std::int64_t tp, const MicroShape& shape,
                     Recompute rc) {
  const ModelSpec& m = cm.model();
  PACKPIPE_CHECK_ARG(layout.encoder_layers >= 0 && layout.decoder_layers >= 0,
                     "stage layer counts must be non-negative, found {} encoder and {} decoder", layout.encoder_layers,
                     layout.decoder_layers);
  PACKPIPE_CHECK_ARG(layout.decoder_layers == 0 || m.arch == Architecture::EncoderDecoder,
                     "stage has {} decoder layers but model '{}' is decoder-only", layout.decoder_layers, m.name);
  PACKPIPE_CHECK_ARG(layout.encoder_layers + layout.decoder_layers > 0 || layout.has_embedding || layout.has_postprocess,
                     "stage holds no layers");
  LayerCost total;
  total.time_source = Provenance::Profiled;
  total.memory_source = Provenance::Profiled;
  double stored = 0, peak_abs = 0;
  // Layers in execution order; the stage's transient peak is the largest stored-so-far plus the
  // running layer's peak (backward of the last layer sees everything stored), reported on top of
  // the stage's stored total.
  auto add = [&](LayerKind kind, std::int64_t n) {
    if (n <= 0) return;
    const LayerCost c = cm.query(shape_query(m, kind, n, tp, shape, rc));
    total.forward_ms += c.forward_ms;
    total.backward_ms += c.backward_ms;
    total.recompute_ms += c.recompute_ms;
    stored += c.stored_bytes;
    peak_abs = std::max(peak_abs, stored + c.peak_bytes);
    total.boundary_bytes = c.boundary_bytes;  // the last kind's output leaves the stage
    total.time_source = std::max(total.time_source, c.time_source);
    total.memory_source = std::max(total.memory_source, c.memory_source);
  };
  add(LayerKind::Embedding, layout.has_embedding ? 1 : 0);
  add(LayerKind::Encoder, layout.encoder_layers);
  add(LayerKind::Decoder, layout.decoder_layers);
  add(LayerKind::PostProcess, layout.has_postprocess ? 1 : 0);
  total.stored_bytes = stored;
  total.peak_bytes = peak_abs - stored;
  if (layout.has_postprocess) total.boundary_bytes = 0;
  return total;
}

StaticMemory stage_static_memory(const ModelSpec& m, const StageLayout& layout, std::int64_t tp, std::int64_t dp,
                                 int zero_stage) {
  PACKPIPE_CHECK_ARG(tp > 0, "tp must be positive, found {}", tp);
  PACKPIPE_CHECK_ARG(layout.encoder_layers >= 0 && layout.decoder_layers >= 0,
                     "stage layer counts must be non-negative, found {} encoder and {} decoder", layout.encoder_layers,
                     layout.decoder_layers);
  PACKPIPE_CHECK_ARG(layout.decoder_layers == 0 || m.arch == Architecture::EncoderDecoder,
                     "stage has {} decoder layers but model '{}' is decoder-only", layout.decoder_layers, m.name);
  double params = static_cast<double>(layout.encoder_layers) * static_cast<double>(m.layer_params(false)) +
                  static_cast<double>(layout.decoder_layers) * static_cast<double>(m.layer_params(true));
  // The LM head is tied to the word embedding: a last stage without the embedding keeps its own
  // copy (synchronized by the embedding all-reduce), a stage with both keeps one.
  if (layout.has_embedding || layout.has_postprocess) params += static_cast<double>(m.embedding_params());
  if (layout.has_postprocess) params += 2.0 * static_cast<double>(m.hidden);  // final norm
  return static_memory(params / static_cast<double>(tp), dp, zero_stage);
}

}  // namespace packpipe::costmodel
