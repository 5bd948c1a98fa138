// Micro-batch partition: DynaPipe's tau-DP against an independent reference, packpipe's DP
// against brute force and against DynaPipe's, guarantees on random long-tailed batches,
// oversize policies, baselines, rank assignment and the encoder-decoder order.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "costmodel/factory.h"
#include "partition/detail/coster.h"
#include "partition/partition.h"
#include "schedule/stage_costs.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::partition;
using namespace packpipe::schedule;
namespace cm = packpipe::costmodel;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::unique_ptr<cm::CostModel> model(const char* name) {
  cm::CostModelConfig c;
  c.model = name;
  c.device = "A100-40GB";
  return cm::make_cost_model(c);
}
const cm::CostModel& gpt() {
  static auto m = model("gpt-6.7b");
  return *m;
}
const cm::CostModel& t5() {
  static auto m = model("t5-11b");
  return *m;
}

PipelineShape gpt_shape(std::int64_t S = 4) {
  PipelineShape s;
  s.stages = S;
  s.layers_per_stage = 16 / S;
  s.memory_limit_mb = 36000;
  return s;
}
PipelineShape t5_shape(std::int64_t S = 4) {
  PipelineShape s;
  s.stages = S;
  s.layers_per_stage = 24 / S;  // 12 encoder + 12 decoder layers as DynaPipe's T5-11B runs
  s.memory_limit_mb = 36000;
  return s;
}

// Long-tailed lengths: log-normal (median `median`) from raw generator bits, clipped.
std::uint32_t lognormal(std::mt19937_64& rng, double median, double sigma, std::uint32_t cap) {
  const double u1 = (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  const double v = median * std::exp(sigma * z);
  return static_cast<std::uint32_t>(std::min<double>(cap, std::max(1.0, std::round(v))));
}

// T5-11B's 128 heads make attention scores grow fast: its samples are capped at 1536 tokens.
BatchLengths random_batch(std::mt19937_64& rng, std::size_t n, bool encdec, std::uint32_t cap = 2048) {
  BatchLengths b;
  if (encdec) cap = std::min<std::uint32_t>(cap, 1536);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t x = lognormal(rng, 200, 1.0, cap);
    b.input.push_back(x);
    if (encdec) {
      const std::uint32_t y = lognormal(rng, 60, 1.0, cap / 2);
      b.target.push_back(y);
    }
  }
  return b;
}

// The padded DP (DynaPipe's micro-batch space) unless a test asks for packed layouts too.
PartitionOptions opts(PartitionMethod m) {
  PartitionOptions o;
  o.method = m;
  o.microbatch_size = 4;
  o.token_budget = 4096;
  o.layouts = packpipe::layout_bit(packpipe::Layout::Padded);
  if (m == PartitionMethod::Packing) o.layout = packpipe::Layout::PackedMask;  // as DynaPipe compares it
  return o;
}

// Every sample exactly once (minus dropped ones), every micro-batch non-empty.
void check_cover(const Partition& p, std::size_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& mb : p.microbatches) {
    REQUIRE(!mb.samples.empty());
    for (auto s : mb.samples) {
      REQUIRE(s < n);
      ++seen[s];
    }
  }
  for (auto s : p.dropped) ++seen[s];
  for (std::size_t s = 0; s < n; ++s) REQUIRE(seen[s] == 1);
}

// ---- independent reference of DynaPipe's algorithm (section 3 of the design reference) ------

struct RefWin {
  double t = kInf, stored = kInf, peak = kInf;
};

double ref_dynapipe(const BatchLengths& b, const cm::CostModel& cost, const PipelineShape& shape) {
  const bool encdec = b.encoder_decoder();
  const std::int64_t l = shape.layers_per_stage;
  const std::size_t n = b.size();
  auto round8 = [](std::int64_t x) { return (x + 7) / 8 * 8; };
  // Model state: embedding + l layers (max of encoder / decoder layer state) on GPU 0.
  auto state = [&](std::int64_t enc, std::int64_t dec) {
    cm::StageLayout lay;
    lay.encoder_layers = enc;
    lay.decoder_layers = dec;
    lay.has_embedding = true;
    return cm::stage_static_memory(cost.model(), lay, 1, 1, 1).total() / 1e6;
  };
  double ms = state(l, 0);
  if (encdec) ms = std::max(ms, state(0, l));
  const double available = shape.memory_limit_mb - ms;
  std::vector<double> order_key;
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    if (b.input[x] != b.input[y]) return b.input[x] > b.input[y];
    return encdec && b.target[x] > b.target[y];
  });
  for (double budget : {available / static_cast<double>(shape.stages), available}) {
    for (auto rc : {cm::Recompute::None, cm::Recompute::Selective, cm::Recompute::Full}) {
      // Window costs, O(N^2) table.
      std::vector<std::vector<RefWin>> w(n, std::vector<RefWin>(n + 1));
      std::vector<std::size_t> valid(n, 0);
      std::vector<double> cand;
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = i + 1; j <= n; ++j) {
          std::int64_t me = 0, md = 0;
          for (std::size_t k = i; k < j; ++k) {
            me = std::max<std::int64_t>(me, b.input[order[k]]);
            if (encdec) md = std::max<std::int64_t>(md, b.target[order[k]]);
          }
          const std::int64_t Le = round8(me), Ld = encdec ? round8(md + 2) : 0;
          const auto m = static_cast<std::int64_t>(j - i);
          auto q = [&](cm::LayerKind kind) {
            cm::Query qq;
            qq.kind = kind;
            qq.mbs = m;
            qq.seq = Le;
            qq.dec_seq = Ld;
            qq.recompute = rc;
            return cost.query(qq);
          };
          const auto e = q(cm::LayerKind::Encoder);
          const auto p = q(cm::LayerKind::PostProcess);
          double T = 0, s = e.stored_bytes / 1e6, a = (e.stored_bytes + e.peak_bytes) / 1e6;
          if (encdec) {
            const auto d = q(cm::LayerKind::Decoder);
            T = std::max(static_cast<double>(l) * e.total_ms(), static_cast<double>(l) * d.total_ms() + p.total_ms());
            s = std::max(s, d.stored_bytes / 1e6);
            a = std::max(a, (d.stored_bytes + d.peak_bytes) / 1e6);
          } else {
            T = static_cast<double>(l) * e.total_ms() + p.total_ms();
          }
          const double stored = static_cast<double>(l) * s;
          const double peak = a + static_cast<double>(l - 1) * s;
          if (!(stored <= budget && peak <= available)) break;
          w[i][j] = {T, stored, peak};
          valid[i] = j;
          cand.push_back(T);
        }
      }
      std::sort(cand.begin(), cand.end());
      std::vector<double> taus;
      for (double v : cand) {
        if (taus.empty() || v - taus.back() > 5.0) taus.push_back(v);
      }
      double best = kInf;
      for (double tau : taus) {
        std::vector<double> F(n + 1, kInf);
        F[0] = 0;
        for (std::size_t j = 1; j <= n; ++j) {
          for (std::size_t i = 0; i < j; ++i) {
            if (valid[i] < j || F[i] == kInf || !(w[i][j].t <= tau)) continue;
            F[j] = std::min(F[j], F[i] + w[i][j].t);
          }
        }
        if (F[n] == kInf) continue;
        best = std::min(best, static_cast<double>(shape.stages - 1) * tau / 1.0 + F[n] / 1.0);
      }
      if (best < kInf) return best;
    }
  }
  return kInf;
}

}  // namespace

