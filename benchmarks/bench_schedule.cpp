// Schedule search speed and quality: 40 long-tailed micro-batches of GPT-6.7B on 8 pipeline
// stages (A100-40GB, analytic cost model): the fast search (goal under 5 ms) against the
// DynaPipe-like exhaustive reference in the same run, both makespans, one simulation, and every
// schedule's makespan and bubble fraction as counters. PACKPIPE_BENCH_SMALL=1: 8 micro-batches
// on 4 stages.
#include <cstdlib>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include "costmodel/factory.h"
#include "scheduler/schedules.h"
#include "scheduler/search.h"
#include "scheduler/simulator.h"

namespace cm = packpipe::costmodel;
namespace sc = packpipe::scheduler;

namespace {

bool small() { return std::getenv("PACKPIPE_BENCH_SMALL") != nullptr; }

std::uint64_t mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Long-tailed multi-task micro-batches: padded lengths 128 .. 2048 with geometric frequencies
// (half at 128, a quarter at 256, ...), about 4K tokens each, a few smaller ones.
std::vector<sc::MicroBatch> microbatches(std::size_t n) {
  std::vector<sc::MicroBatch> mbs(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h = mix(i + 1);
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

struct Bench {
  std::unique_ptr<cm::CostModel> cost;
  sc::PipelineShape shape;
  sc::SimProblem problem;
  Bench() {
    cost = cm::make_cost_model(cm::CostModelConfig{"gpt-6.7b", "A100-40GB", {}});
    shape.stages = small() ? 4 : 8;
    const auto vs = sc::virtual_stages(cost->model(), shape);
    problem = sc::make_sim_problem(sc::stage_cost_table(*cost, shape, vs, microbatches(small() ? 8 : 40)), *cost, shape);
  }
};

const Bench& bench() {
  static const Bench b;
  return b;
}

void BM_FastSearch(benchmark::State& state) {
  const auto& b = bench();
  sc::SearchResult r;
  for (auto _ : state) {
    r = sc::search_schedule(b.problem);
    benchmark::DoNotOptimize(static_cast<const double&>(r.best.makespan_ms));
  }
  const sc::SearchResult ref = sc::reference_search(b.problem);
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

void BM_ReferenceSearch(benchmark::State& state) {
  const auto& b = bench();
  sc::SearchResult r;
  for (auto _ : state) {
    r = sc::reference_search(b.problem);
    benchmark::DoNotOptimize(static_cast<const double&>(r.best.makespan_ms));
  }
  state.counters["makespan_ms"] = r.best.makespan_ms;
  state.counters["simulations"] = static_cast<double>(r.simulations);
  state.counters["bubble"] = r.best.bubble_fraction;
  state.SetLabel(r.best.name);
}

// One build + simulation of a schedule on the partition order; counters: makespan, bubble, peak.
void BM_Schedule(benchmark::State& state, sc::ScheduleKind kind) {
  const auto& b = bench();
  std::vector<std::uint32_t> order(static_cast<std::size_t>(b.problem.microbatches()));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  sc::Simulator sim(b.problem);
  sc::RankOrder ro;
  sc::SimResult res;
  for (auto _ : state) {
    sc::build_order(kind, b.problem, order, {}, ro);
    sim.run(ro, res);
    benchmark::DoNotOptimize(static_cast<const double&>(res.makespan_ms));
  }
  state.counters["makespan_ms"] = res.makespan_ms;
  state.counters["bubble"] = res.bubble_fraction;
  state.counters["peak_gb"] = res.max_peak_bytes() / 1e9;
  state.counters["fits"] = res.within_memory ? 1 : 0;
  state.counters["lower_bound_ms"] = sc::makespan_lower_bounds(b.problem).value();
}

BENCHMARK(BM_FastSearch)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReferenceSearch)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Schedule, gpipe, sc::ScheduleKind::GPipe)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Schedule, 1f1b, sc::ScheduleKind::OneFOneB)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Schedule, cyclic, sc::ScheduleKind::Cyclic)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Schedule, wait_free_cyclic, sc::ScheduleKind::WaitFreeCyclic)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Schedule, zero_bubble, sc::ScheduleKind::ZeroBubble)->Unit(benchmark::kMicrosecond);

}  // namespace
