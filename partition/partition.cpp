// Micro-batch partition: driver, oversize policy, DP methods (packpipe's search over every cap and
// DynaPipe's exact tau-DP), baselines, figures and data-parallel assignment.
#include "partition/partition.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <memory>
#include <numeric>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_invoke.h>
#include <oneapi/tbb/task_arena.h>

#include "common/errors.h"
#include "partition/detail/work.h"

namespace packpipe::partition {

using detail::Choice;
using detail::Coster;
using detail::WindowTable;

PartitionCache::PartitionCache()
    : memo_(std::make_unique<detail::ShapeMemo>()), memo2_(std::make_unique<detail::ShapeMemo>()) {}
PartitionCache::~PartitionCache() = default;
PartitionCache::PartitionCache(PartitionCache&&) noexcept = default;
PartitionCache& PartitionCache::operator=(PartitionCache&&) noexcept = default;
std::size_t PartitionCache::shapes() const { return memo_->size() + memo2_->size(); }
using detail::Work;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

std::vector<std::vector<std::uint32_t>> assign_ranks(const std::vector<double>& time_ms, std::int64_t dp,
                                                     std::size_t per_rank) {
  PACKPIPE_CHECK_ARG(dp >= 1, "dp must be at least 1, found {}", dp);
  const auto D = static_cast<std::size_t>(dp);
  PACKPIPE_CHECK_ARG(per_rank == 0 || per_rank * D == time_ms.size(),
                     "assign_ranks: {} micro-batches on each of {} ranks needs {} micro-batches, found {}", per_rank, D,
                     per_rank * D, time_ms.size());
  std::vector<std::uint32_t> idx(time_ms.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](std::uint32_t a, std::uint32_t b) { return time_ms[a] > time_ms[b]; });
  std::vector<std::vector<std::uint32_t>> out(D);
  std::vector<double> load(D, 0.0);
  for (std::uint32_t m : idx) {
    // the least-loaded rank with room (every rank has room without a count)
    std::size_t r = D;
    for (std::size_t k = 0; k < D; ++k) {
      if (per_rank != 0 && out[k].size() >= per_rank) continue;
      if (r == D || load[k] < load[r]) r = k;
    }
    out[r].push_back(m);
    load[r] += time_ms[m];
  }
  for (auto& v : out) std::sort(v.begin(), v.end());
  return out;
}

namespace {

double resolve_limit(const cm::CostModel& cost, const PipelineShape& shape) {
  const double limit = shape.memory_limit_mb > 0 ? shape.memory_limit_mb : cost.device().memory_gb * 1000.0;
  PACKPIPE_CHECK_ARG(limit > 0 && std::isfinite(limit),
                     "memory limit (memory_mb / --memory-mb, or the device's) must be positive, found {} MB", limit);
  // A limit over the device's memory would call plans feasible that cannot run.
  const double device_mb = cost.device().memory_gb * 1000.0;
  PACKPIPE_CHECK_ARG(!(device_mb > 0) || limit <= device_mb,
                     "memory limit (memory_mb / --memory-mb) of {} MB is above the {} MB of the device ({}): give at "
                     "most the device's memory (0: all of it), or a device file with more",
                     limit, device_mb, cost.device().name);
  return limit;
}

// Threads the oneTBB arena of the caller lets a parallel algorithm use.
int available_threads() {
  const auto limit = oneapi::tbb::global_control::active_value(oneapi::tbb::global_control::max_allowed_parallelism);
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(oneapi::tbb::this_task_arena::max_concurrency()), limit));
}

CostBasis resolve_basis(const PartitionOptions& o) {
  if (o.basis != CostBasis::Auto) return o.basis;
  return o.method == PartitionMethod::DynaPipe ? CostBasis::DynaPipe : CostBasis::Stages;
}

void check_options(const PartitionOptions& o) {
  PACKPIPE_CHECK_ARG(o.round_multiple >= 1 && o.round_multiple <= kMaxRoundMultiple,
                     "the padding multiple (round_multiple / --round-multiple) must be in [1, {}], found {}",
                     kMaxRoundMultiple, o.round_multiple);
  PACKPIPE_CHECK_ARG(o.decoder_extra_tokens >= 0, "decoder_extra_tokens must be non-negative, found {}",
                     o.decoder_extra_tokens);
  PACKPIPE_CHECK_ARG(o.tau_tolerance >= 0 && o.tau_tolerance < 1, "tau_tolerance must be in [0, 1), found {}",
                     o.tau_tolerance);
  PACKPIPE_CHECK_ARG(o.dynapipe_thin_ms >= 0, "dynapipe_thin_ms must be non-negative, found {}", o.dynapipe_thin_ms);
  PACKPIPE_CHECK_ARG(o.threads >= 0, "threads must be non-negative (0: automatic), found {}", o.threads);
  if (o.method == PartitionMethod::Fixed || o.method == PartitionMethod::Packing) {
    PACKPIPE_CHECK_ARG(o.microbatch_size >= 1, "method '{}' needs a micro-batch size (mbs / --mbs) of at least 1, "
                       "found {}", partition_method_name(o.method), o.microbatch_size);
  }
  if (o.method == PartitionMethod::Slicing) {
    PACKPIPE_CHECK_ARG(o.capacity >= 1, "method 'slicing' needs the slice length in tokens (capacity / --capacity) of at "
                       "least 1, found {}", o.capacity);
  }
  PACKPIPE_CHECK_ARG(o.min_slice_tokens >= 1, "min_slice_tokens (the shortest slice) must be at least 1, found {}",
                     o.min_slice_tokens);
  PACKPIPE_CHECK_ARG(std::string_view(slice_policy_name(o.slicing)) != "?", "slicing: unknown value {}",
                     static_cast<int>(o.slicing));
  if (o.method == PartitionMethod::Tokens) {
    PACKPIPE_CHECK_ARG(o.token_budget >= 1, "method 'tokens' needs a token budget per micro-batch (tokens / --tokens) "
                       "of at least 1, found {}", o.token_budget);
  }
  const LayoutSet own_layouts = layout_bit(Layout::Padded) | layout_bit(Layout::Packed);
  PACKPIPE_CHECK_ARG((o.layouts & own_layouts) != 0 && (o.layouts & ~(own_layouts | layout_bit(Layout::PackedMask))) == 0,
                     "layouts (--layouts) the executor runs: one or both of padded and packed (packpipe's own "
                     "micro-batches take them), and packed-mask where it also runs dense rows under a block mask (the "
                     "packing-mask baselines then are candidates), found {}",
                     layout_set_names(o.layouts));
  if (o.layout.has_value()) {
    const Layout l = *o.layout;
    PACKPIPE_CHECK_ARG(o.method != PartitionMethod::Packing || l == Layout::Packed || l == Layout::PackedMask,
                       "layout (--layout) of the packing method: packed or packed-mask, found {}",
                       std::string(layout_name(l)));
    PACKPIPE_CHECK_ARG(o.method != PartitionMethod::Fixed || l == Layout::Padded || l == Layout::Packed,
                       "layout (--layout) of the fixed method: padded (Megatron) or packed (a micro-batch's samples "
                       "flattened into one varlen row, as HF's DataCollatorWithFlattening), found {}",
                       std::string(layout_name(l)));
    PACKPIPE_CHECK_ARG(o.method == PartitionMethod::Packing || o.method == PartitionMethod::Fixed,
                       "layout (--layout) applies to the packing and fixed methods; method '{}' {}",
                       partition_method_name(o.method),
                       o.method == PartitionMethod::DP ? "takes layouts (--layouts)" : "sets its own layout");
  }
  PACKPIPE_CHECK_ARG(o.capacity <= (std::uint64_t{1} << 32),
                     "capacity (--capacity) must be at most 2^32 tokens, found {}", o.capacity);
  PACKPIPE_CHECK_ARG(o.count_multiple >= 1 && o.count_multiple <= kMaxPipelineSize,
                     "count_multiple (the micro-batch count's multiple) must be in [1, {}], found {}", kMaxPipelineSize,
                     o.count_multiple);
}

// ---- window tables ---------------------------------------------------------------------------

// First-fit of the window's samples (in window order) into rows of le input tokens (and ld
// decoder tokens); returns the row count and, when `rows_out` is given, each sample's row.
struct RowPacker {
  explicit RowPacker(const Work* work) : w(work) {}
  const Work* w;
  std::int64_t le = 0, ld = 0;
  std::vector<std::int64_t> used_e, used_d;
  void reset(std::int64_t e, std::int64_t d) {
    le = e;
    ld = d;
    used_e.clear();
    used_d.clear();
  }
  std::size_t add(std::uint32_t s) {
    const std::int64_t a = w->input[s];
    const std::int64_t b = w->encdec() ? static_cast<std::int64_t>(w->target[s]) + w->dec_extra : 0;
    for (std::size_t r = 0; r < used_e.size(); ++r) {
      if (used_e[r] + a <= le && (!w->encdec() || used_d[r] + b <= ld)) {
        used_e[r] += a;
        used_d[r] += b;
        return r;
      }
    }
    used_e.push_back(a);
    used_d.push_back(b);
    return used_e.size() - 1;
  }
  std::size_t rows() const { return used_e.size(); }
};

// What building a column reads (read-only, shared by the builders): the padded lengths by
// position, the batch size, whether starts share columns, the recompute policy.
struct ColumnCtx {
  const std::int64_t* re;
  const std::int64_t* rd;
  std::size_t n;
  bool share;
  RecomputePolicy policy;
  // A start that reuses the column of the start before it.
  bool follower(std::size_t i) const { return share && i > 0 && re[i] == re[i - 1]; }
  // The last window end from j on that keeps the shape (le, ld) (bounded look-ahead, from the
  // longest column built so far; a hint for the coster's batched queries).
  std::size_t shape_run_end(std::size_t j, std::int64_t le, std::int64_t ld, std::int32_t max_count) const {
    std::size_t e = share ? n : j;
    const std::size_t look = std::min(n, j + std::max<std::size_t>(16, 2 * static_cast<std::size_t>(max_count)));
    while (e < look && re[e] <= le && rd[e] <= ld) ++e;
    return e;
  }
  // The windows of start i appended to `time` (runs of one shape at a time: j .. run_end share
  // (le, ld)); returns their count.
  std::int32_t column(std::size_t i, Coster& c, std::vector<double>& time, std::int32_t max_count) const {
    std::int64_t le = 0, ld = 0;  // the window's padded lengths
    int first_mode = 0;  // modes below it already failed for this start: they fail for longer windows too
    std::int32_t count = 0;
    for (std::size_t j = i + 1; j <= n;) {
      le = std::max(le, re[j - 1]);
      ld = std::max(ld, rd[j - 1]);
      const std::size_t run_end = shape_run_end(j, le, ld, max_count);
      c.set_rows_hint(static_cast<std::int64_t>(run_end - i));
      const std::int64_t want = static_cast<std::int64_t>(run_end - j) + 1;
      const std::int64_t got = c.choose_run(static_cast<std::int64_t>(j - i), static_cast<std::int64_t>(run_end - i), le,
                                            ld, policy, &first_mode, time);
      count += static_cast<std::int32_t>(got);
      if (got < want) break;  // a window that fits under no allowed mode: longer ones do not either
      j = run_end + 1;
    }
    return count;
  }
};

