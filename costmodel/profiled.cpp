// ProfiledCostModel: grids of measured shapes, fits with residuals interpolated between them (ratio
// or difference form, chosen per grid by leave-one-out), and the nested leave-one-out validation that
// measures them against plain linear interpolation.
#include "costmodel/profiled.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace packpipe::costmodel {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double median_of(std::vector<double>& v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using GridKey = std::tuple<LayerKind, std::int64_t, Recompute, std::int64_t>;  // kind, tp, rc, variant
using Shape = std::tuple<std::int64_t, std::int64_t, std::int64_t>;           // mbs, seq, dec_seq

/// One shape of one grid, repeated measurements resolved to their median.
struct Cell {
  std::int64_t mbs = 0, seq = 0, dec = 0;
  double fwd = kNaN, bwd = kNaN, stored = kNaN, peak = kNaN;
};

std::map<GridKey, std::vector<Cell>> merge_points(const std::vector<ProfilePoint>& points) {
  struct Acc {
    std::vector<double> fwd, bwd, stored, peak;
  };
  std::map<GridKey, std::map<Shape, Acc>> acc;
  for (const auto& p : points) {
    Acc& a = acc[{p.kind, p.tp, p.rc, p.variant}][{p.mbs, p.seq, p.dec_seq}];
    if (!std::isnan(p.fwd_ms)) a.fwd.push_back(p.fwd_ms);
    if (!std::isnan(p.bwd_ms)) a.bwd.push_back(p.bwd_ms);
    if (!std::isnan(p.stored_bytes)) a.stored.push_back(p.stored_bytes);
    if (!std::isnan(p.peak_bytes)) a.peak.push_back(p.peak_bytes);
  }
  std::map<GridKey, std::vector<Cell>> out;
  for (auto& [key, shapes] : acc) {
    auto& cells = out[key];
    for (auto& [shape, a] : shapes) {
      Cell c;
      std::tie(c.mbs, c.seq, c.dec) = shape;
      c.fwd = median_of(a.fwd);
      c.bwd = median_of(a.bwd);
      c.stored = median_of(a.stored);
      c.peak = median_of(a.peak);
      cells.push_back(c);
    }
  }
  return out;
}

// ---- fits ---------------------------------------------------------------------------------------
//
// Every modelled quantity y of a grid (forward, backward, stored, peak) is a fitted curve F of a few
// shape features combined with a residual that is interpolated between grid points, in one of two
// forms chosen per grid by cross-validation on the grid's own points (choose_forms):
//   ratio form:      F fitted by non-negative least squares in relative error, y = F * r,
//                    r = measured / fitted interpolated (the efficiency relative to the curve);
//   difference form: F fitted by non-negative least squares in absolute error, y = F + e,
//                    e = measured - fitted interpolated (offsets that do not scale with the shape).
// Time features: 1 (launch latency), matrix-product GFLOP, attention GFLOP (forward_flops), so
// F / FLOPs is an efficiency curve that falls for small shapes. Memory features: 1, b*L, b*L^2
// (decoder: 1, b*d, b*s, b*d^2, b*d*s). Design and measurements: docs/design/003-costmodel-profiles.md.

constexpr int kMaxFeatures = 5;

/// The four modelled quantities: forward, backward (time), stored, peak (memory).
constexpr int kFields = 4;
double Cell::*const kField[kFields] = {&Cell::fwd, &Cell::bwd, &Cell::stored, &Cell::peak};
inline bool is_time_field(int f) { return f < 2; }

/// Fields that share one form: time (forward and backward together), stored, peak.
constexpr int kGroups = 3;
inline int group_of(int f) { return f < 2 ? 0 : f - 1; }

enum class Form : std::uint8_t { Ratio = 0, Difference = 1 };
constexpr int kForms = 2;

struct Featurizer {
  const ModelSpec* m = nullptr;
  LayerKind kind = LayerKind::Encoder;

  /// FLOPs of the layer (whole layer, all TP ranks) at a profile shape, with the size open:
  /// shape(s, d).at(b) is forward_flops at (b, s, d) as the features read the lengths.
  FlopsShape shape(std::int64_t s, std::int64_t d) const {
    const bool enc_dec = m->arch == Architecture::EncoderDecoder;
    if (kind == LayerKind::PostProcess) {
      return flops_shape(*m, kind, enc_dec ? std::max<std::int64_t>(s, 1) : s, enc_dec ? (d > 0 ? d : s) : 0);
    }
    if (kind == LayerKind::Decoder) return flops_shape(*m, kind, s, d);
    return flops_shape(*m, kind, s > 0 ? s : d, d);
  }
  int time(std::int64_t b, std::int64_t s, std::int64_t d, double* x) const { return time_at(shape(s, d), b, s, d, x); }
  /// time() with the FLOP shape of (s, d) given (a batch of sizes shares it).
  int time_at(const FlopsShape& fs, std::int64_t b, std::int64_t s, std::int64_t d, double* x) const {
    const LayerFlops f = fs.at(static_cast<double>(b));
    x[0] = 1.0;
    if (f.total() <= 0) {  // the embedding is a gather: tokens instead of FLOPs
      x[1] = static_cast<double>(b) * static_cast<double>(std::max(s, d)) * 1e-3;
      return 2;
    }
    x[1] = f.matmul * 1e-9;
    if (f.attention <= 0) return 2;
    x[2] = f.attention * 1e-9;
    return 3;
  }
  int memory(std::int64_t bi, std::int64_t si, std::int64_t di, double* x) const {
    const double b = static_cast<double>(bi), s = static_cast<double>(si), d = static_cast<double>(di);
    x[0] = 1.0;  // buffers that do not scale with the shape
    if (kind == LayerKind::Decoder) {
      x[1] = b * d;
      x[2] = b * s;
      x[3] = b * d * d;
      x[4] = b * d * s;
      return 5;
    }
    const double L = s > 0 ? s : d;
    x[1] = b * L;
    x[2] = b * L * L;
    return 3;
  }
  /// time() of varlen query `q`: the FLOPs of its tokens and attention sums (tokens for the
  /// embedding's gather).
  int time_varlen(const Query& q, double* x) const {
    const FlopsShape fs = shape(q.seq, q.dec_seq);
    const LayerFlops f = fs.at(static_cast<double>(q.mbs), q.attention);
    x[0] = 1.0;
    if (f.total() <= 0) {
      x[1] = static_cast<double>(q.mbs) * static_cast<double>(std::max(q.seq, q.dec_seq)) * 1e-3;
      return 2;
    }
    x[1] = f.matmul * 1e-9;
    if (f.attention <= 0) return 2;
    x[2] = f.attention * 1e-9;
    return 3;
  }
  /// memory() of varlen query `q`: its tokens and attention sums in place of b L and b L^2.
  int memory_varlen(const Query& q, bool seq_axis, double* x) const {
    const double rows = static_cast<double>(q.mbs);
    x[0] = 1.0;
    if (kind == LayerKind::Decoder) {
      x[1] = rows * static_cast<double>(q.dec_seq);
      x[2] = rows * static_cast<double>(q.seq);
      x[3] = static_cast<double>(q.attention.dec_self);
      x[4] = static_cast<double>(q.attention.cross);
      return 5;
    }
    const bool dec_side = !seq_axis;  // an encoder-decoder post-process: the decoder tokens
    x[1] = rows * static_cast<double>(dec_side ? q.dec_seq : q.seq);
    x[2] = static_cast<double>(dec_side ? q.attention.dec_self : q.attention.self);
    return 3;
  }
  int features(bool is_time, std::int64_t b, std::int64_t s, std::int64_t d, double* x) const {
    return is_time ? time(b, s, d, x) : memory(b, s, d, x);
  }
};

struct Fit {
  int k = 0;
  double c[kMaxFeatures] = {0, 0, 0, 0, 0};
  Form form = Form::Ratio;
  double floor = 0;  ///< difference form: the least answer (time: the smallest value fitted; memory: 0)
  double eval(const double* x, int kx) const {
    double y = 0;
    for (int i = 0; i < std::min(k, kx); ++i) y += c[i] * x[i];
    return y;
  }
  /// Residual of the measured value y at features x: y / F (ratio form) or y - F (difference form).
  double residual(const double* x, int kx, double y) const {
    const double f = eval(x, kx);
    return form == Form::Ratio ? y / f : y - f;
  }
  /// The answer at features x from the residual r interpolated there; NaN stays NaN.
  double apply(const double* x, int kx, double r) const {
    const double f = eval(x, kx);
    if (form == Form::Ratio) return f * r;
    const double y = f + r;
    return y < floor ? floor : y;
  }
};

