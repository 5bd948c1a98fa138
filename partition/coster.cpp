// Memoised micro-batch costs for the partitioner (stage basis and DynaPipe's formula) and the
// min-sum DP under a cap shared by the DP methods.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/errors.h"
#include "common/rng.h"
#include "common/target_clones.h"
#include "costmodel/calibration.h"
#include "costmodel/stage_ops.h"
#include "partition/detail/coster.h"

namespace packpipe::partition::detail {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMB = 1e6;

int rc_index(cm::Recompute rc) { return static_cast<int>(rc); }
// Recompute modes by index, least work first.
constexpr cm::Recompute kModes[3] = {cm::Recompute::None, cm::Recompute::Selective, cm::Recompute::Full};

// The DynaPipe basis's queries (kinds_): 0 encoder-kind layer, 1 post-process, 2 decoder layer.
const std::vector<int> kDynEncoder{0}, kDynDecoder{2};

// min that keeps a NaN (a memory the cost model could not give does not fit).
inline double nan_min(double a, double b) { return (a < b || std::isnan(a)) ? a : b; }

// The DP's inner loop: prefixes j = i+1 .. i+K through start i's windows t[0, K) under lim, with
// fi = F[i]. Branch-free so that it vectorises; an AVX2 clone where the CPU has it (the same
// additions and comparisons, so the same results bit for bit).
PACKPIPE_TARGET_CLONES
void relax(const double* t, std::size_t K, double lim, double fi, std::int64_t i, double* Fj, std::int64_t* Pj) {
  for (std::size_t k = 0; k < K; ++k) {
    const double cur = Fj[k];
    const double tk = t[k];
    const double v = fi + (tk <= lim ? tk : kInf);
    const bool better = v < cur;
    Pj[k] = better ? i : Pj[k];
    Fj[k] = better ? v : cur;
  }
}

}  // namespace

ShapeMemo::ShapeMemo() : scratch(std::make_unique<Scratch>()) {}
ShapeMemo::~ShapeMemo() = default;

void ShapeMemo::clear() {
  shapes.clear();
  kind_rows.clear();
  slots = 0;
  last_new_share = 1.0;
  key.clear();
}

std::size_t ShapeMemo::size() const {
  std::size_t n = 0;
  for (const auto& [k, v] : shapes) {
    for (const auto& s : v) n += s.have != 0;
  }
  return n;
}

