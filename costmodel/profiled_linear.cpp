// LinearProfiledCostModel: DynaPipe's interpolation of its profiles (scipy RegularGridInterpolator,
// linear, holes and the 2x extension at 1e100), reproduced so that packpipe can plan on DynaPipe's
// own cost basis.
#include "costmodel/profiled_linear.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "common/errors.h"
#include "costmodel/flops.h"

namespace packpipe::costmodel {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int kMaxDims = 3;

/// One of DynaPipe's interpolators: axes (each extended by twice its largest value) and the values
/// at their nodes, NaN where DynaPipe holds 1e100 (an unprofiled node).
struct Interp {
  int dims = 0;
  std::array<std::vector<double>, kMaxDims> axis;
  std::vector<double> v;  ///< row-major over the axes
  bool empty() const { return v.empty(); }

  /// The multilinear value at x (DynaPipe's: the cell by searchsorted - 1 clamped to the axis,
  /// linear extrapolation beyond the first node); NaN when a node with a non-zero weight is
  /// unprofiled.
  double at(const double* x) const {
    std::size_t lo[kMaxDims];
    double w[kMaxDims];
    for (int d = 0; d < dims; ++d) {
      const auto& a = axis[static_cast<std::size_t>(d)];
      std::size_t i = static_cast<std::size_t>(std::lower_bound(a.begin(), a.end(), x[d]) - a.begin());
      i = i == 0 ? 0 : std::min(i - 1, a.size() - 2);
      lo[d] = i;
      w[d] = (x[d] - a[i]) / (a[i + 1] - a[i]);
    }
    double sum = 0;
    for (unsigned corner = 0; corner < (1u << dims); ++corner) {
      double weight = 1;
      std::size_t index = 0;
      for (int d = 0; d < dims; ++d) {
        const bool up = (corner >> d) & 1u;
        weight *= up ? w[d] : 1 - w[d];
        index = index * axis[static_cast<std::size_t>(d)].size() + lo[d] + (up ? 1 : 0);
      }
      if (weight == 0) continue;  // DynaPipe: 0 x 1e100 = 0
      const double value = v[index];
      if (std::isnan(value)) return kNaN;
      sum += weight * value;
    }
    return sum;
  }
};

/// The points of one interpolator: shape (mbs, seq[, dec]) -> the largest value measured there.
using Nodes = std::map<std::array<std::int64_t, kMaxDims>, double>;

Interp build(const Nodes& nodes, int dims) {
  Interp g;
  if (nodes.empty()) return g;
  g.dims = dims;
  std::array<std::set<std::int64_t>, kMaxDims> values;
  for (const auto& [x, value] : nodes) {
    for (int d = 0; d < dims; ++d) values[static_cast<std::size_t>(d)].insert(x[static_cast<std::size_t>(d)]);
  }
  std::size_t size = 1;
  for (int d = 0; d < dims; ++d) {
    auto& a = g.axis[static_cast<std::size_t>(d)];
    a.assign(values[static_cast<std::size_t>(d)].begin(), values[static_cast<std::size_t>(d)].end());
    a.push_back(2 * a.back());  // DynaPipe's extension, held at 1e100
    size *= a.size();
  }
  g.v.assign(size, kNaN);
  for (const auto& [x, value] : nodes) {
    std::size_t index = 0;
    for (int d = 0; d < dims; ++d) {
      const auto& a = g.axis[static_cast<std::size_t>(d)];
      index = index * a.size() +
              static_cast<std::size_t>(std::lower_bound(a.begin(), a.end(), static_cast<double>(x[static_cast<std::size_t>(d)])) -
                                       a.begin());
    }
    g.v[index] = value;
  }
  return g;
}

/// The four interpolators of one (kind, tp, recompute).
struct Grids {
  Interp fwd, bwd, stored, peak;  ///< peak: DynaPipe's absolute layer peak
  bool derived = false;
};

using Key = std::tuple<LayerKind, std::int64_t, Recompute>;

/// The node coordinates of a point as DynaPipe keys it.
std::array<std::int64_t, kMaxDims> node_of(const ProfilePoint& p, bool enc_dec) {
  if (p.kind == LayerKind::Decoder) return {p.mbs, p.seq, p.dec_seq};
  if (p.kind == LayerKind::PostProcess && enc_dec) return {p.mbs, p.dec_seq, 0};
  return {p.mbs, p.seq, 0};
}

void keep_max(Nodes& nodes, const std::array<std::int64_t, kMaxDims>& x, double value) {
  if (std::isnan(value)) return;
  auto [it, added] = nodes.emplace(x, value);
  if (!added) it->second = std::max(it->second, value);
}

/// The share of a layer's forward a recompute mode repeats: all of it (full), the attention FLOPs'
/// share (selective), nothing (none, and kinds other than encoder and decoder layers).
double recompute_share(const ModelSpec& m, LayerKind kind, Recompute rc, std::int64_t mbs, std::int64_t seq,
                       std::int64_t dec, const AttentionWork& w = {}) {
  if (rc == Recompute::None || (kind != LayerKind::Encoder && kind != LayerKind::Decoder)) return 0;
  if (rc == Recompute::Full) return 1;
  const LayerFlops f = forward_flops(m, kind, MicroShape{mbs, seq, kind == LayerKind::Decoder ? dec : 0, w});
  return f.total() > 0 ? f.attention / f.total() : 0.0;
}

}  // namespace