TEST_CASE("DynaPipe baseline reproduces the reference tau-DP objective", "[regression]") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const bool encdec = trial % 2 == 1;
    const std::size_t n = 1 + static_cast<std::size_t>(rng() % 40);
    const BatchLengths b = random_batch(rng, n, encdec);
    const cm::CostModel& cost = encdec ? t5() : gpt();
    const PipelineShape shape = encdec ? t5_shape() : gpt_shape();
    const Partition p = partition(b, cost, shape, opts(PartitionMethod::DynaPipe));
    const double ref = ref_dynapipe(b, cost, shape);
    INFO("trial " << trial << " n " << n);
    REQUIRE(std::isfinite(ref));
    CHECK(p.objective_ms == Approx(ref).epsilon(1e-12));
    check_cover(p, n);
  }
}

TEST_CASE("packpipe DP objective is never worse than DynaPipe's on the same cost basis", "[regression]") {
  std::mt19937_64 rng(12);
  double sum_ratio = 0;
  int count = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const bool encdec = trial % 3 == 2;
    const std::size_t n = 1 + static_cast<std::size_t>(rng() % 120);
    const BatchLengths b = random_batch(rng, n, encdec, trial % 5 == 0 ? 8192 : 2048);
    const cm::CostModel& cost = encdec ? t5() : gpt();
    const PipelineShape shape = encdec ? t5_shape(trial % 2 ? 4 : 8) : gpt_shape(trial % 2 ? 4 : 8);
    PartitionOptions o = opts(PartitionMethod::DynaPipe);
    const Partition base = partition(b, cost, shape, o);
    o.method = PartitionMethod::DP;
    o.basis = CostBasis::DynaPipe;
    o.order = EncDecOrder::Auto;
    const Partition ours = partition(b, cost, shape, o);
    INFO("trial " << trial << " n " << n);
    CHECK(ours.objective_ms <= base.objective_ms * (1 + 1e-12));
    check_cover(ours, n);
    sum_ratio += ours.objective_ms / base.objective_ms;
    ++count;
  }
  std::printf("partition: packpipe DP / DynaPipe objective, mean over %d batches: %.4f\n", count, sum_ratio / count);
}

TEST_CASE("packpipe DP finds the brute-force optimum over consecutive partitions", "[regression]") {
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 60; ++trial) {
    const bool encdec = trial % 2 == 1;
    const std::size_t n = 1 + static_cast<std::size_t>(rng() % 10);
    const BatchLengths b = random_batch(rng, n, encdec, 8192);
    const cm::CostModel& cost = encdec ? t5() : gpt();
    const PipelineShape shape = encdec ? t5_shape() : gpt_shape();
    PartitionOptions o = opts(PartitionMethod::DP);
    o.order = EncDecOrder::Sorted;
    const Partition p = partition(b, cost, shape, o);
    const std::vector<VirtualStage> vs = virtual_stages(cost.model(), shape);
    // Every consecutive partition of the same order: 2^(n-1) cut sets.
    double best = kInf;
    for (std::uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
      std::vector<MicroBatch> mbs(1);
      for (std::size_t k = 0; k < n; ++k) {
        mbs.back().samples.push_back(p.order[k]);
        if (k + 1 < n && (mask >> k & 1u)) mbs.emplace_back();
      }
      try {
        const Partition e = evaluate_partition(b, cost, shape, vs, mbs, o, CostBasis::Stages);
        best = std::min(best, e.objective_ms);
      } catch (const packpipe::InvalidArgument&) {
        // a window that does not fit: not a candidate
      }
    }
    INFO("trial " << trial << " n " << n);
    CHECK(p.objective_ms == Approx(best).epsilon(1e-12));
    // And DynaPipe's objective (it charges its cap) can only be larger on its own basis.
    // (It may find no plan when samples need different recompute modes: its mode is per iteration.)
    PartitionOptions d = opts(PartitionMethod::DynaPipe);
    d.basis = CostBasis::Stages;
    try {
      const Partition dp = partition(b, cost, shape, d);
      CHECK(dp.objective_ms >= best * (1 - 1e-12));
    } catch (const packpipe::InvalidArgument& e) {
      CHECK(std::string(e.what()).find("no feasible plan") != std::string::npos);
    }
  }
}

