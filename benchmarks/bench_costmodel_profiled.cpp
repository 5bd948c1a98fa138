// ProfiledCostModel query cost: one query per candidate window of the micro-batch DP, so it must be
// a table look-up (target < 100 ns on one core).
//
// Data: a synthetic grid shaped like DynaPipe's GPT-6.7B profile (tp 1, 2, 4, 8 x three recompute
// modes; mbs 1..2048 and seq 16..8192 in powers of two, triangular: mbs x seq <= 32768 tokens),
// times from a latency + FLOP-rate curve, memory linear + quadratic in tokens. Queries are random
// shapes inside the grid (mostly between points) or exactly on grid points. PACKPIPE_BENCH_SMALL=1
// uses one tp and fewer queries.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "costmodel/profiled.h"
#include "bench_rows.h"

namespace cm = packpipe::costmodel;

namespace {

bool small_mode() { return std::getenv("PACKPIPE_BENCH_SMALL") != nullptr; }

cm::Profile synthetic_profile(const cm::ModelSpec& m) {
  cm::Profile p;
  p.model = m.name;
  const std::vector<std::int64_t> tps = small_mode() ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{1, 2, 4, 8};
  for (std::int64_t tp : tps) {
    for (auto rc : {cm::Recompute::None, cm::Recompute::Selective, cm::Recompute::Full}) {
      for (std::int64_t s = 16; s <= 8192; s *= 2) {
        for (std::int64_t b = 1; b * s <= 32768; b *= 2) {
          const double gflop = cm::forward_flops(m, cm::LayerKind::Encoder, b, s).total() / 1e9 / static_cast<double>(tp);
          cm::ProfilePoint pt;
          pt.kind = cm::LayerKind::Encoder;
          pt.tp = tp;
          pt.rc = rc;
          pt.mbs = b;
          pt.seq = s;
          pt.fwd_ms = 0.05 + gflop / 150.0;
          pt.bwd_ms = 2.1 * pt.fwd_ms;
          const double tokens = static_cast<double>(b * s);
          pt.stored_bytes = 34.0 * tokens * 4096 / static_cast<double>(tp) + 5.0 * 32 * tokens * static_cast<double>(s);
          pt.peak_bytes = 3 * pt.stored_bytes;
          p.points.push_back(pt);
        }
      }
    }
  }
  return p;
}

const cm::ProfiledCostModel& model() {
  static const cm::ModelSpec spec = cm::load_model("gpt-6.7b");
  static const cm::ProfiledCostModel m(synthetic_profile(spec), spec, cm::DeviceSpec{});
  return m;
}

std::vector<cm::Query> queries(bool on_grid) {
  std::mt19937_64 rng(20261122);
  const std::size_t n = small_mode() ? 256 : 4096;
  std::vector<cm::Query> qs;
  const int tps[] = {1, 2, 4, 8};
  for (std::size_t i = 0; i < n; ++i) {
    cm::Query q;
    q.kind = cm::LayerKind::Encoder;
    q.tp = small_mode() ? 1 : tps[rng() % 4];
    q.recompute = static_cast<cm::Recompute>(rng() % 3);
    if (on_grid) {
      q.seq = std::int64_t{16} << (rng() % 10);
      q.mbs = std::int64_t{1} << (rng() % 4);
    } else {
      q.seq = 16 + static_cast<std::int64_t>(rng() % 8000);
      q.mbs = 1 + static_cast<std::int64_t>(rng() % 8);
    }
    qs.push_back(q);
  }
  return qs;
}

void run(benchmark::State& state, bool on_grid) {
  const cm::ProfiledCostModel& m = model();
  const std::vector<cm::Query> qs = queries(on_grid);
  std::size_t i = 0;
  for (auto _ : state) {
    const cm::LayerCost c = m.query(qs[i]);
    benchmark::DoNotOptimize(c);
    if (++i == qs.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_ProfiledQueryInterpolated(benchmark::State& state) { run(state, false); }
void BM_ProfiledQueryGridHit(benchmark::State& state) { run(state, true); }

/// The partitioner's rows: for one (seq, recompute, tp) the sizes 1..K, as one query_rows call
/// (batch) or K query() calls (loop); sequence lengths mostly between grid points. Counter
/// time_per_row: seconds per row.
void BM_ProfiledRows(benchmark::State& state, bool batch) {
  std::vector<cm::Query> qs = queries(false);
  qs.resize(std::min<std::size_t>(qs.size(), 64));
  packpipe::bench::query_rows_benchmark(state, model(), qs, batch);
}

/// The same on DynaPipe's real GPT-6.7B grid (the fixture): random decoder-layer shapes inside it
/// (tp 1, every recompute mode, mbs 1..64, seq 16..2048, mostly between points), or grid points.
/// Skipped with an error when the fixture is not there.
void BM_ProfiledQueryFixture(benchmark::State& state, bool on_grid) {
  static const std::unique_ptr<cm::CostModel> m = [] {
    const std::string dir = std::string(PACKPIPE_FIXTURES_DIR) + "/dynapipe/derived_from_cost_models_pkl/";
    try {
      return cm::make_profiled_cost_model({dir + "gpt_6.7b_timing.csv", dir + "gpt_6.7b_activation.csv"},
                                          cm::load_model("gpt-6.7b"), cm::load_device("A100-40GB"));
    } catch (const std::exception&) {
      return std::unique_ptr<cm::CostModel>();
    }
  }();
  if (!m) {
    state.SkipWithError("DynaPipe GPT-6.7B fixture not found");
    return;
  }
  std::mt19937_64 rng(20261122);
  std::vector<cm::Query> qs(small_mode() ? 256 : 4096);
  for (auto& q : qs) {
    q.kind = cm::LayerKind::Encoder;
    q.recompute = static_cast<cm::Recompute>(rng() % 3);
    if (on_grid) {
      q.seq = std::int64_t{16} << (rng() % 8);
      q.mbs = std::int64_t{1} << (rng() % 4);
    } else {
      q.seq = 16 + static_cast<std::int64_t>(rng() % 2032);
      q.mbs = 1 + static_cast<std::int64_t>(rng() % 64);
    }
  }
  std::size_t i = 0;
  for (auto _ : state) {
    cm::LayerCost c = m->query(qs[i]);
    benchmark::DoNotOptimize(c);
    if (++i == qs.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK_CAPTURE(BM_ProfiledQueryFixture, interpolated, false);
BENCHMARK_CAPTURE(BM_ProfiledQueryFixture, grid, true);
BENCHMARK(BM_ProfiledQueryInterpolated);
BENCHMARK(BM_ProfiledQueryGridHit);
BENCHMARK_CAPTURE(BM_ProfiledRows, query_rows, true)->Arg(64)->Arg(256);
BENCHMARK_CAPTURE(BM_ProfiledRows, query_loop, false)->Arg(64)->Arg(256);