// The columns of every start (not packed) by two builders: one claims starts from the front, the
// other from the back (a start with its followers is one claim), under a lock, until they meet;
// each has its own coster. The back builder's columns are then copied after the front one's in
// start order, the layout of a serial build: a window's cost does not depend on which coster or
// batch of rows computed it, so the table is the same bits. Fills count, offset, time_ms (the
// followers' entries are left to the caller). Out of line, so that the serial build's locals do
// not escape into the tasks.
[[gnu::noinline]] void build_columns_two(const ColumnCtx x, Coster& front_coster, Coster& back_coster, WindowTable& t) {
  const std::size_t n = x.n;
  back_coster.set_dynapipe_limits(front_coster.dynapipe_stored_limit_mb(), front_coster.dynapipe_peak_limit_mb());
  std::mutex lock;
  std::size_t front = 0, back = n;  // starts [0, front) are the front builder's, [back, n) the back one's
  std::vector<double> back_time;    // the back builder's columns, in the order it built them
  std::vector<std::int64_t> back_offset(n, -1);
  std::int32_t front_max = 0, back_max = 0;
  // Isolated: while this thread waits for the other builder it takes no outside task (one that
  // might run another partition on this thread's cache).
  oneapi::tbb::this_task_arena::isolate([&] {
    oneapi::tbb::parallel_invoke(
        [&] {
          for (;;) {
            std::size_t i = 0;
            {
              std::lock_guard<std::mutex> g(lock);
              if (front >= back) return;
              i = front;
              std::size_t e = i + 1;
              while (e < back && x.follower(e)) ++e;
              front = e;
            }
            t.offset[i] = static_cast<std::int64_t>(t.time_ms.size());
            t.count[i] = x.column(i, front_coster, t.time_ms, front_max);
            front_max = std::max(front_max, t.count[i]);
          }
        },
        [&] {
          for (;;) {
            std::size_t i = 0;
            {
              std::lock_guard<std::mutex> g(lock);
              if (front >= back) return;
              i = back - 1;
              while (i > front && x.follower(i)) --i;
              if (x.follower(i)) return;  // its column's first start is the front builder's
              back = i;
            }
            back_offset[i] = static_cast<std::int64_t>(back_time.size());
            t.count[i] = x.column(i, back_coster, back_time, back_max);
            back_max = std::max(back_max, t.count[i]);
          }
        });
  });
  for (std::size_t i = back; i < n; ++i) {
    if (back_offset[i] < 0) continue;
    const auto* src = back_time.data() + back_offset[i];
    t.offset[i] = static_cast<std::int64_t>(t.time_ms.size());
    t.time_ms.insert(t.time_ms.end(), src, src + t.count[i]);
  }
}

// Fills `t` (its storage reused) with the feasible windows of `order`. `second` (optional, not
// with packing): a coster of the same setting with its own memo; batches of 64 samples or more
// are then built by two threads (build_columns_two).
void build_windows(const Work& w, const std::vector<std::uint32_t>& order, Coster& coster, RecomputePolicy policy,
                   bool pack, WindowTable& t, Coster* second = nullptr) {
  const std::size_t n = order.size();
  t.count.assign(n, 0);
  t.offset.assign(n, 0);
  t.column_end.clear();
  t.time_ms.clear();
  t.rows.clear();
  t.max_count = 0;
  RowPacker packer(&w);
  // Padded lengths by position (rounding is monotone, so a window's padded length is the largest
  // of its samples' padded lengths; no division per window).
  std::vector<std::int64_t>& re = coster.scratch().padded_in;
  std::vector<std::int64_t>& rd = coster.scratch().padded_tg;
  re.resize(n);
  rd.assign(n, 0);
  for (std::size_t k = 0; k < n; ++k) {
    re[k] = w.le_of(w.input[order[k]]);
    if (w.encdec()) rd[k] = w.ld_of(w.target[order[k]]);
  }
  // Decoder-only, unpacked, sorted by length: a window's shape is (rows, padded length of its
  // first sample), so starts with the same padded length share the first one's column.
  bool share = !w.encdec() && !pack;
  for (std::size_t i = 1; i < n && share; ++i) share = w.input[order[i]] <= w.input[order[i - 1]];
  const ColumnCtx x{re.data(), rd.data(), n, share, policy};
  if (!pack) {
    // Every column (by one or two builders), then the followers point into their first start's.
    constexpr std::size_t kMinParallel = 64;
    if (second != nullptr && n >= kMinParallel) {
      build_columns_two(x, coster, *second, t);
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        if (x.follower(i)) continue;
        t.offset[i] = static_cast<std::int64_t>(t.time_ms.size());
        t.count[i] = x.column(i, coster, t.time_ms, t.max_count);
        t.max_count = std::max(t.max_count, t.count[i]);
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (x.follower(i)) {
        t.offset[i] = t.offset[i - 1];
        t.count[i] = std::min<std::int32_t>(t.count[i - 1], static_cast<std::int32_t>(n - i));
        continue;
      }
      t.max_count = std::max(t.max_count, t.count[i]);
      t.column_end.push_back(t.offset[i] + t.count[i]);
    }
    detail::finish_table(t);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    t.offset[i] = static_cast<std::int64_t>(t.time_ms.size());
    std::int64_t le = 0, ld = 0;  // the window's padded lengths
    int first_mode = 0;  // modes below it already failed for this start: they fail for longer windows too
    std::int64_t pack_le = -1, pack_ld = -1;
    std::size_t run_end = 0;  // windows up to here keep the current shape
    for (std::size_t j = i + 1; j <= n; ++j) {
      const std::uint32_t s = order[j - 1];
      le = std::max(le, re[j - 1]);
      ld = std::max(ld, rd[j - 1]);
      const auto m = static_cast<std::int64_t>(j - i);
      if (j > run_end) {  // a new shape: how far it lasts
        run_end = x.shape_run_end(j, le, ld, t.max_count);
        coster.set_rows_hint(static_cast<std::int64_t>(run_end - i));
      }
      Choice c = coster.choose(m, le, ld, policy, &first_mode);
      std::int64_t rows = m;
      if (m > 1) {
        if (le != pack_le || ld != pack_ld) {  // capacity changed: repack the window from scratch
          packer.reset(le, ld);
          for (std::size_t k = i; k < j; ++k) packer.add(order[k]);
          pack_le = le;
          pack_ld = ld;
        } else {
          packer.add(s);
        }
        const auto pr = static_cast<std::int64_t>(packer.rows());
        if (pr < m) {
          const Choice cp = coster.choose(pr, le, ld, policy);
          if (cp.fits && (!c.fits || cp.time_ms < c.time_ms)) {
            c = cp;
            rows = pr;
          }
        }
      } else {
        packer.reset(le, ld);
        packer.add(s);
        pack_le = le;
        pack_ld = ld;
      }
      if (!c.fits) break;
      t.time_ms.push_back(c.time_ms);
      t.rows.push_back(static_cast<std::int32_t>(rows));
      ++t.count[i];
    }
    t.max_count = std::max(t.max_count, t.count[i]);
    t.column_end.push_back(static_cast<std::int64_t>(t.time_ms.size()));
  }
  detail::finish_table(t);
}

// Same for DynaPipe's iteration-wide recompute mode: windows grow until the first infeasible one.
WindowTable build_windows_fixed_rc(const Work& w, const std::vector<std::uint32_t>& order, Coster& coster,
                                   cm::Recompute rc, bool pack, Coster* second) {
  RecomputePolicy p = rc == cm::Recompute::None        ? RecomputePolicy::None
                      : rc == cm::Recompute::Selective ? RecomputePolicy::Selective
                                                       : RecomputePolicy::Full;
  WindowTable t;
  build_windows(w, order, coster, p, pack, t, second);
  return t;
}

// ---- packpipe's search over every cap --------------------------------------------------------

struct SearchOutcome {
  detail::CapResult best;
  double objective = kInf;
  std::int64_t evaluations = 0;
};