/// Normal equations of weighted least squares: A = sum w x x^T, v = sum w y x, with w = 1 / y^2
/// (relative error, ratio form) or 1 (absolute error, difference form).
struct FitSums {
  int k = 0;
  double A[kMaxFeatures][kMaxFeatures] = {};
  double v[kMaxFeatures] = {};
  std::size_t n = 0;
  /// Adds (sign 1) or removes (sign -1) the point (x, y).
  void add(const double* x, int kx, double y, Form form, double sign) {
    k = std::max(k, kx);
    const double w = sign * (form == Form::Ratio ? 1.0 / (y * y) : 1.0);
    for (int i = 0; i < kx; ++i) {
      for (int j = 0; j < kx; ++j) A[i][j] += w * x[i] * x[j];
      v[i] += w * y * x[i];
    }
    n = sign > 0 ? n + 1 : n - 1;
  }
};

/// Solves the normal equations restricted to the features in `mask`; false when singular.
bool solve_subset(const FitSums& s, unsigned mask, Fit& f) {
  int idx[kMaxFeatures], m = 0;
  for (int i = 0; i < s.k; ++i) {
    if (mask & (1u << i)) idx[m++] = i;
  }
  double M[kMaxFeatures][kMaxFeatures + 1];
  double scale[kMaxFeatures];
  for (int a = 0; a < m; ++a) scale[a] = s.A[idx[a]][idx[a]] > 0 ? std::sqrt(s.A[idx[a]][idx[a]]) : 0.0;
  for (int a = 0; a < m; ++a) {
    if (!(scale[a] > 0)) return false;
    for (int b = 0; b < m; ++b) M[a][b] = s.A[idx[a]][idx[b]] / (scale[a] * scale[b]);
    M[a][m] = s.v[idx[a]] / scale[a];
  }
  for (int col = 0; col < m; ++col) {
    int piv = col;
    for (int r = col + 1; r < m; ++r) {
      if (std::abs(M[r][col]) > std::abs(M[piv][col])) piv = r;
    }
    if (std::abs(M[piv][col]) < 1e-10) return false;
    if (piv != col) {
      for (int j = 0; j <= m; ++j) std::swap(M[piv][j], M[col][j]);
    }
    for (int r = 0; r < m; ++r) {
      if (r == col) continue;
      const double q = M[r][col] / M[col][col];
      for (int j = col; j <= m; ++j) M[r][j] -= q * M[col][j];
    }
  }
  f = Fit{};
  f.k = s.k;
  for (int a = 0; a < m; ++a) f.c[idx[a]] = M[a][m] / M[a][a] / scale[a];
  return true;
}

/// Non-negative least squares by enumerating feature subsets (at most 5 features): the best fit
/// whose coefficients are all >= 0, so the fit is positive wherever the features are.
Fit solve(const FitSums& s) {
  Fit best;
  best.k = s.k;
  if (s.k == 0 || s.n == 0) return best;
  // The objective is convex: a non-negative solution on all features is the optimum.
  const unsigned full = (1u << s.k) - 1;
  if (solve_subset(s, full, best) && std::all_of(best.c, best.c + s.k, [](double c) { return c >= 0; })) return best;
  best = Fit{};
  best.k = s.k;
  double best_obj = std::numeric_limits<double>::infinity();
  for (unsigned mask = 1; mask < full; ++mask) {
    Fit f;
    if (!solve_subset(s, mask, f)) continue;
    if (!std::all_of(f.c, f.c + s.k, [](double c) { return c >= 0; })) continue;
    // sum w (c.x - y)^2 up to a constant: c^T A c - 2 c.v
    double obj = 0;
    for (int i = 0; i < s.k; ++i) {
      obj -= 2 * f.c[i] * s.v[i];
      for (int j = 0; j < s.k; ++j) obj += f.c[i] * s.A[i][j] * f.c[j];
    }
    if (obj < best_obj) {
      best_obj = obj;
      best = f;
    }
  }
  return best;
}

/// The cells of one grid with their time and memory features, computed once.
struct Points {
  const std::vector<Cell>* cells = nullptr;
  std::vector<std::array<double, kMaxFeatures>> x[2];  // [0] time, [1] memory
  std::vector<int> k[2];

  Points(const Featurizer& fz, const std::vector<Cell>& cs) : cells(&cs) {
    for (int t = 0; t < 2; ++t) {
      x[t].assign(cs.size(), std::array<double, kMaxFeatures>{});
      k[t].assign(cs.size(), 0);
      for (std::size_t i = 0; i < cs.size(); ++i) {
        k[t][i] = fz.features(t == 0, cs[i].mbs, cs[i].seq, cs[i].dec, x[t][i].data());
      }
    }
  }
  std::size_t size() const { return cells->size(); }
  const double* xs(int field, std::size_t i) const { return x[is_time_field(field) ? 0 : 1][i].data(); }
  int ks(int field, std::size_t i) const { return k[is_time_field(field) ? 0 : 1][i]; }
  double y(int field, std::size_t i) const { return (*cells)[i].*kField[field]; }
  double eval(const Fit& f, int field, std::size_t i) const { return f.eval(xs(field, i), ks(field, i)); }
};

/// Sums of every field in both forms over a set of cells, and each field's smallest value there.
struct GridSums {
  FitSums s[kFields][kForms];
  double least[kFields] = {kInf, kInf, kInf, kInf};

  GridSums(const Points& p, const std::vector<char>& in) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (in[i]) add(p, i, 1.0);
    }
  }
  /// Adds (sign 1) or removes (sign -1) cell i.
  void add(const Points& p, std::size_t i, double sign) {
    for (int f = 0; f < kFields; ++f) {
      const double y = p.y(f, i);
      if (!(y > 0)) continue;
      for (int m = 0; m < kForms; ++m) s[f][m].add(p.xs(f, i), p.ks(f, i), y, static_cast<Form>(m), sign);
      if (sign > 0) least[f] = std::min(least[f], y);
    }
  }
  /// Recomputes the smallest values over the cells i with use(i) (removing a cell can raise them).
  template <typename Use>
  void recompute_least(const Points& p, const Use& use) {
    for (int f = 0; f < kFields; ++f) least[f] = kInf;
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (!use(i)) continue;
      for (int f = 0; f < kFields; ++f) {
        const double y = p.y(f, i);
        if (y > 0) least[f] = std::min(least[f], y);
      }
    }
  }
  /// The fit of field f in form m.
  Fit fit(int f, Form m) const {
    const FitSums& fs = s[f][static_cast<int>(m)];
    Fit out = solve(fs);
    out.form = m;
    out.floor = m == Form::Difference && is_time_field(f) && fs.n > 0 ? least[f] : 0.0;
    return out;
  }
};

// ---- choosing the form: leave-one-out on the grid's own points ----------------------------------

/// One removal of the leave-one-out protocol: point i, interior along `axis` (0 mbs: i alone is
/// removed; 1 seq, 2 dec_seq: its whole slice), with neighbours lo and hi at the adjacent values.
struct Removal {
  std::size_t i = 0, lo = 0, hi = 0;
  int axis = 0;
  double tlog = 0;  ///< position of i between lo and hi, linear in log2 of the axis
  double tlin = 0;  ///< the same, linear in the axis value (linear interpolation)
};

std::int64_t coord(const Cell& c, int axis) { return axis == 0 ? c.mbs : (axis == 1 ? c.seq : c.dec); }

/// Whether removal r takes cell k out of the fit.
bool removes(const std::vector<Cell>& cells, const Removal& r, std::size_t k) {
  return r.axis == 0 ? k == r.i : coord(cells[k], r.axis) == coord(cells[r.i], r.axis);
}

