// Packed micro-batches with varlen attention: the dp method's balanced search and WLB-LLM's
// attention-balanced packing baseline (docs/design/014-layouts.md).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>

#include "common/errors.h"
#include "costmodel/flops.h"
#include "partition/detail/work.h"

namespace packpipe::partition::detail {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The loads of k micro-batches, with the least-loaded one in a range found in O(log k): the first
// index of the range's minimum, what a scan from the range's start with a strict < finds.
class LeastLoaded {
 public:
  explicit LeastLoaded(const std::vector<double>& load) {
    while (n_ < load.size()) n_ <<= 1;
    tree_.assign(2 * n_, {kInf, std::numeric_limits<std::uint32_t>::max()});
    for (std::size_t i = 0; i < load.size(); ++i) tree_[n_ + i] = {load[i], static_cast<std::uint32_t>(i)};
    for (std::size_t i = n_ - 1; i >= 1; --i) tree_[i] = std::min(tree_[2 * i], tree_[2 * i + 1]);
  }
  /// The least-loaded index in [lo, hi] (lo <= hi < k); ties to the lowest index.
  std::size_t argmin(std::size_t lo, std::size_t hi) const {
    Entry best{kInf, std::numeric_limits<std::uint32_t>::max()};
    for (std::size_t l = lo + n_, r = hi + n_ + 1; l < r; l >>= 1, r >>= 1) {
      if (l & 1) best = std::min(best, tree_[l++]);
      if (r & 1) best = std::min(best, tree_[--r]);
    }
    return best.second;
  }
  /// The least-loaded index of all (the root: O(1)).
  std::size_t least() const { return tree_[1].second; }
  /// Sets the load of index i.
  void set(std::size_t i, double load) {
    std::size_t p = n_ + i;
    tree_[p].first = load;
    for (p >>= 1; p >= 1; p >>= 1) tree_[p] = std::min(tree_[2 * p], tree_[2 * p + 1]);
  }

 private:
  using Entry = std::pair<double, std::uint32_t>;
  std::size_t n_ = 1;
  std::vector<Entry> tree_;
};

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
  // (scaled from p0's sums after clamping: a batch whose sum of squares exceeds what one dense
  // micro-batch of the mean tokens holds, a long sample among short ones, is clamped in p0, and
  // scaling the unclamped sums would clamp again to the same value and measure no slope)
  const double f = work_of(p0) * 2 <= static_cast<double>(p0.seq * p0.seq) ? 2.0 : 0.5;
  const auto a0 = p0.attention;
  const cm::MicroShape p2 = probe_shape(e0, d0, static_cast<double>(a0.self) * f, static_cast<double>(a0.dec_self) * f,
                                        static_cast<double>(a0.cross) * f);
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
  // The least-loaded bin, ties to the lowest index (a min-heap of (load, bin) pops the same).
  std::vector<double> load(static_cast<std::size_t>(k), lin.fixed);
  LeastLoaded least(load);
  for (const auto s : order) {
    const std::size_t b = least.least();
    const auto g = packed_sample(w, s);
    if (keep_bins) a.bins[b].push_back(s);
    a.sums[b].add(g);
    load[b] += lin.weight(g);
    least.set(b, load[b]);
  }
  return a;
}