Coster::Coster(const cm::CostModel& cost, const PipelineShape& shape, const std::vector<VirtualStage>& vstages,
               CostBasis basis, double limit_mb, ShapeMemo* shared)
    : cost_(cost),
      calibrated_(cost.calibration() != nullptr),
      attention_share_(calibrated_ && cost.calibration()->uses_attention_share()),
      kernel_(cost.attention()),
      shape_(shape), basis_(basis), limit_mb_(limit_mb) {
  if (shared != nullptr) {
    // Everything a shape's cost depends on besides the shape itself.
    std::vector<std::uint64_t> key = {reinterpret_cast<std::uintptr_t>(&cost),
                                      static_cast<std::uint64_t>(shape.stages),
                                      static_cast<std::uint64_t>(shape.chunks),
                                      static_cast<std::uint64_t>(shape.layers_per_stage),
                                      static_cast<std::uint64_t>(shape.dp),
                                      static_cast<std::uint64_t>(shape.tp),
                                      static_cast<std::uint64_t>(shape.zero_stage),
                                      static_cast<std::uint64_t>(basis),
                                      std::hash<double>{}(limit_mb)};
    for (const auto& v : vstages) {
      key.insert(key.end(), {static_cast<std::uint64_t>(v.rank), static_cast<std::uint64_t>(v.layout.encoder_layers),
                             static_cast<std::uint64_t>(v.layout.decoder_layers),
                             static_cast<std::uint64_t>(v.layout.has_embedding) * 2u +
                                 static_cast<std::uint64_t>(v.layout.has_postprocess)});
    }
    // Another setting, or the memo at its size bound: start afresh (results never depend on it).
    if (shared->key != key || shared->slots > shared->max_slots) {
      shared->clear();
      shared->key = std::move(key);
    }
    memo_ = shared;
  }
  PACKPIPE_CHECK_ARG(!vstages.empty(), "virtual stages are empty");
  PACKPIPE_CHECK_ARG(static_cast<std::int64_t>(vstages.size()) == shape.vstages(),
                     "{} virtual stages given for stages {} x chunks {}", vstages.size(), shape.stages, shape.chunks);
  PACKPIPE_CHECK_ARG(basis == CostBasis::Stages || basis == CostBasis::DynaPipe, "cost basis must be resolved");
  const cm::ModelSpec& model = cost.model();
  encdec_ = model.arch == cm::Architecture::EncoderDecoder;
  max_weight_ = static_cast<double>(shape.stages - 1) / static_cast<double>(shape.chunks);
  sum_weight_ = 1.0 / static_cast<double>(shape.dp);
  const std::int64_t V = shape.vstages();

  // Stage basis: distinct (kind, layers) queries and each virtual stage's composition.
  auto query_index = [&](cm::LayerKind kind, std::int64_t layers) {
    for (std::size_t k = 0; k < kinds_.size(); ++k) {
      if (kinds_[k].kind == kind && kinds_[k].layers == layers) return static_cast<int>(k);
    }
    kinds_.push_back({kind, layers});
    return static_cast<int>(kinds_.size() - 1);
  };
  static_bytes_.assign(static_cast<std::size_t>(shape.stages), 0.0);
  limit_bytes_ = limit_mb_ * kMB;
  for (const auto& vs : vstages) {
    StagePlan p;
    p.rank = vs.rank;
    p.inflight = static_cast<double>(V - vs.index);
    if (vs.layout.has_embedding) p.queries.push_back(query_index(cm::LayerKind::Embedding, 1));
    if (vs.layout.encoder_layers > 0) p.queries.push_back(query_index(cm::LayerKind::Encoder, vs.layout.encoder_layers));
    if (vs.layout.decoder_layers > 0) p.queries.push_back(query_index(cm::LayerKind::Decoder, vs.layout.decoder_layers));
    if (vs.layout.has_postprocess) p.queries.push_back(query_index(cm::LayerKind::PostProcess, 1));
    // Stages with the same layers (most of them) share one composition per shape.
    p.comp = -1;
    for (std::size_t c = 0; c < comps_.size(); ++c) {
      if (comps_[c] == p.queries) p.comp = static_cast<int>(c);
    }
    if (p.comp < 0) {
      comps_.push_back(p.queries);
      p.comp = static_cast<int>(comps_.size() - 1);
    }
    stages_.push_back(std::move(p));
    static_bytes_[static_cast<std::size_t>(vs.rank)] +=
        cm::stage_static_memory(model, vs.layout, shape.tp, shape.dp, shape.zero_stage).total();
  }

  // Every rank holds exactly one stage (no interleaving): composition skips the per-rank sums.
  std::vector<int> per_rank(static_cast<std::size_t>(shape.stages), 0);
  for (const auto& st : stages_) {
    if (st.rank >= 0 && st.rank < shape.stages) ++per_rank[static_cast<std::size_t>(st.rank)];
  }
  one_stage_per_rank_ = std::all_of(per_rank.begin(), per_rank.end(), [](int c) { return c == 1; });
  if (one_stage_per_rank_) {
    // Per composition, the stages no other stage of it dominates (at least the static memory and
    // the copies of another, strictly more in one); equal ones are kept once.
    for (std::size_t a = 0; a < stages_.size(); ++a) {
      const StagePlan& x = stages_[a];
      const double xs = static_bytes_[static_cast<std::size_t>(x.rank)];
      bool dominated = false;
      for (std::size_t b = 0; b < stages_.size() && !dominated; ++b) {
        const StagePlan& y = stages_[b];
        if (b == a || y.comp != x.comp) continue;
        const double ys = static_bytes_[static_cast<std::size_t>(y.rank)];
        const bool geq = ys >= xs && y.inflight >= x.inflight;
        const bool more = ys > xs || y.inflight > x.inflight;
        dominated = geq && (more || b < a);  // an equal stage: the first one stands for both
      }
      if (!dominated) frontier_.push_back({static_cast<std::size_t>(x.comp), xs, x.inflight});
    }
  }

  // DynaPipe basis: l layers per stage, c chunks; GPU-0 model state as DynaPipe computes it.
  if (basis == CostBasis::DynaPipe) {
    const auto& first = vstages.front().layout;
    dyn_layers_ = first.encoder_layers > 0 ? first.encoder_layers : first.decoder_layers;
    dyn_chunks_ = shape.chunks;
    if (encdec_ && V == 1) {  // DynaPipe plans T5 at pp = 1 as c = 2 with l / 2 layers
      dyn_chunks_ = 2;
      dyn_layers_ = std::max<std::int64_t>(1, first.encoder_layers / 2);
    }
    PACKPIPE_CHECK_ARG(encdec_ || dyn_chunks_ == 1,
                       "the DynaPipe cost basis needs chunks = 1 for decoder-only models, found chunks {} "
                       "(DynaPipe raises ValueError)",
                       dyn_chunks_);
    // Parameters as the profile measured them when the cost model has them (DynaPipe's model
    // state), else from the model's shape.
    const double p_emb = cost.layer_param_bytes(cm::LayerKind::Embedding, shape.tp);
    const double p_enc = cost.layer_param_bytes(cm::LayerKind::Encoder, shape.tp);
    const double p_dec = encdec_ ? cost.layer_param_bytes(cm::LayerKind::Decoder, shape.tp) : 0.0;
    const bool measured = std::isfinite(p_emb) && std::isfinite(p_enc) && std::isfinite(p_dec);
    auto state = [&](std::int64_t enc, std::int64_t dec) {
      if (measured) {
        const double bytes = p_emb + static_cast<double>(enc) * p_enc + static_cast<double>(dec) * p_dec;
        return cm::static_memory(bytes / static_cast<double>(model.bytes_per_param), shape.dp, shape.zero_stage).total() /
               kMB;
      }
      cm::StageLayout l;
      l.encoder_layers = enc;
      l.decoder_layers = dec;
      l.has_embedding = true;
      return cm::stage_static_memory(model, l, shape.tp, shape.dp, shape.zero_stage).total() / kMB;
    };
    if (dyn_chunks_ == 1) {
      model_state_mb_ = state(dyn_layers_, 0);
      if (encdec_) model_state_mb_ = std::max(model_state_mb_, state(0, dyn_layers_));
    } else {
      const std::int64_t half = dyn_layers_ * dyn_chunks_ / 2;
      model_state_mb_ = state(half, half);
    }
    const double available = limit_mb_ - model_state_mb_;
    stored_limit_ = available / static_cast<double>(shape.stages);
    peak_limit_ = available;
    // Queried per shape: one encoder-kind layer, the postprocess, and for T5 one decoder layer.
    kinds_ = {{cm::LayerKind::Encoder, 1}, {cm::LayerKind::PostProcess, 1}};
    if (encdec_) kinds_.push_back({cm::LayerKind::Decoder, 1});
  }
  PACKPIPE_ASSERT(kinds_.size() <= kMaxKinds);
  for (const auto& kq : kinds_) {
    const cm::LengthUse use = cost.lengths_used(kq.kind);
    kind_use_.push_back(use);
    shared_kind_.push_back(encdec_ && (!use.seq || !use.dec_seq) ? 1 : 0);
  }
}

