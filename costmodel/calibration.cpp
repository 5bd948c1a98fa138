#include "costmodel/calibration.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/errors.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/stats.h"

namespace packpipe::costmodel {

namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

constexpr const char* kFormat = "packpipe-calibration";
// Version 2 adds schedule factors; a calibration without them is written as version 1, which
// every reader opens. (A reader of version 1 alone refuses a file with factors instead of
// planning without them.)
constexpr int kVersion = 2;
/// A calibrated time is never below this share of the fitted slope times the base prediction
/// (keeps a negative intercept from making a small op's time negative).
constexpr double kFloorShare = 0.1;

std::size_t op_index(MeasuredOp op) { return static_cast<std::size_t>(op); }

// ---- robust line fits ---------------------------------------------------------------------------

struct Point {
  double lt = 0;  // log2(tokens)
  double p = 0;   // base prediction, ms (reweighted by the op's attention term once it is chosen)
  double m = 0;   // measured, ms
  double s = 0;   // the stage's attention share (attention_share)
};

double calibrated(const RegionFit& f, double p) { return std::max(f.apply(p), kFloorShare * f.a * p); }

// Least squares of the relative residual (m - a p - b) / p over the kept points: with y = m / p and
// x = 1 / p it is the ordinary regression y = a + b x. Falls back to a ratio through the origin
// (b = 0, a = mean m / p) when the predictions are too narrow for a slope or the line is not
// increasing and positive over the points.
void fit_line(const std::vector<Point>& pts, const std::vector<char>& kept, RegionFit& f) {
  double n = 0, sx = 0, sy = 0;
  double xmin = std::numeric_limits<double>::infinity(), xmax = 0, pmin = xmin;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (!kept[i]) continue;
    const double x = 1.0 / pts[i].p, y = pts[i].m / pts[i].p;
    n += 1;
    sx += x;
    sy += y;
    xmin = std::min(xmin, x);
    xmax = std::max(xmax, x);
    pmin = std::min(pmin, pts[i].p);
  }
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (!kept[i]) continue;
    const double dx = 1.0 / pts[i].p - mx, dy = pts[i].m / pts[i].p - my;
    sxx += dx * dx;
    sxy += dx * dy;
  }
  f.through_origin = true;
  f.a = my;
  f.b = 0;
  // A slope needs predictions that differ by at least 5% (x = 1/p spread relative to its mean).
  if (n >= 2 && xmax - xmin > 0.05 * mx && sxx > 0) {
    const double b = sxy / sxx, a = my - b * mx;
    if (a > 0 && a * pmin + b > 0) {
      f.a = a;
      f.b = b;
      f.through_origin = false;
    }
  }
}

// Fit, reject points beyond outlier_mads robust deviations of the relative residual, refit, until
// the kept set is stable (at most max_iterations rounds; never below half the points or 2).
RegionFit robust_fit(const std::vector<Point>& pts, const FitOptions& o) {
  RegionFit f;
  const std::size_t n = pts.size();
  f.points = static_cast<std::int64_t>(n);
  std::vector<char> kept(n, 1);
  fit_line(pts, kept, f);
  const std::size_t min_kept = std::max<std::size_t>(2, (n + 1) / 2);
  std::vector<double> r(n), rk, dev;
  for (int it = 0; it < o.max_iterations && n >= 3; ++it) {
    rk.clear();
    for (std::size_t i = 0; i < n; ++i) {
      r[i] = (pts[i].m - f.apply(pts[i].p)) / pts[i].p;
      if (kept[i]) rk.push_back(r[i]);
    }
    const double med = median(rk);
    dev.clear();
    for (double x : rk) dev.push_back(std::abs(x - med));
    const double scale = std::max(1.4826 * median(dev), 1e-3 * f.a);
    std::vector<char> next(n, 0);
    std::size_t count = 0;
    for (std::size_t i = 0; i < n; ++i) {
      next[i] = std::abs(r[i] - med) <= o.outlier_mads * scale ? 1 : 0;
      count += next[i];
    }
    if (next == kept || count < min_kept) break;
    kept = std::move(next);
    fit_line(pts, kept, f);
  }
  std::int64_t k = 0;
  for (char c : kept) k += c;
  f.rejected = f.points - k;
  return f;
}

// Statistics and ranges of a fit over its points (rejected ones included).
void describe_points(const std::vector<Point>& pts, RegionFit& f) {
  std::vector<double> before, after;
  double slt = 0;
  f.min_log2_tokens = f.min_predicted_ms = std::numeric_limits<double>::infinity();
  f.max_log2_tokens = f.max_predicted_ms = -std::numeric_limits<double>::infinity();
  for (const Point& q : pts) {
    before.push_back(std::abs(q.p - q.m) / q.m);
    after.push_back(std::abs(calibrated(f, q.p) - q.m) / q.m);
    slt += q.lt;
    f.min_log2_tokens = std::min(f.min_log2_tokens, q.lt);
    f.max_log2_tokens = std::max(f.max_log2_tokens, q.lt);
    f.min_predicted_ms = std::min(f.min_predicted_ms, q.p);
    f.max_predicted_ms = std::max(f.max_predicted_ms, q.p);
  }
  f.center_log2_tokens = slt / static_cast<double>(pts.size());
  f.error_before = median(before);
  f.error_after = median(after);
}

RegionFit region_of(const std::vector<Point>& pts, const RegionFit& global, const FitOptions& o) {
  RegionFit f;
  if (static_cast<std::int64_t>(pts.size()) >= o.min_region_points) {
    f = robust_fit(pts, o);
  } else {
    f.a = global.a;
    f.b = global.b;
    f.through_origin = global.through_origin;
    f.points = static_cast<std::int64_t>(pts.size());
    f.global_fallback = true;
  }
  describe_points(pts, f);
  return f;
}

// Whether the blend of two neighbouring regions (centres ci < cj) stays non-decreasing in tokens
// for the predictions measured around them. Along tokens the blend changes at rate
// a_blend x dp/dlt + (L_j(p) - L_i(p)) / (cj - ci); the base prediction grows as p ~ tokens^e
// (dp/dlt = e ln2 p), e estimated from the two groups' mean log predictions (clamped to [0, 1]:
// a base model that does not grow gives no credit). Linear in p: checked at both ends of the
// predictions of the points between the centres (or of both groups when none lies between).
bool ordered(const RegionFit& li, const RegionFit& lj, const std::vector<Point>& gi, const std::vector<Point>& gj) {
  const double ci = li.center_log2_tokens, cj = lj.center_log2_tokens;
  if (!(cj > ci)) return false;
  double lpi = 0, lpj = 0;
  for (const Point& q : gi) lpi += std::log(q.p);
  for (const Point& q : gj) lpj += std::log(q.p);
  lpi /= static_cast<double>(gi.size());
  lpj /= static_cast<double>(gj.size());
  const double e = std::clamp((lpj - lpi) / (std::log(2.0) * (cj - ci)), 0.0, 1.0);
  double plo = std::numeric_limits<double>::infinity(), phi = 0;
  for (const auto* g : {&gi, &gj}) {
    for (const Point& q : *g) {
      if (q.lt < ci || q.lt > cj) continue;
      plo = std::min(plo, q.p);
      phi = std::max(phi, q.p);
    }
  }
  if (!(phi > 0)) {
    plo = std::min(li.min_predicted_ms, lj.min_predicted_ms);
    phi = std::max(li.max_predicted_ms, lj.max_predicted_ms);
  }
  const double a = std::min(li.a, lj.a);
  for (double p : {plo, phi}) {
    const double rate = a * e * std::log(2.0) * p + (lj.apply(p) - li.apply(p)) / (cj - ci);
    if (rate < -1e-9 * std::max(1.0, std::abs(li.apply(p)))) return false;
  }
  return true;
}