// Exact minimum over caps tau of (S-1) tau/c + G(tau)/d, where G(tau) is the min-sum partition
// with every window <= tau. G is non-increasing and only changes at window times, and the optimal
// partition's max is some window's time, so only window times are candidate caps; a run at cap m
// returns the realised max r <= m and G is constant on [r, m], so the candidates in [r, m] need no
// run. Order of work:
//  1. run at the top cap (every window): G(inf) and its realised max r0; no cap above r0 can win;
//  2. run at lb, the largest over samples of the cheapest window covering it (no partition's max
//     is below lb): an incumbent that is often the optimum (one long sample sets the max);
//  3. candidates: the window times in (lb, min(r0, tau_max)), tau_max = (best - G(inf)/d)
//     / ((S-1)/c) (a larger cap cannot beat the incumbent even with the least sum), unsorted;
//  4. bisection by rank (median selection) with the bound obj(tau) >= (S-1) c_min/c + G(above)/d
//     on a range (c_min its least candidate, G(above) known from the run above it), which prunes
//     every range that cannot win.
// `bound`: an objective already reached (another order's): ranges that cannot beat it are pruned
// too, and nothing that does not beat it is returned as better (callers compare with it).
SearchOutcome search_caps(const WindowTable& t, const PipelineShape& shape, double tol, detail::Scratch& scratch,
                          double bound = kInf) {
  SearchOutcome out;
  const std::size_t n = t.count.size();
  if (n == 0) {
    out.best.feasible = true;
    out.best.cuts = {0};
    out.objective = 0;
    return out;
  }
  // Lower bound on any partition's max: every sample needs a window covering it. Sample i + k is
  // covered from start i at best tail_min[k] (for a start sharing a column, the column's least
  // time from k on, which may include windows past n - i: a weaker but still valid bound).
  std::vector<double>& cover = scratch.cover;
  cover.assign(n, kInf);
  for (std::size_t i = 0; i < n; ++i) {
    const double* tm = t.tail_min.data() + t.offset[i];
    double* cv = cover.data() + i;
    for (std::int32_t k = 0; k < t.count[i]; ++k) cv[k] = std::min(cv[k], tm[k]);
  }
  double lb = 0;
  for (double v : cover) lb = std::max(lb, v);
  if (lb == kInf) return out;  // some sample has no feasible window
  const double a = static_cast<double>(shape.stages - 1) / static_cast<double>(shape.chunks);
  const double b = 1.0 / static_cast<double>(shape.dp);
  auto consider = [&](detail::CapResult&& r) {
    const double obj = detail::objective(shape, r.max, r.sum);
    if (obj < out.objective) {
      out.objective = obj;
      out.best = std::move(r);
    }
  };
  detail::CapWorkspace& ws = scratch.ws;
  auto run = [&](double cap) {
    ++out.evaluations;
    return detail::min_sum_under_cap(t, cap, ws);
  };
  detail::CapResult first = run(t.max_time_ms);
  if (!first.feasible) return out;
  const double g0 = first.sum, r0 = first.max;
  consider(std::move(first));
  if (!(lb < r0)) return out;
  {
    detail::CapResult r = run(lb);  // infeasible when the cheapest covering windows do not chain
    if (r.feasible) consider(std::move(r));
  }
  const double target = std::min(out.objective, bound) * (1.0 - tol);
  // Candidate caps strictly between lb and r0 that could still beat the incumbent.
  const double tau_max = a > 0 ? std::min(r0, (target - b * g0) / a) : r0;
  std::vector<double>& cand = scratch.cand;
  cand.clear();
  for (double c : t.time_ms) {
    if (c > lb && c < tau_max) cand.push_back(c);
  }
  auto pruned = [&](double lo, double g) { return a * lo + b * g >= std::min(out.objective, bound) * (1.0 - tol); };
  // explore(lo, hi, g): the candidates in cand[lo, hi) (unsorted), over which G >= g. Bisection by
  // rank: the median is selected (not sorted for) and each side partitioned, so ranges that are
  // pruned are never ordered (the candidates are as many as the windows).
  std::function<void(std::size_t, std::size_t, double)> explore = [&](std::size_t lo, std::size_t hi, double g) {
    if (lo >= hi) return;
    const auto first = cand.begin() + static_cast<std::ptrdiff_t>(lo), last = cand.begin() + static_cast<std::ptrdiff_t>(hi);
    if (pruned(*std::min_element(first, last), g)) return;
    const std::size_t m = lo + (hi - lo) / 2;
    const auto mid = cand.begin() + static_cast<std::ptrdiff_t>(m);
    std::nth_element(first, mid, last);
    const double cm = *mid;
    // Above the median: candidates equal to it need no run of their own.
    const auto above = static_cast<std::size_t>(std::partition(mid + 1, last, [cm](double x) { return x > cm; }) - cand.begin());
    detail::CapResult r = run(cm);
    if (!r.feasible) {  // then no smaller cap is feasible either
      explore(m + 1, above, g);
      return;
    }
    const double rm = r.max, rg = r.sum;
    consider(std::move(r));
    // Candidates in [rm, cm] share G(cm) and have been charged at rm.
    const auto left = static_cast<std::size_t>(std::partition(first, mid, [rm](double x) { return x < rm; }) - cand.begin());
    explore(lo, left, rg);
    explore(m + 1, above, g);
  };
  explore(0, cand.size(), g0);
  return out;
}

// ---- DynaPipe's exact tau-DP -----------------------------------------------------------------

struct DynaPipeOutcome {
  detail::CapResult best;
  double objective = kInf;
  double tau = 0;
  std::int64_t evaluations = 0;
  cm::Recompute rc = cm::Recompute::None;
  WindowTable table;
};

DynaPipeOutcome dynapipe_dp(const Work& w, const std::vector<std::uint32_t>& order, Coster& coster,
                            const PipelineShape& shape, cm::Recompute rc, double thin, bool pack, Coster* second) {
  DynaPipeOutcome out;
  out.rc = rc;
  out.table = build_windows_fixed_rc(w, order, coster, rc, pack, second);
  std::vector<double> cand(out.table.time_ms);
  std::sort(cand.begin(), cand.end());
  std::vector<double> taus;
  for (double v : cand) {
    if (!std::isfinite(v)) break;
    if (taus.empty() || v - taus.back() > thin) taus.push_back(v);
  }
  detail::CapWorkspace ws;
  for (double tau : taus) {
    ++out.evaluations;
    detail::CapResult r = detail::min_sum_under_cap(out.table, tau, ws);
    if (!r.feasible) continue;
    const double obj = detail::objective(shape, tau, r.sum);
    if (obj < out.objective) {
      out.objective = obj;
      out.tau = tau;
      out.best = std::move(r);
    }
  }
  return out;
}

// ---- micro-batches and figures ---------------------------------------------------------------

std::vector<std::uint32_t> sorted_order(const Work& w, const std::vector<std::uint32_t>& ids) {
  std::vector<std::uint32_t> o(ids);
  std::stable_sort(o.begin(), o.end(), [&](std::uint32_t a, std::uint32_t b) {
    if (w.input[a] != w.input[b]) return w.input[a] > w.input[b];
    if (w.encdec() && w.target[a] != w.target[b]) return w.target[a] > w.target[b];
    return false;
  });
  return o;
}

// Micro-batches from window cuts of `order` (repacking the windows where the table packed them).
std::vector<MicroBatch> windows_to_microbatches(const Work& w, const std::vector<std::uint32_t>& order,
                                                const WindowTable& t, const std::vector<std::int32_t>& cuts) {
  std::vector<MicroBatch> out;
  out.reserve(cuts.empty() ? 0 : cuts.size() - 1);
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
    const auto i = static_cast<std::size_t>(cuts[k]), j = static_cast<std::size_t>(cuts[k + 1]);
    MicroBatch mb;
    mb.samples.assign(order.begin() + static_cast<std::ptrdiff_t>(i), order.begin() + static_cast<std::ptrdiff_t>(j));
    const std::int32_t rows = t.rows.empty() ? static_cast<std::int32_t>(j - i)
                                             : t.rows[static_cast<std::size_t>(t.offset[i]) + (j - i - 1)];
    if (static_cast<std::size_t>(rows) < j - i) {
      std::uint32_t max_in = 0, max_tg = 0;
      for (auto s : mb.samples) {
        max_in = std::max(max_in, w.input[s]);
        if (w.encdec()) max_tg = std::max(max_tg, w.target[s]);
      }
      mb.layout = Layout::PackedMask;
      RowPacker packer(&w);
      packer.reset(w.le_of(max_in), w.ld_of(max_tg));
      std::vector<std::vector<std::uint32_t>> row_samples;
      for (auto s : mb.samples) {
        const std::size_t r = packer.add(s);
        if (r >= row_samples.size()) row_samples.resize(r + 1);
        row_samples[r].push_back(s);
      }
      mb.samples.clear();
      mb.row_offsets.push_back(0);
      for (const auto& rs : row_samples) {
        mb.samples.insert(mb.samples.end(), rs.begin(), rs.end());
        mb.row_offsets.push_back(static_cast<std::uint32_t>(mb.samples.size()));
      }
    }
    out.push_back(std::move(mb));
  }
  return out;
}

// Target tokens of a micro-batch's samples.
std::uint64_t packed_target_tokens(const Work& w, const MicroBatch& mb) {
  std::uint64_t n = 0;
  if (w.encdec()) {
    for (auto s : mb.samples) n += w.target[s];
  }
  return n;
}

// A Packed micro-batch's row (every sample back to back), attention sums and cost choice.
Choice finalize_packed(const Work& w, Coster& coster, MicroBatch& mb, RecomputePolicy policy, int forced_rc) {
  std::int64_t enc = 0, dec = 0;
  std::uint64_t tokens = 0;
  cm::AttentionWork a;
  if (mb.has_slices()) {
    // Slices (decoder-only): each entry's tokens after the kept ones before it.
    PACKPIPE_CHECK_ARG(!w.encdec(), "slices are for decoder-only samples; the model is encoder-decoder");
    PACKPIPE_CHECK_ARG(mb.spans.size() == mb.samples.size(), "{} spans for {} samples", mb.spans.size(),
                       mb.samples.size());
    for (std::size_t i = 0; i < mb.samples.size(); ++i) {
      const Span& sp = mb.spans[i];
      PACKPIPE_CHECK_ARG(sp.length >= 1 && std::uint64_t{sp.begin} + sp.length <= w.input[mb.samples[i]],
                         "sample {}: tokens [{}, {}) are not within its {} tokens", mb.samples[i], sp.begin,
                         std::uint64_t{sp.begin} + sp.length, w.input[mb.samples[i]]);
      enc += sp.length;
      a.add_slice(sp.length, sp.begin);
      tokens += sp.length;
    }
  } else {
    for (auto s : mb.samples) {
      const auto [e, d] = packed_sample(w, s);
      enc += e;
      dec += d;
      a.add(e, d);
      tokens += w.input[s] + (w.encdec() ? w.target[s] : 0u);
    }
  }
  mb.row_offsets = {0, static_cast<std::uint32_t>(mb.samples.size())};
  mb.padded_len = enc;
  mb.padded_dec_len = dec;
  mb.attention = a;
  mb.tokens = tokens;
  if (forced_rc < 0) return coster.choose_varlen(mb.shape(), policy);
  const auto rc = static_cast<cm::Recompute>(forced_rc);
  const detail::RcCost c = coster.get_varlen(mb.shape(), rc);
  Choice out;
  out.time_ms = c.time_ms;
  out.stored_mb = c.stored_mb;
  out.peak_mb = c.peak_mb;
  out.rc = rc;
  out.fits = coster.fits(c);
  return out;
}