/// The removals among the cells i with in[i] (an axis counts with at least three values among
/// them), by axis and then cell order.
std::vector<Removal> removals(const std::vector<Cell>& cells, const std::vector<char>& in) {
  std::vector<Removal> out;
  std::map<Shape, std::size_t> index;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    if (in[i]) index[{cells[i].mbs, cells[i].seq, cells[i].dec}] = i;
  }
  for (int axis = 0; axis < 3; ++axis) {
    std::set<std::int64_t> vs;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      if (in[i]) vs.insert(coord(cells[i], axis));
    }
    const std::vector<std::int64_t> vals(vs.begin(), vs.end());
    if (vals.size() < 3) continue;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      if (!in[i]) continue;
      const Cell& c = cells[i];
      const auto j = static_cast<std::size_t>(std::lower_bound(vals.begin(), vals.end(), coord(c, axis)) - vals.begin());
      if (j == 0 || j + 1 == vals.size()) continue;
      auto at = [&](std::int64_t x) -> std::size_t {
        Shape sh{c.mbs, c.seq, c.dec};
        (axis == 0 ? std::get<0>(sh) : (axis == 1 ? std::get<1>(sh) : std::get<2>(sh))) = x;
        const auto it = index.find(sh);
        return it == index.end() ? cells.size() : it->second;
      };
      Removal r;
      r.i = i;
      r.axis = axis;
      r.lo = at(vals[j - 1]);
      r.hi = at(vals[j + 1]);
      if (r.lo == cells.size() || r.hi == cells.size()) continue;
      const double x = static_cast<double>(coord(c, axis)), xl = static_cast<double>(vals[j - 1]),
                   xh = static_cast<double>(vals[j + 1]);
      r.tlin = (x - xl) / (xh - xl);
      r.tlog = (std::log2(x) - std::log2(xl)) / (std::log2(xh) - std::log2(xl));
      out.push_back(r);
    }
  }
  return out;
}

/// Linear interpolation of the raw values of the removal's neighbours (DynaPipe's rule).
double predict_linear(const Points& p, int field, const Removal& r) {
  const double yl = p.y(field, r.lo), yh = p.y(field, r.hi);
  return yl + r.tlin * (yh - yl);
}

/// Our prediction of the removed point from its neighbours with `fit` made without it: the fit at
/// the point combined with the neighbours' residuals interpolated in log2 of the axis. A ratio
/// fit that is not positive there falls back to the linear rule.
double predict(const Points& p, int field, const Fit& fit, const Removal& r) {
  const double fl = p.eval(fit, field, r.lo), fh = p.eval(fit, field, r.hi), fc = p.eval(fit, field, r.i);
  if (fit.form == Form::Ratio && !(fl > 0 && fh > 0 && fc > 0)) return predict_linear(p, field, r);
  const double el = fit.residual(p.xs(field, r.lo), p.ks(field, r.lo), p.y(field, r.lo));
  const double eh = fit.residual(p.xs(field, r.hi), p.ks(field, r.hi), p.y(field, r.hi));
  return fit.apply(p.xs(field, r.i), p.ks(field, r.i), el + r.tlog * (eh - el));
}

/// Whether the removal can be scored on `field`: the point and both neighbours measured.
bool scorable(const Points& p, int field, const Removal& r) {
  return p.y(field, r.i) > 0 && p.y(field, r.lo) > 0 && p.y(field, r.hi) > 0;
}

/// The form of each field group for the cells i with in[i] (`base`: their sums): leave-one-out
/// over their removals, the form with the smaller sum of |predicted - measured| / measured. Ties
/// (no removal, or a few points that both fits pass through) go to the difference form.
std::array<Form, kGroups> choose_forms(const Points& p, const std::vector<char>& in, const GridSums& base) {
  const std::vector<Cell>& cells = *p.cells;
  double score[kGroups][kForms] = {};
  // Fits without a removed slice serve every point of that slice.
  std::map<std::pair<int, std::int64_t>, std::array<Fit, kFields * kForms>> slice_fits;
  std::array<Fit, kFields * kForms> fits;
  for (const Removal& r : removals(cells, in)) {
    auto refit = [&]() {
      GridSums s = base;
      auto use = [&](std::size_t k) { return in[k] && !removes(cells, r, k); };
      for (std::size_t k = 0; k < cells.size(); ++k) {
        if (in[k] && !use(k)) s.add(p, k, -1.0);
      }
      s.recompute_least(p, use);
      for (int f = 0; f < kFields; ++f) {
        for (int m = 0; m < kForms; ++m) fits[static_cast<std::size_t>(f * kForms + m)] = s.fit(f, static_cast<Form>(m));
      }
    };
    if (r.axis == 0) {
      refit();
    } else {
      const auto slice = std::make_pair(r.axis, coord(cells[r.i], r.axis));
      auto it = slice_fits.find(slice);
      if (it == slice_fits.end()) {
        refit();
        it = slice_fits.emplace(slice, fits).first;
      }
      fits = it->second;
    }
    for (int f = 0; f < kFields; ++f) {
      if (!scorable(p, f, r)) continue;
      const double y = p.y(f, r.i);
      for (int m = 0; m < kForms; ++m) {
        score[group_of(f)][m] += std::abs(predict(p, f, fits[static_cast<std::size_t>(f * kForms + m)], r) - y) / y;
      }
    }
  }
  std::array<Form, kGroups> out;
  for (int g = 0; g < kGroups; ++g) {
    // Rounding aside, equal scores are a tie.
    const double ratio = score[g][0], diff = score[g][1];
    out[static_cast<std::size_t>(g)] = ratio < diff - 1e-9 * diff ? Form::Ratio : Form::Difference;
  }
  return out;
}

/// The fits of every field of the grid made of the cells i with in[i], forms by choose_forms.
std::array<Fit, kFields> fit_grid(const Points& p, const std::vector<char>& in) {
  const GridSums base(p, in);
  const std::array<Form, kGroups> forms = choose_forms(p, in, base);
  std::array<Fit, kFields> fits;
  for (int f = 0; f < kFields; ++f) fits[static_cast<std::size_t>(f)] = base.fit(f, forms[static_cast<std::size_t>(group_of(f))]);
  return fits;
}

// ---- grid ---------------------------------------------------------------------------------------

/// Residual of each quantity at one grid node (Fit::residual: ratio or difference; NaN when not
/// measured).
struct Node {
  double r[kFields] = {kNaN, kNaN, kNaN, kNaN};
};

struct Axis {
  std::vector<std::int64_t> v;
  std::vector<double> lg;
  bool used() const { return !(v.size() == 1 && v[0] == 0); }
  std::int64_t max() const { return v.back(); }
};

struct Bracket {
  int i0 = 0, i1 = 0;
  double w1 = 0;
  bool exact = true;
  bool above = false;
  bool below = false;
};

/// Position of x on the sorted axis v (log2 values lg): the two nodes around it and the weight of
/// the upper one, linear in log2 x. With `hint` (batch queries along a growing x), the search
/// starts at *hint (an index with v[*hint] <= x, 0 at first) and leaves the found index there.
/// X is std::int64_t (sizes and lengths) or double (the equivalent dense shape of varlen rows).
template <typename X>
[[gnu::always_inline]] inline Bracket bracket(const std::int64_t* v, const double* lg, int n, X x,
                                              double log2x = kNaN, int* hint = nullptr) {
  Bracket b;
  if (x <= v[0]) {
    b.exact = x == v[0];
    b.below = x < v[0];
    if (n == 1 && b.below) b.above = true;  // one value: no trend known below either
    return b;
  }
  if (x >= v[n - 1]) {
    b.i0 = b.i1 = n - 1;
    b.exact = x == v[n - 1];
    b.above = x > v[n - 1];
    return b;
  }
  // Axes are short (at most a dozen values): a branch-free count beats a binary search here.
  int i = -1;
  if (hint != nullptr) {
    i = *hint;
    while (v[i + 1] <= x) ++i;  // stops below n - 1: x < v[n - 1]
    *hint = i;
  } else {
    for (int k = 0; k < n; ++k) i += v[k] <= x;
  }
  b.i0 = i;
  if (v[i] == x) {
    b.i1 = i;
    return b;
  }
  b.exact = false;
  b.i1 = i + 1;
  const double lx = std::isnan(log2x) ? std::log2(static_cast<double>(x)) : log2x;
  b.w1 = (lx - lg[i]) / (lg[i + 1] - lg[i]);
  return b;
}