// The typical base prediction of a region: the geometric mean of its range (the file holds no points).
double typical_predicted_ms(const RegionFit& r) { return std::sqrt(r.min_predicted_ms * r.max_predicted_ms); }

// The file's form of `ordered`, from what a calibration file holds (no points), so that its reader
// checks exactly what the fit guarantees: along tokens from li's centre to lj's, the blend changes at
// rate a_blend x e ln2 p + (L_j(p) - L_i(p)) / (cj - ci), the base prediction growing as
// tokens^e with e from the two regions' typical predictions (clamped to [0, 1]); the rate must not
// be negative at either end of the two regions' whole prediction range (linear in p: nor between).
// Returns the p where it is, or 0 when ordered.
double falls_at(const RegionFit& li, const RegionFit& lj) {
  const double ci = li.center_log2_tokens, cj = lj.center_log2_tokens;
  if (!(cj > ci)) return std::max(li.max_predicted_ms, 1.0);
  const double e = std::clamp(std::log(typical_predicted_ms(lj) / typical_predicted_ms(li)) / (std::log(2.0) * (cj - ci)),
                              0.0, 1.0);
  const double a = std::min(li.a, lj.a);
  for (double p : {std::min(li.min_predicted_ms, lj.min_predicted_ms), std::max(li.max_predicted_ms, lj.max_predicted_ms)}) {
    const double rate = a * e * std::log(2.0) * p + (lj.apply(p) - li.apply(p)) / (cj - ci);
    if (!(rate >= -1e-9 * std::max(1.0, std::abs(li.apply(p))))) return p;
  }
  return 0;
}