// A Padded or PackedMask micro-batch's padded shape, tokens (into in_tok, tg_tok) and cost choice;
// `other` as finalize's.
Choice finalize_rows(const Work& w, Coster& coster, MicroBatch& mb, std::size_t m, RecomputePolicy policy,
                     int forced_rc, Coster* other, std::uint64_t& in_tok, std::uint64_t& tg_tok) {
  mb.attention = {};
  std::uint64_t max_in = 0, max_tg = 0;
  if (mb.row_offsets.empty()) {
    for (auto s : mb.samples) {
      max_in = std::max<std::uint64_t>(max_in, w.input[s]);
      in_tok += w.input[s];
      if (w.encdec()) {
        max_tg = std::max<std::uint64_t>(max_tg, w.target[s]);
        tg_tok += w.target[s];
      }
    }
  } else {
    PACKPIPE_CHECK_ARG(mb.row_offsets.front() == 0 && mb.row_offsets.back() == mb.samples.size(),
                       "micro-batch {}: row_offsets must start at 0 and end at {} samples", m, mb.samples.size());
    for (std::size_t r = 0; r + 1 < mb.row_offsets.size(); ++r) {
      PACKPIPE_CHECK_ARG(mb.row_offsets[r] < mb.row_offsets[r + 1], "micro-batch {}: row {} is empty", m, r);
      std::uint64_t ri = 0, rt = 0;
      for (std::uint32_t k = mb.row_offsets[r]; k < mb.row_offsets[r + 1]; ++k) {
        const auto s = mb.samples[k];
        ri += w.input[s];
        if (w.encdec()) rt += static_cast<std::uint64_t>(w.target[s]) + static_cast<std::uint64_t>(w.dec_extra);
      }
      in_tok += ri;
      max_in = std::max(max_in, ri);
      if (w.encdec()) {
        tg_tok += rt - static_cast<std::uint64_t>(w.dec_extra) * (mb.row_offsets[r + 1] - mb.row_offsets[r]);
        max_tg = std::max(max_tg, rt);
      }
    }
    // ld_of adds dec_extra once more for a single sample; packed rows already counted theirs.
    if (w.encdec()) max_tg = max_tg >= static_cast<std::uint64_t>(w.dec_extra) ? max_tg - static_cast<std::uint64_t>(w.dec_extra) : 0;
  }
  mb.padded_len = w.le_of(max_in);
  mb.padded_dec_len = w.ld_of(max_tg);
  mb.tokens = in_tok + tg_tok;
  Coster& cc = other != nullptr && !coster.has(mb.rows(), mb.padded_len, mb.padded_dec_len) &&
                       other->has(mb.rows(), mb.padded_len, mb.padded_dec_len)
                   ? *other
                   : coster;
  Choice c;
  if (forced_rc >= 0) {
    const auto rc = static_cast<cm::Recompute>(forced_rc);
    const detail::RcCost& rcst = cc.get(mb.rows(), mb.padded_len, mb.padded_dec_len, rc);
    c.time_ms = rcst.time_ms;
    c.stored_mb = rcst.stored_mb;
    c.peak_mb = rcst.peak_mb;
    c.rc = rc;
    c.fits = cc.fits(rcst);
  } else {
    c = cc.choose(mb.rows(), mb.padded_len, mb.padded_dec_len, policy);
  }
  return c;
}

// The shares of the activation memory that sliced samples' chains are fitted in for the planner's
// variants (chain_variants): the rest is for the other micro-batches in flight; 0 recomputes every
// slice that can be.
constexpr double kChainRooms[] = {0.6, 0.0};

// A sliced sample's micro-batches hold their activations together until its backward: where they
// do not fit together, its micro-batches are recomputed in full, the cheapest first, when the
// policy leaves the mode free (auto), and the partition is refused (require_fit) when they still do
// not fit.
void fit_chains(const Work& w, Coster& coster, std::vector<MicroBatch>& mbs, RecomputePolicy policy, int forced_rc,
                bool require_fit, double room_fraction) {
  std::vector<std::uint32_t> over = detail::chains_over(mbs, coster, room_fraction);
  if (over.empty()) return;
  if (policy == RecomputePolicy::Auto && forced_rc < 0) {
    over = detail::relieve_chains(
        mbs, coster,
        [&](std::size_t b) {
          MicroBatch copy = mbs[b];
          return finalize_packed(w, coster, copy, policy, static_cast<int>(Recompute::Full));
        },
        room_fraction);
  } else {
    over = detail::chains_over(mbs, coster);
  }
  PACKPIPE_CHECK_ARG(!require_fit || over.empty(),
                     "the slices of sample {} do not fit in {} MB together (each stage keeps their activations until the "
                     "sample's backward) under recompute {}; use more stages or tp, a larger memory limit, or recompute "
                     "auto or full",
                     over.empty() ? 0 : over.front(), coster.limit_mb(), recompute_policy_name(policy));
}

// Padded shapes, recompute, costs and figures of given micro-batches. `forced_rc` >= 0 pins the
// recompute mode (DynaPipe's iteration-wide choice); otherwise the fastest that fits under policy.
// `other` (optional): the second table builder's coster; a shape only it has costed is read there.
Partition finalize(const Work& w, Coster& coster, const PipelineShape& shape, std::vector<MicroBatch> mbs,
                   RecomputePolicy policy, int forced_rc, bool require_fit, std::int64_t count_multiple,
                   Coster* other = nullptr, double chain_room = 1.0) {
  if (other != nullptr) {
    other->set_dynapipe_limits(coster.dynapipe_stored_limit_mb(), coster.dynapipe_peak_limit_mb());
  }
  Partition p;
  p.basis = coster.basis();
  p.memory_limit_mb = coster.limit_mb();
  std::vector<double> times;
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    MicroBatch& mb = mbs[m];
    PACKPIPE_CHECK_ARG(!mb.samples.empty(), "micro-batch {} has no samples", m);
    PACKPIPE_CHECK_ARG(std::string_view(layout_name(mb.layout)) != "?", "micro-batch {}: unknown layout value {}", m,
                       static_cast<int>(mb.layout));
    // Rows given without a layout are rows under a block mask, as before layouts existed.
    if (mb.layout == Layout::Padded && !mb.row_offsets.empty()) mb.layout = Layout::PackedMask;
    PACKPIPE_CHECK_ARG(!mb.has_slices() || mb.layout == Layout::Packed,
                       "micro-batch {} holds slices in layout {}; slices are entries of packed (varlen) micro-batches", m,
                       layout_name(mb.layout));
    Choice c;
    std::uint64_t in_tok = 0, tg_tok = 0;
    if (mb.layout == Layout::Packed) {
      c = finalize_packed(w, coster, mb, policy, forced_rc);
      tg_tok = packed_target_tokens(w, mb);
      in_tok = mb.tokens - tg_tok;
    } else {
      c = finalize_rows(w, coster, mb, m, policy, forced_rc, other, in_tok, tg_tok);
    }
    if (require_fit && !c.fits) {
      const std::string dec =
          w.encdec() ? " + " + std::to_string(mb.padded_dec_len) + " decoder tokens" : std::string();
      const std::string what = mb.layout == Layout::Packed
                                   ? fmt::format("one packed row of {} samples, {} tokens{}", mb.samples.size(),
                                                 mb.padded_len, dec)
                                   : fmt::format("{} rows x {} tokens{}", mb.rows(), mb.padded_len, dec);
      PACKPIPE_CHECK_ARG(c.fits,
                         "micro-batch {} ({}) does not fit in {} MB under recompute {}; use smaller micro-batches (a "
                         "smaller micro-batch size, token budget or capacity, or fewer rows)",
                         m, what, coster.limit_mb(), recompute_policy_name(policy));
    }
    mb.recompute = c.rc;
    mb.time_ms = c.time_ms;
    mb.stored_mb = c.stored_mb;
    mb.peak_mb = c.peak_mb;
    p.input_tokens += in_tok;
    p.target_tokens += tg_tok;
    p.padded_input_tokens += static_cast<std::uint64_t>(mb.rows()) * static_cast<std::uint64_t>(mb.padded_len);
    p.padded_target_tokens += static_cast<std::uint64_t>(mb.rows()) * static_cast<std::uint64_t>(mb.padded_dec_len);
  }
  fit_chains(w, coster, mbs, policy, forced_rc, require_fit, chain_room);
  for (const MicroBatch& mb : mbs) {
    p.max_time_ms = std::max(p.max_time_ms, mb.time_ms);
    p.sum_time_ms += mb.time_ms;
    times.push_back(mb.time_ms);
  }
  p.microbatches = std::move(mbs);
  p.tau_ms = p.max_time_ms;
  p.predicted_iteration_ms = detail::objective(shape, p.max_time_ms, p.sum_time_ms);
  p.objective_ms = p.predicted_iteration_ms;
  auto ratio = [](std::uint64_t a, std::uint64_t b) { return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
  p.input_efficiency = ratio(p.input_tokens, p.padded_input_tokens);
  p.target_efficiency = ratio(p.target_tokens, p.padded_target_tokens);
  p.efficiency = ratio(p.input_tokens + p.target_tokens, p.padded_input_tokens + p.padded_target_tokens);
  const bool sliced = std::any_of(p.microbatches.begin(), p.microbatches.end(),
                                  [](const MicroBatch& mb) { return mb.has_slices(); });
  // A count that must be a multiple (interleaved 1F1B) is split evenly: with count_multiple =
  // stages x dp, every replica runs a multiple of the stages.
  const auto D = static_cast<std::size_t>(shape.dp);
  const std::size_t per_rank = count_multiple > 1 && D > 1 && times.size() % D == 0 ? times.size() / D : 0;
  p.ranks = sliced ? assign_ranks(times, shape.dp,
                                  slice_edges(p.microbatches, std::vector<std::uint32_t>(w.input, w.input + w.count)),
                                  per_rank)
                   : assign_ranks(times, shape.dp, per_rank);
  p.rank_time_ms.assign(p.ranks.size(), 0.0);
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    for (auto m : p.ranks[r]) p.rank_time_ms[r] += times[m];
  }
  return p;
}