struct Grid {
  LayerKind kind = LayerKind::Encoder;
  std::int64_t tp = 1;
  Recompute rc = Recompute::None;
  std::int64_t variant = 0;
  Axis mbs, seq, dec;
  std::vector<int> row_of;     // seq index * dec count + dec index -> row, -1 when absent
  std::vector<int> row_begin;  // into cell_mbs / nodes
  std::vector<int> row_count;
  std::vector<std::int64_t> cell_mbs;
  std::vector<double> cell_lmbs;
  std::vector<Node> nodes;
  Fit fit[kFields];
  bool has[kFields] = {false, false, false, false};
  /// A recompute mode the profile lacks, answered from the no-recompute grid grids[base] of the same
  /// kind and tp (its own axes and cells are empty).
  bool derived = false;
  std::size_t base = 0;
  bool has_time() const { return has[0] || has[1]; }
};

/// Interpolates a row at micro-batch size b; `exact`/`extrap` updated; `hint` as for bracket().
template <typename X>
[[gnu::always_inline]] inline Node row_value(const Grid& g, int row, X b, double log2b, bool& exact,
                                             bool& extrap, int* hint = nullptr) {
  const auto begin = static_cast<std::size_t>(g.row_begin[static_cast<std::size_t>(row)]);
  const int n = g.row_count[static_cast<std::size_t>(row)];
  const Bracket br = bracket(g.cell_mbs.data() + begin, g.cell_lmbs.data() + begin, n, b, log2b, hint);
  if (!br.exact) exact = false;
  if (br.above || (br.below && g.cell_mbs[begin] != g.mbs.v[0])) extrap = true;
  const Node& a = g.nodes[begin + static_cast<std::size_t>(br.i0)];
  if (br.i0 == br.i1) return a;
  const Node& c = g.nodes[begin + static_cast<std::size_t>(br.i1)];
  Node out;
  for (int f = 0; f < kFields; ++f) out.r[f] = a.r[f] + br.w1 * (c.r[f] - a.r[f]);
  return out;
}

Axis make_axis(const std::set<std::int64_t>& values) {
  Axis a;
  a.v.assign(values.begin(), values.end());
  for (auto x : a.v) a.lg.push_back(x > 0 ? std::log2(static_cast<double>(x)) : 0.0);
  return a;
}

Grid build_grid(const GridKey& key, const std::vector<Cell>& cells, const ModelSpec& m) {
  Grid g;
  std::tie(g.kind, g.tp, g.rc, g.variant) = key;
  const Featurizer fz{&m, g.kind};
  std::set<std::int64_t> ms, ss, ds;
  for (const auto& c : cells) {
    ms.insert(c.mbs);
    ss.insert(c.seq);
    ds.insert(c.dec);
  }
  g.mbs = make_axis(ms);
  g.seq = make_axis(ss);
  g.dec = make_axis(ds);
  const Points pts(fz, cells);
  const std::array<Fit, kFields> fits = fit_grid(pts, std::vector<char>(cells.size(), 1));
  for (int f = 0; f < kFields; ++f) {
    g.has[f] = std::any_of(cells.begin(), cells.end(), [f](const Cell& c) { return c.*kField[f] > 0; });
    g.fit[f] = fits[static_cast<std::size_t>(f)];
  }
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<const Cell*>> rows;
  for (const auto& c : cells) rows[{c.seq, c.dec}].push_back(&c);
  g.row_of.assign(g.seq.v.size() * g.dec.v.size(), -1);
  for (auto& [sd, rcells] : rows) {
    std::sort(rcells.begin(), rcells.end(), [](const Cell* a, const Cell* b) { return a->mbs < b->mbs; });
    const auto si = std::lower_bound(g.seq.v.begin(), g.seq.v.end(), sd.first) - g.seq.v.begin();
    const auto di = std::lower_bound(g.dec.v.begin(), g.dec.v.end(), sd.second) - g.dec.v.begin();
    g.row_of[static_cast<std::size_t>(si) * g.dec.v.size() + static_cast<std::size_t>(di)] =
        static_cast<int>(g.row_begin.size());
    g.row_begin.push_back(static_cast<int>(g.cell_mbs.size()));
    g.row_count.push_back(static_cast<int>(rcells.size()));
    for (const Cell* c : rcells) {
      Node n;
      const auto i = static_cast<std::size_t>(c - cells.data());
      for (int f = 0; f < kFields; ++f) {
        const double y = pts.y(f, i);
        if (g.has[f] && y > 0) n.r[f] = g.fit[f].residual(pts.xs(f, i), pts.ks(f, i), y);
      }
      g.cell_mbs.push_back(c->mbs);
      g.cell_lmbs.push_back(std::log2(static_cast<double>(c->mbs)));
      g.nodes.push_back(n);
    }
  }
  return g;
}

}  // namespace

// ---- the model ----------------------------------------------------------------------------------

struct ProfiledCostModel::Impl {
  Profile profile;
  ModelSpec model;
  DeviceSpec device;
  CommModel comm;
  std::unique_ptr<CostModel> fallback;
  std::vector<Grid> grids;
  std::vector<AlphaBetaFit> fits;

  /// Variant-0 grids by (kind, recompute, tp) for tp < kDirectTp (null: none); built once the
  /// grids are final, so a query finds its grid with one load instead of a scan.
  static constexpr std::int64_t kDirectTp = 65;
  std::vector<const Grid*> direct;

  const Grid* scan(LayerKind k, std::int64_t tp, Recompute rc) const {
    for (const auto& g : grids) {
      if (g.kind == k && g.tp == tp && g.rc == rc && g.variant == 0) return &g;
    }
    return nullptr;
  }
  static std::size_t slot(LayerKind k, std::int64_t tp, Recompute rc) {
    return (static_cast<std::size_t>(k) * 3 + static_cast<std::size_t>(rc)) * kDirectTp + static_cast<std::size_t>(tp);
  }
  void index_grids() {
    direct.assign(4 * 3 * kDirectTp, nullptr);
    for (auto k : {LayerKind::Embedding, LayerKind::Encoder, LayerKind::Decoder, LayerKind::PostProcess}) {
      for (auto rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        for (std::int64_t tp = 1; tp < kDirectTp; ++tp) direct[slot(k, tp, rc)] = scan(k, tp, rc);
      }
    }
  }
  const Grid* find(LayerKind k, std::int64_t tp, Recompute rc) const {
    const bool in_table = tp > 0 && tp < kDirectTp && static_cast<unsigned>(k) < 4 && static_cast<unsigned>(rc) < 3;
    return in_table ? direct[slot(k, tp, rc)] : scan(k, tp, rc);
  }
};

ProfiledCostModel::ProfiledCostModel(Profile profile, ModelSpec model, DeviceSpec device,
                                     std::unique_ptr<CostModel> fallback)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.model = std::move(model);
  I.device = std::move(device);
  I.fallback = std::move(fallback);
  const std::string sources = profile_sources(profile);
  PACKPIPE_CHECK_ARG(I.fallback == nullptr || I.fallback->attention() == profile.kernel(),
                     "the profile ({}) was measured with {} attention, its fallback answers for {}: give the fallback "
                     "the profile's kernel (ModelSpec::attention), as make_profiled_cost_model does",
                     sources, attention_kernel_name(profile.kernel()), attention_kernel_name(I.fallback->attention()));
  check_profile_for(profile, I.model);
  const auto merged = merge_points(profile.points);
  for (const auto& [key, cells] : merged) I.grids.push_back(build_grid(key, cells, I.model));
  // A grid with times must have both: a missing backward would be costed as 0 ms, a missing
  // forward as NaN.
  for (const auto& g : I.grids) {
    if (!g.has_time() || (g.has[0] && g.has[1])) continue;
    PACKPIPE_THROW(InvalidArgument,
                   "profile {}: {} layers (tp {}, rc {}) have {} times but no {} times (missing or all zero); a "
                   "profile must measure both, so add the missing rows or file",
                   sources, layer_kind_name(g.kind), g.tp, recompute_name(g.rc),
                   g.has[0] ? "forward" : "backward", g.has[0] ? "backward" : "forward");
  }
  // Recompute modes the profile lacks, of a kind and tp it measures without recompute: derived
  // from that grid at query time (the profiled forward recomputed), not answered by the fallback.
  const std::size_t measured = I.grids.size();
  for (std::size_t i = 0; i < measured; ++i) {
    if (I.grids[i].rc != Recompute::None || I.grids[i].variant != 0 || !I.grids[i].has_time()) continue;
    for (Recompute to : {Recompute::Selective, Recompute::Full}) {
      const Grid& none = I.grids[i];  // (again after each push_back)
      if (merged.count({none.kind, none.tp, to, 0}) != 0) continue;  // measured (or its memory only): kept
      Grid g;
      g.kind = none.kind;
      g.tp = none.tp;
      g.rc = to;
      std::copy(std::begin(none.has), std::end(none.has), std::begin(g.has));
      g.derived = true;
      g.base = i;
      I.grids.push_back(std::move(g));
    }
  }
  I.index_grids();
  // Communication: device figures, replaced by measured p2p where the profile has it.
  I.comm.intra_latency_ms = I.device.intra_node_latency_us / 1e3;
  I.comm.intra_bytes_per_ms = I.device.intra_node_gbps * 1e6;
  I.comm.inter_latency_ms = I.device.inter_node_latency_us / 1e3;
  I.comm.inter_bytes_per_ms = I.device.inter_node_gbps * 1e6;
  I.fits = fit_alpha_beta(profile.comm);
  for (const auto& f : I.fits) {
    if (f.collective != "p2p" || f.bytes_per_ms <= 0) continue;
    (f.inter_node ? I.comm.inter_latency_ms : I.comm.intra_latency_ms) = f.alpha_ms;
    (f.inter_node ? I.comm.inter_bytes_per_ms : I.comm.intra_bytes_per_ms) = f.bytes_per_ms;
  }
  I.profile = std::move(profile);
}