// The lines of an op kind's fit (global, then regions pooled until ordered) over `pts`, whose
// predictions are already reweighted by its attention term.
OpFit fit_lines(MeasuredOp op, const std::vector<Point>& pts, const FitOptions& o) {
  OpFit f;
  f.op = op;
  f.fitted = !pts.empty();
  f.from = "measured";
  if (pts.empty()) return f;
  f.global = robust_fit(pts, o);
  describe_points(pts, f.global);
  if (!o.regions) return f;
  // Buckets of one octave of tokens, ascending; points keep their canonical order inside.
  std::map<std::int64_t, std::vector<Point>> buckets;
  for (const Point& q : pts) buckets[static_cast<std::int64_t>(std::floor(q.lt))].push_back(q);
  std::vector<std::vector<Point>> groups;
  for (auto& [k, g] : buckets) groups.push_back(std::move(g));
  std::vector<RegionFit> regions;
  for (const auto& g : groups) regions.push_back(region_of(g, f.global, o));
  // Pool adjacent regions whose blend would fall with tokens, until every boundary is ordered.
  for (bool changed = true; changed && regions.size() > 1;) {
    changed = false;
    for (std::size_t i = 0; i + 1 < regions.size(); ++i) {
      // Ordered over the points, and in the form the file's reader checks (check_calibration).
      if (ordered(regions[i], regions[i + 1], groups[i], groups[i + 1]) && falls_at(regions[i], regions[i + 1]) == 0) {
        continue;
      }
      std::vector<Point> merged = groups[i];
      merged.insert(merged.end(), groups[i + 1].begin(), groups[i + 1].end());
      groups[i] = std::move(merged);
      groups.erase(groups.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      regions[i] = region_of(groups[i], f.global, o);
      regions.erase(regions.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      changed = true;
      break;
    }
  }
  f.regions = std::move(regions);
  return f;
}

// A fit's calibrated time of a (reweighted) prediction p at log2(tokens) lt: Calibration::apply's blend.
double fitted_ms(const OpFit& f, double lt, double p) {
  if (f.regions.empty()) return calibrated(f.global, p);
  const auto& r = f.regions;
  if (lt <= r.front().center_log2_tokens) return calibrated(r.front(), p);
  if (lt >= r.back().center_log2_tokens) return calibrated(r.back(), p);
  std::size_t i = 0;
  while (i + 2 < r.size() && lt >= r[i + 1].center_log2_tokens) ++i;
  const double w = (lt - r[i].center_log2_tokens) / (r[i + 1].center_log2_tokens - r[i].center_log2_tokens);
  // lo + w (hi - lo): exactly lo where both lines agree (an identity calibration changes no bit).
  const double lo = r[i].apply(p);
  const double v = lo + w * (r[i + 1].apply(p) - lo);
  const double a = r[i].a + w * (r[i + 1].a - r[i].a);
  return std::max(v, kFloorShare * a * p);
}

// The points with their predictions reweighted by attention term `gamma`.
std::vector<Point> reweighted(const std::vector<Point>& pts, double gamma) {
  std::vector<Point> q = pts;
  if (gamma != 0) {
    for (Point& x : q) x.p *= 1.0 + gamma * x.s;
  }
  return q;
}

// Median relative error of a fit over points already reweighted for it.
double fit_error(const OpFit& f, const std::vector<Point>& pts) {
  std::vector<double> e;
  e.reserve(pts.size());
  for (const Point& q : pts) e.push_back(std::abs(fitted_ms(f, q.lt, q.p) - q.m) / q.m);
  return median(e);
}

// The fit of one op kind: its lines at the attention term gamma that fits best. A grid of
// 1 + gamma = 2^(k/4) from 1/8 to 64, refined to 2^(1/32) steps around the best, each candidate
// fitting its lines afresh and scored by the median relative error over all points. gamma stays 0
// unless the points' shares spread by at least 0.02 and the best term cuts the error by 5% or
// more: a term the points do not pin down is not fitted to noise. Deterministic (a fixed grid,
// ties to the smaller |gamma|).
OpFit fit_op(MeasuredOp op, const std::vector<Point>& pts, const FitOptions& o) {
  OpFit best = fit_lines(op, pts, o);
  if (pts.size() < 4) return best;
  double smin = 1, smax = 0;
  for (const Point& q : pts) {
    smin = std::min(smin, q.s);
    smax = std::max(smax, q.s);
  }
  if (!(smax - smin >= 0.02)) return best;
  const double base_error = fit_error(best, pts);
  double best_error = base_error, best_gamma = 0;
  OpFit best_fit = best;
  auto consider = [&](double gamma) {
    if (!(gamma > kMinAttentionGamma && gamma <= kMaxAttentionGamma) || gamma == 0) return;
    const std::vector<Point> q = reweighted(pts, gamma);
    OpFit f = fit_lines(op, q, o);
    const double e = fit_error(f, q);
    if (e < best_error || (e == best_error && std::abs(gamma) < std::abs(best_gamma))) {
      best_error = e;
      best_gamma = gamma;
      best_fit = std::move(f);
    }
  };
  for (int k = -12; k <= 24; ++k) consider(std::exp2(k / 4.0) - 1.0);
  if (best_gamma != 0) {
    const double centre = std::log2(1.0 + best_gamma);
    for (int k = -7; k <= 7; ++k) consider(std::exp2(centre + k / 32.0) - 1.0);
  }
  if (best_gamma == 0 || !(best_error <= 0.95 * base_error)) return best;
  best_fit.attention_gamma = best_gamma;
  return best_fit;
}

// ---- transfers ----------------------------------------------------------------------------------

// The fewest samples an octave of transfer sizes needs to give a point of the fit.
constexpr std::size_t kMinTransferGroup = 6;

struct TransferSample {
  double bytes = 0, ms = 0;
};

// time = latency + bytes / bandwidth through the per-size quantiles, least squares of the relative
// residual; a non-positive slope keeps the base bandwidth, a negative latency is fixed at 0.
TransferFit fit_transfers(bool inter, std::vector<TransferSample> s, const CommModel& base, const FitOptions& o) {
  TransferFit f;
  f.inter_node = inter;
  f.points = static_cast<std::int64_t>(s.size());
  if (s.empty()) return f;
  std::sort(s.begin(), s.end(), [](const TransferSample& x, const TransferSample& y) {
    return std::tie(x.bytes, x.ms) < std::tie(y.bytes, y.ms);
  });
  // Groups of one octave of bytes: packed micro-batches send activations of every size, so a
  // byte count rarely repeats, and a quantile of one or two waits is a wait, not a transfer. A
  // group needs kMinTransferGroup samples; its point is (median bytes, the quantile of its times).
  std::vector<double> bytes, q;
  for (std::size_t i = 0; i < s.size();) {
    std::size_t j = i;
    const double octave = std::floor(std::log2(std::max(s[i].bytes, 1.0)));
    std::vector<double> v, b;
    while (j < s.size() && std::floor(std::log2(std::max(s[j].bytes, 1.0))) == octave) {
      b.push_back(s[j].bytes);
      v.push_back(s[j++].ms);
    }
    std::sort(v.begin(), v.end());
    const double t = v.size() >= kMinTransferGroup ? quantile_sorted(v, o.transfer_quantile) : 0;
    if (t > 0) {  // a group whose waits were all hidden says nothing about its transfer time
      bytes.push_back(b[b.size() / 2]);
      q.push_back(t);
    }
    i = j;
  }
  f.sizes = static_cast<std::int64_t>(bytes.size());
  if (bytes.empty()) return f;
  const double lat0 = inter ? base.inter_latency_ms : base.intra_latency_ms;
  const double bw0 = inter ? base.inter_bytes_per_ms : base.intra_bytes_per_ms;
  double alpha = lat0, slope = 1.0 / bw0;
  if (bytes.size() == 1) {
    if (q[0] > lat0) {
      slope = (q[0] - lat0) / bytes[0];
    } else {
      alpha = std::max(0.0, q[0] - bytes[0] / bw0);
    }
  } else {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (std::size_t i = 0; i < q.size(); ++i) {
      const double w = 1.0 / (q[i] * q[i]);
      sw += w;
      sx += w * bytes[i];
      sy += w * q[i];
      sxx += w * bytes[i] * bytes[i];
      sxy += w * bytes[i] * q[i];
    }
    const double det = sw * sxx - sx * sx;
    slope = det > 0 ? (sw * sxy - sx * sy) / det : 0;
    alpha = det > 0 ? (sy - slope * sx) / sw : 0;
    if (!(slope > 0) || !std::isfinite(1.0 / slope)) {
      slope = 1.0 / bw0;
      alpha = std::max(0.0, (sy - slope * sx) / sw);
    } else if (alpha < 0) {
      alpha = 0;
      slope = sxy / sxx;
    }
  }
  if (!(slope > 0) || !std::isfinite(1.0 / slope)) slope = 1.0 / bw0;
  // a latency above every measured time would be no fit of them
  alpha = std::clamp(alpha, 0.0, *std::max_element(q.begin(), q.end()));
  f.fitted = true;
  f.latency_ms = alpha;
  f.bytes_per_ms = 1.0 / slope;
  std::vector<double> before, after;
  for (std::size_t i = 0; i < q.size(); ++i) {
    before.push_back(std::abs(base.p2p_ms(bytes[i], inter) - q[i]) / q[i]);
    after.push_back(std::abs(alpha + bytes[i] * slope - q[i]) / q[i]);
  }
  f.error_before = median(before);
  f.error_after = median(after);
  return f;
}

// ---- canonical order ------------------------------------------------------------------------------

auto sort_key(const Measurement& m) {
  return std::make_tuple(static_cast<int>(m.op), m.layout.encoder_layers, m.layout.decoder_layers,
                         m.layout.has_embedding, m.layout.has_postprocess, m.tp, m.rows, m.seq, m.dec_seq,
                         static_cast<int>(m.recompute), m.bytes, m.ms, m.iteration, m.replica, m.rank, m.stage, m.mb,
                         m.index, m.start_ms, m.peer);
}

double op_time(const StageOpTimes& t, MeasuredOp op) {
  switch (op) {
    case MeasuredOp::Forward: return t.forward_ms;
    case MeasuredOp::Backward: return t.backward_ms;
    case MeasuredOp::BackwardInput: return t.backward_input_ms;
    case MeasuredOp::BackwardWeight: return t.backward_weight_ms;
    default: break;
  }
  PACKPIPE_THROW(InvalidArgument, "{} is a transfer, not a compute op", measured_op_name(op));
}

// ---- JSON ----------------------------------------------------------------------------------------

OJson region_json(const RegionFit& f) {
  OJson j;
  j["a"] = f.a;
  j["b"] = f.b;
  j["center_log2_tokens"] = f.center_log2_tokens;
  j["min_log2_tokens"] = f.min_log2_tokens;
  j["max_log2_tokens"] = f.max_log2_tokens;
  j["min_predicted_ms"] = f.min_predicted_ms;
  j["max_predicted_ms"] = f.max_predicted_ms;
  j["points"] = f.points;
  j["rejected"] = f.rejected;
  j["error_before"] = f.error_before;
  j["error_after"] = f.error_after;
  j["global_fallback"] = f.global_fallback;
  j["through_origin"] = f.through_origin;
  return j;
}

// Field access of the reader: every error names the file and the JSON pointer.
struct Reader {
  const std::string& what;

  const Json& at(const Json& obj, const std::string& path, const char* key) const {
    PACKPIPE_CHECK(obj.is_object(), "{}: {}: expected an object, found {}", what, path.empty() ? "/" : path,
                   obj.type_name());
    const auto it = obj.find(key);
    PACKPIPE_CHECK(it != obj.end(), "{}: {}/{}: missing", what, path, key);
    return *it;
  }
  double number(const Json& obj, const std::string& path, const char* key) const {
    const Json& v = at(obj, path, key);
    PACKPIPE_CHECK(v.is_number() && std::isfinite(v.get<double>()), "{}: {}/{}: expected a finite number, found {}",
                   what, path, key, v.dump());
    return v.get<double>();
  }
  double positive(const Json& obj, const std::string& path, const char* key) const {
    const double x = number(obj, path, key);
    PACKPIPE_CHECK(x > 0, "{}: {}/{}: expected a positive number, found {}", what, path, key, x);
    return x;
  }
  std::int64_t count(const Json& obj, const std::string& path, const char* key) const {
    const Json& v = at(obj, path, key);
    PACKPIPE_CHECK(v.is_number_integer() && v.get<std::int64_t>() >= 0,
                   "{}: {}/{}: expected a non-negative integer, found {}", what, path, key, v.dump());
    return v.get<std::int64_t>();
  }
  bool flag(const Json& obj, const std::string& path, const char* key) const {
    const Json& v = at(obj, path, key);
    PACKPIPE_CHECK(v.is_boolean(), "{}: {}/{}: expected true or false, found {}", what, path, key, v.dump());
    return v.get<bool>();
  }
  std::string text(const Json& obj, const std::string& path, const char* key) const {
    const Json& v = at(obj, path, key);
    PACKPIPE_CHECK(v.is_string(), "{}: {}/{}: expected a string, found {}", what, path, key, v.dump());
    return v.get<std::string>();
  }
  const Json& array(const Json& obj, const std::string& path, const char* key) const {
    const Json& v = at(obj, path, key);
    PACKPIPE_CHECK(v.is_array(), "{}: {}/{}: expected an array, found {}", what, path, key, v.type_name());
    return v;
  }
  /// Refuses a field of `obj` outside `keys` (a misspelt field is an error, never ignored).
  void only(const Json& obj, const std::string& path, std::initializer_list<const char*> keys) const {
    PACKPIPE_CHECK(obj.is_object(), "{}: {}: expected an object, found {}", what, path.empty() ? "/" : path,
                   obj.type_name());
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      bool known = false;
      for (const char* k : keys) known = known || it.key() == k;
      if (!known) {
        PACKPIPE_THROW(Error, "{}: {}/{}: unknown field (expected {})", what, path, it.key(), fmt::join(keys, ", "));
      }
    }
  }

  RegionFit region(const Json& j, const std::string& path) const {
    only(j, path, {"a", "b", "center_log2_tokens", "min_log2_tokens", "max_log2_tokens", "min_predicted_ms",
                   "max_predicted_ms", "points", "rejected", "error_before", "error_after", "global_fallback",
                   "through_origin"});
    RegionFit f;
    f.a = positive(j, path, "a");
    f.b = number(j, path, "b");
    f.center_log2_tokens = number(j, path, "center_log2_tokens");
    PACKPIPE_CHECK(f.center_log2_tokens >= 0 && f.center_log2_tokens <= 64,
                   "{}: {}/center_log2_tokens: expected in [0, 64], found {}", what, path, f.center_log2_tokens);
    f.min_log2_tokens = number(j, path, "min_log2_tokens");
    f.max_log2_tokens = number(j, path, "max_log2_tokens");
    f.min_predicted_ms = number(j, path, "min_predicted_ms");
    f.max_predicted_ms = number(j, path, "max_predicted_ms");
    f.points = count(j, path, "points");
    f.rejected = count(j, path, "rejected");
    f.error_before = number(j, path, "error_before");
    f.error_after = number(j, path, "error_after");
    f.global_fallback = flag(j, path, "global_fallback");
    f.through_origin = flag(j, path, "through_origin");
    return f;
  }
};

}  // namespace