void Coster::eval_rows(std::int64_t rows, std::int64_t count, std::int64_t le, std::int64_t ld, cm::Recompute rc,
                       RcCost* out) {
  evaluated_ += count;
  // Every distinct (kind, layers) query over the rows at once, then each row composed.
  const auto nk = kinds_.size();
  const auto cnt = static_cast<std::size_t>(count);
  scratch_.resize(nk * cnt);
  // Rows from `ok` on are shapes the cost model refuses (far beyond its data) for some kind: they
  // cannot be run (infinitely costly).
  std::int64_t ok = count;
  const cm::LayerCost* base[kMaxKinds];
  for (std::size_t k = 0; k < nk; ++k) {
    cm::Query query;
    query.kind = kinds_[k].kind;
    query.num_layers = kinds_[k].layers;
    query.tp = shape_.tp;
    query.mbs = rows;
    query.seq = le;
    query.dec_seq = encdec_ ? ld : 0;
    query.recompute = rc;
    constexpr std::int64_t kMaxLen = std::int64_t{1} << 28;
    if (!shared_kind_[k] || le >= kMaxLen || ld >= kMaxLen) {
      ok = std::min(ok, cost_.query_rows(query, ok, scratch_.data() + k * cnt));
      base[k] = scratch_.data() + k * cnt;
      continue;
    }
    ok = shared_rows(k, query, rows, ok, cnt);
    base[k] = nullptr;
  }
  for (std::int64_t r = ok; r < count; ++r) {
    RcCost& o = out[r];
    o.time_ms = kInf;
    o.stored_mb = kInf;
    o.peak_mb = kInf;
    o.headroom_mb = -kInf;
  }
  const cm::LayerCost* q[kMaxKinds];
  for (std::size_t r = 0; r < static_cast<std::size_t>(ok); ++r) {
    for (std::size_t k = 0; k < nk; ++k) q[k] = base[k] ? base[k] + r : kind_ptrs_[k * cnt + r];
    const double tokens = static_cast<double>(rows + static_cast<std::int64_t>(r)) *
                          static_cast<double>(le + (encdec_ ? ld : 0));
    const cm::MicroShape ms{rows + static_cast<std::int64_t>(r), le, ld, {}};
    out[r] = basis_ == CostBasis::Stages ? compose_stages(q, ms, tokens) : compose_dynapipe(q, ms, tokens);
  }
}