ProfiledCostModel::~ProfiledCostModel() = default;

const ModelSpec& ProfiledCostModel::model() const { return impl_->model; }
const DeviceSpec& ProfiledCostModel::device() const { return impl_->device; }
const CommModel& ProfiledCostModel::comm() const { return impl_->comm; }
const Profile& ProfiledCostModel::profile() const { return impl_->profile; }
AttentionKernel ProfiledCostModel::attention() const { return impl_->profile.kernel(); }
const std::vector<AlphaBetaFit>& ProfiledCostModel::comm_fits() const { return impl_->fits; }

bool ProfiledCostModel::profiled(LayerKind kind, std::int64_t tp, Recompute rc) const {
  const Grid* g = impl_->find(kind, tp, rc);
  return g != nullptr && g->has_time() && !g->derived;
}

double ProfiledCostModel::layer_param_bytes(LayerKind kind, std::int64_t tp) const {
  return profile_param_bytes(impl_->profile, kind, tp);
}

bool ProfiledCostModel::derived(LayerKind kind, std::int64_t tp, Recompute rc) const {
  const Grid* g = impl_->find(kind, tp, rc);
  return g != nullptr && g->derived;
}

LengthUse ProfiledCostModel::lengths_used(LayerKind kind) const {
  const Impl& I = *impl_;
  const bool enc_dec = I.model.arch == Architecture::EncoderDecoder;
  LengthUse u{false, false};
  bool gridded = false;
  for (const auto& g : I.grids) {
    if (g.kind != kind || g.derived) continue;  // a derived mode reads its base grid's lengths
    gridded = true;
    u.seq = u.seq || g.seq.used();  // interpolation axes
    u.dec_seq = u.dec_seq || g.dec.used();
  }
  if (gridded) {
    // Besides its axes, a grid's answer reads the lengths its time features (FLOPs; tokens of the
    // embedding's gather, the longer length) and its boundary bytes use.
    switch (kind) {
      case LayerKind::Embedding:
        u.seq = true;
        u.dec_seq = u.dec_seq || enc_dec;
        break;
      case LayerKind::Encoder: u.seq = true; break;
      case LayerKind::Decoder: u.seq = u.dec_seq = true; break;
      case LayerKind::PostProcess: (enc_dec ? u.dec_seq : u.seq) = true; break;
    }
  }
  if (I.fallback) {  // answers what the grids do not (other recompute modes, memory)
    const LengthUse f = I.fallback->lengths_used(kind);
    u.seq = u.seq || f.seq;
    u.dec_seq = u.dec_seq || f.dec_seq;
  } else if (!gridded) {
    return {};  // every query of the kind is refused: nothing to share
  }
  return u;
}

std::string ProfiledCostModel::describe() const {
  const auto& p = impl_->profile;
  return fmt::format("profiled ({} points in {} grids from {} file{}; fallback {})", p.points.size(),
                     impl_->grids.size(), p.sources.size(), p.sources.size() == 1 ? "" : "s",
                     impl_->fallback ? "analytic" : "none");
}

// ---- queries ------------------------------------------------------------------------------------
//
// A query is planned once for everything that does not depend on the micro-batch size (checks,
// grid, the (seq, dec_seq) cell and its corner weights, flags), then evaluated per size; query()
// plans and evaluates one row, query_rows() plans once and evaluates consecutive sizes with the
// same code, so both give the same bits.

namespace {

/// std::log2 of 0 .. kSize - 1 (128 KB of static storage, filled on first use, no allocation).
struct Log2Table {
  static constexpr std::int64_t kSize = std::int64_t{1} << 14;
  double v[kSize];
  Log2Table() {
    v[0] = -std::numeric_limits<double>::infinity();
    for (std::int64_t i = 1; i < kSize; ++i) v[i] = std::log2(static_cast<double>(i));
  }
};

/// log2 of a positive integer: std::log2 itself, from a table for the small values every query
/// meets (sizes and lengths), so the result is the same bits either way.
[[gnu::always_inline]] inline double log2_int(std::int64_t x) {
  static const Log2Table table;
  return x >= 0 && x < Log2Table::kSize ? table.v[x] : std::log2(static_cast<double>(x));
}

/// Fit::eval for the query path: the same sums in the same order, unrolled with constant indices
/// so that the features of a query stay in registers (the loop's vector reload of scalars just
/// stored was a store-forwarding stall costing a third of a query). `x` holds kMaxFeatures values.
[[gnu::always_inline]] inline double fit_value(const Fit& f, const double* x, int kx) {
  static_assert(kMaxFeatures == 5, "fit_value is unrolled for 5 features");
  const int n = std::min(f.k, kx);
  double y = 0;
  if (n > 0) y += f.c[0] * x[0];
  if (n > 1) y += f.c[1] * x[1];
  if (n > 2) y += f.c[2] * x[2];
  if (n > 3) y += f.c[3] * x[3];
  if (n > 4) y += f.c[4] * x[4];
  return y;
}

/// Fit::apply for the query path, on fit_value: the answer from the residual r interpolated at x.
[[gnu::always_inline]] inline double fit_apply(const Fit& f, const double* x, int kx, double r) {
  const double v = fit_value(f, x, kx);
  if (f.form == Form::Ratio) return v * r;
  const double y = v + r;
  return y < f.floor ? f.floor : y;
}

/// x clamped up to the smallest value of an axis with at least two values (the latency floor below
/// the grid); a single value gives no trend.
inline std::int64_t clamp_low(const Axis& a, std::int64_t x) { return a.v.size() > 1 && x < a.v[0] ? a.v[0] : x; }

/// A query with its micro-batch size left open.
/// Filled by Rows::plan (no initializers: a query must not pay for zeroing it; plan sets every
/// field row() reads when g is set).
struct RowPlan {
  const Grid* g;            ///< null: the fallback answers the whole query
  bool derived;             ///< g is the no-recompute grid a recompute mode the profile lacks is derived from
  std::int64_t mbs_limit;   ///< larger sizes are refused (also when the fallback answers)
  bool exact;               ///< the seq / dec_seq coordinates are profiled
  bool extrap;              ///< beyond the grid or in a hole along seq / dec_seq
  int corners;              ///< (seq, dec_seq) grid rows carrying the answer, with weights
  int row[4];
  double w[4];
  double inv;               ///< 1 / sum of the weights
  std::int64_t ts, td;      ///< shape of the time features (clamped below the grid)
  std::int64_t ms, md;      ///< shape of the memory features
  FlopsShape fs;            ///< FLOPs of (ts, td), the size left open
  // Varlen rows (Query::attention set): the residual is read at the dense shape with the same
  // tokens and attention sums (vb rows of the cell's lengths), the features at the real sums.
  bool varlen;
  double vb, vlb;           ///< the equivalent micro-batch size (clamped below the grid) and its log2
  int kt, km;               ///< feature counts of xt, xm
  double xt[kMaxFeatures];  ///< time features of the real shape
  double xm[kMaxFeatures];  ///< memory features of the real shape
};


}  // namespace