std::string sample_name(const PartitionOptions& o, std::uint32_t s) {
  return o.describe_sample ? o.describe_sample(s) : fmt::format("sample {}", s);
}

// The Work view of lengths (`target` null for decoder-only) under the options' rounding.
Work make_work(const std::uint32_t* input, const std::uint32_t* target, std::size_t count, const PartitionOptions& o) {
  Work w;
  w.count = count;
  w.input = input;
  w.target = target;
  w.round = o.round_multiple;
  w.dec_extra = o.decoder_extra_tokens;
  return w;
}

// The DynaPipe basis' memory rule for a partition's micro-batches: stored activations within the
// available memory / S, peak within the available memory (the stage basis has no such limits).
void set_basis_limits(Coster& coster, const PipelineShape& shape) {
  if (coster.basis() != CostBasis::DynaPipe) return;
  const double avail = coster.dynapipe_available_mb();
  coster.set_dynapipe_limits(avail / static_cast<double>(shape.stages), avail);
}

// Every sample needs at least one input token.
void check_input_lengths(const std::vector<std::uint32_t>& in, const PartitionOptions& o) {
  for (std::size_t s = 0; s < in.size(); ++s) {
    PACKPIPE_CHECK_ARG(in[s] > 0, "{} has input length 0; every sample needs at least one input token",
                       sample_name(o, static_cast<std::uint32_t>(s)));
  }
}

// Throws when the model state (parameters, gradients, optimizer state) of some rank alone fills
// the memory limit: then no sample fits whatever its length, and truncating or dropping samples
// cannot help (the message says what can).
void check_model_state_fits(const cm::CostModel& cost, const PipelineShape& shape,
                            const std::vector<VirtualStage>& vstages, const Coster& coster, double limit_mb) {
  const char* what_helps =
      "use more pipeline stages, a larger tp, ZeRO stage 1-3 with dp > 1, or a larger memory limit (memory_mb / "
      "--memory-mb; the oversize policy cannot help: no sample fits whatever its length)";
  if (coster.basis() == CostBasis::DynaPipe) {
    PACKPIPE_CHECK_ARG(coster.dynapipe_available_mb() > 0,
                       "the model state of a pipeline stage needs {:.0f} MB, all of the {} MB memory limit; {}",
                       limit_mb - coster.dynapipe_available_mb(), limit_mb, what_helps);
    return;
  }
  std::vector<double> state(static_cast<std::size_t>(shape.stages), 0.0);
  for (const auto& v : vstages) {
    state[static_cast<std::size_t>(v.rank)] +=
        cm::stage_static_memory(cost.model(), v.layout, shape.tp, shape.dp, shape.zero_stage).total() / 1e6;
  }
  for (std::size_t r = 0; r < state.size(); ++r) {
    PACKPIPE_CHECK_ARG(state[r] <= limit_mb,
                       "the model state of rank {} (parameters, gradients and optimizer state of its layers) needs "
                       "{:.0f} MB, more than the {} MB memory limit; {}",
                       r, state[r], limit_mb, what_helps);
  }
}

// Why the cost model refuses one sample's shape (empty: it does not, the sample is too long).
std::string cost_refusal(const cm::CostModel& cost, const PipelineShape& shape, const std::vector<VirtualStage>& vstages,
                         std::int64_t le, std::int64_t ld) {
  const bool encdec = cost.model().arch == cm::Architecture::EncoderDecoder;
  for (const auto& v : vstages) {
    std::vector<std::pair<cm::LayerKind, std::int64_t>> kinds;
    if (v.layout.has_embedding) kinds.emplace_back(cm::LayerKind::Embedding, 1);
    if (v.layout.encoder_layers > 0) kinds.emplace_back(cm::LayerKind::Encoder, v.layout.encoder_layers);
    if (v.layout.decoder_layers > 0) kinds.emplace_back(cm::LayerKind::Decoder, v.layout.decoder_layers);
    if (v.layout.has_postprocess) kinds.emplace_back(cm::LayerKind::PostProcess, 1);
    for (const auto& [kind, layers] : kinds) {
      cm::Query q;
      q.kind = kind;
      q.num_layers = layers;
      q.tp = shape.tp;
      q.mbs = 1;
      q.seq = le;
      q.dec_seq = encdec ? ld : 0;
      try {
        (void)cost.query(q);
      } catch (const InvalidArgument& e) {
        return e.what();
      }
    }
  }
  return {};
}

bool allowed_fits_alone(Coster& coster, std::int64_t le, std::int64_t ld, RecomputePolicy policy) {
  if (coster.basis() == CostBasis::DynaPipe) {
    const double avail = coster.dynapipe_available_mb();
    coster.set_dynapipe_limits(avail, avail);
    return coster.choose(1, le, ld, policy).fits;  // the caller sets the DP's limits afterwards
  }
  return coster.choose(1, le, ld, policy).fits;
}

// ---- one partition call ----------------------------------------------------------------------

// The working lengths of a batch: `in` and `tg` (copies the oversize step may truncate) and the
// Work view over them. Not movable: the view points into the copies.
struct Lengths {
  std::vector<std::uint32_t> in, tg;
  Work w;
  Lengths(const BatchLengths& lengths, bool encdec, const PartitionOptions& o) : in(lengths.input), tg(lengths.target) {
    w = make_work(in.data(), encdec ? tg.data() : nullptr, in.size(), o);
  }
  Lengths(const Lengths&) = delete;
  Lengths& operator=(const Lengths&) = delete;
};

// What the steps of one partition call share: the inputs, the costers (the second table builder's
// made when first needed), the working lengths and the samples the oversize step kept.
struct Run {
  const cm::CostModel& cost;
  const PipelineShape& shape;
  const std::vector<VirtualStage>& vstages;
  const PartitionOptions& options;
  bool encdec;
  CostBasis basis;
  double limit;
  Coster coster;
  bool two_builders = false;
  std::unique_ptr<Coster> coster2;
  Lengths len;
  std::vector<std::uint32_t> ids, truncated, dropped;  ///< samples kept (batch order), truncated, dropped
  std::vector<char> must_slice;                         ///< OversizePolicy::Slice: samples that cannot fit alone
  std::size_t windows_built = 0;                        ///< window values of every table built

  Run(const BatchLengths& lengths, const cm::CostModel& cost_, const PipelineShape& shape_,
      const std::vector<VirtualStage>& vstages_, const PartitionOptions& o, bool encdec_)
      : cost(cost_), shape(shape_), vstages(vstages_), options(o), encdec(encdec_), basis(resolve_basis(o)),
        limit(resolve_limit(cost_, shape_)),
        coster(cost_, shape_, vstages_, basis, limit, o.cache ? &o.cache->memo() : nullptr),
        len(lengths, encdec_, o) {}
  // The second table builder's coster when two build (PartitionOptions::threads), else null.
  Coster* second() {
    if (!two_builders) return nullptr;
    if (!coster2) {
      coster2 = std::make_unique<Coster>(cost, shape, vstages, basis, limit,
                                         options.cache ? &options.cache->memo(1) : nullptr);
    }
    return coster2.get();
  }
  // A sample's padded (encoder, decoder) lengths alone.
  std::int64_t le(std::uint32_t s) const { return len.w.le_of(len.in[s]); }
  std::int64_t ld(std::uint32_t s) const { return len.w.ld_of(encdec ? len.tg[s] : 0); }
  // Figures of `mbs` under the run's recompute policy (`forced_rc` >= 0 pins the mode).
  Partition finish(std::vector<MicroBatch> mbs, int forced_rc = -1, Coster* other = nullptr, double chain_room = 1.0) {
    return finalize(len.w, coster, shape, std::move(mbs), options.recompute, forced_rc, true, options.count_multiple,
                    other, chain_room);
  }
  // Sliced micro-batches `mbs` with their chains recomputed to leave room for the micro-batches a
  // schedule keeps in flight beside them: variants at kChainRooms (none when nothing is sliced,
  // the policy pins the mode, or a variant changes no mode), for the planner to simulate.
  std::vector<Partition> chain_variants(const Partition& p) {
    std::vector<Partition> out;
    const bool sliced = std::any_of(p.microbatches.begin(), p.microbatches.end(),
                                    [](const MicroBatch& mb) { return mb.has_slices(); });
    if (!sliced || options.recompute != RecomputePolicy::Auto) return out;
    auto modes = [](const Partition& x) {
      std::vector<Recompute> m;
      for (const MicroBatch& mb : x.microbatches) m.push_back(mb.recompute);
      return m;
    };
    std::vector<std::vector<Recompute>> seen{modes(p)};
    for (const double room : kChainRooms) {
      Partition v = finish(p.microbatches, -1, nullptr, room);
      v.order = p.order;
      std::vector<Recompute> m = modes(v);
      if (std::find(seen.begin(), seen.end(), m) != seen.end()) continue;
      seen.push_back(std::move(m));
      out.push_back(std::move(v));
    }
    return out;
  }
};

// The model and the batch agree on target lengths, and the batch is small enough for 31-bit ids.
void check_batch(const BatchLengths& lengths, const cm::CostModel& cost, bool encdec) {
  PACKPIPE_CHECK_ARG(encdec == lengths.encoder_decoder() || (encdec && lengths.size() == 0),
                     "model '{}' is {} but the batch {} target lengths", cost.model().name,
                     encdec ? "encoder-decoder" : "decoder-only", lengths.encoder_decoder() ? "has" : "has no");
  PACKPIPE_CHECK_ARG(!lengths.encoder_decoder() || lengths.target.size() == lengths.input.size(),
                     "batch has {} input lengths but {} target lengths", lengths.input.size(), lengths.target.size());
  PACKPIPE_CHECK_ARG(lengths.size() < (1ull << 31), "batch of {} samples is too large", lengths.size());
}

// Whether two builders make the window table (PartitionOptions::threads). Automatic: when the
// arena has a second thread and the work is mostly new rows (a cold call; a warm cache's call is
// mostly look-ups, which a second builder only slows). A cache's second memo follows the first
// one's setting.
bool use_two_builders(const PartitionOptions& o, const Coster& coster) {
  if (o.cache != nullptr && o.cache->memo(1).key != coster.setting()) o.cache->memo(1).clear();
  constexpr double kNewShare = 0.1;
  return o.threads >= 2 || (o.threads == 0 && available_threads() > 1 &&
                            (o.cache == nullptr || o.cache->memo().last_new_share >= kNewShare));
}

