#include "costmodel/activation_fit.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "common/errors.h"
#include "costmodel/analytic.h"

namespace packpipe::costmodel {

namespace {

/// One measured stored value (the median of a shape's repeats) with the analytic pieces at it.
struct Measured {
  LayerKind kind = LayerKind::Encoder;
  Recompute rc = Recompute::None;
  std::int64_t tp = 1, mbs = 1, seq = 0, dec = 0;
  double bytes = 0;    ///< profiled
  double closed = 0;   ///< the closed forms (no calibration)
  double feature[3] = {0, 0, 1};  ///< b x tokens x h, attention scores, 1: the calibration terms
  const ModelSpec* model = nullptr;
};

std::vector<Measured> measured(const Profile& profile, const ModelSpec& model) {
  using Key = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
  std::map<Key, std::vector<double>> shapes;
  for (const auto& p : profile.points) {
    if ((p.kind != LayerKind::Encoder && p.kind != LayerKind::Decoder) || p.variant != 0) continue;
    if (!(p.stored_bytes > 0) || !std::isfinite(p.stored_bytes)) continue;
    if (p.kind == LayerKind::Decoder && model.arch != Architecture::EncoderDecoder) continue;
    shapes[{static_cast<int>(p.kind), static_cast<int>(p.rc), p.tp, p.mbs, p.seq, p.dec_seq}].push_back(p.stored_bytes);
  }
  AnalyticOptions token, score;  // one calibration term each, at 1
  token.activation_score_bytes = token.activation_layer_bytes = 0;
  score.activation_token_bytes = score.activation_layer_bytes = 0;
  token.activation_token_bytes = 1;
  score.activation_score_bytes = 1;
  std::vector<Measured> out;
  for (auto& [key, values] : shapes) {
    Measured m;
    int kind = 0, rc = 0;
    std::tie(kind, rc, m.tp, m.mbs, m.seq, m.dec) = key;
    m.kind = static_cast<LayerKind>(kind);
    m.rc = static_cast<Recompute>(rc);
    if (m.seq <= 0 || m.tp <= 0 || model.heads % m.tp != 0) continue;
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    m.bytes = n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
    m.closed = layer_activation_bytes(model, m.kind, m.tp, m.mbs, m.seq, m.dec, m.rc);
    m.feature[0] = layer_activation_bytes(model, m.kind, m.tp, m.mbs, m.seq, m.dec, m.rc, &token) - m.closed;
    m.feature[1] = layer_activation_bytes(model, m.kind, m.tp, m.mbs, m.seq, m.dec, m.rc, &score) - m.closed;
    m.model = &model;
    out.push_back(m);
  }
  return out;
}

double estimate(const Measured& m, const AnalyticOptions& o) {
  return m.closed + o.activation_token_bytes * m.feature[0] + o.activation_score_bytes * m.feature[1] +
         o.activation_layer_bytes;
}

/// Least squares of sum ((closed + c . feature - y) / y)^2 over the features in `mask`; false when
/// the normal equations are singular.
bool solve_masked(const std::vector<Measured>& pts, unsigned mask, double c[3]) {
  int idx[3], k = 0;
  for (int i = 0; i < 3; ++i) {
    if (mask & (1u << i)) idx[k++] = i;
  }
  double A[3][4] = {};
  for (const auto& m : pts) {
    const double w = 1.0 / (m.bytes * m.bytes);
    for (int a = 0; a < k; ++a) {
      for (int b = 0; b < k; ++b) A[a][b] += w * m.feature[idx[a]] * m.feature[idx[b]];
      A[a][k] += w * m.feature[idx[a]] * (m.bytes - m.closed);
    }
  }
  double scale[3];
  for (int a = 0; a < k; ++a) {  // unit diagonal: the features differ by ten orders of magnitude
    scale[a] = A[a][a] > 0 ? std::sqrt(A[a][a]) : 0.0;
    if (!(scale[a] > 0)) return false;
  }
  for (int a = 0; a < k; ++a) {
    for (int b = 0; b < k; ++b) A[a][b] /= scale[a] * scale[b];
    A[a][k] /= scale[a];
  }
  for (int col = 0; col < k; ++col) {  // Gauss-Jordan with partial pivoting
    int piv = col;
    for (int r = col + 1; r < k; ++r) {
      if (std::abs(A[r][col]) > std::abs(A[piv][col])) piv = r;
    }
    if (std::abs(A[piv][col]) < 1e-12) return false;
    std::swap(A[piv], A[col]);
    for (int r = 0; r < k; ++r) {
      if (r == col) continue;
      const double q = A[r][col] / A[col][col];
      for (int j = col; j <= k; ++j) A[r][j] -= q * A[col][j];
    }
  }
  c[0] = c[1] = c[2] = 0;
  for (int a = 0; a < k; ++a) c[idx[a]] = A[a][k] / A[a][a] / scale[a];
  return true;
}

void add_error(ActivationError& g, double err_pct, bool beyond) {
  ++g.points;
  g.mean_abs_pct += std::abs(err_pct);
  g.worst_below_pct = std::min(g.worst_below_pct, err_pct);
  g.worst_above_pct = std::max(g.worst_above_pct, err_pct);
  if (beyond) ++g.beyond_margin;
}

}  // namespace

double activation_margin_bytes(const ModelSpec& model, LayerKind kind, std::int64_t mbs, std::int64_t seq,
                               std::int64_t dec_seq, double profiled_bytes) {
  const double tokens = static_cast<double>(kind == LayerKind::Decoder ? dec_seq : seq);
  const double output = static_cast<double>(model.bytes_per_param) * static_cast<double>(mbs) * tokens *
                        static_cast<double>(model.hidden);
  return kActivationMarginRelative * profiled_bytes + kActivationMarginOutput * output + kActivationMarginBytes;
}

std::size_t activation_points(const Profile& profile, const ModelSpec& model) { return measured(profile, model).size(); }

ActivationReport activation_error(const Profile& profile, const ModelSpec& model, const AnalyticOptions& options) {
  const std::vector<Measured> pts = measured(profile, model);
  PACKPIPE_CHECK_ARG(!pts.empty(), "profile of '{}' measures no stored activations of encoder or decoder layers",
                     profile.model.empty() ? model.name : profile.model);
  ActivationReport r;
  r.model = model.name;
  r.all.kind = pts.front().kind;
  r.all.rc = pts.front().rc;
  std::map<std::pair<int, int>, ActivationError> groups;
  for (const auto& m : pts) {
    const double est = estimate(m, options);
    const double err = 100.0 * (est / m.bytes - 1.0);
    const bool beyond = est < m.bytes - activation_margin_bytes(model, m.kind, m.mbs, m.seq, m.dec, m.bytes);
    ActivationError& g = groups[{static_cast<int>(m.kind), static_cast<int>(m.rc)}];
    g.kind = m.kind;
    g.rc = m.rc;
    add_error(g, err, beyond);
    add_error(r.all, err, beyond);
  }
  for (auto& [key, g] : groups) {
    g.mean_abs_pct /= static_cast<double>(g.points);
    r.groups.push_back(g);
  }
  r.all.mean_abs_pct /= static_cast<double>(r.all.points);
  return r;
}

AnalyticOptions fit_activation(const std::vector<ActivationSource>& sources, AnalyticOptions options) {
  std::vector<Measured> pts;
  for (const auto& s : sources) {
    PACKPIPE_CHECK_ARG(s.profile != nullptr && s.model != nullptr, "fit_activation: a source without profile or model");
    const std::vector<Measured> one = measured(*s.profile, *s.model);
    pts.insert(pts.end(), one.begin(), one.end());
  }
  PACKPIPE_CHECK_ARG(pts.size() >= kMinActivationPoints,
                     "fitting the activation calibration needs at least {} measured stored activations of encoder or "
                     "decoder layers, found {}",
                     kMinActivationPoints, pts.size());
  // Non-negative least squares over three terms: the unconstrained optimum when it is
  // non-negative, else the best fit over the subsets of terms whose coefficients are.
  double best[3] = {0, 0, 0};
  double best_obj = std::numeric_limits<double>::infinity();
  for (unsigned mask = 7; mask >= 1; --mask) {
    double c[3];
    if (!solve_masked(pts, mask, c) || c[0] < 0 || c[1] < 0 || c[2] < 0) continue;
    double obj = 0;
    for (const auto& m : pts) {
      const double e = (m.closed + c[0] * m.feature[0] + c[1] * m.feature[1] + c[2]) / m.bytes - 1.0;
      obj += e * e;
    }
    if (obj < best_obj) {
      best_obj = obj;
      std::copy(c, c + 3, best);
    }
  }
  options.activation_token_bytes = best[0];
  options.activation_score_bytes = best[1];
  options.activation_layer_bytes = best[2];
  return options;
}

}  // namespace packpipe::costmodel