struct ProfiledCostModel::Rows {
  /// The fallback's memory (stored and peak bytes) for `r` into `out`: true, or false when it
  /// refuses the shape and `batch` (a batch row ends there); a single query (batch false) lets the
  /// refusal propagate.
  static bool fallback_memory(const Impl& I, const Query& r, LayerCost& out, bool batch) {
    if (I.fallback->memory_rows(r, 1, &out) == 1) return true;
    if (!batch) out = I.fallback->query(r);  // throws the fallback's reason
    return false;
  }
  /// Checks `q` as query() does (throws InvalidArgument) and fills `p`.
  static void plan(const Impl& I, const Query& q, RowPlan& p);
  /// plan() of a varlen query on grid `g` (the residual at the dense equivalent shape).
  static void plan_varlen(const Impl& I, const Query& q, const Grid* g, RowPlan& p);
  /// The (seq, dec_seq) rows around brackets bs and bd of grid `g` with their weights into `p`
  /// (p.g set); false when every corner is a hole (the fallback answers; throws without one).
  static bool corners(const Impl& I, const Query& q, const Grid& g, const Bracket& bs, const Bracket& bd, RowPlan& p,
                      bool exact, bool extrap);
  /// The answer at micro-batch size `mbs` (q.mbs ignored). A memory fallback that refuses throws
  /// (one_row) or returns false (batch: `hint` given, one per corner). `fallback_row`: the
  /// fallback's answer at this size when the caller already has it (batch), else null.
  static bool row(const Impl& I, const RowPlan& p, const Query& q, std::int64_t mbs, LayerCost& out, int* hint,
                  const LayerCost* fallback_row = nullptr);
};

[[gnu::always_inline]] inline void ProfiledCostModel::Rows::plan(const Impl& I, const Query& q, RowPlan& p) {
  PACKPIPE_CHECK_ARG(q.mbs > 0, "mbs must be positive, found {}", q.mbs);
  PACKPIPE_CHECK_ARG(q.tp > 0, "tp must be positive, found {}", q.tp);
  PACKPIPE_CHECK_ARG(q.num_layers > 0, "num_layers must be positive, found {}", q.num_layers);
  PACKPIPE_CHECK_ARG(q.seq >= 0, "seq must not be negative, found {}", q.seq);
  PACKPIPE_CHECK_ARG(q.dec_seq >= 0, "dec_seq must not be negative, found {}", q.dec_seq);
  check_query_limits(q, q.mbs);
  const bool enc_dec = I.model.arch == Architecture::EncoderDecoder;
  if (q.kind == LayerKind::Decoder || (enc_dec && q.kind == LayerKind::PostProcess)) {
    PACKPIPE_CHECK_ARG(q.dec_seq > 0, "dec_seq must be positive for {} layers of '{}', found {}",
                       layer_kind_name(q.kind), I.model.name, q.dec_seq);
  }
  if (q.kind != LayerKind::PostProcess || !enc_dec) {
    PACKPIPE_CHECK_ARG(q.seq > 0, "seq must be positive, found {}", q.seq);
  }
  PACKPIPE_CHECK_ARG(q.kind != LayerKind::Decoder || enc_dec, "model '{}' is decoder-only: it has no decoder layers",
                     I.model.name);
  p.g = nullptr;
  p.varlen = false;
  p.mbs_limit = std::numeric_limits<std::int64_t>::max();
  const Grid* g = I.find(q.kind, q.tp, q.recompute);
  p.derived = g != nullptr && g->derived;
  if (p.derived) g = &I.grids[g->base];
  if (g == nullptr || !g->has_time()) {
    PACKPIPE_CHECK_ARG(I.fallback != nullptr,
                       "{} layers at tp {} with recompute {} are not profiled and there is no analytic fallback",
                       layer_kind_name(q.kind), q.tp, recompute_name(q.recompute));
    return;
  }
  if (q.attention.varlen()) {
    plan_varlen(I, q, g, p);
    return;
  }
  // Refuse far beyond the grid.
  PACKPIPE_CHECK_ARG(q.mbs <= 2 * g->mbs.max(),
                     "mbs {} is beyond twice the largest profiled micro-batch size {} ({} tp {} rc {})", q.mbs,
                     g->mbs.max(), layer_kind_name(q.kind), q.tp, recompute_name(q.recompute));
  if (g->seq.used()) {
    PACKPIPE_CHECK_ARG(q.seq <= 2 * g->seq.max(),
                       "seq {} is beyond twice the largest profiled sequence length {} ({} tp {} rc {})", q.seq,
                       g->seq.max(), layer_kind_name(q.kind), q.tp, recompute_name(q.recompute));
  }
  if (g->dec.used()) {
    PACKPIPE_CHECK_ARG(q.dec_seq <= 2 * g->dec.max(),
                       "dec_seq {} is beyond twice the largest profiled decoder length {} ({} tp {} rc {})", q.dec_seq,
                       g->dec.max(), layer_kind_name(q.kind), q.tp, recompute_name(q.recompute));
  }
  p.mbs_limit = 2 * g->mbs.max();  // also when the fallback answers (below): query() refuses first
  bool exact = true, extrap = false;
  const std::int64_t s = g->seq.used() ? clamp_low(g->seq, q.seq) : 0;
  const std::int64_t d = g->dec.used() ? clamp_low(g->dec, q.dec_seq) : 0;
  Bracket bs, bd;
  if (g->seq.used()) {
    bs = bracket(g->seq.v.data(), g->seq.lg.data(), static_cast<int>(g->seq.v.size()), s, log2_int(s));
  }
  if (g->dec.used()) {
    bd = bracket(g->dec.v.data(), g->dec.lg.data(), static_cast<int>(g->dec.v.size()), d, log2_int(d));
  }
  if ((g->seq.used() && s != q.seq) || (g->dec.used() && d != q.dec_seq)) exact = false;
  if (!corners(I, q, *g, bs, bd, p, exact, extrap)) return;
  // Time at the clamped shape (latency floor below the grid), at the real shape above it.
  p.ts = g->seq.used() ? s : q.seq;
  p.td = g->dec.used() ? d : q.dec_seq;
  p.fs = Featurizer{&I.model, q.kind}.shape(p.ts, p.td);
  p.ms = g->seq.used() ? q.seq : 0;
  p.md = g->dec.used() ? q.dec_seq : 0;
}

void ProfiledCostModel::Rows::plan_varlen(const Impl& I, const Query& q, const Grid* g, RowPlan& p) {
  const DenseShape e = dense_equivalent(I.model, q);
  // Segments far beyond the grid are refused, as a padded query's lengths are; many segments are
  // not (the equivalent size is held at the grid's edge and the FLOP features follow the tokens).
  if (g->seq.used()) {
    PACKPIPE_CHECK_ARG(e.seq <= 2.0 * static_cast<double>(g->seq.max()),
                       "varlen rows: the segments' mean length {:.1f} (sum of squares / tokens) is beyond twice the "
                       "largest profiled sequence length {} ({} tp {} rc {})",
                       e.seq, g->seq.max(), layer_kind_name(q.kind), q.tp, recompute_name(q.recompute));
  }
  if (g->dec.used()) {
    PACKPIPE_CHECK_ARG(e.dec_seq <= 2.0 * static_cast<double>(g->dec.max()),
                       "varlen rows: the decoder segments' mean length {:.1f} is beyond twice the largest profiled "
                       "decoder length {} ({} tp {} rc {})",
                       e.dec_seq, g->dec.max(), layer_kind_name(q.kind), q.tp, recompute_name(q.recompute));
  }
  p.mbs_limit = std::numeric_limits<std::int64_t>::max();
  bool exact = false, extrap = false;  // an equivalent shape is never a measured one
  auto clamp_d = [](const Axis& a, double x) { return a.v.size() > 1 && x < static_cast<double>(a.v[0]) ? static_cast<double>(a.v[0]) : x; };
  Bracket bs, bd;
  if (g->seq.used()) {
    const double x = clamp_d(g->seq, e.seq);
    bs = bracket(g->seq.v.data(), g->seq.lg.data(), static_cast<int>(g->seq.v.size()), x, std::log2(x));
  }
  if (g->dec.used()) {
    const double x = clamp_d(g->dec, e.dec_seq);
    bd = bracket(g->dec.v.data(), g->dec.lg.data(), static_cast<int>(g->dec.v.size()), x, std::log2(x));
  }
  if (!corners(I, q, *g, bs, bd, p, exact, extrap)) return;
  p.varlen = true;
  p.exact = false;
  p.vb = clamp_d(g->mbs, e.rows);
  p.vlb = std::log2(p.vb);
  if (e.rows > static_cast<double>(g->mbs.max())) p.extrap = true;
  const Featurizer fz{&I.model, q.kind};
  std::fill(p.xt, p.xt + kMaxFeatures, 0.0);
  std::fill(p.xm, p.xm + kMaxFeatures, 0.0);
  p.kt = fz.time_varlen(q, p.xt);
  p.km = fz.memory_varlen(q, g->seq.used(), p.xm);
  p.ts = q.seq;
  p.td = q.dec_seq;
  p.ms = q.seq;
  p.md = q.dec_seq;
}

