// Packed micro-batches with varlen attention: the dp method's balanced search and WLB-LLM's
// attention-balanced packing baseline (docs/design/014-layouts.md).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>
#include <tuple>

#include "common/errors.h"
#include "costmodel/flops.h"
#include "partition/detail/work.h"

namespace packpipe::partition::detail {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Tokens and attention sums of packed samples.
struct Sums {
  std::int64_t enc = 0, dec = 0;
  cm::AttentionWork attn;
  void add(std::pair<std::int64_t, std::int64_t> g) {
    enc += g.first;
    dec += g.second;
    attn.add(g.first, g.second);
  }
  void remove(std::pair<std::int64_t, std::int64_t> g) {
    enc -= g.first;
    dec -= g.second;
    attn.self -= g.first * g.first;
    attn.dec_self -= g.second * g.second;
    attn.cross -= g.first * g.second;
  }
  double tokens() const { return static_cast<double>(enc + dec); }
  double work() const { return static_cast<double>(attn.self + attn.dec_self + attn.cross); }
  cm::MicroShape shape() const { return {1, enc, dec, attn}; }
};

// A varlen shape near (enc, dec) tokens with attention sums near the given ones, rounded and
// clamped into what samples can make (each sum between the tokens it covers and the dense row's).
cm::MicroShape probe_shape(double enc, double dec, double self, double dec_self, double cross) {
  cm::MicroShape s;
  s.rows = 1;
  s.seq = std::max<std::int64_t>(1, std::llround(enc));
  s.dec_seq = dec > 0 ? std::max<std::int64_t>(1, std::llround(dec)) : 0;
  auto clamp = [](double v, std::int64_t lo, std::int64_t hi) {
    return std::min(hi, std::max(lo, static_cast<std::int64_t>(std::llround(v))));
  };
  s.attention.self = clamp(self, s.seq, s.seq * s.seq);
  if (s.dec_seq > 0) {
    s.attention.dec_self = clamp(dec_self, s.dec_seq, s.dec_seq * s.dec_seq);
    s.attention.cross = clamp(cross, 1, s.dec_seq * s.seq);
  }
  return s;
}

// time ~ fixed + token x tokens + attention x (self + dec_self + cross) near one micro-batch shape:
// what a packed micro-batch costs, linearised for assigning samples.
struct Linear {
  double fixed = 0, token = 1, attention = 0;
  double time(const Sums& s) const { return fixed + token * s.tokens() + attention * s.work(); }
  double weight(std::pair<std::int64_t, std::int64_t> g) const {
    const double e = static_cast<double>(g.first), d = static_cast<double>(g.second);
    return token * (e + d) + attention * (e * e + d * d + e * d);
  }
};

// Linear from three probes of the coster (recompute none, fit ignored): the average micro-batch of
// a batch with totals `all` cut k ways, the same twice over (twice its tokens and sums), and the
// same tokens with other attention sums. Token balancing (attention 0, fixed 0) where the model
// refuses a probe.
Linear marginal(Coster& coster, const Sums& all, std::int64_t k) {
  const double kd = static_cast<double>(k);
  const double e0 = static_cast<double>(all.enc) / kd, d0 = static_cast<double>(all.dec) / kd;
  const double s0 = static_cast<double>(all.attn.self) / kd, ds0 = static_cast<double>(all.attn.dec_self) / kd,
               c0 = static_cast<double>(all.attn.cross) / kd;
  const cm::MicroShape p0 = probe_shape(e0, d0, s0, ds0, c0);
  const cm::MicroShape p1 = probe_shape(2 * e0, 2 * d0, 2 * s0, 2 * ds0, 2 * c0);
  // Attention sums scaled by f at the same tokens (up, or down when already dense).
  auto work_of = [](const cm::MicroShape& s) {
    return static_cast<double>(s.attention.self + s.attention.dec_self + s.attention.cross);
  };
  const double f = work_of(p0) * 2 <= static_cast<double>(p0.seq * p0.seq) ? 2.0 : 0.5;
  const cm::MicroShape p2 = probe_shape(e0, d0, s0 * f, ds0 * f, c0 * f);
  const double t0 = coster.get_varlen(p0, cm::Recompute::None).time_ms;
  const double t1 = coster.get_varlen(p1, cm::Recompute::None).time_ms;
  const double t2 = coster.get_varlen(p2, cm::Recompute::None).time_ms;
  Linear l;
  if (!(std::isfinite(t0) && std::isfinite(t1) && std::isfinite(t2))) return l;
  const double T0 = static_cast<double>(p0.seq + p0.dec_seq), A0 = work_of(p0);
  const double T1 = static_cast<double>(p1.seq + p1.dec_seq), A1 = work_of(p1), A2 = work_of(p2);
  l.attention = A2 != A0 ? std::max(0.0, (t2 - t0) / (A2 - A0)) : 0.0;
  l.token = T1 != T0 ? std::max(0.0, ((t1 - t0) - l.attention * (A1 - A0)) / (T1 - T0)) : 0.0;
  if (!(l.token > 0) && !(l.attention > 0)) l.token = 1;
  l.fixed = std::max(0.0, t0 - l.token * T0 - l.attention * A0);
  return l;
}

// One assignment of samples to k packed micro-batches.
struct Assignment {
  std::vector<std::vector<std::uint32_t>> bins;
  std::vector<Sums> sums;
};

// Samples by descending weight under `lin` (ties by id): the order every count's assignment
// takes (for decoder-only models the same as by length, whatever the weights).
std::vector<std::uint32_t> weight_order(const Work& w, const std::vector<std::uint32_t>& ids, const Linear& lin) {
  std::vector<std::pair<double, std::uint32_t>> order;
  order.reserve(ids.size());
  for (const auto s : ids) order.emplace_back(lin.weight(packed_sample(w, s)), s);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<std::uint32_t> out;
  out.reserve(order.size());
  for (const auto& x : order) out.push_back(x.second);
  return out;
}

// Longest processing time first: samples in `order` onto the bin of least load (ties to the lower
// index).
Assignment lpt(const Work& w, const std::vector<std::uint32_t>& order, const Linear& lin, std::int64_t k,
               bool keep_bins = true) {
  Assignment a;
  if (keep_bins) a.bins.resize(static_cast<std::size_t>(k));
  a.sums.resize(static_cast<std::size_t>(k));
  using Load = std::pair<double, std::size_t>;
  std::priority_queue<Load, std::vector<Load>, std::greater<>> heap;
  for (std::size_t b = 0; b < static_cast<std::size_t>(k); ++b) heap.emplace(lin.fixed, b);
  for (const auto s : order) {
    auto [load, b] = heap.top();
    heap.pop();
    const auto g = packed_sample(w, s);
    if (keep_bins) a.bins[b].push_back(s);
    a.sums[b].add(g);
    heap.emplace(load + lin.weight(g), b);
  }
  return a;
}

// The objective of micro-batch times `t` on `shape`.
double objective_of(const PipelineShape& shape, const std::vector<double>& t) {
  double mx = 0, sum = 0;
  for (double x : t) {
    mx = std::max(mx, x);
    sum += x;
  }
  return objective(shape, mx, sum);
}

// Exact costs of an assignment's bins: times, and whether every bin fits.
struct Exact {
  std::vector<double> time;
  bool fits = true;
  double objective = kInf;
};

Exact exact_costs(Coster& coster, const PipelineShape& shape, const Assignment& a, RecomputePolicy policy) {
  Exact e;
  e.time.reserve(a.bins.size());
  for (std::size_t b = 0; b < a.bins.size(); ++b) {
    if (a.bins[b].empty()) {
      e.fits = false;
      return e;
    }
    const Choice c = coster.choose_varlen(a.sums[b].shape(), policy);
    if (!c.fits) {
      e.fits = false;
      return e;
    }
    e.time.push_back(c.time_ms);
  }
  e.objective = objective_of(shape, e.time);
  return e;
}

// Moves and swaps of samples between the slowest micro-batch and the fastest ones while the
// objective falls (exact costs; at most `budget` trial costings).
void refine(const Work& w, Coster& coster, const PipelineShape& shape, RecomputePolicy policy, Assignment& a, Exact& e,
            int budget) {
  const std::size_t k = a.bins.size();
  if (k < 2) return;
  auto cost_of = [&](const Sums& s, double& t) {
    --budget;
    const Choice c = coster.choose_varlen(s.shape(), policy);
    t = c.time_ms;
    return c.fits;
  };
  while (budget > 0) {
    const std::size_t hi = static_cast<std::size_t>(std::max_element(e.time.begin(), e.time.end()) - e.time.begin());
    // The other micro-batches, fastest first (ties by index).
    std::vector<std::size_t> others;
    for (std::size_t b = 0; b < k; ++b) {
      if (b != hi) others.push_back(b);
    }
    std::sort(others.begin(), others.end(), [&](std::size_t x, std::size_t y) {
      return e.time[x] != e.time[y] ? e.time[x] < e.time[y] : x < y;
    });
    if (others.size() > 2) others.resize(2);
    auto& from = a.bins[hi];
    // Whether moving `out` (a sample of the slowest bin) to bin `to`, and `in` (one of bin `to`'s, or
    // none) back, lowers the objective; if so it is done.
    auto try_change = [&](std::size_t to, std::size_t out, const std::size_t* in) {
      const auto go = packed_sample(w, from[out]);
      Sums fs = a.sums[hi], ts = a.sums[to];
      fs.remove(go);
      ts.add(go);
      if (in != nullptr) {
        const auto gi = packed_sample(w, a.bins[to][*in]);
        ts.remove(gi);
        fs.add(gi);
      }
      double tf = 0, tt = 0;
      if (!cost_of(fs, tf) || !cost_of(ts, tt)) return false;
      std::vector<double> t = e.time;
      t[hi] = tf;
      t[to] = tt;
      const double obj = objective_of(shape, t);
      if (!(obj < e.objective * (1 - 1e-9))) return false;
      if (in != nullptr) {
        std::swap(from[out], a.bins[to][*in]);
      } else {
        a.bins[to].push_back(from[out]);
        from.erase(from.begin() + static_cast<std::ptrdiff_t>(out));
      }
      a.sums[hi] = fs;
      a.sums[to] = ts;
      e.time = std::move(t);
      e.objective = obj;
      return true;
    };
    bool improved = false;
    for (std::size_t to : others) {
      // Moves of the slowest bin's samples (largest first: its bins keep descending order).
      for (std::size_t i = 0; i < from.size() && !improved && budget > 0 && from.size() > 1; ++i) {
        improved = try_change(to, i, nullptr);
      }
      // Swaps: a sample of the slowest bin for the first lighter one of the other bin.
      for (std::size_t i = 0; i < from.size() && !improved && budget > 0; ++i) {
        const auto gi = packed_sample(w, from[i]);
        const auto& into = a.bins[to];
        for (std::size_t j = 0; j < into.size(); ++j) {
          const auto gj = packed_sample(w, into[j]);
          if (gj.first + gj.second >= gi.first + gi.second) continue;
          improved = try_change(to, i, &j);
          break;
        }
      }
      if (improved) break;
    }
    if (!improved) return;
  }
}

}  // namespace