// Tapered: as lpt, but the first `edge` and the last `edge` bins take a share of a middle bin's load
// growing (j + 1) / (edge + 1) towards the middle (ratios of load to share decide): micro-batches
// small enough to fill and drain a pipeline quickly, large ones to hide in its steady state (the
// schedules' constructive orders put the small ones at the ends).
Assignment tapered_lpt(const Work& w, const std::vector<std::uint32_t>& order, const Linear& lin, std::int64_t k,
                       std::int64_t edge) {
  Assignment a;
  a.bins.resize(static_cast<std::size_t>(k));
  a.sums.resize(static_cast<std::size_t>(k));
  std::vector<double> share(static_cast<std::size_t>(k), 1.0), load(static_cast<std::size_t>(k), lin.fixed);
  for (std::int64_t j = 0; j < edge && j < k / 2; ++j) {
    const double f = static_cast<double>(j + 1) / static_cast<double>(edge + 1);
    share[static_cast<std::size_t>(j)] = f;
    share[static_cast<std::size_t>(k - 1 - j)] = f;
  }
  // The bin of least load / share, ties to the lowest index (what a scan with a strict < finds).
  std::vector<double> ratio(static_cast<std::size_t>(k));
  for (std::size_t j = 0; j < ratio.size(); ++j) ratio[j] = load[j] / share[j];
  LeastLoaded least(ratio);
  for (const auto s : order) {
    const std::size_t b = least.least();
    const auto g = packed_sample(w, s);
    a.bins[b].push_back(s);
    a.sums[b].add(g);
    load[b] += lin.weight(g);
    least.set(b, load[b] / share[b]);
  }
  std::vector<std::vector<std::uint32_t>> bins;
  std::vector<Sums> sums;
  for (std::size_t b = 0; b < a.bins.size(); ++b) {  // a bin left empty (more bins than samples) is dropped
    if (a.bins[b].empty()) continue;
    bins.push_back(std::move(a.bins[b]));
    sums.push_back(a.sums[b]);
  }
  a.bins = std::move(bins);
  a.sums = std::move(sums);
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

// Exact costs of bins given as their shapes (empty bins do not fit); `each(b, choice)` sees every
// fitting bin's choice.
template <typename Bins, typename Each>
Exact exact_bin_costs(Coster& coster, const PipelineShape& shape, const Bins& bins, RecomputePolicy policy,
                      Each&& each) {
  Exact e;
  e.time.reserve(bins.size());
  for (std::size_t b = 0; b < bins.size(); ++b) {
    if (bins[b].first) {
      e.fits = false;
      return e;
    }
    const Choice c = coster.choose_varlen(bins[b].second, policy);
    if (!c.fits) {
      e.fits = false;
      return e;
    }
    e.time.push_back(c.time_ms);
    each(b, c);
  }
  e.objective = objective_of(shape, e.time);
  return e;
}

Exact exact_costs(Coster& coster, const PipelineShape& shape, const Assignment& a, RecomputePolicy policy) {
  std::vector<std::pair<bool, cm::MicroShape>> bins;
  for (std::size_t b = 0; b < a.bins.size(); ++b) bins.emplace_back(a.bins[b].empty(), a.sums[b].shape());
  return exact_bin_costs(coster, shape, bins, policy, [](std::size_t, const Choice&) {});
}

// The slowest micro-batch of times `t` and the two fastest others (ties by index).
std::pair<std::size_t, std::vector<std::size_t>> slowest_and_fastest(const std::vector<double>& t) {
  const std::size_t hi = static_cast<std::size_t>(std::max_element(t.begin(), t.end()) - t.begin());
  std::vector<std::size_t> others;
  for (std::size_t b = 0; b < t.size(); ++b) {
    if (b != hi) others.push_back(b);
  }
  std::sort(others.begin(), others.end(), [&](std::size_t x, std::size_t y) { return t[x] != t[y] ? t[x] < t[y] : x < y; });
  if (others.size() > 2) others.resize(2);
  return {hi, others};
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
    const auto order = slowest_and_fastest(e.time);
    const std::size_t hi = order.first;  // a named copy: lambdas cannot capture structured bindings in C++17
    const std::vector<std::size_t>& others = order.second;
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
  auto to_mbs = [](std::vector<std::vector<std::uint32_t>>& bins) {
    std::vector<MicroBatch> mbs;
    for (auto& bin : bins) {
      MicroBatch mb;
      mb.layout = Layout::Packed;
      mb.samples = std::move(bin);
      mbs.push_back(std::move(mb));
    }
    return mbs;
  };
  for (const auto& [obj, k, lin] : est) {
    if (feasible >= kFeasible || tries >= kTries) break;
    ++tries;
    Assignment a = lpt(w, order, lin, k);
    Exact e = exact_costs(coster, shape, a, policy);
    if (!e.fits) continue;
    ++feasible;
    if (e.objective < best_e.objective) {
      if (best_a.bins.size() > 0) out.alternatives.emplace_back(best_e.objective, to_mbs(best_a.bins));
      best_a = std::move(a);
      best_e = std::move(e);
    } else {
      out.alternatives.emplace_back(e.objective, to_mbs(a.bins));
    }
  }
  if (feasible == 0) return out;
  std::stable_sort(out.alternatives.begin(), out.alternatives.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  // Fewer, larger micro-batches (and more, smaller ones) than the bound prefers, first among the
  // alternatives: a schedule that fills bubbles pays less for a large micro-batch than (S - 1) x its
  // time, and fewer micro-batches cost less overhead; the planner's simulation decides.
  const auto k_best = static_cast<std::int64_t>(best_a.bins.size());
  std::vector<std::pair<double, std::vector<MicroBatch>>> scaled;
  const std::int64_t edge = shape.stages - 1;
  for (const double f : {1.0, 0.7, 0.5}) {  // tapered: small micro-batches to fill and drain with
    const std::int64_t k = up(std::max<std::int64_t>(k_lo, std::llround(static_cast<double>(k_best) * f)));
    if (edge < 1 || k < 2 * edge + 1 || k > n) continue;
    Assignment a = tapered_lpt(w, order, marginal(coster, all, k), k, edge);
    if (static_cast<std::int64_t>(a.bins.size()) < k_lo) continue;
    Exact e = exact_costs(coster, shape, a, policy);
    if (e.fits) scaled.emplace_back(e.objective, to_mbs(a.bins));
  }
  for (const double f : {0.5, 0.7, 1.4}) {
    const std::int64_t k = up(std::max<std::int64_t>(k_lo, std::llround(static_cast<double>(k_best) * f)));
    if (k == k_best || k > n) continue;
    const Linear lin = marginal(coster, all, k);
    Assignment a = lpt(w, order, lin, k);
    Exact e = exact_costs(coster, shape, a, policy);
    if (e.fits) scaled.emplace_back(e.objective, to_mbs(a.bins));
  }
  out.alternatives.insert(out.alternatives.begin(), std::make_move_iterator(scaled.begin()),
                          std::make_move_iterator(scaled.end()));
  refine(w, coster, shape, policy, best_a, best_e, 64);
  out.microbatches = to_mbs(best_a.bins);
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

namespace packpipe::partition::detail {

namespace {

// One entry of a sliced assignment: tokens [begin, begin + length) of a sample; `cut` when the
// sample is sliced (then the entry never moves: its micro-batch is fixed by its slice order).
struct Piece {
  std::uint32_t sample = 0, begin = 0, length = 0;
  bool cut = false;
};

// Tokens and attention sums of packed pieces.
struct PieceSums {
  std::int64_t tokens = 0;
  cm::AttentionWork attn;
  void add(const Piece& p) {
    tokens += p.length;
    attn.add_slice(p.length, p.begin);
  }
  void remove(const Piece& p) {
    const auto l = static_cast<std::int64_t>(p.length), b = static_cast<std::int64_t>(p.begin);
    tokens -= l;
    attn.self -= l * l;
    attn.prefix -= l * b;
    attn.prefix_tokens -= b;
  }
  cm::MicroShape shape() const { return {1, tokens, 0, attn}; }
};

// The linearised weight of l tokens after p kept ones: token l + attention (l^2 + kappa l p), where
// kappa converts the prefix's work to the self units the fit measured (the kernel executes l (l + p)
// of the square under eager, l^2 / 2 + l p under flash: kappa 1 and 2).
struct PieceWeight {
  double token = 1, attention = 0, kappa = 1;
  double operator()(double l, double p) const { return token * l + attention * (l * l + kappa * l * p); }
};

// Slice boundaries of a sample of `len` tokens into at most `n` slices of at least `min_slice` tokens
// (the last may be shorter when the sample is): the least cap C on the slices' weights for which
// the greedy cut (each slice the longest under C) needs at most n, by bisection; returns the pieces.
std::vector<Piece> cut_sample(std::uint32_t s, std::uint32_t len, std::int64_t n, std::uint32_t min_slice,
                              const PieceWeight& wt) {
  auto greedy = [&](double cap, std::vector<Piece>* out) {
    std::int64_t count = 0;
    std::uint32_t at = 0;
    while (at < len) {
      const double p = at, left = len - at;
      // the longest l with wt(l, p) <= cap: a t l^2 + (token + a kappa p) l - cap <= 0
      double l;
      const double a = wt.attention, b = wt.token + wt.attention * wt.kappa * p;
      if (a > 0) {
        l = (-b + std::sqrt(b * b + 4 * a * cap)) / (2 * a);
      } else {
        l = b > 0 ? cap / b : left;
      }
      std::uint32_t take = static_cast<std::uint32_t>(std::clamp(std::floor(l), 1.0, left));
      take = std::max(take, std::min<std::uint32_t>(min_slice, len - at));
      if (len - at - take < min_slice) take = len - at;  // no slice shorter than min_slice after it
      if (out != nullptr) out->push_back({s, at, take, true});
      at += take;
      ++count;
    }
    return count;
  };
  double lo = 0, hi = wt(len, 0) * 1.0000001;
  for (int it = 0; it < 60; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (greedy(mid, nullptr) <= n) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  std::vector<Piece> out;
  greedy(hi, &out);
  if (out.size() == 1) out[0].cut = false;
  return out;
}

struct PieceAssignment {
  std::vector<std::vector<Piece>> bins;
  std::vector<PieceSums> sums;
  bool sliced = false;
};

// Exact costs of an assignment: times and fit (each micro-batch, and every chain together). Each
// micro-batch takes the fastest mode that fits alone; under RecomputePolicy::Auto, the micro-batches
// of a sample whose slices do not fit together are then recomputed in full (a chain holds all its
// slices' activations until its backward) before the assignment is refused.
Exact exact_piece_costs(Coster& coster, const PipelineShape& shape, const PieceAssignment& a, RecomputePolicy policy) {
  std::vector<std::pair<bool, cm::MicroShape>> bins;
  for (std::size_t b = 0; b < a.bins.size(); ++b) bins.emplace_back(a.bins[b].empty(), a.sums[b].shape());
  std::vector<MicroBatch> mbs(a.bins.size());
  Exact e = exact_bin_costs(coster, shape, bins, policy, [&](std::size_t b, const Choice& c) {
    MicroBatch& mb = mbs[b];
    for (const Piece& p : a.bins[b]) {
      mb.samples.push_back(p.sample);
      mb.spans.push_back({p.begin, p.length});
    }
    mb.recompute = c.rc;
    mb.time_ms = c.time_ms;
    mb.stored_mb = c.stored_mb;
    mb.peak_mb = c.peak_mb;
  });
  if (!e.fits) return e;
  std::vector<std::uint32_t> over = chains_over(mbs, coster);
  if (!over.empty() && policy == RecomputePolicy::Auto) {
    over = relieve_chains(mbs, coster,
                          [&](std::size_t b) { return coster.choose_varlen(bins[b].second, RecomputePolicy::Full); });
    for (std::size_t b = 0; b < mbs.size(); ++b) e.time[b] = mbs[b].time_ms;
    e.objective = objective_of(shape, e.time);
  }
  if (!over.empty()) {
    e.fits = false;
    e.objective = kInf;
  }
  return e;
}


// Moves and swaps of whole (not sliced) samples between the slowest micro-batch and the two
// fastest while the objective falls (at most `budget` trial costings).
void refine_pieces(Coster& coster, const PipelineShape& shape, RecomputePolicy policy, PieceAssignment& a, Exact& e,
                   int budget) {
  const std::size_t k = a.bins.size();
  if (k < 2) return;
  while (budget > 0) {
    const auto [hi, others] = slowest_and_fastest(e.time);
    bool improved = false;
    for (const std::size_t to : others) {
      auto& from = a.bins[hi];
      for (std::size_t i = 0; i < from.size() && !improved && budget > 0; ++i) {
        if (from[i].cut || from.size() < 2) continue;
        PieceSums fs = a.sums[hi], ts = a.sums[to];
        fs.remove(from[i]);
        ts.add(from[i]);
        budget -= 2;
        const Choice cf = coster.choose_varlen(fs.shape(), policy), ct = coster.choose_varlen(ts.shape(), policy);
        if (!cf.fits || !ct.fits) continue;
        std::vector<double> t = e.time;
        t[hi] = cf.time_ms;
        t[to] = ct.time_ms;
        const double obj = objective_of(shape, t);
        if (!(obj < e.objective * (1 - 1e-9))) continue;
        a.bins[to].push_back(from[i]);
        from.erase(from.begin() + static_cast<std::ptrdiff_t>(i));
        a.sums[hi] = fs;
        a.sums[to] = ts;
        e.time = std::move(t);
        e.objective = obj;
        improved = true;
      }
      if (improved) break;
    }
    if (!improved) return;
  }
}

}  // namespace

SlicedOutcome sliced_search(const Work& w, const std::vector<std::uint32_t>& ids, const std::vector<char>& must,
                            Coster& coster, const PipelineShape& shape, RecomputePolicy policy,
                            std::int64_t count_multiple, std::uint32_t min_slice, bool optional) {
  SlicedOutcome out;
  if (w.encdec() || ids.empty()) return out;
  const std::uint32_t ms = std::max<std::uint32_t>(1, min_slice);
  const std::int64_t m = std::max<std::int64_t>(1, count_multiple);
  auto up = [&](std::int64_t k) { return (k + m - 1) / m * m; };
  const auto n = static_cast<std::int64_t>(ids.size());
  Sums all;
  std::int64_t cut_room = 0;  // the most slices the samples could be cut into beyond one each
  bool any_must = false;
  for (const auto s : ids) {
    all.add(packed_sample(w, s));
    cut_room += std::max<std::int64_t>(0, static_cast<std::int64_t>(w.input[s] / ms) - 1);
    any_must = any_must || (s < must.size() && must[s] != 0);
  }
  if (cut_room == 0) return out;
  const std::int64_t k_lo = up(std::max<std::int64_t>(1, shape.dp));
  const std::int64_t k_hi = std::min(n + cut_room, 4 * n + 256);
  std::vector<std::int64_t> counts;
  for (std::int64_t k = k_lo; k <= k_hi;) {
    counts.push_back(k);
    k = up(std::max(k + 1, static_cast<std::int64_t>(std::ceil(static_cast<double>(k) * 1.25))));
  }
  const double kappa = coster.kernel() == cm::AttentionKernel::Flash ? 2.0 : 1.0;
  // Per count: the assignment and its estimate.
  struct Option {
    double estimate;
    std::int64_t k;
    PieceAssignment a;
  };
  std::vector<Option> options;
  // The assignment of count k (none when nothing is sliced).
  auto assign = [&](std::int64_t k, Option& opt) -> bool {
    const Linear lin = marginal(coster, all, k);
    const PieceWeight wt{lin.token, lin.attention, kappa};
    double total = 0;
    std::vector<std::pair<double, std::uint32_t>> by_weight;
    for (const auto s : ids) {
      const double x = wt(w.input[s], 0);
      total += x;
      by_weight.emplace_back(x, s);
    }
    std::sort(by_weight.begin(), by_weight.end(),
              [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    const double target = total / static_cast<double>(k);
    PieceAssignment a;
    a.bins.resize(static_cast<std::size_t>(k));
    a.sums.resize(static_cast<std::size_t>(k));
    std::vector<double> load(static_cast<std::size_t>(k), lin.fixed);
    LeastLoaded least(load);
    std::vector<std::uint32_t> whole;
    // Slices first, heaviest sample first, each on the least-loaded micro-batch after its previous.
    for (const auto& [x, s] : by_weight) {
      const bool forced = s < must.size() && must[s] != 0;
      const std::int64_t most = std::min<std::int64_t>(k, std::max<std::int64_t>(1, w.input[s] / ms));
      std::int64_t pieces = static_cast<std::int64_t>(std::ceil(x / std::max(target, 1e-300)));
      if (forced) pieces = std::max<std::int64_t>(pieces, 2);
      pieces = std::min(pieces, most);
      const bool slice = most >= 2 && (forced || (optional && x > target * 1.1 && pieces >= 2));
      if (!slice) {
        whole.push_back(s);
        continue;
      }
      const std::vector<Piece> cut = cut_sample(s, w.input[s], pieces, ms, wt);
      std::int64_t prev = -1;
      const auto P = static_cast<std::int64_t>(cut.size());
      for (std::int64_t j = 0; j < P; ++j) {
        PACKPIPE_ASSERT(prev + 1 <= k - (P - j));
        const auto best = static_cast<std::int64_t>(
            least.argmin(static_cast<std::size_t>(prev + 1), static_cast<std::size_t>(k - (P - j))));
        const Piece& pc = cut[static_cast<std::size_t>(j)];
        a.bins[static_cast<std::size_t>(best)].push_back(pc);
        a.sums[static_cast<std::size_t>(best)].add(pc);
        load[static_cast<std::size_t>(best)] += wt(pc.length, pc.begin);
        least.set(static_cast<std::size_t>(best), load[static_cast<std::size_t>(best)]);
        prev = best;
      }
      a.sliced = a.sliced || P > 1;
    }
    if (!a.sliced) return false;
    // Whole samples by least load (heaviest first; ties to the lower index).
    for (const auto s : whole) {
      const std::size_t b = least.argmin(0, load.size() - 1);
      const Piece pc{s, 0, w.input[s], false};
      a.bins[b].push_back(pc);
      a.sums[b].add(pc);
      load[b] += wt(pc.length, 0);
      least.set(b, load[b]);
    }
    std::vector<double> t(load.begin(), load.end());
    opt = Option{objective_of(shape, t), k, std::move(a)};
    return true;
  };
  for (const std::int64_t k : counts) {
    Option o;
    if (assign(k, o)) options.push_back(std::move(o));
  }
  if (options.empty()) return out;
  std::stable_sort(options.begin(), options.end(), [](const Option& x, const Option& y) { return x.estimate < y.estimate; });
  constexpr int kFeasible = 3, kTries = 10;
  PieceAssignment best_a;
  Exact best_e;
  int feasible = 0, tries = 0;
  auto to_mbs = [](const PieceAssignment& a) {
    std::vector<MicroBatch> mbs;
    for (const auto& bin : a.bins) {
      MicroBatch mb;
      mb.layout = Layout::Packed;
      for (const Piece& p : bin) {
        mb.samples.push_back(p.sample);
        mb.spans.push_back({p.begin, p.length});
      }
      mbs.push_back(std::move(mb));
    }
    return mbs;
  };
  for (auto& o : options) {
    // A sample that cannot fit alone needs a feasible count whatever the estimates say.
    if (feasible >= kFeasible || (tries >= kTries && (!any_must || feasible > 0))) break;
    ++tries;
    Exact e = exact_piece_costs(coster, shape, o.a, policy);
    if (!e.fits) continue;
    ++feasible;
    if (e.objective < best_e.objective) {
      if (!best_a.bins.empty()) out.alternatives.emplace_back(best_e.objective, to_mbs(best_a));
      best_a = std::move(o.a);
      best_e = std::move(e);
    } else {
      out.alternatives.emplace_back(e.objective, to_mbs(o.a));
    }
  }
  if (feasible == 0) return out;
  std::stable_sort(out.alternatives.begin(), out.alternatives.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  // More and smaller micro-batches (finer slices), and fewer, first among the alternatives: the
  // bound does not see the slices' dependencies nor how a schedule fills bubbles; the planner's
  // simulation decides.
  const auto k_best = static_cast<std::int64_t>(best_a.bins.size());
  std::vector<std::pair<double, std::vector<MicroBatch>>> scaled;
  for (const double f : {2.0, 1.5, 0.7}) {
    const std::int64_t k = up(std::max<std::int64_t>(k_lo, std::llround(static_cast<double>(k_best) * f)));
    if (k == k_best || k > k_hi) continue;
    Option o;
    if (!assign(k, o)) continue;
    Exact e = exact_piece_costs(coster, shape, o.a, policy);
    if (e.fits) scaled.emplace_back(e.objective, to_mbs(o.a));
  }
  out.alternatives.insert(out.alternatives.begin(), std::make_move_iterator(scaled.begin()),
                          std::make_move_iterator(scaled.end()));
  refine_pieces(coster, shape, policy, best_a, best_e, 64);
  out.microbatches = to_mbs(best_a);
  out.objective = best_e.objective;
  out.feasible = true;
  return out;
}

}  // namespace packpipe::partition::detail