struct LinearProfiledCostModel::Impl {
  Profile profile;
  ModelSpec model;
  DeviceSpec device;
  CommModel comm;
  std::unique_ptr<CostModel> fallback;
  std::map<Key, Grids> grids;
  bool enc_dec = false;

  const Grids* find(LayerKind k, std::int64_t tp, Recompute rc) const {
    const auto it = grids.find({k, tp, rc});
    return it == grids.end() || it->second.fwd.empty() || it->second.bwd.empty() ? nullptr : &it->second;
  }
  /// DynaPipe's coordinates of a query.
  /// The query's node coordinates (varlen rows: their dense equivalent, cost_model.h).
  std::array<double, kMaxDims> coords(const Query& q) const {
    const DenseShape e = dense_equivalent(model, q);
    if (q.kind == LayerKind::Decoder) return {e.rows, e.seq, e.dec_seq};
    if (q.kind == LayerKind::PostProcess && enc_dec) return {e.rows, e.dec_seq, 0};
    return {e.rows, e.seq, 0};
  }
};

LinearProfiledCostModel::LinearProfiledCostModel(Profile profile, ModelSpec model, DeviceSpec device,
                                                 std::unique_ptr<CostModel> fallback)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.model = std::move(model);
  I.device = std::move(device);
  I.fallback = std::move(fallback);
  I.enc_dec = I.model.arch == Architecture::EncoderDecoder;
  validate(I.model);
  PACKPIPE_CHECK_ARG(I.fallback == nullptr || I.fallback->attention() == profile.kernel(),
                     "the profile was measured with {} attention, its fallback answers for {}: give the fallback the "
                     "profile's kernel (ModelSpec::attention), as make_profiled_cost_model does",
                     attention_kernel_name(profile.kernel()), attention_kernel_name(I.fallback->attention()));
  check_profile_for(profile, I.model);
  // Per (kind, tp, rc): the nodes of each quantity, repeats at their maximum (DynaPipe's sorted
  // lists, the last one kept). The peak node is the absolute peak, stored + transient.
  std::map<Key, std::array<Nodes, 4>> nodes;
  for (const auto& p : profile.points) {
    if (p.variant != 0) continue;
    auto& n = nodes[{p.kind, p.tp, p.rc}];
    const auto x = node_of(p, I.enc_dec);
    keep_max(n[0], x, p.fwd_ms);
    keep_max(n[1], x, p.bwd_ms);
    keep_max(n[2], x, p.stored_bytes);
    keep_max(n[3], x, p.stored_bytes + p.peak_bytes);
  }
  auto dims_of = [](LayerKind k) { return k == LayerKind::Decoder ? 3 : 2; };
  for (const auto& [key, n] : nodes) {
    Grids g;
    const int dims = dims_of(std::get<0>(key));
    g.fwd = build(n[0], dims);
    g.bwd = build(n[1], dims);
    g.stored = build(n[2], dims);
    g.peak = build(n[3], dims);
    I.grids.emplace(key, std::move(g));
  }
  // Recompute modes the profile lacks: derived node by node from the no-recompute nodes, as
  // ProfiledCostModel derives them (forward again during backward; memory less what the mode does
  // not keep, from the fallback's difference).
  for (const auto& [key, n] : nodes) {
    const auto& [kind, tp, rc] = key;
    if (rc != Recompute::None || n[0].empty() || n[1].empty()) continue;
    for (Recompute to : {Recompute::Selective, Recompute::Full}) {
      if (nodes.count({kind, tp, to}) != 0) continue;
      std::array<Nodes, 4> d = n;
      for (auto& [x, bwd] : d[1]) {
        const auto f = n[0].find(x);
        const std::int64_t seq = kind == LayerKind::PostProcess && I.enc_dec ? 0 : x[1];
        bwd = f == n[0].end() ? kNaN : bwd + f->second * recompute_share(I.model, kind, to, x[0], seq, x[2]);
      }
      const bool layer = kind == LayerKind::Encoder || kind == LayerKind::Decoder;
      for (int field : {2, 3}) {
        for (auto& [x, value] : d[static_cast<std::size_t>(field)]) {
          if (!layer) continue;
          double delta = kNaN;
          if (I.fallback != nullptr) {
            Query q;
            q.kind = kind;
            q.tp = tp;
            q.mbs = x[0];
            q.seq = x[1];
            q.dec_seq = x[2];
            try {
              const LayerCost a = I.fallback->query(q);
              q.recompute = to;
              const LayerCost b = I.fallback->query(q);
              delta = field == 2 ? b.stored_bytes - a.stored_bytes
                                 : (b.stored_bytes + b.peak_bytes) - (a.stored_bytes + a.peak_bytes);
            } catch (const InvalidArgument&) {
            }
          }
          value = value + delta < 0 ? 0.0 : value + delta;  // NaN (unknown) stays NaN
        }
      }
      Grids g;
      const int dims = dims_of(kind);
      g.fwd = build(d[0], dims);
      g.bwd = build(d[1], dims);
      g.stored = build(d[2], dims);
      g.peak = build(d[3], dims);
      g.derived = true;
      I.grids.emplace(Key{kind, tp, to}, std::move(g));
    }
  }
  I.comm = CommModel::from_device(I.device);
  I.profile = std::move(profile);
}