TEST_CASE("every method covers every sample once, fits memory and is deterministic", "[stress]") {
  std::mt19937_64 rng(14);
  const PartitionMethod methods[] = {PartitionMethod::DP, PartitionMethod::DynaPipe, PartitionMethod::Fixed,
                                     PartitionMethod::Tokens, PartitionMethod::Packing};
  int batches = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    const bool encdec = trial % 4 == 3;
    const std::size_t n = 1 + static_cast<std::size_t>(rng() % 48);
    const BatchLengths b = random_batch(rng, n, encdec, 4096);
    const cm::CostModel& cost = encdec ? t5() : gpt();
    PipelineShape shape = encdec ? t5_shape(trial % 2 ? 4 : 8) : gpt_shape(trial % 2 ? 4 : 8);
    shape.dp = 1 + trial % 3;
    const std::vector<VirtualStage> vs = virtual_stages(cost.model(), shape);
    const PartitionMethod m = methods[trial % 5];
    PartitionOptions o = opts(m);
    o.microbatch_size = 1 + static_cast<std::int64_t>(rng() % 2);
    o.pack_windows = trial % 7 == 0;
    o.round_multiple = trial % 3 == 0 ? 64 : 8;
    Partition p;
    try {
      p = partition(b, cost, shape, vs, o);
    } catch (const packpipe::InvalidArgument& e) {
      // Only a fixed-shape baseline may find no plan: its micro-batch does not fit.
      INFO(e.what());
      REQUIRE((m == PartitionMethod::Fixed || m == PartitionMethod::Packing || m == PartitionMethod::DynaPipe));
      REQUIRE((std::string(e.what()).find("does not fit") != std::string::npos ||
               std::string(e.what()).find("no feasible plan") != std::string::npos));
      ++batches;
      continue;
    }
    check_cover(p, n);
    // Within memory: re-evaluating the micro-batches on their basis does not throw, and each
    // micro-batch's padded lengths cover its rows.
    std::vector<MicroBatch> mbs = p.microbatches;
    REQUIRE_NOTHROW(evaluate_partition(b, cost, shape, vs, mbs, o, p.basis));
    for (const auto& mb : p.microbatches) {
      CHECK(mb.padded_len % o.round_multiple == 0);
      CHECK(mb.time_ms > 0);
      for (auto s : mb.samples) CHECK(mb.padded_len >= static_cast<std::int64_t>(b.input[s]));
    }
    // Ranks: every micro-batch once.
    std::vector<int> seen(p.microbatches.size(), 0);
    REQUIRE(p.ranks.size() == static_cast<std::size_t>(shape.dp));
    for (const auto& r : p.ranks) {
      CHECK(std::is_sorted(r.begin(), r.end()));
      for (auto k : r) ++seen[k];
    }
    for (int v : seen) CHECK(v == 1);
    CHECK(p.efficiency > 0);
    CHECK(p.efficiency <= 1.0);
    // Deterministic.
    const Partition q = partition(b, cost, shape, vs, o);
    REQUIRE(q.microbatches.size() == p.microbatches.size());
    for (std::size_t k = 0; k < q.microbatches.size(); ++k) {
      CHECK(q.microbatches[k].samples == p.microbatches[k].samples);
      CHECK(q.microbatches[k].time_ms == p.microbatches[k].time_ms);
    }
    CHECK(q.objective_ms == p.objective_ms);
    ++batches;
  }
  CHECK(batches == 1000);
}