BalancedOutcome balanced_search(const Work& w, const std::vector<std::uint32_t>& ids, Coster& coster,
                                const PipelineShape& shape, RecomputePolicy policy, std::int64_t count_multiple) {
  BalancedOutcome out;
  const auto n = static_cast<std::int64_t>(ids.size());
  const std::int64_t m = std::max<std::int64_t>(1, count_multiple);
  auto up = [&](std::int64_t k) { return (k + m - 1) / m * m; };
  const std::int64_t k_lo = up(std::max<std::int64_t>(1, shape.dp));
  if (n < k_lo) return out;
  Sums all;
  for (const auto s : ids) all.add(packed_sample(w, s));
  // Counts: a geometric grid (ratio 1.25) from k_lo to n, multiples of m.
  std::vector<std::int64_t> counts;
  for (std::int64_t k = k_lo; k <= n;) {
    counts.push_back(k);
    k = up(std::max(k + 1, static_cast<std::int64_t>(std::ceil(static_cast<double>(k) * 1.25))));
  }
  // One sample order for every count: by weight under the middle count's costs.
  const std::vector<std::uint32_t> order = weight_order(w, ids, marginal(coster, all, counts[counts.size() / 2]));
  // Estimated objective per count.
  std::vector<std::tuple<double, std::int64_t, Linear>> est;
  for (const std::int64_t k : counts) {
    const Linear lin = marginal(coster, all, k);
    const Assignment a = lpt(w, order, lin, k, false);
    std::vector<double> t;
    for (const auto& s : a.sums) t.push_back(lin.time(s));
    est.emplace_back(objective_of(shape, t), k, lin);
  }
  std::stable_sort(est.begin(), est.end(), [](const auto& x, const auto& y) { return std::get<0>(x) < std::get<0>(y); });
  // Exact costs in order of the estimates: the best of the first few feasible counts. A count whose
  // micro-batches do not fit is passed over (a larger one may).
  constexpr int kFeasible = 3, kTries = 10;
  Assignment best_a;
  Exact best_e;
  int feasible = 0, tries = 0;
  for (const auto& [obj, k, lin] : est) {
    if (feasible >= kFeasible || tries >= kTries) break;
    ++tries;
    Assignment a = lpt(w, order, lin, k);
    Exact e = exact_costs(coster, shape, a, policy);
    if (!e.fits) continue;
    ++feasible;
    if (e.objective < best_e.objective) {
      best_a = std::move(a);
      best_e = std::move(e);
    }
  }
  if (feasible == 0) return out;
  refine(w, coster, shape, policy, best_a, best_e, 64);
  for (auto& bin : best_a.bins) {
    MicroBatch mb;
    mb.layout = Layout::Packed;
    mb.samples = std::move(bin);
    out.microbatches.push_back(std::move(mb));
  }
  out.objective = best_e.objective;
  out.feasible = true;
  return out;
}