std::int64_t Coster::shared_rows(std::size_t k, cm::Query query, std::int64_t rows, std::int64_t ok, std::size_t cnt) {
  // A length the kind ignores is 0 in the query and the key: shapes that differ only in it
  // share these rows (the answers are the same bit for bit: CostModel::lengths_used).
  if (!kind_use_[k].seq) query.seq = 0;
  if (!kind_use_[k].dec_seq) query.dec_seq = 0;
  const std::uint64_t key = (static_cast<std::uint64_t>(k) << 61) |
                            (static_cast<std::uint64_t>(rc_index(query.recompute)) << 58) |
                            (static_cast<std::uint64_t>(query.seq) << 29) | static_cast<std::uint64_t>(query.dec_seq);
  RecentKind& recent = recent_kinds_[(key * kSplitMixGamma) >> (64 - kRecentBits)];
  if (recent.rows == nullptr || recent.key != key) {
    recent.rows = &memo_->kind_rows[key];
    recent.key = key;
  }
  KindRows& kr = *recent.rows;
  const auto end = static_cast<std::size_t>(rows + ok);
  if (kr.rows.size() < end) {
    const std::size_t grown = end + end / 2 + 8;
    memo_->slots += (grown - kr.rows.size()) / 2;  // half a shape slot each
    kr.rows.resize(grown);
  }
  for (std::int64_t r = rows; r < rows + ok && r < kr.refused;) {  // the missing runs
    if (kr.rows[static_cast<std::size_t>(r)].have) {
      ++r;
      continue;
    }
    std::int64_t e = r + 1;
    while (e < rows + ok && !kr.rows[static_cast<std::size_t>(e)].have) ++e;
    query.mbs = r;
    block_rows_.resize(static_cast<std::size_t>(e - r));
    const std::int64_t got = cost_.query_rows(query, e - r, block_rows_.data());
    for (std::int64_t x = 0; x < got; ++x) {
      KindRows::Row& row = kr.rows[static_cast<std::size_t>(r + x)];
      row.c = block_rows_[static_cast<std::size_t>(x)];
      row.have = true;
    }
    if (got < e - r) kr.refused = r + got;
    r = e;
  }
  ok = std::min(ok, std::max<std::int64_t>(0, std::min(kr.refused, rows + ok) - rows));
  const KindRows::Row* src = kr.rows.data() + rows;
  kind_ptrs_.resize(static_cast<std::size_t>(kMaxKinds) * cnt);
  const cm::LayerCost** ptrs = kind_ptrs_.data() + k * cnt;
  for (std::size_t r = 0; r < static_cast<std::size_t>(ok); ++r) ptrs[r] = &src[r].c;
  return ok;
}

double Coster::calibration_delta(const std::vector<int>& comp, const cm::LayerCost* const* q, double layers,
                                 const cm::LayerCost* once, const cm::MicroShape& shape, double tokens) const {
  // The stage's times composed as costmodel::stage_cost composes them (per part: forward,
  // backward, recompute), then what calibration adds to their forward + backward. The stage's
  // attention share (costmodel::attention_share) from the same parts' forward FLOPs, only when the
  // calibration has an attention term.
  cm::LayerCost s;
  double matmul = 0, attention = 0;
  for (int k : comp) {
    s.forward_ms += layers * q[k]->forward_ms;
    s.backward_ms += layers * q[k]->backward_ms;
    s.recompute_ms += layers * q[k]->recompute_ms;
    if (attention_share_) {
      const auto& kq = kinds_[static_cast<std::size_t>(k)];
      const cm::LayerFlops f = cm::forward_flops(cost_.model(), kq.kind, shape);
      matmul += layers * static_cast<double>(kq.layers) * f.matmul;
      attention += layers * static_cast<double>(kq.layers) *
                   cm::executed_attention_flops(cost_.model(), cm::flops_shape(cost_.model(), kq.kind, shape.seq, shape.dec_seq),
                                                static_cast<double>(shape.rows), shape.attention, kernel_);
    }
  }
  if (once != nullptr) {
    s.forward_ms += once->forward_ms;
    s.backward_ms += once->backward_ms;
    s.recompute_ms += once->recompute_ms;
    if (attention_share_) {
      const cm::LayerFlops f = cm::forward_flops(cost_.model(), cm::LayerKind::PostProcess, shape);
      matmul += f.matmul;
    }
  }
  const double share = matmul + attention > 0 ? attention / (matmul + attention) : 0.0;
  return cm::stage_time_delta_ms(cost_, s, tokens, share);
}