TEST_CASE("a sample that cannot fit alone is named, or truncated or dropped on request", "[negative]") {
  BatchLengths b;
  b.input = {100, 300, 50, 1000000, 20};
  const PipelineShape shape = gpt_shape();
  PartitionOptions o = opts(PartitionMethod::DP);
  o.microbatch_size = 1;
  REQUIRE_THROWS_AS(partition(b, gpt(), shape, o), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(partition(b, gpt(), shape, o), Catch::Matchers::Contains("sample 3 (length 1000000)"));
  for (auto m : {PartitionMethod::DP, PartitionMethod::DynaPipe, PartitionMethod::Fixed, PartitionMethod::Tokens,
                 PartitionMethod::Packing}) {
    o.method = m;
    o.oversize = OversizePolicy::Drop;
    Partition p = partition(b, gpt(), shape, o);
    CHECK(p.dropped == std::vector<std::uint32_t>{3});
    check_cover(p, b.size());
    o.oversize = OversizePolicy::Truncate;
    p = partition(b, gpt(), shape, o);
    CHECK(p.truncated == std::vector<std::uint32_t>{3});
    check_cover(p, b.size());
    CHECK(p.input_tokens < 1000000u);
  }
}

TEST_CASE("invalid options and mismatched batches are refused", "[negative]") {
  BatchLengths b;
  b.input = {10, 20};
  PartitionOptions o = opts(PartitionMethod::Fixed);
  o.microbatch_size = 0;
  REQUIRE_THROWS_WITH(partition(b, gpt(), gpt_shape(), o),
                      Catch::Matchers::Contains("method 'fixed' needs a micro-batch size (mbs / --mbs) of at least 1"));
  o = opts(PartitionMethod::Tokens);
  o.token_budget = 0;
  REQUIRE_THROWS_WITH(partition(b, gpt(), gpt_shape(), o),
                      Catch::Matchers::Contains("needs a token budget per micro-batch (tokens / --tokens)"));
  o = opts(PartitionMethod::DP);
  REQUIRE_THROWS_WITH(partition(b, t5(), t5_shape(), o), Catch::Matchers::Contains("target lengths"));
  b.input = {10, 0};
  REQUIRE_THROWS_WITH(partition(b, gpt(), gpt_shape(), o), Catch::Matchers::Contains("sample 1 has input length 0"));
  REQUIRE_THROWS_WITH(partition_method_from_name("greedy"), Catch::Matchers::Contains("greedy"));
  // A fixed micro-batch that cannot fit names the micro-batch.
  b.input = std::vector<std::uint32_t>(64, 2048);
  o = opts(PartitionMethod::Fixed);
  o.microbatch_size = 64;
  REQUIRE_THROWS_WITH(partition(b, gpt(), gpt_shape(), o), Catch::Matchers::Contains("micro-batch 0"));
}

TEST_CASE("empty batch gives no micro-batches", "[boundary]") {
  BatchLengths b;
  const Partition p = partition(b, gpt(), gpt_shape(), opts(PartitionMethod::DP));
  CHECK(p.microbatches.empty());
  CHECK(p.objective_ms == 0);
}

TEST_CASE("rank assignment is balanced and covers every micro-batch", "[interface]") {
  std::mt19937_64 rng(15);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> t(1 + rng() % 40);
    for (auto& x : t) x = static_cast<double>(1 + rng() % 1000);
    const std::int64_t d = 1 + static_cast<std::int64_t>(rng() % 8);
    const auto r = assign_ranks(t, d);
    std::vector<int> seen(t.size(), 0);
    double mx = 0, total = 0, biggest = 0;
    for (const auto& rank : r) {
      double load = 0;
      for (auto k : rank) {
        ++seen[k];
        load += t[k];
      }
      mx = std::max(mx, load);
    }
    for (double x : t) {
      total += x;
      biggest = std::max(biggest, x);
    }
    for (int v : seen) CHECK(v == 1);
    // LPT: the fullest rank exceeds the mean by at most one micro-batch.
    CHECK(mx <= total / static_cast<double>(d) + biggest + 1e-9);
    CHECK(assign_ranks(t, d) == r);
  }
}

TEST_CASE("rank assignment with a count per rank gives every rank exactly that many", "[interface]") {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t d = 1 + static_cast<std::int64_t>(rng() % 6);
    const std::size_t per = 1 + rng() % 6;
    std::vector<double> t(per * static_cast<std::size_t>(d));
    for (auto& x : t) x = static_cast<double>(1 + rng() % 1000);
    const auto r = assign_ranks(t, d, per);
    REQUIRE(r.size() == static_cast<std::size_t>(d));
    std::vector<int> seen(t.size(), 0);
    for (const auto& rank : r) {
      CHECK(rank.size() == per);
      for (auto k : rank) ++seen[k];
    }
    for (int v : seen) CHECK(v == 1);
    CHECK(assign_ranks(t, d, per) == r);
  }
  // Skewed costs: the count holds where LPT alone would give the longest a rank of its own.
  const auto r = assign_ranks({100, 1, 1, 1, 1, 1, 1, 1}, 2, 4);
  CHECK(r[0] == std::vector<std::uint32_t>{0, 5, 6, 7});
  CHECK(r[1] == std::vector<std::uint32_t>{1, 2, 3, 4});
  CHECK(assign_ranks({100, 1, 1, 1, 1, 1, 1, 1}, 2)[0] == std::vector<std::uint32_t>{0});
  REQUIRE_THROWS_WITH(assign_ranks({1, 2, 3}, 2, 2), Catch::Matchers::Contains("needs 4 micro-batches, found 3"));
  // Slice groups go whole; where whole groups cannot fill the ranks evenly, the split without counts.
  const std::vector<std::pair<std::uint32_t, std::uint32_t>> edges{{0, 1}, {1, 2}};
  const auto g = assign_ranks({5, 5, 5, 1, 1, 1}, 2, edges, 3);
  CHECK(g[0] == std::vector<std::uint32_t>{0, 1, 2});
  CHECK(g[1] == std::vector<std::uint32_t>{3, 4, 5});
  const auto u = assign_ranks({5, 5, 5, 1, 1, 1}, 3, edges, 2);
  CHECK(u == assign_ranks({5, 5, 5, 1, 1, 1}, 3, edges));
}

TEST_CASE("encoder-decoder order is close to the brute-force shortest path", "[regression]") {
  std::mt19937_64 rng(16);
  double gap_sum = 0, sorted_gap_sum = 0;
  int exact = 0, trials = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t n = 3 + static_cast<std::size_t>(rng() % 6);  // 3..8
    std::vector<std::uint32_t> in(n), tg(n);
    for (std::size_t k = 0; k < n; ++k) {
      in[k] = lognormal(rng, 200, 1.0, 4096);
      tg[k] = lognormal(rng, 60, 1.0, 2048);
    }
    std::vector<std::uint32_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0u);
    std::uint64_t best = std::numeric_limits<std::uint64_t>::max();
    do {
      best = std::min(best, path_length(in, tg, perm));
    } while (std::next_permutation(perm.begin(), perm.end()));
    const auto o = encdec_order(in, tg, true);
    const auto s = encdec_order(in, tg, false);
    std::vector<std::uint32_t> chk(o);
    std::sort(chk.begin(), chk.end());
    for (std::size_t k = 0; k < n; ++k) REQUIRE(chk[k] == k);
    const std::uint64_t ours = path_length(in, tg, o), sorted = path_length(in, tg, s);
    CHECK(ours >= best);
    CHECK(ours <= sorted);
    gap_sum += static_cast<double>(ours) / static_cast<double>(std::max<std::uint64_t>(best, 1)) - 1.0;
    sorted_gap_sum += static_cast<double>(sorted) / static_cast<double>(std::max<std::uint64_t>(best, 1)) - 1.0;
    exact += ours == best;
    ++trials;
  }
  std::printf("partition: enc-dec order, n 3-8, %d cases: optimal in %d, mean excess %.2f%% (sorted: %.2f%%)\n",
              trials, exact, 100.0 * gap_sum / trials, 100.0 * sorted_gap_sum / trials);
  CHECK(gap_sum / trials < 0.05);
}

