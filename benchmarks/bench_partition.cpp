// Micro-batch partition speed and figures: packpipe's DP against the exact DynaPipe tau-DP (the
// baseline, measured in the same run) on GPT-6.7B (16 layers) and T5-11B (12 + 12 layers) with
// DynaPipe's fixture cost models when the profiled model is available (analytic otherwise; the
// benchmark name says which), 36000 MB, S = 4 and 8; batches: the embedded demo data's real
// lengths (64K-token global batches through the sampler) and synthetic log-normal lengths.
// Counters: objective_ms, predicted_ms (stage basis), efficiency, microbatches; for dp on the
// DynaPipe basis also obj_vs_dynapipe (its objective / the tau-DP's on the same costs).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <benchmark/benchmark.h>

#include "common/errors.h"
#include "costmodel/factory.h"
#include "dataloader/manifest.h"
#include "dataloader/multitask.h"
#include "dataloader/sampler.h"
#include "partition/partition.h"

namespace {

namespace cm = packpipe::costmodel;
namespace part = packpipe::partition;
namespace dl = packpipe::dataloader;

bool small() { return std::getenv("PACKPIPE_BENCH_SMALL") != nullptr; }

std::string repo_root() {
  std::string f = __FILE__;
  for (int k = 0; k < 2; ++k) f = f.substr(0, f.find_last_of('/'));
  return f;
}

struct Model {
  std::unique_ptr<cm::CostModel> cost;
  bool profiled = false;
};

// The profiled model from DynaPipe's grids, or the analytic one if it cannot be built here.
const Model& model(bool t5) {
  static std::map<bool, Model> cache;
  auto it = cache.find(t5);
  if (it != cache.end()) return it->second;
  Model m;
  cm::CostModelConfig c;
  c.model = t5 ? "t5-11b" : "gpt-6.7b";
  c.device = "A100-40GB";
  const std::string dir = repo_root() + "/../shared/fixtures/dynapipe/derived_from_cost_models_pkl/";
  const std::string p = t5 ? "t5_11b" : "gpt_6.7b";
  c.profiles = {dir + p + "_timing.csv", dir + p + "_activation.csv", dir + p + "_model_state.csv"};
  try {
    m.cost = cm::make_cost_model(c);
    m.profiled = true;
  } catch (const std::exception&) {
    c.profiles.clear();
    m.cost = cm::make_cost_model(c);
  }
  return cache.emplace(t5, std::move(m)).first->second;
}

part::PipelineShape shape(bool t5, std::int64_t S) {
  part::PipelineShape s;
  s.stages = S;
  s.layers_per_stage = t5 ? 24 / S : 16 / S;
  s.memory_limit_mb = 36000;
  return s;
}

std::uint32_t lognormal(std::mt19937_64& rng, double median, double sigma, std::uint32_t cap) {
  const double u1 = (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  return static_cast<std::uint32_t>(std::min<double>(cap, std::max(1.0, std::round(median * std::exp(sigma * z)))));
}

// Synthetic: n samples, or (n = 0) samples until 64K tokens.
part::BatchLengths synthetic(bool t5, std::size_t n, std::uint64_t seed = 2024) {
  std::mt19937_64 rng(seed);
  part::BatchLengths b;
  std::uint64_t tokens = 0;
  while (n ? b.size() < n : tokens < 65536) {
    const std::uint32_t x = lognormal(rng, 200, 1.0, t5 ? 1536 : 2048);
    b.input.push_back(x);
    tokens += x;
    if (t5) {
      const std::uint32_t y = lognormal(rng, 60, 1.0, 512);
      b.target.push_back(y);
      tokens += y;
    }
  }
  return b;
}

// The demo data's first 64K-token global batch (GPT: input + target as one sequence).
part::BatchLengths demo(bool t5) {
  const dl::MultiTaskDataset mt(dl::load_manifest(repo_root() + "/data/demo/manifest.json"));
  dl::SamplerConfig cfg;
  cfg.seed = 1234;
  cfg.global_batch_tokens = 65536;
  dl::Sampler sampler(mt, cfg);
  dl::GlobalBatch g;
  PACKPIPE_CHECK(sampler.next_batch(g), "demo data gave no batch");
  part::BatchLengths b;
  for (const auto& r : g.samples) {
    const std::uint32_t in = mt.input_length(r), tg = mt.target_length(r);
    if (t5) {
      b.input.push_back(std::min<std::uint32_t>(in, 1536));
      b.target.push_back(std::min<std::uint32_t>(tg, 512));
    } else {
      b.input.push_back(std::min<std::uint32_t>(in + tg, 2048));
    }
  }
  return b;
}

const part::BatchLengths& batch(bool t5, int kind) {  // kind 0: demo, 1: synthetic 64K, 2: 4096 samples
  static std::map<std::pair<bool, int>, part::BatchLengths> cache;
  auto key = std::make_pair(t5, kind);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  part::BatchLengths b = kind == 0 ? demo(t5) : synthetic(t5, kind == 1 ? 0 : (small() ? 256 : 4096));
  return cache.emplace(key, std::move(b)).first->second;
}

const char* kind_name(int k) { return k == 0 ? "demo64K" : k == 1 ? "lognormal64K" : "lognormal4096"; }

// `threads` as PartitionOptions::threads: 1 for the CPU-time figures (the default timer counts
// the benchmark's own thread only), 2 for the wall-clock ones (UseRealTime).
void BM_Partition(benchmark::State& state, bool t5, int kind, std::int64_t S, part::PartitionMethod method,
                  part::CostBasis basis, part::EncDecOrder order, int threads) {
  const Model& m = model(t5);
  const part::BatchLengths& b = batch(t5, kind);
  const part::PipelineShape sh = shape(t5, S);
  const auto vs = part::virtual_stages(m.cost->model(), sh);
  part::PartitionOptions o;
  o.method = method;
  o.basis = basis;
  o.microbatch_size = 4;
  o.token_budget = 4096;
  o.oversize = part::OversizePolicy::Drop;
  o.order = order;
  o.threads = threads;
  part::Partition p;
  for (auto _ : state) {
    try {
      p = part::partition(b, *m.cost, sh, vs, o);
    } catch (const packpipe::InvalidArgument& e) {
      // A fixed-shape baseline whose micro-batch fits under no recompute mode (T5's longest
      // samples four to a micro-batch): reported, not timed.
      state.SkipWithError(e.what());
      return;
    }
    benchmark::DoNotOptimize(p.objective_ms);
  }
  state.SetLabel(std::string(m.profiled ? "profiled" : "analytic") + " " + std::to_string(b.size()) + " samples");
  state.counters["objective_ms"] = p.objective_ms;
  state.counters["efficiency"] = p.efficiency;
  state.counters["microbatches"] = static_cast<double>(p.microbatches.size());
  state.counters["tau_runs"] = static_cast<double>(p.tau_evaluations);
  try {
    const part::Partition e = part::evaluate_partition(b, *m.cost, sh, vs, p.microbatches, o, part::CostBasis::Stages);
    state.counters["predicted_ms"] = e.predicted_iteration_ms;
  } catch (const std::exception&) {
    state.counters["predicted_ms"] = -1;  // does not fit on the stage basis
  }
  if (method == part::PartitionMethod::DP && basis == part::CostBasis::DynaPipe) {
    part::PartitionOptions d = o;
    d.method = part::PartitionMethod::DynaPipe;
    const part::Partition base = part::partition(b, *m.cost, sh, vs, d);
    state.counters["obj_vs_dynapipe"] = p.objective_ms / base.objective_ms;
  }
}

// The planning job's case: one PartitionCache per thread kept across iterations, so shapes seen in
// earlier global batches cost a look-up. Warm: the cache has seen this batch before.
void BM_PartitionWarm(benchmark::State& state, bool t5, int kind, std::int64_t S) {
  const Model& m = model(t5);
  const part::BatchLengths& b = batch(t5, kind);
  const part::PipelineShape sh = shape(t5, S);
  const auto vs = part::virtual_stages(m.cost->model(), sh);
  part::PartitionCache cache;
  part::PartitionOptions o;
  o.oversize = part::OversizePolicy::Drop;
  o.threads = 1;
  o.cache = &cache;
  part::Partition p = part::partition(b, *m.cost, sh, vs, o);
  for (auto _ : state) {
    p = part::partition(b, *m.cost, sh, vs, o);
    benchmark::DoNotOptimize(p.microbatches.data());
  }
  state.SetLabel(std::string(m.profiled ? "profiled" : "analytic") + " " + std::to_string(b.size()) + " samples");
  state.counters["objective_ms"] = p.objective_ms;
  state.counters["shapes"] = static_cast<double>(cache.shapes());
}

// Distinct synthetic batches for the planning-loop benchmarks (64K tokens, or `n` samples), from
// seed `first` on; kept across benchmarks.
const std::vector<part::BatchLengths>& batch_series(bool t5, std::size_t n, std::uint64_t first, std::size_t count) {
  static std::map<std::tuple<bool, std::size_t, std::uint64_t>, std::vector<part::BatchLengths>> series;
  auto& bs = series[{t5, n, first}];
  for (std::uint64_t seed = first + bs.size(); bs.size() < count; ++seed) {
    bs.push_back(synthetic(t5, small() && n ? 256 : n, seed));
  }
  return bs;
}

// The planning loop's steady state: a new global batch every iteration (synthetic batches of 64K
// tokens, or of `n` samples; seeds 1, 2, ...; never the same twice within one run), one
// PartitionCache kept across them as `packpipe plan` keeps one per thread. The first batches
// warm the cache before timing; shapes then come from earlier batches or are evaluated.
void BM_PartitionStream(benchmark::State& state, bool t5, std::int64_t S, std::size_t n) {
  const Model& m = model(t5);
  const part::PipelineShape sh = shape(t5, S);
  const auto vs = part::virtual_stages(m.cost->model(), sh);
  const std::size_t warmup = n ? 30 : 50;
  const auto& bs = batch_series(t5, n, 1, small() ? warmup + 10 : warmup + (n ? 220 : 1050));
  part::PartitionCache cache;
  part::PartitionOptions o;
  o.oversize = part::OversizePolicy::Drop;
  o.threads = 1;
  o.cache = &cache;
  std::size_t next = 0;
  for (; next < warmup; ++next) part::partition(bs[next], *m.cost, sh, vs, o);
  for (auto _ : state) {
    if (next == bs.size()) {
      state.SkipWithError("ran out of distinct batches");
      break;
    }
    const part::Partition p = part::partition(bs[next++], *m.cost, sh, vs, o);
    benchmark::DoNotOptimize(p.microbatches.data());
  }
  state.SetLabel(std::string(m.profiled ? "profiled" : "analytic") + (n ? " 4096-sample batches" : " 64K-token batches"));
  state.counters["shapes"] = static_cast<double>(cache.shapes());
}

// The second batch of a planning run: a fresh PartitionCache has seen one batch (untimed) when the
// next, different one is partitioned (timed). Pairs of batches (seeds 2k + 1, 2k + 2) never repeat
// within one run. DynaPipe's quoted planning times are medians of such early batches.
void BM_PartitionSecond(benchmark::State& state, bool t5, std::int64_t S, std::size_t n, part::EncDecOrder order,
                        int threads) {
  const Model& m = model(t5);
  const part::PipelineShape sh = shape(t5, S);
  const auto vs = part::virtual_stages(m.cost->model(), sh);
  const std::size_t pairs = small() ? 3 : n ? 40 : 200;
  const auto& bs = batch_series(t5, n, 100001, 2 * pairs);
  part::PartitionOptions o;
  o.oversize = part::OversizePolicy::Drop;
  o.order = order;
  o.threads = threads;
  std::size_t next = 0;
  std::unique_ptr<part::PartitionCache> cache;
  for (auto _ : state) {
    if (next + 1 >= bs.size()) {
      state.SkipWithError("ran out of distinct batch pairs");
      break;
    }
    state.PauseTiming();
    cache = std::make_unique<part::PartitionCache>();  // the previous one is freed untimed
    o.cache = cache.get();
    part::partition(bs[next++], *m.cost, sh, vs, o);
    state.ResumeTiming();
    const part::Partition p = part::partition(bs[next++], *m.cost, sh, vs, o);
    benchmark::DoNotOptimize(p.microbatches.data());
  }
  state.SetLabel(std::string(m.profiled ? "profiled" : "analytic") + (n ? " 4096-sample batches" : " 64K-token batches"));
}

void register_all() {
  for (std::size_t n : {std::size_t{0}, std::size_t{4096}}) {
    for (bool t5 : {false, true}) {
      for (std::int64_t S : {4, 8}) {
        const std::string tail = std::string(t5 ? "t5-11b" : "gpt-6.7b") + (n ? "/lognormal4096/S" : "/lognormal64K/S") +
                                 std::to_string(S) + "/dp";
        benchmark::RegisterBenchmark(("BM_PartitionStream/" + tail).c_str(),
                                     [=](benchmark::State& st) { BM_PartitionStream(st, t5, S, n); })
            ->Unit(benchmark::kMillisecond)
            ->Iterations(small() ? 5 : n ? 200 : 1000);
        // Serial (CPU time) and two table builders (wall clock); T5 also in DynaPipe's sorted order.
        for (const auto order : t5 ? std::vector<part::EncDecOrder>{part::EncDecOrder::Auto, part::EncDecOrder::Sorted}
                                   : std::vector<part::EncDecOrder>{part::EncDecOrder::Auto}) {
          const std::string name = tail + (order == part::EncDecOrder::Sorted ? "_sorted" : "");
          benchmark::RegisterBenchmark(("BM_PartitionSecond/" + name).c_str(),
                                       [=](benchmark::State& st) { BM_PartitionSecond(st, t5, S, n, order, 1); })
              ->Unit(benchmark::kMillisecond)
              ->Iterations(small() ? 2 : n ? 30 : 150);
          benchmark::RegisterBenchmark(("BM_PartitionSecondWall/" + name).c_str(),
                                       [=](benchmark::State& st) { BM_PartitionSecond(st, t5, S, n, order, 2); })
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime()
              ->Iterations(small() ? 2 : n ? 30 : 150);
        }
      }
    }
  }
  using M = part::PartitionMethod;
  using B = part::CostBasis;
  for (bool t5 : {false, true}) {
    for (int kind : {0, 1, 2}) {
      for (std::int64_t S : {4, 8}) {
        const std::string base =
            std::string(t5 ? "t5-11b" : "gpt-6.7b") + "/" + kind_name(kind) + "/S" + std::to_string(S) + "/";
        struct Run {
          const char* name;
          M m;
          B b;
          part::EncDecOrder order = part::EncDecOrder::Auto;
        };
        std::vector<Run> runs = {{"dynapipe_exact", M::DynaPipe, B::DynaPipe}, {"dp_dynapipe_basis", M::DP, B::DynaPipe},
                                 {"dp", M::DP, B::Stages}};
        if (t5) runs.push_back({"dp_sorted", M::DP, B::Stages, part::EncDecOrder::Sorted});  // DynaPipe's order
        if (kind != 2) {
          runs.push_back({"fixed_mbs4", M::Fixed, B::Stages});
          runs.push_back({"tokens_4096", M::Tokens, B::Stages});
          runs.push_back({"packing_mbs4", M::Packing, B::Stages});
        }
        benchmark::RegisterBenchmark(("BM_PartitionWarm/" + base + "dp").c_str(),
                                     [=](benchmark::State& st) { BM_PartitionWarm(st, t5, kind, S); })
            ->Unit(benchmark::kMillisecond);
        for (const auto& r : runs) {
          const M m = r.m;
          const B bb = r.b;
          const part::EncDecOrder order = r.order;
          benchmark::RegisterBenchmark(("BM_Partition/" + base + r.name).c_str(),
                                       [=](benchmark::State& st) { BM_Partition(st, t5, kind, S, m, bb, order, 1); })
              ->Unit(benchmark::kMillisecond);
          // Cold calls with two table builders, wall clock (the DP methods on the synthetic batches).
          if (kind != 0 && (m == M::DynaPipe || (m == M::DP && bb == B::Stages))) {
            benchmark::RegisterBenchmark(("BM_PartitionWall/" + base + r.name).c_str(),
                                         [=](benchmark::State& st) { BM_Partition(st, t5, kind, S, m, bb, order, 2); })
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
          }
        }
      }
    }
  }
}

const int registered = (register_all(), 0);

}  // namespace