RcCost Coster::compose_stages(const cm::LayerCost* const* q, const cm::MicroShape& shape, double tokens) const {
  // Every distinct stage composition as costmodel::stage_cost composes it (times add, stored adds,
  // peak = max of stored-so-far + layer peak), then ranks add their stages. Memory stays in bytes
  // until the end: one division per figure instead of two per composition.
  constexpr std::size_t kSmall = 16;
  double comp_time[kSmall], comp_stored[kSmall], comp_peak[kSmall];
  double rank_time[64], rank_mem[64], rank_peak[64];
  const std::size_t S = static_bytes_.size(), C = comps_.size();
  std::vector<double> big;
  double *ct = comp_time, *cs = comp_stored, *cp = comp_peak;
  double *t = rank_time, *mem = rank_mem, *pk = rank_peak;
  if (C > kSmall || S > 64) {
    big.assign(3 * (C + S), 0.0);
    ct = big.data();
    cs = ct + C;
    cp = cs + C;
    t = cp + C;
    mem = t + S;
    pk = mem + S;
  }
  RcCost out;
  double stored_max = 0, peak_max = 0, room = kInf;
  bool negative = false;
  for (std::size_t c = 0; c < C; ++c) {
    double time = 0, stored = 0, peak_abs = 0;
    for (int k : comps_[c]) {
      time += q[k]->total_ms();
      stored += q[k]->stored_bytes;
      peak_abs = std::max(peak_abs, stored + q[k]->peak_bytes);
    }
    if (calibrated_) time += calibration_delta(comps_[c], q, 1.0, nullptr, shape, tokens);
    ct[c] = time;
    cs[c] = stored;
    cp[c] = peak_abs - stored;
    stored_max = std::max(stored_max, cs[c]);
    peak_max = std::max(peak_max, cp[c]);
    out.time_ms = std::max(out.time_ms, time);  // every composition is some stage's
    negative = negative || stored < 0;
  }
  out.stored_mb = stored_max / kMB;
  out.peak_mb = peak_max / kMB;
  if (one_stage_per_rank_ && !negative) {
    // Only the stages on each composition's frontier: with stored >= 0, a stage whose rank holds
    // no more static memory and fewer copies than another of its composition never uses more
    // (rounding is monotone), so the least headroom is among these.
    for (const auto& f : frontier_) {
      const double used = f.static_bytes + f.inflight * cs[f.comp] + cp[f.comp];
      room = nan_min(room, limit_bytes_ - used);
    }
    out.headroom_mb = room / kMB;
    return out;
  }
  out.time_ms = 0;
  if (one_stage_per_rank_) {  // no per-rank sums
    for (const auto& st : stages_) {
      const auto c = static_cast<std::size_t>(st.comp);
      const auto r = static_cast<std::size_t>(st.rank);
      out.time_ms = std::max(out.time_ms, ct[c]);
      const double used = static_bytes_[r] + st.inflight * cs[c] + cp[c];
      room = nan_min(room, limit_bytes_ - used);
    }
    out.headroom_mb = room / kMB;
    return out;
  }
  for (std::size_t r = 0; r < S; ++r) {
    t[r] = 0;
    mem[r] = static_bytes_[r];
    pk[r] = 0;
  }
  for (const auto& st : stages_) {
    const auto c = static_cast<std::size_t>(st.comp);
    const auto r = static_cast<std::size_t>(st.rank);
    t[r] += ct[c];
    mem[r] += st.inflight * cs[c];
    pk[r] = std::max(pk[r], cp[c]);
  }
  for (std::size_t r = 0; r < S; ++r) {
    out.time_ms = std::max(out.time_ms, t[r]);
    room = nan_min(room, limit_bytes_ - (mem[r] + pk[r]));
  }
  out.headroom_mb = room / kMB;
  return out;
}