bool ProfiledCostModel::Rows::corners(const Impl& I, const Query& q, const Grid& grid, const Bracket& bs,
                                      const Bracket& bd, RowPlan& p, bool exact, bool extrap) {
  const Grid* g = &grid;
  for (const Bracket* br : {&bs, &bd}) {
    if (!br->exact) exact = false;
    if (br->above) extrap = true;
  }
  const std::size_t nd = g->dec.v.size();
  double wsum = 0;
  p.corners = 0;
  for (int cs = 0; cs < 2; ++cs) {
    if (cs && bs.i0 == bs.i1) continue;
    const int si = cs ? bs.i1 : bs.i0;
    const double ws = cs ? bs.w1 : 1 - bs.w1;
    for (int cd = 0; cd < 2; ++cd) {
      if (cd && bd.i0 == bd.i1) continue;
      const int di = cd ? bd.i1 : bd.i0;
      const double wd = cd ? bd.w1 : 1 - bd.w1;
      if (ws * wd <= 0) continue;
      const int row = g->row_of[static_cast<std::size_t>(si) * nd + static_cast<std::size_t>(di)];
      if (row < 0) {
        extrap = true;  // a hole of the grid: the other corners carry the answer
        exact = false;
        continue;
      }
      p.row[p.corners] = row;
      p.w[p.corners] = ws * wd;
      ++p.corners;
      wsum += ws * wd;
    }
  }
  if (!(wsum > 0)) {
    PACKPIPE_CHECK_ARG(I.fallback != nullptr,
                       "no profiled shape near mbs {} seq {} dec_seq {} ({} tp {} rc {}) and no analytic fallback",
                       q.mbs, q.seq, q.dec_seq, layer_kind_name(q.kind), q.tp, recompute_name(q.recompute));
    return false;
  }
  p.g = g;
  p.exact = exact;
  p.extrap = extrap;
  p.inv = 1.0 / wsum;
  return true;
}

[[gnu::always_inline]] inline bool ProfiledCostModel::Rows::row(const Impl& I, const RowPlan& p, const Query& q,
                                                                 std::int64_t mbs, LayerCost& out, int* hint,
                                                                 const LayerCost* fallback_row) {
  const Grid& g = *p.g;
  const std::int64_t b = g.mbs.v.size() > 1 && mbs < g.mbs.v[0] ? g.mbs.v[0] : mbs;
  bool exact = p.exact && b == mbs, extrap = p.extrap;
  double acc[kFields] = {0, 0, 0, 0};
  if (p.varlen) {
    for (int c = 0; c < p.corners; ++c) {
      const Node n = row_value(g, p.row[c], p.vb, p.vlb, exact, extrap);
      for (int f = 0; f < kFields; ++f) acc[f] += p.w[c] * n.r[f];
    }
    exact = false;
  } else {
    const double log2b = log2_int(b);
    for (int c = 0; c < p.corners; ++c) {
      const Node n = row_value(g, p.row[c], b, log2b, exact, extrap, hint ? hint + c : nullptr);
      for (int f = 0; f < kFields; ++f) acc[f] += p.w[c] * n.r[f];
    }
  }
  const double inv = p.inv;
  const double layers = static_cast<double>(q.num_layers);
  const Featurizer fz{&I.model, q.kind};
  double xt[kMaxFeatures] = {0, 0, 0, 0, 0};
  const int kt = p.varlen ? p.kt : fz.time_at(p.fs, b, p.ts, p.td, xt);
  if (p.varlen) std::copy(p.xt, p.xt + kMaxFeatures, xt);
  const Provenance prov = p.derived ? Provenance::Derived
                          : exact  ? Provenance::Profiled
                                   : (extrap ? Provenance::Extrapolated : Provenance::Interpolated);
  const double fwd = g.has[0] ? fit_apply(g.fit[0], xt, kt, acc[0] * inv) : kNaN;
  const double bwd_profiled = g.has[1] ? fit_apply(g.fit[1], xt, kt, acc[1] * inv) : kNaN;
  // A derived mode recomputes the forward of encoder and decoder layers only; a measured mode's
  // backward includes its recompute (DynaPipe's profiles), which is split off here.
  const bool layer = q.kind == LayerKind::Encoder || q.kind == LayerKind::Decoder;
  double recompute = 0;
  if (q.recompute == Recompute::Full && (layer || !p.derived)) {
    recompute = fwd;
  } else if (q.recompute == Recompute::Selective && kt == 3 && (layer || !p.derived)) {
    recompute = fwd * xt[2] / (xt[1] + xt[2]);  // the attention core is what selective recompute redoes
  }
  out.forward_ms = fwd * layers;
  out.recompute_ms = recompute * layers;
  out.backward_ms = (p.derived ? bwd_profiled : std::max(0.0, bwd_profiled - recompute)) * layers;
  out.time_source = prov;
  // Never a NaN, infinite or negative time out of a profile: the construction checks make this
  // unreachable, and a query that reaches it is refused rather than partitioned at 0 ms.
  if (!(std::isfinite(out.forward_ms) && out.forward_ms >= 0 && std::isfinite(bwd_profiled) && bwd_profiled > 0)) {
    PACKPIPE_THROW(Error, "profiled cost of {} layers (tp {}, rc {}) at mbs {}, seq {}, dec_seq {}: forward {} ms, "
                   "backward {} ms; the profile does not cover this query",
                   layer_kind_name(q.kind), q.tp, recompute_name(q.recompute), mbs, q.seq, q.dec_seq, out.forward_ms,
                   bwd_profiled);
  }
  double xm[kMaxFeatures] = {0, 0, 0, 0, 0};
  const int km = p.varlen ? p.km : fz.memory(mbs, p.ms, p.md, xm);
  if (p.varlen) std::copy(p.xm, p.xm + kMaxFeatures, xm);
  if (g.has[2] && !std::isnan(acc[2])) {
    double stored = fit_apply(g.fit[2], xm, km, acc[2] * inv);
    double peak = g.has[3] && !std::isnan(acc[3]) ? fit_apply(g.fit[3], xm, km, acc[3] * inv) : 0.0;
    if (p.derived && layer && q.recompute != Recompute::None) {
      // The profiled bytes less what the mode does not keep, as the fallback's answers differ.
      Query r = q;
      r.mbs = mbs;
      r.num_layers = 1;
      LayerCost with, without;
      if (I.fallback == nullptr) {
        stored = peak = kNaN;  // nothing to take the difference from: not known
      } else {
        r.recompute = Recompute::None;
        if (!fallback_memory(I, r, without, hint != nullptr)) return false;
        r.recompute = q.recompute;
        if (!fallback_memory(I, r, with, hint != nullptr)) return false;
        stored = std::max(0.0, stored + with.stored_bytes - without.stored_bytes);
        peak = std::max(0.0, peak + with.peak_bytes - without.peak_bytes);
      }
    }
    out.stored_bytes = stored * layers;
    out.peak_bytes = peak;
    out.memory_source = prov;
  } else if (I.fallback) {
    Query r = q;
    r.mbs = mbs;
    LayerCost a;
    if (fallback_row != nullptr) {
      a = *fallback_row;
    } else if (hint == nullptr) {
      a = I.fallback->query(r);
    } else if (I.fallback->query_rows(r, 1, &a) == 0) {
      return false;
    }
    out.stored_bytes = a.stored_bytes;
    out.peak_bytes = a.peak_bytes;
    out.memory_source = a.memory_source;
  } else {
    out.stored_bytes = kNaN;
    out.peak_bytes = kNaN;
    out.memory_source = Provenance::Analytic;
  }
  // Activations handed to the next stage: hidden states of every token (the encoder output rides
  // along through decoder stages); the post-process ends the pipeline.
  const double h = static_cast<double>(I.model.hidden) * static_cast<double>(I.model.bytes_per_param);
  const double bq = static_cast<double>(mbs);
  switch (q.kind) {
    case LayerKind::PostProcess: out.boundary_bytes = 0; break;
    case LayerKind::Decoder: out.boundary_bytes = bq * static_cast<double>(q.seq + q.dec_seq) * h; break;
    default: out.boundary_bytes = bq * static_cast<double>(q.seq) * h; break;
  }
  return true;
}