// Whether each sample fits alone under the most permissive setting the method allows (1: fits).
// The DP methods with two builders check halves of the samples on the two costers.
std::vector<char> fits_alone(Run& r) {
  const auto& in = r.len.in;
  std::vector<char> alone(in.size(), 0);
  auto check = [&](Coster& c, std::size_t a, std::size_t b) {
    for (std::size_t s = a; s < b; ++s) {
      const auto id = static_cast<std::uint32_t>(s);
      alone[s] = allowed_fits_alone(c, r.le(id), r.ld(id), r.options.recompute) ? 1 : 0;
    }
  };
  constexpr std::size_t kMinParallelCheck = 64;
  const bool dp_method = r.options.method == PartitionMethod::DP || r.options.method == PartitionMethod::DynaPipe;
  if (dp_method && r.two_builders && in.size() >= kMinParallelCheck) {
    Coster& other = *r.second();
    oneapi::tbb::this_task_arena::isolate([&] {
      oneapi::tbb::parallel_invoke([&] { check(r.coster, 0, in.size() / 2); },
                                   [&] { check(other, in.size() / 2, in.size()); });
    });
  } else {
    check(r.coster, 0, in.size());
  }
  return alone;
}

// OversizePolicy::Error: throws for sample `s`, saying why the cost model refuses it or that it
// does not fit even alone.
[[noreturn]] void refuse_oversize(const Run& r, std::uint32_t s) {
  const auto& in = r.len.in;
  const auto& tg = r.len.tg;
  const std::string why = cost_refusal(r.cost, r.shape, r.vstages, r.le(s), r.ld(s));
  const std::string len =
      r.encdec ? fmt::format("input length {}, target length {}", in[s], tg[s]) : fmt::format("length {}", in[s]);
  const std::string name = sample_name(r.options, s);
  PACKPIPE_CHECK_ARG(why.empty(), "{} ({}): the cost model cannot cost it: {}", name, len, why);
  const bool offer_slice = !r.encdec && r.options.slices_refused.empty();
  PACKPIPE_THROW(InvalidArgument,
                 "{} ({}) does not fit in {} MB even alone (recompute {}); use {} truncate, drop{}, more "
                 "stages or tp, or a larger memory limit{}",
                 name, len, r.limit, recompute_policy_name(r.options.recompute), r.options.oversize_option,
                 offer_slice ? " or slice (cut into slices that pipeline, trained as the whole sample)" : "",
                 !r.encdec && !r.options.slices_refused.empty()
                     ? fmt::format(" (slices, which are how a sample too long for one micro-batch fits, {})",
                                   r.options.slices_refused)
                     : std::string());
}