TEST_CASE("encoder-decoder order shortens the sorted path on larger batches", "[regression]") {
  std::mt19937_64 rng(18);
  double ratio = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t n = 20 + static_cast<std::size_t>(rng() % 300);
    std::vector<std::uint32_t> in(n), tg(n);
    for (std::size_t k = 0; k < n; ++k) {
      in[k] = lognormal(rng, 200, 1.0, 4096);
      tg[k] = lognormal(rng, 60, 1.0, 2048);
    }
    const auto o = encdec_order(in, tg, true);
    std::vector<std::uint32_t> chk(o);
    std::sort(chk.begin(), chk.end());
    for (std::size_t k = 0; k < n; ++k) REQUIRE(chk[k] == k);
    const auto sorted = path_length(in, tg, encdec_order(in, tg, false));
    CHECK(path_length(in, tg, o) <= sorted);
    ratio += static_cast<double>(path_length(in, tg, o)) / static_cast<double>(sorted);
  }
  // Long-tailed (input, target) pairs: the local search takes out most of the target zigzag.
  CHECK(ratio / 40 < 0.6);
}

TEST_CASE("encoder-decoder order keeps the sorted order for lengths of 2^28 or more", "[boundary]") {
  // Samples 1 and 3 are equal: the search would move sample 2 (far in target) off the sorted path.
  const std::vector<std::uint32_t> small_in = {10, 9, 9, 8}, tg = {1, 900, 1, 900};
  REQUIRE(encdec_order(small_in, tg, true) != encdec_order(small_in, tg, false));
  std::vector<std::uint32_t> big_in = small_in;
  big_in[0] = 1u << 28;
  CHECK(encdec_order(big_in, tg, true) == encdec_order(big_in, tg, false));
  big_in[0] = (1u << 28) - 1;  // still searched
  CHECK(encdec_order(big_in, tg, true) != encdec_order(big_in, tg, false));
}

TEST_CASE("the min-sum DP handles a start without windows before another column", "[boundary]") {
  // Starts 0, 1, 2 with 2, 0 and 1 windows; the empty column has the next one's offset.
  detail::WindowTable t;
  t.count = {2, 0, 1};
  t.offset = {0, 2, 2};
  t.column_end = {2, 2, 3};
  t.time_ms = {1, 1, 1};
  t.max_count = 2;
  detail::finish_table(t);
  detail::CapWorkspace ws;
  const detail::CapResult r = detail::min_sum_under_cap(t, 1.0, ws);
  REQUIRE(r.feasible);
  CHECK(r.sum == 2.0);
  CHECK(r.cuts == std::vector<std::int32_t>{0, 2, 3});
}

TEST_CASE("packing inside windows never makes the DP objective worse", "[regression]") {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 30; ++trial) {
    const std::size_t n = 2 + static_cast<std::size_t>(rng() % 60);
    const BatchLengths b = random_batch(rng, n, false);
    PartitionOptions o = opts(PartitionMethod::DP);
    const Partition plain = partition(b, gpt(), gpt_shape(), o);
    o.pack_windows = true;
    const Partition packed = partition(b, gpt(), gpt_shape(), o);
    CHECK(packed.objective_ms <= plain.objective_ms * (1 + 1e-12));
    check_cover(packed, n);
    for (const auto& mb : packed.microbatches) {
      if (mb.row_offsets.empty()) continue;
      for (std::size_t r = 0; r + 1 < mb.row_offsets.size(); ++r) {
        std::int64_t sum = 0;
        for (auto k = mb.row_offsets[r]; k < mb.row_offsets[r + 1]; ++k) sum += b.input[mb.samples[k]];
        CHECK(sum <= mb.padded_len);
      }
    }
  }
}

TEST_CASE("forced recompute policies are honoured and auto picks the fastest that fits", "[interface]") {
  std::mt19937_64 rng(18);
  const BatchLengths b = random_batch(rng, 80, false, 8192);
  for (auto pol : {RecomputePolicy::None, RecomputePolicy::Selective, RecomputePolicy::Full}) {
    PartitionOptions o = opts(PartitionMethod::DP);
    o.recompute = pol;
    o.oversize = OversizePolicy::Drop;
    const Partition p = partition(b, gpt(), gpt_shape(), o);
    for (const auto& mb : p.microbatches) CHECK(std::string(recompute_policy_name(pol)) == cm::recompute_name(mb.recompute));
  }
  PartitionOptions o = opts(PartitionMethod::DP);
  o.oversize = OversizePolicy::Drop;
  const Partition autop = partition(b, gpt(), gpt_shape(), o);
  for (auto pol : {RecomputePolicy::None, RecomputePolicy::Selective, RecomputePolicy::Full}) {
    o.recompute = pol;
    const Partition p = partition(b, gpt(), gpt_shape(), o);
    if (p.dropped == autop.dropped) CHECK(autop.objective_ms <= p.objective_ms * (1 + 1e-12));
  }
}