LayerCost ProfiledCostModel::query(const Query& q) const {
  const Impl& I = *impl_;
  if (q.attention.prefix_tokens != 0 || q.attention.prefix != 0) {
    // Slices: the profile answers the row without its kept prefix, the fallback (the profile's
    // kernel) adds what the prefix costs (015).
    PACKPIPE_CHECK_ARG(I.fallback != nullptr, "a row with slices needs the analytic fallback for the cost of its prefix");
    const Query base = without_prefix(q);
    return add_prefix_cost(query(base), I.fallback->query(q), I.fallback->query(base));
  }
  RowPlan p;
  Rows::plan(I, q, p);
  if (p.g == nullptr) return I.fallback->query(q);
  LayerCost out;
  Rows::row(I, p, q, q.mbs, out, nullptr);
  return out;
}

std::int64_t ProfiledCostModel::query_rows(const Query& q, std::int64_t count, LayerCost* out) const {
  check_query_rows(q, count, out);
  if (count == 0) return 0;
  const Impl& I = *impl_;
  if (q.attention.prefix_tokens != 0 || q.attention.prefix != 0) {
    // A varlen row (slices are only in varlen rows) has one row: the query answers it.
    try {
      out[0] = query(q);
    } catch (const InvalidArgument&) {
      return 0;
    }
    return 1;
  }
  RowPlan p;
  try {
    Rows::plan(I, q, p);  // checks row 0; later rows differ only in a larger mbs
  } catch (const InvalidArgument&) {
    return 0;
  }
  // Sizes above twice the largest profiled one are refused (q.mbs itself passed the plan).
  const std::int64_t n = std::min(count, p.mbs_limit - q.mbs + 1);
  if (p.g == nullptr) return I.fallback->query_rows(q, n, out);
  int hint[4] = {0, 0, 0, 0};  // per corner row: the mbs bracket, growing with the size
  if (p.g->has[2] || !I.fallback) {
    for (std::int64_t k = 0; k < n; ++k) {
      if (!Rows::row(I, p, q, q.mbs + k, out[k], hint)) return k;
    }
    return n;
  }
  // A grid without memory (e.g. DynaPipe's post-process): the fallback's memory for a chunk of
  // rows in one batch query (the same answers as one query per row).
  // A small chunk on the stack (re-entrant, unlike a shared buffer; cheap to construct).
  constexpr std::int64_t kChunk = 16;
  LayerCost mem[kChunk];
  for (std::int64_t k0 = 0; k0 < n; k0 += kChunk) {
    Query r = q;
    r.mbs = q.mbs + k0;
    const std::int64_t want = std::min(kChunk, n - k0);
    const std::int64_t got = I.fallback->memory_rows(r, want, mem);
    for (std::int64_t k = 0; k < got; ++k) {
      if (!Rows::row(I, p, q, q.mbs + k0 + k, out[k0 + k], hint, &mem[k])) return k0 + k;
    }
    if (got < want) return k0 + got;
  }
  return n;
}

// ---- leave-one-out ------------------------------------------------------------------------------

namespace {

struct ErrAcc {
  std::size_t points = 0;
  std::size_t n[kFields] = {0, 0, 0, 0};
  double ours[kFields] = {0, 0, 0, 0}, lin[kFields] = {0, 0, 0, 0};
  void add(const ErrAcc& o) {
    points += o.points;
    for (int f = 0; f < kFields; ++f) {
      n[f] += o.n[f];
      ours[f] += o.ours[f];
      lin[f] += o.lin[f];
    }
  }
  LooErrors done() const {
    auto pct = [](double sum, std::size_t k) { return k ? 100.0 * sum / static_cast<double>(k) : 0.0; };
    LooErrors e;
    e.points = points;
    e.time_predictions = n[0] + n[1];
    e.memory_predictions = n[2];
    e.time_mape = pct(ours[0] + ours[1], n[0] + n[1]);
    e.linear_time_mape = pct(lin[0] + lin[1], n[0] + n[1]);
    e.memory_mape = pct(ours[2], n[2]);
    e.linear_memory_mape = pct(lin[2], n[2]);
    e.peak_memory_mape = pct(ours[3], n[3]);
    e.linear_peak_memory_mape = pct(lin[3], n[3]);
    return e;
  }
};

}  // namespace

std::string loo_errors_json(const LooErrors& e) {
  nlohmann::ordered_json j;
  j["points"] = e.points;
  j["time_predictions"] = e.time_predictions;
  j["memory_predictions"] = e.memory_predictions;
  j["time_mape"] = e.time_mape;
  j["memory_mape"] = e.memory_mape;
  j["linear_time_mape"] = e.linear_time_mape;
  j["linear_memory_mape"] = e.linear_memory_mape;
  j["peak_memory_mape"] = e.peak_memory_mape;
  j["linear_peak_memory_mape"] = e.linear_peak_memory_mape;
  return j.dump();
}

LooReport leave_one_out(const Profile& profile, const ModelSpec& model) {
  for (const auto& p : profile.points) {
    PACKPIPE_CHECK_ARG(p.kind != LayerKind::Decoder || model.arch == Architecture::EncoderDecoder,
                       "profile has decoder layers but model '{}' is decoder-only", model.name);
  }
  LooReport report;
  report.model = model.name;
  report.device = profile.device;
  ErrAcc total;
  std::map<std::pair<LayerKind, Recompute>, ErrAcc> by;
  const auto merged = merge_points(profile.points);
  for (const auto& grid_entry : merged) {
    const GridKey& key = grid_entry.first;
    const std::vector<Cell>& cells = grid_entry.second;
    const LayerKind kind = std::get<0>(key);
    const Featurizer fz{&model, kind};
    const Points pts(fz, cells);
    ErrAcc acc[3];
    // Nested: the forms are chosen again for every removal, from the remaining points only. The
    // fits without a removed slice (seq, dec_seq) serve every point of that slice.
    std::map<std::pair<int, std::int64_t>, std::array<Fit, kFields>> slice_fits;
    for (const Removal& r : removals(cells, std::vector<char>(cells.size(), 1))) {
      auto refit = [&]() {
        std::vector<char> in(cells.size(), 1);
        for (std::size_t k = 0; k < cells.size(); ++k) in[k] = !removes(cells, r, k);
        return fit_grid(pts, in);
      };
      std::array<Fit, kFields> fits;
      if (r.axis == 0) {
        fits = refit();
      } else {
        const auto slice = std::make_pair(r.axis, coord(cells[r.i], r.axis));
        auto it = slice_fits.find(slice);
        if (it == slice_fits.end()) it = slice_fits.emplace(slice, refit()).first;
        fits = it->second;
      }
      ErrAcc& a = acc[r.axis];
      a.points += 1;
      for (int f = 0; f < kFields; ++f) {
        if (!scorable(pts, f, r)) continue;
        const double y = pts.y(f, r.i);
        a.ours[f] += std::abs(predict(pts, f, fits[static_cast<std::size_t>(f)], r) - y) / y;
        a.lin[f] += std::abs(predict_linear(pts, f, r) - y) / y;
        a.n[f] += 1;
      }
    }
    for (int axis = 0; axis < 3; ++axis) {
      if (acc[axis].points == 0) continue;
      LooGroup grp;
      std::tie(grp.kind, grp.tp, grp.rc, grp.variant) = key;
      grp.axis = axis == 0 ? "mbs" : (axis == 1 ? "seq" : "dec_seq");
      grp.errors = acc[axis].done();
      report.groups.push_back(grp);
      total.add(acc[axis]);
      by[{grp.kind, grp.rc}].add(acc[axis]);
    }
  }
  PACKPIPE_CHECK_ARG(total.points > 0,
                     "no interior grid point to leave out (an axis needs a point with profiled neighbours on both sides)");
  report.all = total.done();
  for (const auto& [k, acc] : by) report.by_stage_rc.push_back(LooBreakdown{k.first, k.second, acc.done()});
  return report;
}

}  // namespace packpipe::costmodel