void check_fit_options(const FitOptions& o) {
  PACKPIPE_CHECK_ARG(o.min_region_points >= 2 && o.min_region_points <= (std::int64_t{1} << 31),
                     "min_region_points (--min-region-points) must be in [2, 2^31], found {}", o.min_region_points);
  PACKPIPE_CHECK_ARG(o.outlier_mads >= 1 && o.outlier_mads <= 100, "outlier_mads (--outlier-mads) must be in [1, 100], found {}",
                     o.outlier_mads);
  PACKPIPE_CHECK_ARG(o.max_iterations >= 1 && o.max_iterations <= 1000, "max_iterations (--max-iterations) must be in [1, 1000], found {}",
                     o.max_iterations);
  PACKPIPE_CHECK_ARG(o.transfer_quantile >= 0 && o.transfer_quantile <= 1,
                     "transfer_quantile (--transfer-quantile) must be in [0, 1], found {}", o.transfer_quantile);
}

namespace {

// The schedule factors' part of check_calibration (also what CalibratedCostModel needs of a
// Calibration built in code: the simulator stretches timelines by factors of at least 1).
void check_schedule_fits(const Calibration& c, const std::string& what) {
  for (std::size_t k = 0; k < c.schedules.size(); ++k) {
    const ScheduleFit& f = c.schedules[k];
    const std::string path = fmt::format("/schedules/{}", k);
    const auto* kind = enum_find(kScheduleKindNames, f.schedule);
    PACKPIPE_CHECK(kind != nullptr, "{}: {}/schedule: expected one of {}, found \"{}\"", what, path,
                   enum_name_list(kScheduleKindNames), f.schedule);
    PACKPIPE_CHECK(k == 0 || static_cast<int>(kind->value) >
                                 static_cast<int>(schedule_kind_from_name(c.schedules[k - 1].schedule)),
                   "{}: {}/schedule: kinds are listed once each, in the order {}; found \"{}\" after \"{}\"", what,
                   path, enum_name_list(kScheduleKindNames), f.schedule, c.schedules[k - 1].schedule);
    PACKPIPE_CHECK(f.factor >= kMinScheduleFactor && f.factor <= kMaxScheduleFactor,
                   "{}: {}/factor: expected in [{:g}, {:g}], found {}", what, path, kMinScheduleFactor,
                   kMaxScheduleFactor, f.factor);
    PACKPIPE_CHECK(f.iterations >= kMinScheduleIterations, "{}: {}/iterations: a fitted kind has at least {}, found {}",
                   what, path, kMinScheduleIterations, f.iterations);
    PACKPIPE_CHECK(std::isfinite(f.spread) && f.spread >= 0, "{}: {}/spread: expected >= 0, found {}", what, path,
                   f.spread);
  }
}

}  // namespace