namespace {

// DynaPipe's profiled GPT-6.7B / T5-11B grids (the benchmark's cost models): their times are not
// monotone in rows at the smallest shapes, which the exact search must not rely on.
const cm::CostModel& profiled(bool t5) {
  static std::unique_ptr<cm::CostModel> m[2];
  auto& slot = m[t5 ? 1 : 0];
  if (!slot) {
    cm::CostModelConfig c;
    c.model = t5 ? "t5-11b" : "gpt-6.7b";
    c.device = "A100-40GB";
    const std::string p = std::string("dynapipe/derived_from_cost_models_pkl/") + (t5 ? "t5_11b" : "gpt_6.7b");
    c.profiles = {packpipe::test::fixture(p + "_timing.csv"), packpipe::test::fixture(p + "_activation.csv"),
                  packpipe::test::fixture(p + "_model_state.csv")};
    slot = cm::make_cost_model(c);
  }
  return *slot;
}

// Independent reference of the exact search: every window of `order` costed by
// evaluate_partition (stage basis, windows grow until the first that does not fit), then for
// EVERY distinct window time c a pull-style min-sum DP with all windows <= c; min of
// (S-1) c/chunks + G(c)/dp.
double exhaustive_caps(const BatchLengths& b, const cm::CostModel& cost, const PipelineShape& shape,
                       const std::vector<std::uint32_t>& order, const PartitionOptions& o) {
  const std::vector<VirtualStage> vs = virtual_stages(cost.model(), shape);
  const std::size_t n = order.size();
  std::vector<std::vector<double>> t(n);
  std::vector<double> caps;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i + 1; j <= n; ++j) {
      MicroBatch mb;
      mb.samples.assign(order.begin() + static_cast<std::ptrdiff_t>(i), order.begin() + static_cast<std::ptrdiff_t>(j));
      double time = 0;
      try {
        time = evaluate_partition(b, cost, shape, vs, {mb}, o, CostBasis::Stages).max_time_ms;
      } catch (const packpipe::InvalidArgument&) {
        break;
      }
      t[i].push_back(time);
      caps.push_back(time);
    }
  }
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  double best = kInf;
  for (double c : caps) {
    std::vector<double> F(n + 1, kInf);
    F[0] = 0;
    for (std::size_t j = 1; j <= n; ++j) {
      for (std::size_t i = 0; i < j; ++i) {
        if (j - i > t[i].size() || !(t[i][j - i - 1] <= c)) continue;
        F[j] = std::min(F[j], F[i] + t[i][j - i - 1]);
      }
    }
    if (F[n] == kInf) continue;
    best = std::min(best, static_cast<double>(shape.stages - 1) * c / static_cast<double>(shape.chunks) +
                              F[n] / static_cast<double>(shape.dp));
  }
  return best;
}

}  // namespace

TEST_CASE("packpipe DP equals the exhaustive scan over every window-time cap on the profiled models",
          "[regression]") {
  std::mt19937_64 rng(19);
  for (int trial = 0; trial < 16; ++trial) {
    const bool encdec = trial % 2 == 1;
    // Short samples too: the profiled grids' latency floor makes small windows non-monotone.
    const std::size_t n = 2 + static_cast<std::size_t>(rng() % 38);
    BatchLengths b = random_batch(rng, n, encdec, trial % 4 < 2 ? 2048 : 256);
    const cm::CostModel& cost = profiled(encdec);
    const PipelineShape shape = encdec ? t5_shape(trial % 3 ? 4 : 8) : gpt_shape(trial % 3 ? 4 : 8);
    PartitionOptions o = opts(PartitionMethod::DP);
    o.order = EncDecOrder::Sorted;
    o.round_multiple = trial % 5 == 0 ? 64 : 8;
    const Partition p = partition(b, cost, shape, o);
    INFO("trial " << trial << " n " << n);
    check_cover(p, n);
    CHECK(p.objective_ms == Approx(exhaustive_caps(b, cost, shape, p.order, o)).epsilon(1e-12));
    // The realised figures agree with the objective (the cap charged is the realised max).
    CHECK(p.objective_ms == Approx(p.predicted_iteration_ms).epsilon(1e-12));
  }
}

TEST_CASE("micro-batch times and memory agree with the stage cost table on the profiled models", "[regression]") {
  // An independent path: stage_cost_table queries the cost model per virtual stage with the real
  // lengths, while the partitioner composes memoised (and, for kinds that ignore a length,
  // shared) per-kind answers.
  std::mt19937_64 rng(23);
  int checked = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const bool encdec = trial % 3 != 0;
    const std::int64_t S = trial % 2 ? 8 : 4;
    const BatchLengths b = random_batch(rng, 40 + static_cast<std::size_t>(rng() % 80), encdec, 2048);
    const cm::CostModel& cost = profiled(encdec);
    const PipelineShape shape = encdec ? t5_shape(S) : gpt_shape(S);
    const std::vector<VirtualStage> vs = virtual_stages(cost.model(), shape);
    PartitionCache cache;
    PartitionOptions o = opts(PartitionMethod::DP);
    o.cache = trial % 2 ? &cache : nullptr;
    for (int again = 0; again < 2; ++again) {  // the second call reads the cache's answers
      const Partition p = partition(b, cost, shape, vs, o);
      for (const MicroBatch& mb : p.microbatches) {
        const StageCostTable t = stage_cost_table(cost, shape, vs, {mb});
        std::vector<double> rank_ms(static_cast<std::size_t>(shape.stages), 0.0);
        double stored = 0;
        for (std::int64_t v = 0; v < t.vstages; ++v) {
          rank_ms[static_cast<std::size_t>(vs[static_cast<std::size_t>(v)].rank)] +=
              t.forward_ms[t.at(0, v)] + t.backward_ms[t.at(0, v)];
          stored = std::max(stored, t.stored_bytes[t.at(0, v)] / 1e6);
        }
        INFO("trial " << trial << " rows " << mb.rows() << " len " << mb.padded_len << " dec " << mb.padded_dec_len);
        CHECK(mb.time_ms == Approx(*std::max_element(rank_ms.begin(), rank_ms.end())).epsilon(1e-12));
        CHECK(mb.stored_mb == Approx(stored).epsilon(1e-12));
        ++checked;
      }
    }
  }
  CHECK(checked > 100);
}