RcCost Coster::compose_dynapipe(const cm::LayerCost* const* q, const cm::MicroShape& shape, double tokens) const {
  // Section 3, step 3 of DynaPipe: per-layer costs times l, postprocess once.
  const double l = static_cast<double>(dyn_layers_);
  const cm::LayerCost& e = *q[0];
  const cm::LayerCost& p = *q[1];
  double t_enc = l * e.total_ms();
  double t_dec = 0, s_d = 0, a_d = 0;
  if (encdec_) {
    const cm::LayerCost& d = *q[2];
    t_dec = l * d.total_ms() + p.total_ms();
    if (calibrated_) {
      t_enc += calibration_delta(kDynEncoder, q, l, nullptr, shape, tokens);
      t_dec += calibration_delta(kDynDecoder, q, l, &p, shape, tokens);
    }
    s_d = d.stored_bytes / kMB;
    a_d = (d.stored_bytes + d.peak_bytes) / kMB;
  } else {
    t_enc += p.total_ms();
    if (calibrated_) t_enc += calibration_delta(kDynEncoder, q, l, &p, shape, tokens);
  }
  const double s_e = e.stored_bytes / kMB;
  const double a_e = (e.stored_bytes + e.peak_bytes) / kMB;
  RcCost out;
  if (dyn_chunks_ == 1) {
    out.time_ms = encdec_ ? std::max(t_enc, t_dec) : t_enc;
  } else {
    out.time_ms = (t_enc + t_dec) * static_cast<double>(dyn_chunks_ / 2);
  }
  const double s_hat = dyn_chunks_ == 1 ? std::max(s_e, s_d) : (s_e + s_d) * static_cast<double>(dyn_chunks_) / 2.0;
  out.stored_mb = l * s_hat;
  out.peak_mb = std::max(a_e, a_d) + (l - 1) * s_hat;
  return out;
}

bool Coster::has(std::int64_t rows, std::int64_t le, std::int64_t ld) const {
  const auto it = memo_->shapes.find((static_cast<std::uint64_t>(le) << 32) | static_cast<std::uint64_t>(ld));
  return it != memo_->shapes.end() && it->second.size() > static_cast<std::size_t>(rows) &&
         it->second[static_cast<std::size_t>(rows)].have != 0;
}

const RcCost& Coster::get(std::int64_t rows, std::int64_t le, std::int64_t ld, cm::Recompute rc) {
  const std::uint64_t key = (static_cast<std::uint64_t>(le) << 32) | static_cast<std::uint64_t>(ld);
  if (key != last_key_ || last_row_ == nullptr) {  // windows of one start mostly share (le, ld)
    // Shapes recur from start to start: a small direct-mapped cache of row vectors (stable
    // addresses: the memo's nodes are not erased during a call) before the hash map.
    RecentShape& slot = recent_[(key * kSplitMixGamma) >> (64 - kRecentBits)];
    if (slot.row == nullptr || slot.key != key) {
      slot.row = &memo_->shapes[key];
      slot.key = key;
    }
    last_row_ = slot.row;
    last_key_ = key;
  }
  auto& vec = *last_row_;
  const int k = rc_index(rc);
  const auto bit = static_cast<std::uint8_t>(1u << k);
  const auto r0 = static_cast<std::size_t>(rows);
  if (vec.size() <= r0 || !(vec[r0].have & bit)) {
    // A block of rows at once (the caller's next windows need them): up to a quarter more rows,
    // at least 8, never past the hint; only the rows not memoised yet.
    std::int64_t end = std::max(rows, std::min(rows_hint_, rows + std::max<std::int64_t>(8, rows / 4) - 1));
    // Memory grows close to linearly in rows: when the two rows before are known, stop the block
    // two rows past the one where their trend runs out of memory (a larger window under this
    // mode will not be asked for).
    if (rows >= 3 && vec.size() > r0 && (vec[r0 - 1].have & bit) && (vec[r0 - 2].have & bit)) {
      const double h1 = headroom(vec[r0 - 1].c[static_cast<std::size_t>(k)]);
      const double h2 = headroom(vec[r0 - 2].c[static_cast<std::size_t>(k)]);
      const double slope = h1 - h2;
      if (std::isfinite(h1) && std::isfinite(slope) && slope < 0) {
        const double last = static_cast<double>(rows - 1) + std::max(0.0, h1) / -slope;
        if (last + 2 < static_cast<double>(end)) end = std::max(rows, static_cast<std::int64_t>(last) + 2);
      }
    }
    if (vec.size() <= static_cast<std::size_t>(end)) {
      const std::size_t grown = static_cast<std::size_t>(end) + static_cast<std::size_t>(end) / 2 + 8;
      memo_->slots += grown - vec.size();
      vec.resize(grown);
    }
    std::int64_t r = rows;
    while (r <= end) {
      if (vec[static_cast<std::size_t>(r)].have & bit) {
        ++r;
        continue;
      }
      std::int64_t e = r;
      while (e + 1 <= end && !(vec[static_cast<std::size_t>(e + 1)].have & bit)) ++e;
      const auto cnt = static_cast<std::size_t>(e - r + 1);
      block_.resize(cnt);
      eval_rows(r, e - r + 1, le, ld, rc, block_.data());
      for (std::size_t x = 0; x < cnt; ++x) {
        ShapeSlot& s = vec[static_cast<std::size_t>(r) + x];
        s.c[static_cast<std::size_t>(k)] = block_[x];
        s.have = static_cast<std::uint8_t>(s.have | bit);
      }
      r = e + 1;
    }
  }
  return vec[r0].c[static_cast<std::size_t>(k)];
}