// OversizePolicy::Truncate: cuts sample `s` (both sides) to the largest cap that fits alone.
void truncate_to_fit(Run& r, std::uint32_t s) {
  auto& in = r.len.in;
  auto& tg = r.len.tg;
  const std::uint32_t hi0 = std::max(in[s], r.encdec ? tg[s] : 0u);
  std::uint32_t lo = 0, hi = hi0;  // lo fits (0: nothing yet), hi does not
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    const std::uint32_t a = std::min(in[s], mid), b = r.encdec ? std::min(tg[s], mid) : 0;
    if (allowed_fits_alone(r.coster, r.len.w.le_of(a), r.len.w.ld_of(b), r.options.recompute)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  PACKPIPE_CHECK_ARG(lo >= 1, "{} (length {}) does not fit in {} MB even truncated to 1 token; use {} drop, "
                     "more stages or tp, or a larger memory limit",
                     sample_name(r.options, s), in[s], r.limit, r.options.oversize_option);
  in[s] = std::min(in[s], lo);
  if (r.encdec) tg[s] = std::min(tg[s], lo);
}

// Keeps the samples that fit alone in r.ids and applies the oversize policy to the others; then
// sets the DynaPipe basis' limits for the methods.
void handle_oversize(Run& r) {
  if (r.options.method == PartitionMethod::Slicing) {
    // Fixed-length slicing cuts every long sample: whether its slices fit is its micro-batches' check.
    for (std::uint32_t s = 0; s < r.len.in.size(); ++s) r.ids.push_back(s);
    set_basis_limits(r.coster, r.shape);
    return;
  }
  const std::vector<char> alone = fits_alone(r);
  r.ids.reserve(alone.size());
  for (std::uint32_t s = 0; s < alone.size(); ++s) {
    if (alone[s] != 0) {
      r.ids.push_back(s);
      continue;
    }
    // Decoder-only with slicing on (the default), a sample that does not fit alone is sliced, not
    // refused: the dp method cuts it into slices that fit (refused then only when none do).
    const bool refused = !r.options.slices_refused.empty();
    const bool slice_it = r.options.oversize == OversizePolicy::Error && !r.encdec && !refused &&
                          r.options.slicing == SlicePolicy::Auto && r.options.method == PartitionMethod::DP &&
                          has_layout(r.options.layouts, Layout::Packed);
    const OversizePolicy asked = refused && r.options.oversize == OversizePolicy::Slice ? OversizePolicy::Error
                                                                                          : r.options.oversize;
    switch (slice_it ? OversizePolicy::Slice : asked) {
      case OversizePolicy::Error: refuse_oversize(r, s);
      case OversizePolicy::Drop: r.dropped.push_back(s); break;
      case OversizePolicy::Slice:
        // Kept whole in ids; the methods that can slice cut it (the others cannot fit it).
        PACKPIPE_CHECK_ARG(!r.encdec, "{} does not fit in {} MB alone, and {} slice applies to decoder-only models "
                           "(an encoder attends both ways, a T5 decoder to the whole encoder output); use truncate or "
                           "drop", sample_name(r.options, s), r.limit, r.options.oversize_option);
        if (r.must_slice.empty()) r.must_slice.assign(alone.size(), 0);
        r.must_slice[s] = 1;
        r.ids.push_back(s);
        break;
      case OversizePolicy::Truncate:
        truncate_to_fit(r, s);
        r.truncated.push_back(s);
        r.ids.push_back(s);
        break;
    }
  }
  set_basis_limits(r.coster, r.shape);
}

// The memory budgets the DP methods try in turn: the DynaPipe basis keeps its rule (stored <=
// available / S first, then available); the stage basis has the one limit.
std::vector<double> dp_budgets(const Run& r) {
  const double avail = r.coster.dynapipe_available_mb();
  return r.basis == CostBasis::DynaPipe ? std::vector<double>{avail / static_cast<double>(r.shape.stages), avail}
                                        : std::vector<double>{r.limit};
}

// The sample orders the dp method searches. Encoder-decoder Auto: the path order first (it
// usually wins), so that its objective prunes the sorted order's search.
std::vector<std::vector<std::uint32_t>> dp_orders(const Run& r) {
  std::vector<std::vector<std::uint32_t>> orders;
  if (r.encdec && r.options.order != EncDecOrder::Sorted) {
    std::vector<std::uint32_t> li(r.ids.size()), lt(r.ids.size());
    for (std::size_t k = 0; k < r.ids.size(); ++k) {
      li[k] = r.len.in[r.ids[k]];
      lt[k] = r.len.tg[r.ids[k]];
    }
    std::vector<std::uint32_t> o = encdec_order(li, lt, true);
    for (auto& x : o) x = r.ids[x];
    orders.push_back(std::move(o));
  }
  if (!r.encdec || r.options.order != EncDecOrder::Path) orders.push_back(sorted_order(r.len.w, r.ids));
  return orders;
}

// Splits padded windows (each into two halves of its samples, the window with the most samples
// first) until the count is a multiple of `m`, where it can (every window of one sample: it
// cannot). Halves of a window that fits fit too.
void split_to_multiple(std::vector<MicroBatch>& mbs, std::int64_t m) {
  while (m > 1 && static_cast<std::int64_t>(mbs.size()) % m != 0) {
    std::size_t widest = 0;
    for (std::size_t k = 1; k < mbs.size(); ++k) {
      if (mbs[k].samples.size() > mbs[widest].samples.size()) widest = k;
    }
    if (mbs.empty() || mbs[widest].samples.size() < 2 || !mbs[widest].row_offsets.empty()) return;
    MicroBatch tail;
    const std::size_t half = mbs[widest].samples.size() / 2;
    tail.samples.assign(mbs[widest].samples.begin() + static_cast<std::ptrdiff_t>(half), mbs[widest].samples.end());
    mbs[widest].samples.resize(half);
    mbs.insert(mbs.begin() + static_cast<std::ptrdiff_t>(widest) + 1, std::move(tail));
  }
}

// One search's outcome offered to the dp method: its micro-batches become the result when their
// objective is lower (the result's go to `others`, first), else they join `others` (first); its
// alternatives join `others` after.
void take_candidate(Run& r, bool feasible, double objective, std::vector<MicroBatch> mbs,
                    std::vector<std::pair<double, std::vector<MicroBatch>>> alternatives, Partition& result, bool& done,
                    std::vector<std::pair<double, std::vector<MicroBatch>>>& others) {
  for (auto& alt : alternatives) others.push_back(std::move(alt));
  if (!feasible) return;
  if (done && !(objective < result.objective_ms)) {
    others.emplace(others.begin(), objective, std::move(mbs));
    return;
  }
  if (done) others.emplace(others.begin(), result.objective_ms, std::move(result.microbatches));
  Partition p = r.finish(std::move(mbs));
  p.order = r.ids;
  p.tau_evaluations = result.tau_evaluations;
  result = std::move(p);
  done = true;
}

// A sample is heavy beside micro-batches of `a` tokens on average when longer than kHeavySample x a.
// Below, a micro-batch holding it is at most that much over the average, and with 2+ micro-batches a
// stage the 1F1B bound gains less from cutting it than the slices cost in per-slice overhead and
// attention to kept keys (measured: on the demo's batches, whose longest samples reach 1.1x their
// average micro-batch, the sliced candidates were searched and never chosen).
constexpr double kHeavySample = 1.5;

// Whether cutting samples into slices may beat `best` (the search's unsliced partition, `done`:
// there is one): some sample is heavy beside its average micro-batch (packing whole samples cannot
// balance it), or it has fewer than 2 micro-batches per stage on each replica (finer slices fill
// the pipeline: Seq1F1B's case of a few long samples). Where neither holds the sliced search (the
// costliest of the dp method's) is skipped.
bool slices_may_pay(const Run& r, const Partition& best, bool done) {
  if (!done || best.microbatches.empty()) return true;
  const auto m = static_cast<std::int64_t>(best.microbatches.size());
  if (m < 2 * r.shape.stages * std::max<std::int64_t>(1, r.shape.dp)) return true;
  std::uint64_t tokens = 0, longest = 0;
  for (const auto s : r.ids) {
    tokens += r.len.w.input[s];
    longest = std::max<std::uint64_t>(longest, r.len.w.input[s]);
  }
  return static_cast<double>(longest) > kHeavySample * static_cast<double>(tokens) / static_cast<double>(m);
}

// PartitionMethod::DP: every order under each budget in turn; the best objective of the first
// budget with a feasible partition (on equal objectives the first order is kept).
Partition partition_dp(Run& r) {
  const double avail = r.coster.dynapipe_available_mb();
  Partition result;
  bool done = false;
  std::vector<std::pair<double, std::vector<MicroBatch>>> others;  // the candidates not chosen
  const bool padded = has_layout(r.options.layouts, Layout::Padded);
  const std::vector<std::vector<std::uint32_t>> orders = padded ? dp_orders(r) : std::vector<std::vector<std::uint32_t>>{};
  for (double budget : padded ? dp_budgets(r) : std::vector<double>{}) {
    if (r.basis == CostBasis::DynaPipe) r.coster.set_dynapipe_limits(budget, avail);
    double best = kInf;
    std::int64_t evals = 0;
    for (const auto& order : orders) {
      WindowTable& t = r.coster.scratch().table;
      build_windows(r.len.w, order, r.coster, r.options.recompute, r.options.pack_windows, t, r.second());
      r.windows_built += t.time_ms.size();
      SearchOutcome so = search_caps(t, r.shape, r.options.tau_tolerance, r.coster.scratch(), best);
      evals += so.evaluations;
      if (!so.best.feasible || !(so.objective < best)) continue;
      best = so.objective;
      std::vector<MicroBatch> mbs = windows_to_microbatches(r.len.w, order, t, so.best.cuts);
      const bool split = r.options.count_multiple > 1 &&
                         static_cast<std::int64_t>(mbs.size()) % r.options.count_multiple != 0;
      split_to_multiple(mbs, r.options.count_multiple);
      Partition p = r.finish(std::move(mbs), -1, r.coster2.get());
      p.order = order;
      if (!split) p.objective_ms = so.objective;  // else finalize's objective of the split windows
      result = std::move(p);
      done = true;
    }
    result.tau_evaluations = evals;
    if (done) break;
  }
  if (has_layout(r.options.layouts, Layout::Packed) && !r.ids.empty()) {
    // Packed varlen micro-batches, balanced by cost; kept when their objective is lower. (The
    // DynaPipe basis keeps its first budget, stored activations within the available memory / S.)
    const std::vector<double> budgets = dp_budgets(r);
    if (r.basis == CostBasis::DynaPipe) r.coster.set_dynapipe_limits(budgets.front(), avail);
    detail::BalancedOutcome b = detail::balanced_search(r.len.w, r.ids, r.coster, r.shape, r.options.recompute,
                                        r.options.count_multiple);
    take_candidate(r, b.feasible, b.objective, std::move(b.microbatches), std::move(b.alternatives), result, done,
                   others);
  }
  // Slices (decoder-only, packed): split long, pack short; kept when their objective is lower, and
  // the only way for samples that cannot fit alone (OversizePolicy::Slice).
  const bool may_slice = !r.encdec && has_layout(r.options.layouts, Layout::Packed) && !r.ids.empty() &&
                         (!r.must_slice.empty() || (r.options.slicing == SlicePolicy::Auto && r.options.slices_refused.empty() &&
                                                      slices_may_pay(r, result, done)));
  if (may_slice) {
    detail::SlicedOutcome sl =
        detail::sliced_search(r.len.w, r.ids, r.must_slice, r.coster, r.shape, r.options.recompute,
                              r.options.count_multiple, r.options.min_slice_tokens, r.options.slicing == SlicePolicy::Auto);
    take_candidate(r, sl.feasible, sl.objective, std::move(sl.microbatches), std::move(sl.alternatives), result, done,
                   others);
  }
  if (!done && !r.must_slice.empty()) {
    for (std::uint32_t s = 0; s < r.must_slice.size(); ++s) {
      PACKPIPE_CHECK_ARG(r.must_slice[s] == 0,
                         "{} (length {}) does not fit in {} MB alone, nor when cut into slices of at least {} tokens "
                         "that fit one micro-batch each and together on every stage; use more stages or tp, a larger "
                         "memory limit, or {} truncate or drop",
                         sample_name(r.options, s), r.len.in[s], r.limit, r.options.min_slice_tokens,
                         r.options.oversize_option);
    }
  }
  // (a count that must be a multiple, interleaved 1F1B's stages x dp, may be what no partition of
  // these samples reaches: said, rather than blaming the memory)
  const auto multiple = static_cast<std::size_t>(std::max<std::int64_t>(1, r.options.count_multiple));
  PACKPIPE_CHECK_ARG(done || r.ids.empty() || multiple <= 1 || r.ids.size() >= multiple,
                     "no partition of the batch's {} samples into a multiple of {} micro-batches (interleaved 1F1B "
                     "runs a multiple of stages x dp), at least one sample each, fits in {} MB; allow another "
                     "schedule (the search, or --schedule-fallback), fewer replicas, or slices of long samples",
                     r.ids.size(), multiple, r.limit);
  PACKPIPE_CHECK_ARG(done || r.ids.empty(), "no partition fits in {} MB", r.limit);
  if (r.ids.empty()) result = r.finish({});
  // The chosen micro-batches with their slices recomputed more, then the other candidates in the
  // order gathered: the other layout's or family's best, then each search's fewer-and-larger and
  // other counts (deterministic).
  for (Partition& v : r.chain_variants(result)) result.alternatives.push_back(std::move(v));
  const std::size_t most = result.alternatives.size() + kMaxAlternatives;
  for (auto& [objective, mbs] : others) {
    if (result.alternatives.size() >= most) break;
    if (mbs.empty()) continue;
    Partition p = r.finish(std::move(mbs));
    p.order = r.ids;
    result.alternatives.push_back(std::move(p));
  }
  return result;
}

// The iteration-wide recompute modes DynaPipe tries under `policy`, fastest first.
std::vector<cm::Recompute> dynapipe_modes(RecomputePolicy policy) {
  switch (policy) {
    case RecomputePolicy::Auto: return {cm::Recompute::None, cm::Recompute::Selective, cm::Recompute::Full};
    case RecomputePolicy::None: return {cm::Recompute::None};
    case RecomputePolicy::Selective: return {cm::Recompute::Selective};
    case RecomputePolicy::Full: return {cm::Recompute::Full};
  }
  return {};
}

// PartitionMethod::DynaPipe: the sorted order; under each budget in turn, the first recompute
// mode with a feasible tau-DP.
Partition partition_dynapipe(Run& r) {
  const std::vector<std::uint32_t> order = sorted_order(r.len.w, r.ids);
  const std::vector<cm::Recompute> rcs = dynapipe_modes(r.options.recompute);
  const std::vector<double> budgets = dp_budgets(r);
  const double avail = r.coster.dynapipe_available_mb();
  Partition result;
  bool done = r.ids.empty();
  std::int64_t evals = 0;
  // DynaPipe's caps thinned (the least of each cluster within dynapipe_thin_ms), then, only where no
  // budget and mode found a plan, every cap: where every window time sits within the thinning of the
  // least (a few short samples), no cap kept admits the window the longest sample needs, and
  // DynaPipe's partition found no plan at all (lengths 100 and 2).
  const double thin = r.options.dynapipe_thin_ms;
  for (const double th : thin > 0 ? std::vector<double>{thin, 0.0} : std::vector<double>{0.0}) {
    for (std::size_t bi = 0; bi < budgets.size() && !done; ++bi) {
      for (cm::Recompute rc : rcs) {
        if (r.basis == CostBasis::DynaPipe) r.coster.set_dynapipe_limits(budgets[bi], avail);
        DynaPipeOutcome d = dynapipe_dp(r.len.w, order, r.coster, r.shape, rc, th, r.options.pack_windows, r.second());
        evals += d.evaluations;
        r.windows_built += d.table.time_ms.size();
        if (!d.best.feasible) continue;
        Partition p = r.finish(windows_to_microbatches(r.len.w, order, d.table, d.best.cuts), static_cast<int>(rc),
                               r.coster2.get());
        p.order = order;
        p.objective_ms = d.objective;
        p.tau_ms = d.tau;
        p.dynapipe_recompute = rc;
        result = std::move(p);
        done = true;
        break;
      }
    }
    if (done) break;
  }
  PACKPIPE_CHECK_ARG(done, "DynaPipe's partition found no feasible plan in {} MB", r.limit);
  if (r.ids.empty()) result = r.finish({});
  result.tau_evaluations = evals;
  return result;
}

// PartitionMethod::Fixed: `microbatch_size` samples at a time in batch order, padded rows or (layout
// packed) one flattened varlen row.
Partition partition_fixed(Run& r) {
  const auto size = static_cast<std::size_t>(r.options.microbatch_size);
  const Layout layout = method_layout(r.options);
  std::vector<MicroBatch> mbs;
  mbs.reserve((r.ids.size() + size - 1) / size);
  for (std::size_t k = 0; k < r.ids.size(); k += size) {
    MicroBatch mb;
    mb.layout = layout;
    const std::size_t e = std::min(r.ids.size(), k + size);
    mb.samples.assign(r.ids.begin() + static_cast<std::ptrdiff_t>(k), r.ids.begin() + static_cast<std::ptrdiff_t>(e));
    mbs.push_back(std::move(mb));
  }
  Partition result = r.finish(std::move(mbs));
  result.order = r.ids;
  return result;
}

// PartitionMethod::Tokens: the sorted order cut where the padded tokens would pass the budget.
Partition partition_tokens(Run& r) {
  const std::vector<std::uint32_t> order = sorted_order(r.len.w, r.ids);
  const auto& in = r.len.in;
  const auto& tg = r.len.tg;
  std::vector<MicroBatch> mbs;
  std::size_t i = 0;
  while (i < order.size()) {
    std::uint32_t max_in = 0, max_tg = 0;
    std::size_t j = i;
    while (j < order.size()) {
      const std::uint32_t a = std::max(max_in, in[order[j]]);
      const std::uint32_t b = r.encdec ? std::max(max_tg, tg[order[j]]) : 0;
      const auto padded = static_cast<std::uint64_t>(j - i + 1) *
                          static_cast<std::uint64_t>(r.len.w.le_of(a) + (r.encdec ? r.len.w.ld_of(b) : 0));
      if (j > i && padded > r.options.token_budget) break;
      max_in = a;
      max_tg = b;
      ++j;
    }
    MicroBatch mb;
    mb.samples.assign(order.begin() + static_cast<std::ptrdiff_t>(i), order.begin() + static_cast<std::ptrdiff_t>(j));
    mbs.push_back(std::move(mb));
    i = j;
  }
  Partition result = r.finish(std::move(mbs));
  result.order = order;
  return result;
}

// PartitionMethod::Packing: packed rows of the capacity, `microbatch_size` rows per micro-batch.
Partition partition_packing(Run& r) {
  std::vector<MicroBatch> mbs =
      r.ids.empty() ? std::vector<MicroBatch>{}
                    : detail::packing_baseline(r.len.w, r.ids, r.options.microbatch_size, r.options.capacity,
                                               method_layout(r.options));
  Partition result = r.finish(std::move(mbs));
  result.order = r.ids;
  return result;
}

// PartitionMethod::Slicing: fixed-length slices (Seq1F1B-like), packed into rows of the slice length.
Partition partition_slicing(Run& r) {
  PACKPIPE_CHECK_ARG(!r.encdec, "method 'slicing' is for decoder-only models; model '{}' is encoder-decoder",
                     r.cost.model().name);
  Partition result = r.finish(detail::slicing_baseline(r.len.w, r.ids, r.options.capacity));
  result.order = r.ids;
  if (r.options.recompute_variants) result.alternatives = r.chain_variants(result);  // the same slices, more recomputed
  return result;
}

// PartitionMethod::Wlb: WLB-LLM's attention-balanced packing.
Partition partition_wlb(Run& r) {
  Partition result = r.finish(detail::wlb_baseline(r.len.w, r.cost.model(), r.ids, r.options.capacity));
  result.order = r.ids;
  return result;
}


// The method's partition of the kept samples.
Partition run_method(Run& r) {
  switch (r.options.method) {
    case PartitionMethod::DP: return partition_dp(r);
    case PartitionMethod::DynaPipe: return partition_dynapipe(r);
    case PartitionMethod::Fixed: return partition_fixed(r);
    case PartitionMethod::Tokens: return partition_tokens(r);
    case PartitionMethod::Packing: return partition_packing(r);
    case PartitionMethod::Wlb: return partition_wlb(r);
    case PartitionMethod::Slicing: return partition_slicing(r);
  }
  return {};
}

// Records in the cache the share of new rows of this call (for PartitionOptions::threads).
void record_new_share(const Run& r) {
  if (r.options.cache == nullptr || r.windows_built == 0) return;
  const auto rows = r.coster.rows_evaluated() + (r.coster2 ? r.coster2->rows_evaluated() : 0);
  r.options.cache->memo().last_new_share = static_cast<double>(rows) / static_cast<double>(r.windows_built);
}

// Per sample of a batch of `n`: the micro-batch holding it whole (-1: none) and the tokens its
// slices cover. `twice(s, first, again)` is called, and must throw, for a sample found a second
// time whole, or whole and in slices (first: the micro-batch it was first found in).
struct SampleCover {
  std::vector<std::int64_t> whole_in;
  std::vector<std::uint64_t> sliced;
};
template <typename Twice>
SampleCover sample_cover(const std::vector<MicroBatch>& mbs, std::size_t n, Twice&& twice) {
  SampleCover c{std::vector<std::int64_t>(n, -1), std::vector<std::uint64_t>(n, 0)};
  std::vector<std::int64_t> first(n, -1);
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    const MicroBatch& mb = mbs[m];
    for (std::size_t k = 0; k < mb.samples.size(); ++k) {
      const std::uint32_t s = mb.samples[k];
      const auto at = static_cast<std::int64_t>(m);
      if (c.whole_in[s] >= 0 || (!mb.has_slices() && c.sliced[s] > 0)) twice(s, first[s], at);
      if (first[s] < 0) first[s] = at;
      if (mb.has_slices()) {
        c.sliced[s] += mb.spans[k].length;
      } else {
        c.whole_in[s] = at;
      }
    }
  }
  return c;
}

