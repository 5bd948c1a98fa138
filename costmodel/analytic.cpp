#include "costmodel/analytic.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/errors.h"
#include "costmodel/flops.h"

namespace packpipe::costmodel {

namespace {

/// Smooth maximum of a latency floor and a compute time: (o^4 + c^4)^(1/4). Host launches overlap
/// with GPU work, so a small layer costs the floor and a large one its compute (two square roots,
/// no pow: the query stays cheap).
inline double smooth_max(double o, double c) {
  const double o2 = o * o, c2 = c * c;
  return std::sqrt(std::sqrt(o2 * o2 + c2 * c2));
}

/// Per-GPU pieces of a layer's activations (bytes), the closed forms of Korthikanti et al. 2022
/// generalized to GQA, head_dim != h / a, gated MLPs and cross-attention. `e` = bytes per element.
struct Acts {
  double replicated = 0;  ///< layer norms, linear inputs and dropout masks every TP rank keeps
  double parallel = 0;    ///< Q, K, V, context and MLP intermediates, already divided by tp
  double scores = 0;      ///< softmax output, dropout mask and output: (2e + 1) a s^2 b / tp
  double input = 0;       ///< the layer input (all full recompute keeps)
  double largest = 0;     ///< largest single intermediate tensor (bytes), for the workspace
  double token_h = 0;     ///< b x tokens x h of the layer (elements), for the calibration
  double score_count = 0; ///< attention scores per GPU (a b s^2 / tp; self + cross for decoders)
  double none() const { return replicated + parallel + scores; }
};

/// Stored bytes the profiles measure beyond the closed forms (the calibration terms of
/// AnalyticOptions): per token and hidden unit, per attention score, per layer.
inline double calibration_bytes(const Acts& x, double token_bytes, double score_bytes, double layer_bytes) {
  return token_bytes * x.token_h + score_bytes * x.score_count + layer_bytes;
}

/// The activations of one layer of b rows of s tokens (d decoder tokens); `w` (varlen rows) replaces
/// the dense rows' squares in the score terms by its sums. Under the flash kernel no score is stored:
/// its place is the fp32 log-sum-exp of each query and head (4 a tokens b / t bytes, counted with
/// the tensor-parallel pieces, so selective recompute has nothing to drop). A row's slices store the
/// concatenated kept keys and values of their prefix (2 e k prefix_tokens / t).
[[gnu::always_inline]] inline Acts layer_acts(const ModelSpec& m, LayerKind kind, double t, double b, double s,
                                              double d, const AttentionWork& w, bool flash = false) {
  const double e = static_cast<double>(m.bytes_per_param);
  const double h = static_cast<double>(m.hidden);
  const double a = static_cast<double>(m.heads);
  const double q = static_cast<double>(m.heads * m.head_dim);
  const double kv = static_cast<double>(m.kv_heads * m.head_dim);
  const double f = static_cast<double>(m.ffn_hidden);
  const double mlp_tensors = m.gated_mlp ? 3.0 : 2.0;  // GeLU in + out, or gate, up and product
  Acts x;
  if (kind == LayerKind::Encoder) {
    // two norms' inputs (2e h), QKV and MLP inputs (2e h), two dropout masks (2 h): (4e + 2) h = 10 h.
    x.replicated = s * b * h * (4 * e + 2);
    x.parallel = s * b * e * (2 * q + 2 * kv + mlp_tensors * f) / t;  // 24 h / t for GPT
    x.input = e * s * b * h;
    x.token_h = s * b * h;
    const double kept = 2 * e * kv * static_cast<double>(w.prefix_tokens) / t;  // prefix keys and values
    x.parallel += kept;
    // score elements per GPU: each segment's square (and its slices' prefix rectangles)
    const double ss = w.varlen() ? static_cast<double>(w.self + w.prefix) : s * s * b;
    if (flash) {
      x.parallel += 4 * a * s * b / t;  // fp32 log-sum-exp
      x.largest = std::max({e * b * s * (m.gated_mlp ? 2 : 1) * f / t, e * b * s * (q + 2 * kv) / t, kept});
    } else {
      x.scores = (2 * e + 1) * a * ss / t;  // 5 a s^2 b / t
      x.largest = std::max(e * std::max({b * s * (m.gated_mlp ? 2 : 1) * f, a * ss, b * s * (q + 2 * kv)}) / t, kept);
      x.score_count = a * ss / t;
    }
  } else {
    // self-attention, cross-attention (queries from d decoder tokens, keys / values from s
    // encoder tokens; the encoder output itself is held once, as boundary bytes) and MLP.
    x.replicated = d * b * h * (6 * e + 3);
    x.parallel = (d * b * e * (2 * q + 2 * kv + 2 * q + mlp_tensors * f) + s * b * e * 2 * kv) / t;
    x.input = e * d * b * h;
    x.token_h = d * b * h;
    const double dd = w.varlen() ? static_cast<double>(w.dec_self) : b * d * d;
    const double ds = w.varlen() ? static_cast<double>(w.cross) : b * d * s;
    const double dense = e * std::max({b * d * (m.gated_mlp ? 2 : 1) * f, b * d * (q + 2 * kv), b * s * 2 * kv}) / t;
    if (flash) {
      x.parallel += 2 * 4 * a * d * b / t;  // fp32 log-sum-exp of the self- and the cross-attention
      x.largest = dense;
    } else {
      x.scores = (2 * e + 1) * a * (dd + ds) / t;
      x.largest = std::max(dense, e * a * std::max(dd, ds) / t);
      x.score_count = a * (dd + ds) / t;
    }
  }
  return x;
}

double stored_bytes(const Acts& x, Recompute rc) {
  switch (rc) {
    case Recompute::None: return x.none();
    case Recompute::Selective: return x.replicated + x.parallel;
    case Recompute::Full: return x.input;
  }
  return x.none();
}

/// Transient bytes on top of the stored ones while one layer runs: a workspace of the largest
/// intermediate and its gradient, plus what backward rematerializes under recompute.
double transient_bytes(const Acts& x, Recompute rc) {
  const double workspace = 2 * x.largest;
  switch (rc) {
    case Recompute::None: return workspace;
    case Recompute::Selective: return workspace + x.scores;
    case Recompute::Full: return workspace + x.none() - x.input;
  }
  return workspace;
}

}  // namespace

double layer_activation_bytes(const ModelSpec& m, LayerKind kind, std::int64_t tp, std::int64_t mbs,
                              std::int64_t seq, std::int64_t dec_seq, Recompute rc, const AnalyticOptions* calibration) {
  PACKPIPE_CHECK_ARG(kind == LayerKind::Encoder || kind == LayerKind::Decoder,
                     "layer_activation_bytes: kind must be encoder or decoder, found {}", layer_kind_name(kind));
  PACKPIPE_CHECK_ARG(tp > 0 && mbs > 0 && seq > 0, "tp, mbs and seq must be positive, found {}, {} and {}", tp, mbs,
                     seq);
  PACKPIPE_CHECK_ARG(kind == LayerKind::Encoder || dec_seq > 0, "dec_seq must be positive for a decoder layer, found {}",
                     dec_seq);
  const Acts x = layer_acts(m, kind, static_cast<double>(tp), static_cast<double>(mbs), static_cast<double>(seq),
                           static_cast<double>(dec_seq), AttentionWork{}, attention_kernel(m, DeviceSpec{}) ==
                                                                               AttentionKernel::Flash);
  const double closed = stored_bytes(x, rc);
  if (calibration == nullptr) return closed;
  return closed + calibration_bytes(x, calibration->activation_token_bytes, calibration->activation_score_bytes,
                                    calibration->activation_layer_bytes);
}

AnalyticCostModel::AnalyticCostModel(ModelSpec model, DeviceSpec device)
    : AnalyticCostModel(std::move(model), device, device.analytic) {}

AnalyticCostModel::AnalyticCostModel(ModelSpec model, DeviceSpec device, AnalyticOptions options)
    : model_(std::move(model)), device_(std::move(device)), options_(options) {
  validate(model_);
  validate(device_);
  check_analytic_options(options_, "analytic options");
  comm_ = CommModel::from_device(device_);
  kernel_ = attention_kernel(model_, device_);
  flop_per_ms_ = device_.peak_tflops * 1e9;
  hbm_per_ms_ = device_.hbm_gbps * 1e6;
}

std::string AnalyticCostModel::describe() const {
  return fmt::format("analytic ({} on {}; {} attention; max efficiency {}, overhead {} ms/layer)", model_.name,
                     device_.name, attention_kernel_name(kernel_), options_.max_efficiency, options_.layer_overhead_ms);
}

double AnalyticCostModel::efficiency(double tokens, double width) const {
  const double ft = tokens / (tokens + options_.half_efficiency_tokens);
  const double fw = width / (width + options_.half_efficiency_width);
  return options_.max_efficiency * ft * fw;
}

/// Everything of a query that does not depend on the micro-batch size (see query_rows).
struct AnalyticCostModel::RowPlan {
  LayerKind kind = LayerKind::Encoder;
  Recompute rc = Recompute::None;
  bool dec = false;          ///< a decoder layer
  bool comm = false;         ///< tensor-parallel all-reduces are added
  bool inter = false;        ///< they cross nodes
  bool flash = false;        ///< the flash kernel (AttentionKernel::Flash): no stored scores
  std::int64_t tp = 1;
  double t = 1, s = 0, d = 0, h = 0, e = 0, v = 0;
  double tokens = 0;         ///< tokens of one sample the layer runs on
  double width_factor = 0;   ///< width / (width + half_efficiency_width) of efficiency()
  double layers = 1;
  double act_token = 0, act_score = 0, act_layer = 0;  ///< the activation calibration (AnalyticOptions)
  AttentionWork attn;        ///< varlen rows' attention sums (none: dense rows)
  FlopsShape fl;
};

[[gnu::always_inline]] inline void AnalyticCostModel::plan(const Query& q, RowPlan& p) const {
  const ModelSpec& m = model_;
  const bool enc_dec = m.arch == Architecture::EncoderDecoder;
  // Validation: only comparisons on the happy path; messages are built only when throwing.
  PACKPIPE_CHECK_ARG(q.num_layers > 0, "num_layers must be positive, found {}", q.num_layers);
  PACKPIPE_CHECK_ARG(q.tp > 0, "tp must be positive, found {}", q.tp);
  PACKPIPE_CHECK_ARG(m.heads % q.tp == 0 && m.kv_heads % q.tp == 0,
                     "tp ({}) must divide the attention heads ({}) and key/value heads ({}) of model '{}'", q.tp,
                     m.heads, m.kv_heads, m.name);
  PACKPIPE_CHECK_ARG(q.mbs > 0, "mbs (micro-batch size) must be positive, found {}", q.mbs);
  PACKPIPE_CHECK_ARG(q.dec_seq >= 0, "dec_seq must be non-negative, found {}", q.dec_seq);
  check_query_limits(q, q.mbs);
  PACKPIPE_CHECK_ARG(q.kind != LayerKind::Decoder || enc_dec,
                     "kind decoder needs an encoder-decoder model; model '{}' is decoder-only", m.name);
  PACKPIPE_CHECK_ARG(enc_dec || q.dec_seq == 0, "dec_seq must be 0 for decoder-only model '{}', found {}", m.name,
                     q.dec_seq);
  const bool dec_tokens = q.kind == LayerKind::Decoder || (enc_dec && q.kind == LayerKind::PostProcess);
  PACKPIPE_CHECK_ARG(!dec_tokens || q.dec_seq > 0, "dec_seq (decoder length) must be positive for {} of model '{}', found {}",
                     layer_kind_name(q.kind), m.name, q.dec_seq);
  const bool enc_tokens = !(enc_dec && q.kind == LayerKind::PostProcess);
  PACKPIPE_CHECK_ARG(!enc_tokens || q.seq > 0, "seq (sequence length) must be positive, found {}", q.seq);
  PACKPIPE_CHECK_ARG(q.recompute == Recompute::None || q.recompute == Recompute::Selective ||
                         q.recompute == Recompute::Full,
                     "recompute must be one of {}, found {}", enum_name_list(kRecomputeNames),
                     static_cast<int>(q.recompute));
  p.kind = q.kind;
  p.rc = q.recompute;
  p.dec = q.kind == LayerKind::Decoder;
  p.tp = q.tp;
  p.comm = options_.tp_communication && q.tp > 1;
  p.inter = !(q.tp <= device_.gpus_per_node);
  p.t = static_cast<double>(q.tp);
  p.s = static_cast<double>(q.seq);
  p.d = static_cast<double>(q.dec_seq);
  p.h = static_cast<double>(m.hidden);
  p.e = static_cast<double>(m.bytes_per_param);
  p.v = static_cast<double>(m.vocab);
  p.layers = static_cast<double>(q.num_layers);
  p.act_token = options_.activation_token_bytes;
  p.act_score = options_.activation_score_bytes;
  p.act_layer = options_.activation_layer_bytes;
  p.attn = q.attention;
  p.flash = kernel_ == AttentionKernel::Flash;
  double width = 0;
  switch (q.kind) {
    case LayerKind::Encoder:
    case LayerKind::Decoder:
      p.tokens = p.dec ? p.d : p.s;
      width = std::min({p.h, static_cast<double>(m.heads * m.head_dim) / p.t, static_cast<double>(m.ffn_hidden) / p.t});
      p.fl = flops_shape(m, q.kind, q.seq, q.dec_seq);
      break;
    case LayerKind::Embedding: break;
    case LayerKind::PostProcess:
      p.tokens = enc_dec ? p.d : p.s;
      width = std::min(p.h, p.v / p.t);
      p.fl = flops_shape(m, q.kind, q.seq, q.dec_seq);
      break;
  }
  p.width_factor = width / (width + options_.half_efficiency_width);
}

namespace {

/// The memory of one row (stored bytes of one layer, before the layer count; transient peak) of
/// plan `p` at micro-batch size b, and a layer's activation pieces (empty for other kinds): the
/// one place these are computed, for full rows and memory-only rows alike.
template <typename Plan>
[[gnu::always_inline]] inline Acts memory_row(const ModelSpec& m, const Plan& p, double b, LayerCost& c) {
  Acts x;
  switch (p.kind) {
    case LayerKind::Encoder:
    case LayerKind::Decoder:
      x = layer_acts(m, p.kind, p.t, b, p.s, p.d, p.attn, p.flash);
      c.stored_bytes = stored_bytes(x, p.rc) + calibration_bytes(x, p.act_token, p.act_score, p.act_layer);
      c.peak_bytes = transient_bytes(x, p.rc);
      break;
    case LayerKind::Embedding:
      c.stored_bytes = b * p.s * p.h;       // dropout mask
      c.peak_bytes = p.e * b * p.s * p.h;  // the gathered rows
      break;
    case LayerKind::PostProcess: {
      // Final norm input and LM head input, and fp32 softmax values (4 bytes per logit).
      const double logits = b * p.tokens * p.v / p.t;
      c.stored_bytes = 2 * p.e * b * p.tokens * p.h + 4 * logits;
      c.peak_bytes = (p.e + 4) * logits;
      break;
    }
  }
  return x;
}

}  // namespace

[[gnu::always_inline]] inline LayerCost AnalyticCostModel::row(const RowPlan& p, std::int64_t mbs) const {
  // The arithmetic of every quantity is written once, here, for query() and query_rows() alike;
  // the RowPlan holds sub-expressions that do not involve the micro-batch size, so rounding is
  // the same whichever way a row is asked for.
  const ModelSpec& m = model_;
  const AnalyticOptions& o = options_;
  const double e = p.e, t = p.t, b = static_cast<double>(mbs);
  const double s = p.s, h = p.h;
  auto all_reduce = [&](double bytes) { return p.comm ? comm_.all_reduce_ms(bytes, p.tp, p.inter) : 0.0; };
  // efficiency(tokens, width) with the width factor kept from the plan.
  auto eff_of = [&](double tokens) {
    const double ft = tokens / (tokens + o.half_efficiency_tokens);
    return o.max_efficiency * ft * p.width_factor;
  };

  LayerCost c;
  const Acts x = memory_row(m, p, b, c);
  switch (p.kind) {
    case LayerKind::Encoder:
    case LayerKind::Decoder: {
      const bool dec = p.dec;
      const double tokens = p.tokens;
      const LayerFlops fl = p.fl.at(b, p.attn);
      const double eff = eff_of(b * tokens);
      // The attention products the kernel executes: eager the whole square at the GEMMs'
      // efficiency (times attention_efficiency); flash the causal part at its own efficiency.
      const double executed = executed_attention_flops(m, p.fl, b, p.attn, kernel_);
      const double attn_ms =
          p.flash ? executed / t /
                        (flop_per_ms_ * o.flash_efficiency * (b * tokens) / (b * tokens + o.half_efficiency_tokens))
                  : executed / t / (flop_per_ms_ * eff * o.attention_efficiency);
      const double score_traffic_ms = o.memory_traffic * x.scores / hbm_per_ms_;
      const double linear = fl.matmul / t / (flop_per_ms_ * eff) + o.memory_traffic * x.none() / hbm_per_ms_;
      const double compute = linear + attn_ms;
      // Megatron without sequence parallelism: one all-reduce of the block output per attention
      // and MLP block forward (three blocks in a T5 decoder layer), one per block backward.
      const double comm = (dec ? 3.0 : 2.0) * all_reduce(e * b * tokens * h);
      c.forward_ms = smooth_max(o.layer_overhead_ms, compute) + comm;
      const double back = p.flash ? o.backward_factor * linear + o.flash_backward_factor * attn_ms
                                  : o.backward_factor * compute;
      c.backward_ms = smooth_max(o.layer_overhead_ms, back) + comm;
      if (p.rc == Recompute::Full) c.recompute_ms = c.forward_ms;
      // Selective recomputes the scores eager stored; flash stores none, so it recomputes nothing.
      if (p.rc == Recompute::Selective && !p.flash) {
        c.recompute_ms = smooth_max(o.recompute_overhead_ms, attn_ms + score_traffic_ms);
      }
      c.boundary_bytes = e * b * tokens * h + (dec ? e * b * s * h : 0.0);
      break;
    }
    case LayerKind::Embedding: {
      // A gather of b s rows and a dropout: memory traffic only; vocabulary-parallel embeddings
      // all-reduce their output when tp > 1. Backward scatters into the embedding gradient.
      const double out = c.peak_bytes;  // e b s h
      const double compute = o.memory_traffic * out / hbm_per_ms_;
      c.forward_ms = compute + all_reduce(out);
      c.backward_ms = o.backward_factor * compute;
      c.boundary_bytes = out;
      break;
    }
    case LayerKind::PostProcess: {
      // Final norm, LM head (column-parallel over the vocabulary) and vocabulary-parallel cross
      // entropy, which keeps fp32 softmax values (4 bytes per logit).
      const double tokens = p.tokens;
      const LayerFlops fl = p.fl.at(b);
      const double eff = eff_of(b * tokens);
      const double stored = c.stored_bytes;
      const double compute = fl.matmul / t / (flop_per_ms_ * eff) + o.memory_traffic * stored / hbm_per_ms_;
      c.forward_ms = smooth_max(o.layer_overhead_ms, compute) + all_reduce(3 * 4 * b * tokens);
      c.backward_ms = smooth_max(o.layer_overhead_ms, o.backward_factor * compute) + all_reduce(e * b * tokens * h);
      c.boundary_bytes = 0;
      break;
    }
  }
  const double n = p.layers;
  c.forward_ms *= n;
  c.backward_ms *= n;
  c.recompute_ms *= n;
  c.stored_bytes *= n;  // the transient peak is one layer's: layers run one at a time
  return c;
}

LengthUse AnalyticCostModel::lengths_used(LayerKind kind) const {
  const bool enc_dec = model_.arch == Architecture::EncoderDecoder;
  switch (kind) {
    case LayerKind::Embedding:
    case LayerKind::Encoder: return {true, false};
    case LayerKind::Decoder: return {true, true};
    case LayerKind::PostProcess: return {!enc_dec, enc_dec};
  }
  return {};
}

namespace {

// A time that is not finite is the device's or the model's numbers, not a shape beyond them: an
// Error (which the partition does not take for a shape it cannot run), naming both.
[[gnu::noinline, gnu::cold]] void non_finite(const ModelSpec& m, const DeviceSpec& d, const Query& q, const LayerCost& c) {
  PACKPIPE_THROW(::packpipe::Error,
                 "the analytic cost model of {} on {} gives a forward of {} ms, a backward of {} ms and a recompute of "
                 "{} ms for {} {} layer(s) of {} x {} tokens: check the device's figures (peak_tflops {}, hbm_gbps {}) "
                 "and the model's", m.name, d.name, c.forward_ms, c.backward_ms, c.recompute_ms, q.num_layers,
                 layer_kind_name(q.kind), q.mbs, q.seq, d.peak_tflops, d.hbm_gbps);
}

bool finite(const LayerCost& c) {
  return std::isfinite(c.forward_ms) && std::isfinite(c.backward_ms) && std::isfinite(c.recompute_ms);
}

}  // namespace

LayerCost AnalyticCostModel::query(const Query& q) const {
  RowPlan p;
  plan(q, p);
  LayerCost c = row(p, q.mbs);
  if (!finite(c)) non_finite(model_, device_, q, c);
  return c;
}

std::int64_t AnalyticCostModel::memory_rows(const Query& q, std::int64_t count, LayerCost* out) const {
  check_query_rows(q, count, out);
  if (count == 0) return 0;
  RowPlan p;
  try {
    plan(q, p);
  } catch (const InvalidArgument&) {
    return 0;
  }
  for (std::int64_t k = 0; k < count; ++k) {
    LayerCost& c = out[k];
    c.memory_source = Provenance::Analytic;
    memory_row(model_, p, static_cast<double>(q.mbs + k), c);
    c.stored_bytes *= p.layers;  // as row() scales it
  }
  return count;
}

std::int64_t AnalyticCostModel::query_rows(const Query& q, std::int64_t count, LayerCost* out) const {
  check_query_rows(q, count, out);
  if (count == 0) return 0;
  RowPlan p;
  try {
    plan(q, p);  // checks row 0; the later rows differ only in a larger (positive) mbs
  } catch (const InvalidArgument&) {
    return 0;
  }
  for (std::int64_t k = 0; k < count; ++k) {
    out[k] = row(p, q.mbs + k);
    if (!finite(out[k])) non_finite(model_, device_, q, out[k]);
  }
  return count;
}

}  // namespace packpipe::costmodel