void check_calibration(const Calibration& c, const std::string& what) {
  try {
    check_fit_options(c.options);
  } catch (const InvalidArgument& e) {
    PACKPIPE_THROW(Error, "{}: /options: {}", what, e.what());
  }
  // Both ends of a range hold a point; the centre is their mean (a rounding's tolerance).
  auto inside = [](double x, double lo, double hi) {
    const double tol = 1e-9 * std::max(1.0, std::abs(x));
    return x >= lo - tol && x <= hi + tol;
  };
  auto check_region = [&](const RegionFit& r, const std::string& path, bool in_regions) {
    PACKPIPE_CHECK(r.a >= kMinCalibrationSlope && r.a <= kMaxCalibrationSlope,
                   "{}: {}/a: expected in [{:g}, {:g}], found {}", what, path, kMinCalibrationSlope, kMaxCalibrationSlope,
                   r.a);
    PACKPIPE_CHECK(std::isfinite(r.b) && std::abs(r.b) <= kMaxCalibrationInterceptMs,
                   "{}: {}/b: expected in [-{:g}, {:g}], found {}", what, path, kMaxCalibrationInterceptMs,
                   kMaxCalibrationInterceptMs, r.b);
    PACKPIPE_CHECK(!r.through_origin || r.b == 0, "{}: {}/b: a line through the origin has b 0, found {}", what, path,
                   r.b);
    PACKPIPE_CHECK(r.rejected >= 0 && r.rejected <= r.points, "{}: {}/rejected: expected in [0, points ({})], found {}",
                   what, path, r.points, r.rejected);
    PACKPIPE_CHECK(r.points <= c.measurements, "{}: {}/points: expected at most the {} measurements, found {}", what,
                   path, c.measurements, r.points);
    for (double v : {r.error_before, r.error_after}) {
      PACKPIPE_CHECK(std::isfinite(v) && v >= 0, "{}: {}/error_before, error_after: expected >= 0, found {}", what, path,
                     v);
    }
    if (r.points == 0) return;
    PACKPIPE_CHECK(r.min_log2_tokens >= 0 && r.max_log2_tokens <= 64 &&
                       inside(r.center_log2_tokens, r.min_log2_tokens, r.max_log2_tokens),
                   "{}: {}/center_log2_tokens: expected {} within its points' range [{}, {}] (within [0, 64])", what,
                   path, r.center_log2_tokens, r.min_log2_tokens, r.max_log2_tokens);
    PACKPIPE_CHECK(r.min_predicted_ms > 0 && r.min_predicted_ms <= r.max_predicted_ms &&
                       r.max_predicted_ms <= kMaxMeasuredMs,
                   "{}: {}/min_predicted_ms, max_predicted_ms: expected 0 < {} <= {} <= {:g}", what, path,
                   r.min_predicted_ms, r.max_predicted_ms, kMaxMeasuredMs);
    if (!in_regions) return;
    PACKPIPE_CHECK(r.global_fallback == (r.points < c.options.min_region_points),
                   "{}: {}/global_fallback: a region of {} points {} its op's global line (min_region_points {}), found "
                   "{}", what, path, r.points, r.points < c.options.min_region_points ? "takes" : "has its own",
                   c.options.min_region_points, r.global_fallback);
  };
  for (std::size_t k = 0; k < c.compute.size(); ++k) {
    const OpFit& f = c.compute[k];
    const std::string path = fmt::format("/compute/{}", k);
    const char* op = measured_op_name(f.op);
    PACKPIPE_CHECK(f.from == "measured" || (f.op == MeasuredOp::Backward && f.from == "I + W"),
                   "{}: {}/from: expected \"measured\"{}, found \"{}\"", what, path,
                   f.op == MeasuredOp::Backward ? " or \"I + W\"" : "", f.from);
    PACKPIPE_CHECK(std::isfinite(f.attention_gamma) && f.attention_gamma > kMinAttentionGamma &&
                       f.attention_gamma <= kMaxAttentionGamma && (f.fitted || f.attention_gamma == 0),
                   "{}: {}/attention_gamma: expected in ({:g}, {:g}] (0 for an op without a fit), found {}", what, path,
                   kMinAttentionGamma, kMaxAttentionGamma, f.attention_gamma);
    check_region(f.global, path + "/global", false);
    PACKPIPE_CHECK(f.fitted == (f.global.points > 0), "{}: {}/fitted: {} with {} points in /global", what, path,
                   f.fitted, f.global.points);
    PACKPIPE_CHECK(f.regions.empty() || (f.fitted && c.options.regions),
                   "{}: {}/regions: expected none ({}), found {}", what, path,
                   f.fitted ? "fitted with options.regions false" : "the op is not fitted", f.regions.size());
    std::int64_t points = 0;
    for (std::size_t i = 0; i < f.regions.size(); ++i) {
      const RegionFit& r = f.regions[i];
      const std::string rp = fmt::format("{}/regions/{}", path, i);
      check_region(r, rp, true);
      PACKPIPE_CHECK(r.points > 0, "{}: {}/points: a region holds at least one point, found {}", what, rp, r.points);
      points += r.points;
      if (r.global_fallback) {
        PACKPIPE_CHECK(r.a == f.global.a && r.b == f.global.b && r.through_origin == f.global.through_origin &&
                           r.rejected == 0,
                       "{}: {}: a global_fallback region holds its op's global line (a {}, b {}), found a {}, b {}", what,
                       rp, f.global.a, f.global.b, r.a, r.b);
      }
      if (i == 0) continue;
      const RegionFit& q = f.regions[i - 1];
      PACKPIPE_CHECK(r.center_log2_tokens > q.center_log2_tokens && r.min_log2_tokens > q.max_log2_tokens,
                     "{}: {}: expected above region {} in tokens (centre {} > {}, points from 2^{} above 2^{})", what,
                     rp, i - 1, r.center_log2_tokens, q.center_log2_tokens, r.min_log2_tokens, q.max_log2_tokens);
      // The promise of 013: a calibration never teaches the partitioner that more tokens are faster.
      const double p = falls_at(q, r);
      PACKPIPE_CHECK(p == 0,
                     "{}: {}: the calibrated {} time falls as tokens grow from region {} (2^{:.4g} tokens: {:.4g} ms for "
                     "a typical {:.4g} ms predicted) to region {} (2^{:.4g} tokens: {:.4g} ms for {:.4g} ms predicted; "
                     "falling at {:.4g} ms predicted): a calibration never makes more tokens faster (fit_calibration "
                     "pools such regions; docs/design/013-calibration.md)",
                     what, rp, op, i - 1, q.center_log2_tokens, calibrated(q, typical_predicted_ms(q)),
                     typical_predicted_ms(q), i, r.center_log2_tokens, calibrated(r, typical_predicted_ms(r)),
                     typical_predicted_ms(r), p);
    }
    PACKPIPE_CHECK(f.regions.empty() || points == f.global.points,
                   "{}: {}/regions: the regions hold {} points, /global {} (the regions split the op's points)", what,
                   path, points, f.global.points);
  }
  for (std::size_t k = 0; k < c.transfers.size(); ++k) {
    const TransferFit& t = c.transfers[k];
    const std::string path = fmt::format("/transfers/{}", k);
    PACKPIPE_CHECK(t.inter_node == (k == 1), "{}: {}/link: expected \"{}\"", what, path, k == 1 ? "inter" : "intra");
    PACKPIPE_CHECK(t.points >= 0 && t.points <= c.measurements && t.sizes >= 0 && t.sizes <= t.points,
                   "{}: {}/points, sizes: expected 0 <= sizes ({}) <= points ({}) <= measurements ({})", what, path,
                   t.sizes, t.points, c.measurements);
    for (double v : {t.error_before, t.error_after}) {
      PACKPIPE_CHECK(std::isfinite(v) && v >= 0, "{}: {}/error_before, error_after: expected >= 0, found {}", what, path,
                     v);
    }
    if (t.fitted) {
      PACKPIPE_CHECK(t.sizes >= 1, "{}: {}/sizes: a fitted link has at least one size, found {}", what, path, t.sizes);
      PACKPIPE_CHECK(std::isfinite(t.latency_ms) && t.latency_ms >= 0 && t.latency_ms <= kMaxMeasuredMs,
                     "{}: {}/latency_ms: expected in [0, {:g}], found {}", what, path, kMaxMeasuredMs, t.latency_ms);
      PACKPIPE_CHECK(t.bytes_per_ms >= kMinCalibrationBytesPerMs && t.bytes_per_ms <= kMaxCalibrationBytesPerMs,
                     "{}: {}/bytes_per_ms: expected in [{:g}, {:g}], found {}", what, path, kMinCalibrationBytesPerMs,
                     kMaxCalibrationBytesPerMs, t.bytes_per_ms);
    } else {
      PACKPIPE_CHECK(t.latency_ms == 0 && t.bytes_per_ms == 0,
                     "{}: {}: a link without a fit has latency_ms and bytes_per_ms 0, found {} and {}", what, path,
                     t.latency_ms, t.bytes_per_ms);
    }
  }
  check_schedule_fits(c, what);
}

// ---- applying a calibration ----------------------------------------------------------------------

double Calibration::apply(MeasuredOp op, double tokens, double predicted_ms, double share) const {
  PACKPIPE_CHECK_ARG(is_compute(op), "Calibration::apply: {} is a transfer (the communication model calibrates "
                                     "transfers)", measured_op_name(op));
  const OpFit& f = compute[op_index(op)];
  if (!f.fitted) return predicted_ms;
  // gamma 0 multiplies nothing: a calibration without the term keeps its bits.
  const double p = f.attention_gamma != 0 ? predicted_ms * (1.0 + f.attention_gamma * share) : predicted_ms;
  return fitted_ms(f, std::log2(std::max(tokens, 1.0)), p);
}