TEST_CASE("two window-table builders give the same partition as one", "[regression]") {
  // The parallel build lays the columns out as the serial one does; every figure must be the same
  // bits, with and without a cache (whose second memo then holds the back builder's shapes).
  std::mt19937_64 rng(29);
  PartitionCache serial_cache, parallel_cache;
  int compared = 0;
  for (int trial = 0; trial < 16; ++trial) {
    const bool encdec = trial % 2 == 1;
    const bool prof = trial % 4 >= 2;
    const std::int64_t S = trial % 8 < 4 ? 4 : 8;
    const BatchLengths b = random_batch(rng, 64 + static_cast<std::size_t>(rng() % 300), encdec, 2048);
    const cm::CostModel& cost = prof ? profiled(encdec) : (encdec ? t5() : gpt());
    const PipelineShape shape = encdec ? t5_shape(S) : gpt_shape(S);
    const std::vector<VirtualStage> vs = virtual_stages(cost.model(), shape);
    for (const PartitionMethod m : {PartitionMethod::DP, PartitionMethod::DynaPipe}) {
      PartitionOptions one = opts(m);
      one.oversize = OversizePolicy::Drop;
      one.threads = 1;
      PartitionOptions two = one;
      two.threads = 2;
      if (trial % 3 == 0) {
        one.cache = &serial_cache;
        two.cache = &parallel_cache;
      }
      const Partition p = partition(b, cost, shape, vs, one);
      const Partition q = partition(b, cost, shape, vs, two);
      INFO("trial " << trial << " method " << partition_method_name(m) << " samples " << b.size());
      REQUIRE(p.microbatches.size() == q.microbatches.size());
      for (std::size_t k = 0; k < p.microbatches.size(); ++k) {
        CHECK(p.microbatches[k].samples == q.microbatches[k].samples);
        CHECK(p.microbatches[k].time_ms == q.microbatches[k].time_ms);
        CHECK(p.microbatches[k].stored_mb == q.microbatches[k].stored_mb);
        CHECK(p.microbatches[k].recompute == q.microbatches[k].recompute);
      }
      CHECK(p.objective_ms == q.objective_ms);
      CHECK(p.tau_evaluations == q.tau_evaluations);
      CHECK(p.order == q.order);
      ++compared;
    }
  }
  CHECK(compared == 32);
  CHECK(parallel_cache.memo(1).size() > 0);  // the back builder's shapes were kept
  // The share of new rows that decides the automatic setting: a cold call evaluates about a row
  // per window, a repeat with a warm cache none.
  {
    PartitionCache c;
    PartitionOptions o = opts(PartitionMethod::DP);
    o.threads = 1;
    o.cache = &c;
    const BatchLengths b = random_batch(rng, 200, false);
    CHECK(c.memo().last_new_share == 1.0);
    partition(b, gpt(), gpt_shape(), o);
    CHECK(c.memo().last_new_share > 0.5);
    partition(b, gpt(), gpt_shape(), o);
    CHECK(c.memo().last_new_share == 0.0);
  }
  PartitionOptions bad = opts(PartitionMethod::DP);
  bad.threads = -1;
  REQUIRE_THROWS_WITH(partition(random_batch(rng, 8, false), gpt(), gpt_shape(), bad),
                      Catch::Matchers::Contains("threads must be non-negative"));
}

TEST_CASE("an oversize sample is named as the caller knows it, with the option that handles it", "[negative]") {
  using Catch::Matchers::Contains;
  BatchLengths b;
  b.input = {100, 300, 1000000, 20};
  PartitionOptions o = opts(PartitionMethod::DP);
  o.describe_sample = [](std::uint32_t s) { return "line " + std::to_string(s + 7) + " of lengths.txt"; };
  o.oversize_option = "--oversize";
  REQUIRE_THROWS_WITH(partition(b, gpt(), gpt_shape(), o),
                      Contains("line 9 of lengths.txt (length 1000000) does not fit") &&
                          Contains("use --oversize truncate, drop or slice"));
  b.input = {100, 0};
  REQUIRE_THROWS_WITH(partition(b, gpt(), gpt_shape(), o), Contains("line 8 of lengths.txt has input length 0"));
}

TEST_CASE("a model state over the memory limit is named whatever the oversize policy", "[negative]") {
  using Catch::Matchers::Contains;
  BatchLengths b;
  b.input = {100, 300, 50};
  PipelineShape s = gpt_shape();
  s.memory_limit_mb = 100;  // 4 layers of gpt-6.7b per rank need far more
  for (auto pol : {OversizePolicy::Error, OversizePolicy::Truncate, OversizePolicy::Drop}) {
    for (auto m : {PartitionMethod::DP, PartitionMethod::DynaPipe, PartitionMethod::Tokens}) {
      PartitionOptions o = opts(m);
      o.token_budget = 4096;
      o.oversize = pol;  // drop used to drop every sample and return no micro-batch
      REQUIRE_THROWS_WITH(partition(b, gpt(), s, o),
                          Contains("model state of") && Contains("100 MB memory limit") && Contains("cannot help"));
    }
  }
}