std::vector<MicroBatch> wlb_baseline(const Work& w, const cm::ModelSpec& model, const std::vector<std::uint32_t>& ids,
                                     std::uint64_t capacity) {
  std::vector<MicroBatch> out;
  if (ids.empty()) return out;
  const bool ed = w.encdec();
  std::uint64_t longest = 0, total = 0;
  std::vector<std::tuple<double, std::uint32_t, std::uint64_t>> order;  // (FLOPs, id, tokens)
  for (const auto s : ids) {
    const auto [e, d] = packed_sample(w, s);
    const auto t = static_cast<std::uint64_t>(e + d);
    longest = std::max(longest, t);
    total += t;
    double flops = 0;
    if (ed) {
      flops = static_cast<double>(model.encoder_layers) * cm::forward_flops(model, cm::LayerKind::Encoder, 1, e).total() +
              static_cast<double>(model.decoder_layers) * cm::forward_flops(model, cm::LayerKind::Decoder, 1, e, d).total();
    } else {
      flops = static_cast<double>(model.num_layers) * cm::forward_flops(model, cm::LayerKind::Encoder, 1, e).total();
    }
    order.emplace_back(flops, s, t);
  }
  const std::uint64_t cap = capacity != 0 ? capacity : longest;
  PACKPIPE_CHECK_ARG(cap >= longest,
                     "method 'wlb': capacity {} (capacity / --capacity) is below the longest sample's {} tokens; use a "
                     "larger capacity (or 0 for the longest sample's)",
                     cap, longest);
  const std::uint64_t k = std::max<std::uint64_t>(1, (total + cap - 1) / cap);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) > std::get<0>(b) : std::get<1>(a) < std::get<1>(b);
  });
  std::vector<double> load(k, 0.0);
  std::vector<std::uint64_t> fill(k, 0);
  out.resize(k);
  for (const auto& [flops, s, t] : order) {
    std::size_t pick = k;
    for (std::size_t b = 0; b < k; ++b) {
      if (fill[b] + t <= cap && (pick == k || load[b] < load[pick])) pick = b;
    }
    if (pick == k) pick = static_cast<std::size_t>(std::min_element(fill.begin(), fill.end()) - fill.begin());
    load[pick] += flops;
    fill[pick] += t;
    out[pick].samples.push_back(s);
  }
  std::vector<MicroBatch> kept;
  for (auto& mb : out) {
    if (mb.samples.empty()) continue;
    mb.layout = Layout::Packed;
    kept.push_back(std::move(mb));
  }
  return kept;
}

}  // namespace packpipe::partition::detail
