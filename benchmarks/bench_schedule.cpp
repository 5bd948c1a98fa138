// Schedule search speed and quality: 40 long-tailed micro-batches of GPT-6.7B on 8 and on 4
// pipeline stages (A100-40GB) under two cost models: the analytic one (32 layers) and the
// profiled one from DynaPipe's GPT-6.7B fixture grids (16 layers, as DynaPipe's gpt_6.7b_16l: 2
// per stage on 8 stages, 4 on 4). The fast search (goal under 5 ms, target about 2 ms on 8
// stages) against the DynaPipe-like exhaustive reference in the same run, both makespans as
// counters; one build + simulation of each schedule. PACKPIPE_BENCH_SMALL=1: 8 micro-batches.
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "common/rng.h"
#include "costmodel/factory.h"
#include "schedule/schedules.h"
#include "schedule/search.h"
#include "schedule/simulator.h"

namespace cm = packpipe::costmodel;
namespace part = packpipe::partition;
namespace sched = packpipe::schedule;

namespace {

bool small() { return std::getenv("PACKPIPE_BENCH_SMALL") != nullptr; }

// Long-tailed multi-task micro-batches: padded lengths 128 .. 2048 with geometric frequencies
// (half at 128, a quarter at 256, ...), about 4K tokens each, a few smaller ones.
std::vector<part::MicroBatch> microbatches(std::size_t n) {
  std::vector<part::MicroBatch> mbs(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h = packpipe::SplitMix64(i + 1).next();  // splitmix64 of i + 1
    int e = 0;
    while (e < 4 && (h >> e) & 1) ++e;
    const std::int64_t len = 128 << e;
    std::int64_t rows = std::max<std::int64_t>(1, 4096 / len);
    if ((h >> 8) % 4 == 0) rows = std::max<std::int64_t>(1, rows / 2);
    mbs[i].samples.resize(static_cast<std::size_t>(rows));
    mbs[i].padded_len = len;
  }
  return mbs;
}

enum class Model { Analytic, Profiled };

struct Bench {
  std::unique_ptr<cm::CostModel> cost;
  part::PipelineShape shape;
  sched::SimProblem problem;
  Bench(Model model, std::int64_t stages) {
    cm::CostModelConfig cfg;  // (GPT-6.7B on A100-40GB, the analytic model)
    cfg.model = "gpt-6.7b";
    cfg.device = "A100-40GB";
    shape.stages = stages;
    if (model == Model::Profiled) {
      const std::string dir = std::string(PACKPIPE_FIXTURES_DIR) + "/dynapipe/derived_from_cost_models_pkl/";
      cfg.profiles = {dir + "gpt_6.7b_timing.csv", dir + "gpt_6.7b_activation.csv", dir + "gpt_6.7b_model_state.csv"};
      shape.layers_per_stage = 16 / stages;
    }
    cost = cm::make_cost_model(cfg);
    const auto vs = part::virtual_stages(cost->model(), shape);
    problem = sched::make_sim_problem(sched::stage_cost_table(*cost, shape, vs, microbatches(small() ? 8 : 40)), *cost, shape);
  }
};

const Bench& bench(Model model, std::int64_t stages) {
  static std::map<std::pair<int, std::int64_t>, std::unique_ptr<Bench>> cache;
  auto& b = cache[{static_cast<int>(model), stages}];
  if (!b) b = std::make_unique<Bench>(model, stages);
  return *b;
}

void BM_FastSearch(benchmark::State& state, Model model, std::int64_t stages) {
  const auto& b = bench(model, stages);
  sched::SearchResult r;
  for (auto _ : state) {
    r = sched::search_schedule(b.problem);
    benchmark::DoNotOptimize(static_cast<const double&>(r.best.makespan_ms));
  }
  const sched::SearchResult ref = sched::reference_search(b.problem);
  state.counters["makespan_ms"] = r.best.makespan_ms;
  state.counters["reference_makespan_ms"] = ref.best.makespan_ms;
  state.counters["makespan_vs_reference"] = r.best.makespan_ms / ref.best.makespan_ms;
  state.counters["lower_bound_ms"] = r.lower_bound_ms;
  state.counters["simulations"] = static_cast<double>(r.simulations);
  state.counters["early_exits"] = static_cast<double>(r.early_exits);
  state.counters["schedule"] = static_cast<double>(r.kind);
  state.counters["bubble"] = r.best.bubble_fraction;
  state.SetLabel(r.best.name);
}

void BM_ReferenceSearch(benchmark::State& state, Model model, std::int64_t stages) {
  const auto& b = bench(model, stages);
  sched::SearchResult r;
  for (auto _ : state) {
    r = sched::reference_search(b.problem);
    benchmark::DoNotOptimize(static_cast<const double&>(r.best.makespan_ms));
  }
  state.counters["makespan_ms"] = r.best.makespan_ms;
  state.counters["simulations"] = static_cast<double>(r.simulations);
  state.counters["bubble"] = r.best.bubble_fraction;
  state.SetLabel(r.best.name);
}

// One build + simulation of a schedule on the partition order; counters: makespan, bubble, peak.
void BM_Schedule(benchmark::State& state, Model model, sched::ScheduleKind kind) {
  const auto& b = bench(model, 8);
  std::vector<std::uint32_t> order(static_cast<std::size_t>(b.problem.microbatches()));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  sched::Simulator sim(b.problem);
  sched::RankOrder ro;
  sched::SimResult res;
  for (auto _ : state) {
    sched::build_order(kind, b.problem, order, {}, ro);
    sim.run(ro, res);
    benchmark::DoNotOptimize(static_cast<const double&>(res.makespan_ms));
  }
  state.counters["makespan_ms"] = res.makespan_ms;
  state.counters["bubble"] = res.bubble_fraction;
  state.counters["peak_gb"] = res.max_peak_bytes() / 1e9;
  state.counters["fits"] = res.within_memory ? 1 : 0;
  state.counters["lower_bound_ms"] = sched::makespan_lower_bounds(b.problem).value();
}

#define PACKPIPE_SEARCH_CASE(name, model, stages)                                                             \
  BENCHMARK_CAPTURE(BM_FastSearch, name, model, stages)->Unit(benchmark::kMillisecond);                      \
  BENCHMARK_CAPTURE(BM_ReferenceSearch, name, model, stages)->Unit(benchmark::kMillisecond)

PACKPIPE_SEARCH_CASE(analytic_s8, Model::Analytic, 8);
PACKPIPE_SEARCH_CASE(profiled_s8, Model::Profiled, 8);
PACKPIPE_SEARCH_CASE(analytic_s4, Model::Analytic, 4);
PACKPIPE_SEARCH_CASE(profiled_s4, Model::Profiled, 4);

#define PACKPIPE_SCHEDULE_CASES(model, prefix)                                                                    \
  BENCHMARK_CAPTURE(BM_Schedule, prefix##_gpipe, model, sched::ScheduleKind::GPipe)->Unit(benchmark::kMicrosecond);  \
  BENCHMARK_CAPTURE(BM_Schedule, prefix##_1f1b, model, sched::ScheduleKind::OneFOneB)->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(BM_Schedule, prefix##_cyclic, model, sched::ScheduleKind::Cyclic)->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(BM_Schedule, prefix##_wait_free_cyclic, model, sched::ScheduleKind::WaitFreeCyclic)             \
      ->Unit(benchmark::kMicrosecond);                                                                            \
  BENCHMARK_CAPTURE(BM_Schedule, prefix##_zero_bubble, model, sched::ScheduleKind::ZeroBubble)                      \
      ->Unit(benchmark::kMicrosecond)

PACKPIPE_SCHEDULE_CASES(Model::Analytic, analytic_s8);
PACKPIPE_SCHEDULE_CASES(Model::Profiled, profiled_s8);

}  // namespace