std::int64_t Coster::choose_run(std::int64_t m0, std::int64_t m1, std::int64_t le, std::int64_t ld,
                                RecomputePolicy policy, int* first_auto, std::vector<double>& time) {
  // choose() with the shape's row vector held: get() only where a slot is missing.
  const bool automatic = policy == RecomputePolicy::Auto;
  const int fixed = policy == RecomputePolicy::None ? 0 : policy == RecomputePolicy::Selective ? 1 : 2;
  get(m0, le, ld, kModes[automatic ? *first_auto < 3 ? *first_auto : 2 : fixed]);  // selects the row vector
  for (std::int64_t m = m0; m <= m1; ++m) {
    int k = automatic ? *first_auto : fixed;
    const int k_end = automatic ? 3 : fixed + 1;
    for (; k < k_end; ++k) {
      const auto bit = static_cast<std::uint8_t>(1u << k);
      const auto r = static_cast<std::size_t>(m);
      const RcCost& c = (last_row_->size() > r && (((*last_row_)[r].have & bit) != 0))
                            ? (*last_row_)[r].c[static_cast<std::size_t>(k)]
                            : get(m, le, ld, kModes[k]);
      if (fits(c)) {
        time.push_back(c.time_ms);
        break;
      }
    }
    if (automatic) *first_auto = k;
    if (k == k_end) return m - m0;
  }
  return m1 - m0 + 1;
}

template <typename At>
Choice Coster::choose_with(RecomputePolicy policy, int* first_auto, At&& at) {
  Choice best;
  best.time_ms = kInf;
  auto take = [&](const RcCost& c, cm::Recompute rc, bool ok) {
    best.fits = ok;
    best.time_ms = c.time_ms;
    best.stored_mb = c.stored_mb;
    best.peak_mb = c.peak_mb;
    best.rc = rc;
  };
  if (policy == RecomputePolicy::Auto) {
    // Least recompute that fits; recompute only adds work, so it is also the fastest
    // (assumption checked by the tests on the cost models: time none <= selective <= full).
    int k = first_auto ? *first_auto : 0;
    for (; k < 3; ++k) {
      const RcCost& c = at(kModes[k]);
      if (fits(c)) {
        take(c, kModes[k], true);
        break;
      }
      if (k == 0) take(c, kModes[0], false);  // reported when nothing fits
    }
    if (first_auto) *first_auto = k;  // (when None was skipped and nothing fits, the costs are not set)
    return best;
  }
  const cm::Recompute rc = policy == RecomputePolicy::None        ? cm::Recompute::None
                           : policy == RecomputePolicy::Selective ? cm::Recompute::Selective
                                                                  : cm::Recompute::Full;
  const RcCost& c = at(rc);
  take(c, rc, fits(c));
  return best;
}

Choice Coster::choose(std::int64_t rows, std::int64_t le, std::int64_t ld, RecomputePolicy policy, int* first_auto) {
  return choose_with(policy, first_auto, [&](cm::Recompute rc) -> const RcCost& { return get(rows, le, ld, rc); });
}