// Every sample not dropped is planned exactly once: whole in one micro-batch, or in slices that
// cover its (trained) tokens once. A partition that is not is packpipe's bug, never the user's:
// lost or duplicated samples must not pass as a plan.
void check_covers(const Partition& p, std::size_t n, const std::vector<std::uint32_t>& dropped,
                  const std::vector<std::uint32_t>& input, const char* what) {
  for (const MicroBatch& mb : p.microbatches) {
    for (const std::uint32_t s : mb.samples) {
      PACKPIPE_CHECK(s < n, "internal error: the {} partition plans sample {} of a batch of {}; please report this as "
                     "a packpipe bug", what, s, n);
    }
  }
  const SampleCover c = sample_cover(p.microbatches, n, [&](std::uint32_t s, std::int64_t, std::int64_t) {
    PACKPIPE_THROW(Error, "internal error: the {} partition plans sample {} twice; please report this as a packpipe "
                   "bug", what, s);
  });
  std::vector<char> gone(n, 0);
  for (const std::uint32_t s : dropped) gone[s] = 1;
  for (std::size_t s = 0; s < n; ++s) {
    PACKPIPE_CHECK(gone[s] || c.whole_in[s] >= 0 || c.sliced[s] == input[s],
                   "internal error: the {} partition plans {} of the {} tokens of sample {}; please report this as a "
                   "packpipe bug", what, c.sliced[s], input[s], s);
  }
}

}  // namespace

Partition partition(const BatchLengths& lengths, const cm::CostModel& cost, const PipelineShape& shape,
                    const PartitionOptions& options) {
  return partition(lengths, cost, shape, virtual_stages(cost.model(), shape), options);
}

Partition partition(const BatchLengths& lengths, const cm::CostModel& cost, const PipelineShape& shape,
                    const std::vector<VirtualStage>& vstages, const PartitionOptions& options) {
  check_options(options);
  check_shape(shape);
  const bool encdec = cost.model().arch == cm::Architecture::EncoderDecoder;
  check_batch(lengths, cost, encdec);
  Run r(lengths, cost, shape, vstages, options, encdec);
  check_model_state_fits(cost, shape, vstages, r.coster, r.limit);
  r.two_builders = use_two_builders(options, r.coster);
  check_input_lengths(r.len.in, options);
  handle_oversize(r);
  Partition result = run_method(r);
  record_new_share(r);
  result.truncated = std::move(r.truncated);
  result.dropped = std::move(r.dropped);
  result.lengths.input = std::move(r.len.in);
  if (encdec) result.lengths.target = std::move(r.len.tg);
  const char* method = partition_method_name(options.method);
  check_covers(result, lengths.size(), result.dropped, result.lengths.input, method);
  for (auto& alt : result.alternatives) {  // the same batch, cut otherwise
    alt.truncated = result.truncated;
    alt.dropped = result.dropped;
    alt.lengths = result.lengths;
    check_covers(alt, lengths.size(), alt.dropped, alt.lengths.input, method);
  }
  return result;
}

Partition evaluate_partition(const BatchLengths& lengths, const cm::CostModel& cost, const PipelineShape& shape,
                             const std::vector<VirtualStage>& vstages, std::vector<MicroBatch> microbatches,
                             const PartitionOptions& options, CostBasis basis) {
  check_options(options);
  const bool encdec = cost.model().arch == cm::Architecture::EncoderDecoder;
  PACKPIPE_CHECK_ARG(encdec == lengths.encoder_decoder(), "model '{}' and batch disagree on target lengths",
                     cost.model().name);
  if (basis == CostBasis::Auto) basis = CostBasis::Stages;
  const double limit = resolve_limit(cost, shape);
  Coster coster(cost, shape, vstages, basis, limit, options.cache ? &options.cache->memo() : nullptr);
  set_basis_limits(coster, shape);
  const Work w = make_work(lengths.input.data(), encdec ? lengths.target.data() : nullptr, lengths.size(), options);
  bool sliced = false;
  for (std::size_t m = 0; m < microbatches.size(); ++m) {
    for (auto s : microbatches[m].samples) {
      PACKPIPE_CHECK_ARG(s < lengths.size(), "micro-batch {} names sample {} but the batch has {}", m, s,
                         lengths.size());
    }
    sliced = sliced || microbatches[m].has_slices();
  }
  // Slices: each sample's pieces cover it back to back, in micro-batch order (slice_edges' checks).
  if (sliced) slice_edges(microbatches, lengths.input);
  // No sample twice (whole in two micro-batches, or whole and in slices: figures of a batch with a
  // sample repeated were returned as the batch's); a sample in no micro-batch is listed as dropped
  // (the figures are those of the micro-batches given: a window of the batch may be costed alone).
  const std::size_t n = lengths.size();
  const SampleCover c = sample_cover(microbatches, n, [](std::uint32_t s, std::int64_t first, std::int64_t again) {
    PACKPIPE_THROW(InvalidArgument, "sample {} is in micro-batch {} and again in micro-batch {}: a partition holds "
                   "each sample of the batch once", s, first, again);
  });
  std::vector<std::uint32_t> left_out;
  for (std::uint32_t s = 0; s < n; ++s) {
    if (c.whole_in[s] < 0 && c.sliced[s] == 0) left_out.push_back(s);
  }
  Partition p = finalize(w, coster, shape, std::move(microbatches), options.recompute, -1, true,
                         options.count_multiple);
  p.lengths = lengths;  // (as partition() records them: what the slices were cut from)
  p.dropped = std::move(left_out);
  return p;
}

}  // namespace packpipe::partition