bool Calibration::uses_attention_share() const {
  for (const OpFit& f : compute) {
    if (f.attention_gamma != 0) return true;
  }
  return false;
}

StageOpTimes Calibration::apply(const StageOpTimes& t, double tokens, double share) const {
  StageOpTimes c;
  c.forward_ms = apply(MeasuredOp::Forward, tokens, t.forward_ms, share);
  c.backward_ms = apply(MeasuredOp::Backward, tokens, t.backward_ms, share);
  // Halves without a fit scale with the calibrated backward (a ratio of exactly 1 when B is
  // unchanged, so an identity calibration changes no bit).
  const double scale = t.backward_ms > 0 ? c.backward_ms / t.backward_ms : 1.0;
  c.backward_input_ms = compute[op_index(MeasuredOp::BackwardInput)].fitted
                            ? apply(MeasuredOp::BackwardInput, tokens, t.backward_input_ms, share)
                            : t.backward_input_ms * scale;
  c.backward_weight_ms = compute[op_index(MeasuredOp::BackwardWeight)].fitted
                             ? apply(MeasuredOp::BackwardWeight, tokens, t.backward_weight_ms, share)
                             : t.backward_weight_ms * scale;
  c.backward_weight_ms = std::min(c.backward_weight_ms, c.backward_ms);
  return c;
}

double Calibration::schedule_factor(ScheduleKind k) const {
  double most = 0;
  for (const ScheduleFit& f : schedules) {
    if (f.schedule == schedule_kind_name(k)) return f.factor;
    most = std::max(most, f.factor);
  }
  return schedules.empty() ? 1.0 : most;
}

double Calibration::stage_ms(double tokens, double forward_ms, double backward_ms, double share) const {
  return apply(MeasuredOp::Forward, tokens, forward_ms, share) + apply(MeasuredOp::Backward, tokens, backward_ms, share);
}

CommModel Calibration::apply(const CommModel& base_comm) const {
  CommModel c = base_comm;
  for (const TransferFit& t : transfers) {
    if (!t.fitted) continue;
    (t.inter_node ? c.inter_latency_ms : c.intra_latency_ms) = t.latency_ms;
    (t.inter_node ? c.inter_bytes_per_ms : c.intra_bytes_per_ms) = t.bytes_per_ms;
  }
  return c;
}

// ---- persistence ---------------------------------------------------------------------------------

std::string Calibration::to_json() const {
  OJson j;
  j["format"] = kFormat;
  j["version"] = schedules.empty() ? 1 : kVersion;
  j["base"] = OJson{{"model", base.model},
                    {"device", base.device},
                    {"description", base.description},
                    {"fingerprint", base.fingerprint}};
  j["options"] = OJson{{"min_region_points", options.min_region_points},
                       {"outlier_mads", options.outlier_mads},
                       {"max_iterations", options.max_iterations},
                       {"regions", options.regions},
                       {"transfer_quantile", options.transfer_quantile}};
  j["measurements"] = measurements;
  OJson ops = OJson::array();
  for (const OpFit& f : compute) {
    OJson o;
    o["op"] = measured_op_name(f.op);
    o["fitted"] = f.fitted;
    o["from"] = f.from;
    o["attention_gamma"] = f.attention_gamma;
    o["global"] = region_json(f.global);
    OJson rs = OJson::array();
    for (const auto& r : f.regions) rs.push_back(region_json(r));
    o["regions"] = rs;
    ops.push_back(o);
  }
  j["compute"] = ops;
  OJson ts = OJson::array();
  for (const TransferFit& t : transfers) {
    ts.push_back(OJson{{"link", t.inter_node ? "inter" : "intra"},
                       {"fitted", t.fitted},
                       {"latency_ms", t.latency_ms},
                       {"bytes_per_ms", t.bytes_per_ms},
                       {"points", t.points},
                       {"sizes", t.sizes},
                       {"error_before", t.error_before},
                       {"error_after", t.error_after}});
  }
  j["transfers"] = ts;
  OJson ss = OJson::array();
  for (const ScheduleFit& f : schedules) {
    ss.push_back(OJson{{"schedule", f.schedule}, {"factor", f.factor}, {"iterations", f.iterations}, {"spread", f.spread}});
  }
  j["schedules"] = ss;
  return j.dump(1) + "\n";
}