TEST_CASE("partition options and shape are bounded before anything is sized from them", "[negative]") {
  using Catch::Matchers::Contains;
  BatchLengths b;
  b.input = {100, 300};
  PartitionOptions o = opts(PartitionMethod::DP);
  o.round_multiple = std::int64_t{1} << 62;  // padded lengths would overflow
  REQUIRE_THROWS_WITH(partition(b, gpt(), gpt_shape(), o),
                      Contains("(round_multiple / --round-multiple) must be in [1, 65536]"));
  o.round_multiple = 8;
  PipelineShape s = gpt_shape();
  const auto vs = virtual_stages(gpt().model(), s);
  s.memory_limit_mb = 1e300;  // given virtual stages do not skip the shape's checks
  REQUIRE_THROWS_WITH(partition(b, gpt(), s, vs, o), Contains("memory limit (memory_mb / --memory-mb) must be in"));
}

TEST_CASE("plans on profiled memory keep every micro-batch under the limit, on both bases and interpolations",
          "[regression]") {
  // Each micro-batch's memory recomputed from the cost model's answers, apart from the partitioner:
  // the stage basis per rank (static memory + in-flight copies of its stages' stored activations +
  // the largest transient), the DynaPipe basis per micro-batch (l x stored <= available / S, one
  // layer's peak + (l - 1) x stored <= available, the model state from the profile's parameters).
  std::mt19937_64 rng(29);
  int checked = 0;
  for (int trial = 0; trial < 8; ++trial) {
    const bool encdec = trial % 2 == 1;
    const std::int64_t S = trial % 4 < 2 ? 4 : 8;
    const auto interp = trial % 3 == 0 ? cm::ProfileInterpolation::Linear : cm::ProfileInterpolation::Fit;
    cm::CostModelConfig c;
    c.model = encdec ? "t5-11b" : "gpt-6.7b";
    const std::string p = std::string("dynapipe/derived_from_cost_models_pkl/") + (encdec ? "t5_11b" : "gpt_6.7b");
    c.profiles = {packpipe::test::fixture(p + "_timing.csv"), packpipe::test::fixture(p + "_activation.csv"),
                  packpipe::test::fixture(p + "_model_state.csv")};
    c.interpolation = interp;
    const auto cost = cm::make_cost_model(c);
    const PipelineShape shape = encdec ? t5_shape(S) : gpt_shape(S);
    const std::vector<VirtualStage> vs = virtual_stages(cost->model(), shape);
    const BatchLengths b = random_batch(rng, 120 + static_cast<std::size_t>(rng() % 200), encdec, 2048);
    const std::int64_t l = shape.layers_per_stage;
    const double bpp = static_cast<double>(cost->model().bytes_per_param);
    const double state =
        cm::static_memory((cost->layer_param_bytes(cm::LayerKind::Embedding, 1) +
                           static_cast<double>(l) * std::max(cost->layer_param_bytes(cm::LayerKind::Encoder, 1),
                                                             encdec ? cost->layer_param_bytes(cm::LayerKind::Decoder, 1)
                                                                    : 0.0)) /
                              bpp,
                          1, shape.zero_stage)
            .total() /
        1e6;
    const double available = shape.memory_limit_mb - state;
    for (CostBasis basis : {CostBasis::Stages, CostBasis::DynaPipe}) {
      PartitionOptions o = opts(PartitionMethod::DP);
      o.basis = basis;
      const Partition part = partition(b, *cost, shape, vs, o);
      check_cover(part, b.size());
      for (const MicroBatch& mb : part.microbatches) {
        INFO("trial " << trial << " basis " << cost_basis_name(basis) << " rows " << mb.rows() << " len "
                      << mb.padded_len << " dec " << mb.padded_dec_len << " rc " << cm::recompute_name(mb.recompute));
        auto layer = [&](cm::LayerKind kind) {
          cm::Query q;
          q.kind = kind;
          q.mbs = mb.rows();
          q.seq = mb.padded_len;
          q.dec_seq = mb.padded_dec_len;
          q.recompute = mb.recompute;
          return cost->query(q);
        };
        const cm::LayerCost enc = layer(cm::LayerKind::Encoder);
        CHECK(enc.memory_source != cm::Provenance::Analytic);  // the profile's activations, not the fallback's
        if (basis == CostBasis::DynaPipe) {
          double s = enc.stored_bytes, a = enc.stored_bytes + enc.peak_bytes;
          if (encdec) {
            const cm::LayerCost dec = layer(cm::LayerKind::Decoder);
            s = std::max(s, dec.stored_bytes);
            a = std::max(a, dec.stored_bytes + dec.peak_bytes);
          }
          CHECK(static_cast<double>(l) * s / 1e6 <= available / static_cast<double>(S) * (1 + 1e-12));
          CHECK((a + static_cast<double>(l - 1) * s) / 1e6 <= available * (1 + 1e-12));
        } else {
          std::vector<double> used(static_cast<std::size_t>(S), 0.0), transient(static_cast<std::size_t>(S), 0.0);
          for (const VirtualStage& v : vs) {
            const cm::LayerCost st = cm::stage_cost(*cost, v.layout, shape.tp, mb.rows(), mb.padded_len,
                                                    mb.padded_dec_len, mb.recompute);
            const auto r = static_cast<std::size_t>(v.rank);
            used[r] += cm::stage_static_memory(cost->model(), v.layout, shape.tp, shape.dp, shape.zero_stage).total() +
                       static_cast<double>(shape.vstages() - v.index) * st.stored_bytes;
            transient[r] = std::max(transient[r], st.peak_bytes);
          }
          for (std::size_t r = 0; r < used.size(); ++r) CHECK((used[r] + transient[r]) / 1e6 <= shape.memory_limit_mb);
        }
        ++checked;
      }
    }
  }
  CHECK(checked > 200);
}