double Coster::max_static_mb() const {
  double most = 0;
  for (const double b : static_bytes_) most = std::max(most, b);
  return most / kMB;
}

RcCost Coster::get_varlen(const cm::MicroShape& shape, cm::Recompute rc) {
  evaluated_ += 1;
  const auto nk = kinds_.size();
  cm::LayerCost answers[kMaxKinds];
  const cm::LayerCost* q[kMaxKinds];
  for (std::size_t k = 0; k < nk; ++k) {
    try {
      answers[k] = cost_.query(cm::shape_query(cost_.model(), kinds_[k].kind, kinds_[k].layers, shape_.tp, shape, rc));
    } catch (const InvalidArgument&) {
      RcCost refused;  // beyond the cost model's data: cannot be run
      refused.time_ms = refused.stored_mb = refused.peak_mb = kInf;
      refused.headroom_mb = -kInf;
      return refused;
    }
    q[k] = &answers[k];
  }
  const double tokens = cm::shape_tokens(cost_.model(), shape);
  return basis_ == CostBasis::Stages ? compose_stages(q, shape, tokens) : compose_dynapipe(q, shape, tokens);
}

Choice Coster::choose_varlen(const cm::MicroShape& shape, RecomputePolicy policy) {
  RcCost last;
  return choose_with(policy, nullptr, [&](cm::Recompute rc) -> const RcCost& {
    last = get_varlen(shape, rc);
    return last;
  });
}

void finish_table(WindowTable& t) {
  t.tail_min.resize(t.time_ms.size());
  const double* time = t.time_ms.data();
  double* tail = t.tail_min.data();
  double top = 0;
  std::int64_t begin = 0;
  for (const std::int64_t end : t.column_end) {
    double run = kInf;
    for (std::int64_t k = end - 1; k >= begin; --k) {
      const double c = time[k];
      run = std::min(run, c);
      tail[k] = run;
      top = std::max(top, c);
    }
    begin = end;
  }
  t.max_time_ms = top;
}

CapResult min_sum_under_cap(const WindowTable& w, double cap, CapWorkspace& ws) {
  const std::size_t n = w.count.size();
  ws.F.assign(n + 1, kInf);
  ws.P.resize(n + 1);
  double* F = ws.F.data();
  std::int64_t* P = ws.P.data();
  F[0] = 0;
  const double lim = cap;
  // Push-style: each finite prefix extends through its windows under the cap. tail_min is
  // non-decreasing along a start's windows, so the windows that can be under the cap are a prefix
  // (found by a scan, below). P[j] keeps the least start whose window reaches F[j] (strict
  // improvements only, starts in ascending order), which makes the path deterministic.
  std::int64_t last_off = -1;
  std::size_t last_k = 0, last_count = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double fi = F[i];
    if (fi == kInf) continue;
    const std::int64_t off = w.offset[i];
    const double* t = w.time_ms.data() + off;
    const double* tm = w.tail_min.data() + off;
    // A forward scan, not a binary search: the table is far larger than the caches and a scan's
    // loads are sequential, while every step of a binary search waits for a miss.
    // Starts sharing a column share its scan (a later start's count is only cut shorter; an
    // empty column has the next one's offset, hence the count check).
    const auto count = static_cast<std::size_t>(w.count[i]);
    std::size_t K = 0;
    if (off == last_off && count <= last_count) {
      K = std::min(last_k, count);
    } else {
      while (K < count && tm[K] <= lim) ++K;
      last_off = off;
      last_count = count;
      last_k = K;
    }
    relax(t, K, lim, fi, static_cast<std::int64_t>(i), F + i + 1, P + i + 1);
  }
  CapResult r;
  if (F[n] == kInf) return r;
  r.feasible = true;
  r.sum = F[n];
  r.cuts.push_back(static_cast<std::int32_t>(n));
  for (std::size_t j = n; j > 0;) {
    const auto i = static_cast<std::size_t>(P[j]);
    PACKPIPE_ASSERT(i < j);
    r.max = std::max(r.max, w.time_ms[static_cast<std::size_t>(w.offset[i]) + (j - i - 1)]);
    j = i;
    r.cuts.push_back(static_cast<std::int32_t>(j));
  }
  std::reverse(r.cuts.begin(), r.cuts.end());
  return r;
}

}  // namespace packpipe::partition::detail