Calibration Calibration::from_json(const std::string& text, const std::string& what) {
  const Json j = parse_json(text, what);
  const Reader r{what};
  Calibration c;
  const std::string format = r.text(j, "", "format");
  PACKPIPE_CHECK(format == kFormat, "{}: /format: expected \"{}\", found \"{}\"", what, kFormat, format);
  const std::int64_t version = r.count(j, "", "version");
  PACKPIPE_CHECK(version >= 1 && version <= kVersion,
                 "{}: /version: expected 1 to {}, found {} (written by a newer packpipe?)", what, kVersion, version);
  const Json& b = r.at(j, "", "base");
  r.only(b, "/base", {"model", "device", "description", "fingerprint"});
  c.base.model = r.text(b, "/base", "model");
  c.base.device = r.text(b, "/base", "device");
  c.base.description = r.text(b, "/base", "description");
  c.base.fingerprint = r.text(b, "/base", "fingerprint");
  PACKPIPE_CHECK(c.base.fingerprint.size() == 16 &&
                     c.base.fingerprint.find_first_not_of("0123456789abcdef") == std::string::npos,
                 "{}: /base/fingerprint: expected 16 lower-case hex digits, found \"{}\"", what, c.base.fingerprint);
  const Json& o = r.at(j, "", "options");
  r.only(o, "/options", {"min_region_points", "outlier_mads", "max_iterations", "regions", "transfer_quantile"});
  c.options.min_region_points = r.count(o, "/options", "min_region_points");
  c.options.outlier_mads = r.number(o, "/options", "outlier_mads");
  c.options.max_iterations = static_cast<int>(std::min<std::int64_t>(r.count(o, "/options", "max_iterations"), 1 << 30));
  c.options.regions = r.flag(o, "/options", "regions");
  c.options.transfer_quantile = r.number(o, "/options", "transfer_quantile");
  c.measurements = r.count(j, "", "measurements");
  const Json& ops = r.array(j, "", "compute");
  PACKPIPE_CHECK(ops.size() == c.compute.size(), "{}: /compute: expected {} fits (F, B, I, W), found {}", what,
                 c.compute.size(), ops.size());
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const std::string path = fmt::format("/compute/{}", k);
    OpFit& f = c.compute[k];
    f.op = static_cast<MeasuredOp>(k);
    r.only(ops[k], path, {"op", "fitted", "from", "attention_gamma", "global", "regions"});
    const std::string op = r.text(ops[k], path, "op");
    PACKPIPE_CHECK(op == measured_op_name(f.op), "{}: {}/op: expected \"{}\", found \"{}\"", what, path,
                   measured_op_name(f.op), op);
    f.fitted = r.flag(ops[k], path, "fitted");
    f.from = r.text(ops[k], path, "from");
    if (ops[k].is_object() && ops[k].contains("attention_gamma")) f.attention_gamma = r.number(ops[k], path, "attention_gamma");
    f.global = r.region(r.at(ops[k], path, "global"), path + "/global");
    const Json& rs = r.array(ops[k], path, "regions");
    for (std::size_t i = 0; i < rs.size(); ++i) {
      const std::string rp = fmt::format("{}/regions/{}", path, i);
      f.regions.push_back(r.region(rs[i], rp));
    }
  }
  const Json& ts = r.array(j, "", "transfers");
  PACKPIPE_CHECK(ts.size() == 2, "{}: /transfers: expected 2 links (intra, inter), found {}", what, ts.size());
  for (std::size_t k = 0; k < 2; ++k) {
    const std::string path = fmt::format("/transfers/{}", k);
    TransferFit& t = c.transfers[k];
    t.inter_node = k == 1;
    r.only(ts[k], path, {"link", "fitted", "latency_ms", "bytes_per_ms", "points", "sizes", "error_before", "error_after"});
    const std::string link = r.text(ts[k], path, "link");
    PACKPIPE_CHECK(link == (k == 1 ? "inter" : "intra"), "{}: {}/link: expected \"{}\", found \"{}\"", what, path,
                   k == 1 ? "inter" : "intra", link);
    t.fitted = r.flag(ts[k], path, "fitted");
    t.latency_ms = r.number(ts[k], path, "latency_ms");
    t.bytes_per_ms = r.number(ts[k], path, "bytes_per_ms");
    t.points = r.count(ts[k], path, "points");
    t.sizes = r.count(ts[k], path, "sizes");
    t.error_before = r.number(ts[k], path, "error_before");
    t.error_after = r.number(ts[k], path, "error_after");
  }
  // Version 2 is written only with fitted schedule kinds (a calibration without any is version 1).
  PACKPIPE_CHECK(version < 2 || (j.contains("schedules") && j["schedules"].is_array() && !j["schedules"].empty()),
                 "{}: /schedules: a version-2 file lists at least one fitted schedule kind (one without any is "
                 "version 1), found {}",
                 what, !j.contains("schedules") ? std::string("none") : j["schedules"].dump());
  if (j.contains("schedules")) {
    const Json& ss = r.array(j, "", "schedules");
    PACKPIPE_CHECK(version >= 2 || ss.empty(), "{}: /schedules: a version-1 file has no schedule factors (version 2 "
                   "does), found {}", what, ss.size());
    for (std::size_t k = 0; k < ss.size(); ++k) {
      const std::string path = fmt::format("/schedules/{}", k);
      ScheduleFit f;
      r.only(ss[k], path, {"schedule", "factor", "iterations", "spread"});
      f.schedule = r.text(ss[k], path, "schedule");
      f.factor = r.number(ss[k], path, "factor");
      f.iterations = r.count(ss[k], path, "iterations");
      f.spread = r.number(ss[k], path, "spread");
      c.schedules.push_back(std::move(f));
    }
  }
  // (after the fields it needs, so a renamed one is named missing first)
  r.only(j, "", {"format", "version", "base", "options", "measurements", "compute", "transfers", "schedules"});
  check_calibration(c, what);  // every invariant fit_calibration guarantees
  return c;
}

Calibration Calibration::load(const std::string& path) {
  Calibration c = from_json(read_regular_file(path, "calibration file"), path);
  c.source = path;
  return c;
}

void Calibration::save(const std::string& path) const { write_file_atomic(path, to_json()); }

// ---- fingerprint and predictions -------------------------------------------------------------------

std::string cost_model_fingerprint(const CostModel& cm) {
  PACKPIPE_CHECK_ARG(cm.calibration() == nullptr,
                     "cost_model_fingerprint: the model is calibrated; fingerprint its base model");
  const ModelSpec& m = cm.model();
  const DeviceSpec& d = cm.device();
  const CommModel& c = cm.comm();
  std::string s = fmt::format(
      "model {} {} {} {} {} {} {} {} {} {} {} {} {}\n", m.name, architecture_name(m.arch), m.num_layers,
      m.encoder_layers, m.decoder_layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn_hidden, m.gated_mlp,
      m.vocab, m.bytes_per_param);
  s += fmt::format("device {} {} {} {} {} {} {} {} {}\n", d.name, d.peak_tflops, d.memory_gb, d.hbm_gbps,
                   d.intra_node_gbps, d.intra_node_latency_us, d.inter_node_gbps, d.inter_node_latency_us,
                   d.gpus_per_node);
  s += fmt::format("comm {} {} {} {}\n", c.intra_latency_ms, c.intra_bytes_per_ms, c.inter_latency_ms,
                   c.inter_bytes_per_ms);
  // The kernel (added only for flash, so fingerprints of eager models are those of before it existed).
  if (cm.attention() == AttentionKernel::Flash) s += "attention flash\n";
  const bool encdec = m.arch == Architecture::EncoderDecoder;
  std::vector<StageLayout> layouts = {{1, 0, false, false}, {1, 0, true, false}, {1, 0, false, true}};
  if (encdec) layouts = {{1, 0, false, false}, {1, 0, true, false}, {0, 1, false, false}, {0, 1, true, true}};
  for (const auto& l : layouts) {
    for (Recompute rc : {Recompute::None, Recompute::Selective}) {
      for (std::int64_t mbs : {1, 8}) {
        for (std::int64_t seq : {128, 1024}) {
          const std::int64_t dec = encdec ? 128 : 0;
          try {
            const LayerCost t = stage_cost(cm, l, 1, MicroShape{mbs, seq, dec, {}}, rc);
            s += fmt::format("{} {} {}\n", t.forward_ms, t.backward_ms, t.recompute_ms);
          } catch (const InvalidArgument&) {
            s += "refused\n";
          }
        }
      }
    }
  }
  return fmt::format("{:016x}", XXH64(s.data(), s.size(), 0));
}

bool crosses_nodes(const CostModel& cm, std::int64_t tp, std::int64_t rank, std::int64_t peer) {
  const std::int64_t per_node = std::max<std::int64_t>(1, cm.device().gpus_per_node / std::max<std::int64_t>(1, tp));
  return rank / per_node != peer / per_node;
}

double predict_ms(const CostModel& cm, const Measurement& m) {
  if (!is_compute(m.op)) return cm.comm().p2p_ms(static_cast<double>(m.bytes), crosses_nodes(cm, m.tp, m.rank, m.peer));
  return op_time(stage_op_times(cm, m.layout, m.tp, m.shape(), m.recompute), m.op);
}

// ---- fitting ---------------------------------------------------------------------------------------

