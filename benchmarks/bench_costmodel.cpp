// Query speed of the analytic cost model (target: under 100 ns per query on one core), over a
// rotating set of shapes so the branch predictor and caches see planner-like variety; and batch
// queries over consecutive micro-batch sizes (query_rows) against query() in a loop.
#include <cstdlib>
#include <vector>

#include <benchmark/benchmark.h>

#include "costmodel/analytic.h"
#include "costmodel/cost_model.h"
#include "bench_rows.h"

namespace cm = packpipe::costmodel;

namespace {

std::vector<cm::Query> shapes(bool enc_dec) {
  std::vector<cm::Query> qs;
  const bool small = std::getenv("PACKPIPE_BENCH_SMALL") != nullptr;
  for (std::int64_t b = 1; b <= (small ? 4 : 64); b *= 2) {
    for (std::int64_t s = 64; s <= 8192; s *= 2) {
      for (auto rc : {cm::Recompute::None, cm::Recompute::Selective, cm::Recompute::Full}) {
        cm::Query q;
        q.kind = enc_dec && (s / 64) % 2 ? cm::LayerKind::Decoder : cm::LayerKind::Encoder;
        q.mbs = b;
        q.seq = s;
        q.dec_seq = enc_dec ? s / 4 : 0;
        q.tp = 1 + (s / 64) % 2;
        q.recompute = rc;
        q.num_layers = 4;
        qs.push_back(q);
      }
    }
  }
  return qs;
}

void BM_AnalyticQuery(benchmark::State& state, const char* model) {
  const cm::AnalyticCostModel m(cm::load_model(model), cm::load_device("A100-40GB"));
  const auto qs = shapes(m.model().arch == cm::Architecture::EncoderDecoder);
  std::size_t i = 0;
  for (auto _ : state) {
    const cm::LayerCost c = m.query(qs[i]);
    benchmark::DoNotOptimize(c);
    if (++i == qs.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_AnalyticStageCost(benchmark::State& state) {
  const cm::AnalyticCostModel m(cm::load_model("gpt-6.7b"), cm::load_device("A100-40GB"));
  const cm::StageLayout layout{8, 0, true, false};
  std::int64_t b = 1;
  for (auto _ : state) {
    benchmark::DoNotOptimize(cm::stage_cost(m, layout, 2, b, 2048, 0, cm::Recompute::Selective));
    b = b % 16 + 1;
  }
  state.SetItemsProcessed(state.iterations());
}

/// The partitioner's rows: for one (kind, seq, recompute, tp) the sizes 1..K, as one query_rows
/// call (batch) or K query() calls (loop). Counter time_per_row: seconds per row.
std::vector<cm::Query> row_shapes() {
  std::vector<cm::Query> qs;
  for (std::int64_t s : {128, 512, 1000, 2048, 3000, 4096}) {
    for (auto rc : {cm::Recompute::None, cm::Recompute::Selective, cm::Recompute::Full}) {
      cm::Query q;
      q.kind = cm::LayerKind::Encoder;
      q.seq = s;
      q.tp = 1 + (s / 128) % 2;
      q.recompute = rc;
      q.num_layers = 4;
      qs.push_back(q);
    }
  }
  return qs;
}

void BM_AnalyticRows(benchmark::State& state, bool batch) {
  const cm::AnalyticCostModel m(cm::load_model("gpt-6.7b"), cm::load_device("A100-40GB"));
  packpipe::bench::query_rows_benchmark(state, m, row_shapes(), batch);
}

}  // namespace

BENCHMARK_CAPTURE(BM_AnalyticQuery, gpt_6_7b, "gpt-6.7b");
BENCHMARK_CAPTURE(BM_AnalyticQuery, t5_11b, "t5-11b");
BENCHMARK(BM_AnalyticStageCost);
BENCHMARK_CAPTURE(BM_AnalyticRows, query_rows, true)->Arg(64)->Arg(256);
BENCHMARK_CAPTURE(BM_AnalyticRows, query_loop, false)->Arg(64)->Arg(256);