LinearProfiledCostModel::~LinearProfiledCostModel() = default;

const ModelSpec& LinearProfiledCostModel::model() const { return impl_->model; }
const DeviceSpec& LinearProfiledCostModel::device() const { return impl_->device; }
const CommModel& LinearProfiledCostModel::comm() const { return impl_->comm; }

AttentionKernel LinearProfiledCostModel::attention() const { return impl_->profile.kernel(); }

std::string LinearProfiledCostModel::describe() const {
  const auto& p = impl_->profile;
  return fmt::format("profiled, DynaPipe's linear interpolation ({} points in {} grids from {} file{}; fallback {})",
                     p.points.size(), impl_->grids.size(), p.sources.size(), p.sources.size() == 1 ? "" : "s",
                     impl_->fallback ? "analytic" : "none");
}

double LinearProfiledCostModel::layer_param_bytes(LayerKind kind, std::int64_t tp) const {
  return profile_param_bytes(impl_->profile, kind, tp);
}

bool LinearProfiledCostModel::derived(LayerKind kind, std::int64_t tp, Recompute rc) const {
  const Grids* g = impl_->find(kind, tp, rc);
  return g != nullptr && g->derived;
}

LengthUse LinearProfiledCostModel::lengths_used(LayerKind kind) const {
  const Impl& I = *impl_;
  LengthUse u{false, false};
  switch (kind) {
    case LayerKind::Embedding: break;
    case LayerKind::Encoder: u.seq = true; break;
    case LayerKind::Decoder: u.seq = u.dec_seq = true; break;
    case LayerKind::PostProcess: (I.enc_dec ? u.dec_seq : u.seq) = true; break;
  }
  if (I.fallback) {
    const LengthUse f = I.fallback->lengths_used(kind);
    u.seq = u.seq || f.seq;
    u.dec_seq = u.dec_seq || f.dec_seq;
  }
  return u;
}