Calibration fit_calibration(const CostModel& base, const std::vector<Measurement>& measurements,
                            const FitOptions& options) {
  check_fit_options(options);
  PACKPIPE_CHECK_ARG(!measurements.empty(), "fit_calibration: no measurements to fit");
  PACKPIPE_CHECK_ARG(base.calibration() == nullptr,
                     "fit_calibration: the cost model is already calibrated ({}); fit over its base model",
                     base.describe());
  std::vector<std::size_t> order(measurements.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (std::size_t i : order) check_measurement(measurements[i], describe_measurement(measurements[i], i));
  // Canonical order: every sum below runs over it, so the result does not depend on the input order.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return sort_key(measurements[x]) < sort_key(measurements[y]);
  });
  Calibration c;
  c.options = options;
  c.measurements = static_cast<std::int64_t>(measurements.size());
  c.base = {base.model().name, base.device().name, base.describe(), cost_model_fingerprint(base)};
  std::array<std::vector<Point>, 4> pts;
  std::array<std::vector<TransferSample>, 2> transfers;
  // (iteration, replica, rank, stage, mb) -> index into the I and W points and their predictions
  struct Halves {
    double tokens = 0, b_pred = 0, i_ms = -1, w_ms = -1, share = 0;
  };
  std::map<std::tuple<std::uint64_t, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t>, Halves> halves;
  for (std::size_t i : order) {
    const Measurement& m = measurements[i];
    if (!is_compute(m.op)) {
      transfers[crosses_nodes(base, m.tp, m.rank, m.peer) ? 1 : 0].push_back({static_cast<double>(m.bytes), m.ms});
      continue;
    }
    StageOpTimes t;
    try {
      t = stage_op_times(base, m.layout, m.tp, m.shape(), m.recompute);
    } catch (const InvalidArgument& e) {
      PACKPIPE_THROW(InvalidArgument, "{}: the cost model ({}) refuses its shape (stage {} encoder + {} decoder layers{}{}, "
                     "tp {}, rows {}, seq {}, dec_seq {}, recompute {}): {}",
                     describe_measurement(m, i), base.describe(), m.layout.encoder_layers, m.layout.decoder_layers,
                     m.layout.has_embedding ? ", embedding" : "", m.layout.has_postprocess ? ", LM head" : "", m.tp,
                     m.rows, m.seq, m.dec_seq, recompute_name(m.recompute), e.what());
    }
    const double p = op_time(t, m.op);
    const double tokens = shape_tokens(base.model(), m.shape());
    const double share = attention_share(base.model(), m.layout, m.shape(), base.attention());
    if (m.op == MeasuredOp::BackwardInput || m.op == MeasuredOp::BackwardWeight) {
      Halves& h = halves[std::make_tuple(m.iteration, m.replica, m.rank, m.stage, m.mb)];
      h.tokens = tokens;
      h.b_pred = t.backward_ms;
      h.share = share;
      (m.op == MeasuredOp::BackwardInput ? h.i_ms : h.w_ms) = m.ms;
    }
    // A zero prediction (no weight GEMMs on the stage) cannot be scaled: it keeps its intercept.
    if (p > 0) pts[op_index(m.op)].push_back({std::log2(std::max(tokens, 1.0)), p, m.ms, share});
  }
  for (std::size_t k = 0; k < 4; ++k) c.compute[k] = fit_op(static_cast<MeasuredOp>(k), pts[k], options);
  if (!c.compute[op_index(MeasuredOp::Backward)].fitted) {
    // No full backward measured: its time is that of the two halves run back to back.
    std::vector<Point> b;
    for (const auto& [key, h] : halves) {
      if (h.i_ms >= 0 && h.w_ms >= 0 && h.b_pred > 0) {
        b.push_back({std::log2(std::max(h.tokens, 1.0)), h.b_pred, h.i_ms + h.w_ms, h.share});
      }
    }
    std::sort(b.begin(), b.end(), [](const Point& x, const Point& y) { return std::tie(x.lt, x.p, x.m, x.s) < std::tie(y.lt, y.p, y.m, y.s); });
    c.compute[op_index(MeasuredOp::Backward)] = fit_op(MeasuredOp::Backward, b, options);
    if (!b.empty()) c.compute[op_index(MeasuredOp::Backward)].from = "I + W";
  }
  for (std::size_t k = 0; k < 2; ++k) c.transfers[k] = fit_transfers(k == 1, transfers[k], base.comm(), options);
  for (const OpFit& f : c.compute) {
    std::vector<const RegionFit*> lines = {&f.global};
    for (const auto& r : f.regions) lines.push_back(&r);
    for (const RegionFit* r : lines) {
      PACKPIPE_CHECK_ARG(r->a >= kMinCalibrationSlope && r->a <= kMaxCalibrationSlope &&
                             std::abs(r->b) <= kMaxCalibrationInterceptMs,
                         "{}: the measured times are {} x the model's predictions {:+} ms ({:g} to {:g} x and at most "
                         "{:g} ms accepted): measurements of another model, or in other units?",
                         measured_op_name(f.op), r->a, r->b, kMinCalibrationSlope, kMaxCalibrationSlope,
                         kMaxCalibrationInterceptMs);
    }
  }
  for (const TransferFit& t : c.transfers) {
    PACKPIPE_CHECK_ARG(!t.fitted || (t.bytes_per_ms >= kMinCalibrationBytesPerMs &&
                                     t.bytes_per_ms <= kMaxCalibrationBytesPerMs),
                       "{}-node transfers: the measured times give {:g} bytes per ms ({:g} to {:g} accepted): "
                       "measurements in other units, or not transfers?",
                       t.inter_node ? "inter" : "intra", t.bytes_per_ms, kMinCalibrationBytesPerMs,
                       kMaxCalibrationBytesPerMs);
  }
  try {
    check_calibration(c, "fit_calibration");  // what the fit writes, its reader opens
  } catch (const Error& e) {
    throw std::logic_error(std::string("packpipe bug: a fitted calibration breaks an invariant of its file: ") + e.what());
  }
  return c;
}

// ---- the calibrated model ----------------------------------------------------------------------------

CalibratedCostModel::CalibratedCostModel(std::shared_ptr<const CostModel> base, Calibration calibration)
    : base_(std::move(base)), cal_(std::move(calibration)) {
  PACKPIPE_CHECK_ARG(base_ != nullptr, "CalibratedCostModel: no base model");
  PACKPIPE_CHECK_ARG(base_->calibration() == nullptr,
                     "CalibratedCostModel: the base model is already calibrated ({}); calibrate its base model",
                     base_->describe());
  const std::string fp = cost_model_fingerprint(*base_);
  const std::string name = cal_.source.empty() ? std::string("the calibration") : "calibration '" + cal_.source + "'";
  PACKPIPE_CHECK_ARG(fp == cal_.base.fingerprint,
                     "{} was fitted over {} on {} ({}, fingerprint {}); this cost model is {} on {} ({}, fingerprint "
                     "{}): fit a calibration over this model (packpipe costmodel calibrate) or load the model it was "
                     "fitted over",
                     name, cal_.base.model, cal_.base.device, cal_.base.description, cal_.base.fingerprint,
                     base_->model().name, base_->device().name, base_->describe(), fp);
  try {
    check_schedule_fits(cal_, name);  // a Calibration built in code: factors the simulator can apply
  } catch (const Error& e) {
    throw InvalidArgument(std::string("CalibratedCostModel: ") + e.what());
  }
  comm_ = cal_.apply(base_->comm());
}

std::string CalibratedCostModel::describe() const {
  std::string fitted;
  for (const OpFit& f : cal_.compute) {
    if (f.fitted) fitted += (fitted.empty() ? "" : ", ") + std::string(measured_op_name(f.op));
  }
  for (const TransferFit& t : cal_.transfers) {
    if (t.fitted) fitted += (fitted.empty() ? "" : ", ") + std::string(t.inter_node ? "inter-node" : "intra-node");
  }
  for (const ScheduleFit& f : cal_.schedules) fitted += (fitted.empty() ? "" : ", ") + f.schedule + fmt::format(" x{:.3f}", f.factor);
  return fmt::format("{}, calibrated by {} ({} fitted on {} measurements)", base_->describe(),
                     cal_.source.empty() ? std::string("a calibration") : cal_.source, fitted.empty() ? "nothing" : fitted,
                     cal_.measurements);
}

}  // namespace packpipe::costmodel