LayerCost LinearProfiledCostModel::query(const Query& q) const {
  const Impl& I = *impl_;
  if (q.attention.prefix_tokens != 0 || q.attention.prefix != 0) {
    PACKPIPE_CHECK_ARG(I.fallback != nullptr, "a row with slices needs the analytic fallback for the cost of its prefix");
    const Query base = without_prefix(q);
    return add_prefix_cost(query(base), I.fallback->query(q), I.fallback->query(base));
  }
  PACKPIPE_CHECK_ARG(q.mbs > 0, "mbs must be positive, found {}", q.mbs);
  PACKPIPE_CHECK_ARG(q.tp > 0, "tp must be positive, found {}", q.tp);
  PACKPIPE_CHECK_ARG(q.num_layers > 0, "num_layers must be positive, found {}", q.num_layers);
  PACKPIPE_CHECK_ARG(q.seq >= 0 && q.dec_seq >= 0, "seq and dec_seq must not be negative, found {} and {}", q.seq,
                     q.dec_seq);
  check_query_limits(q, q.mbs);
  PACKPIPE_CHECK_ARG(q.kind != LayerKind::Decoder || I.enc_dec, "model '{}' is decoder-only: it has no decoder layers",
                     I.model.name);
  const bool dec_tokens = q.kind == LayerKind::Decoder || (I.enc_dec && q.kind == LayerKind::PostProcess);
  PACKPIPE_CHECK_ARG(!dec_tokens || q.dec_seq > 0, "dec_seq must be positive for {} layers of '{}', found {}",
                     layer_kind_name(q.kind), I.model.name, q.dec_seq);
  PACKPIPE_CHECK_ARG((I.enc_dec && q.kind == LayerKind::PostProcess) || q.seq > 0, "seq must be positive, found {}",
                     q.seq);
  const Grids* g = I.find(q.kind, q.tp, q.recompute);
  if (g == nullptr) {
    PACKPIPE_CHECK_ARG(I.fallback != nullptr,
                       "{} layers at tp {} with recompute {} are not profiled and there is no analytic fallback",
                       layer_kind_name(q.kind), q.tp, recompute_name(q.recompute));
    return I.fallback->query(q);
  }
  const auto x = I.coords(q);
  const double fwd = g->fwd.at(x.data()), bwd = g->bwd.at(x.data());
  PACKPIPE_CHECK_ARG(!std::isnan(fwd) && !std::isnan(bwd),
                     "{} layers (tp {}, rc {}) at mbs {}, seq {}, dec_seq {}: beyond the profiled grid (DynaPipe "
                     "costs such shapes 1e100)",
                     layer_kind_name(q.kind), q.tp, recompute_name(q.recompute), q.mbs, q.seq, q.dec_seq);
  const double layers = static_cast<double>(q.num_layers);
  const Provenance prov = g->derived ? Provenance::Derived : Provenance::Interpolated;
  LayerCost out;
  // DynaPipe's backward includes the recompute: split it off, the sum unchanged.
  const double share = recompute_share(I.model, q.kind, q.recompute, q.mbs, q.seq, q.dec_seq, q.attention);
  const double recompute = std::min(share * fwd, std::max(0.0, bwd));
  out.forward_ms = fwd * layers;
  out.recompute_ms = recompute * layers;
  out.backward_ms = (bwd - recompute) * layers;
  out.time_source = prov;
  if (!g->stored.empty()) {
    const double stored = g->stored.at(x.data());
    const double peak = g->peak.empty() ? stored : g->peak.at(x.data());
    PACKPIPE_CHECK_ARG(!std::isnan(stored) && !std::isnan(peak),
                       "{} layers (tp {}, rc {}) at mbs {}, seq {}, dec_seq {}: memory beyond the profiled grid "
                       "(DynaPipe costs such shapes 1e100)",
                       layer_kind_name(q.kind), q.tp, recompute_name(q.recompute), q.mbs, q.seq, q.dec_seq);
    out.stored_bytes = stored * layers;
    out.peak_bytes = std::max(0.0, peak - stored);
    out.memory_source = prov;
  } else if (I.fallback) {
    const LayerCost a = I.fallback->query(q);
    out.stored_bytes = a.stored_bytes;
    out.peak_bytes = a.peak_bytes;
    out.memory_source = a.memory_source;
  } else {
    out.stored_bytes = out.peak_bytes = kNaN;
    out.memory_source = Provenance::Analytic;
  }
  const double h = static_cast<double>(I.model.hidden) * static_cast<double>(I.model.bytes_per_param);
  const double b = static_cast<double>(q.mbs);
  switch (q.kind) {
    case LayerKind::PostProcess: out.boundary_bytes = 0; break;
    case LayerKind::Decoder: out.boundary_bytes = b * static_cast<double>(q.seq + q.dec_seq) * h; break;
    default: out.boundary_bytes = b * static_cast<double>(q.seq) * h; break;
  }
  return out;
}

}  // namespace packpipe::costmodel
