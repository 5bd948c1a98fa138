// Shared by the cost-model benchmarks: the partitioner's access pattern, sizes 1..K of one shape.
#pragma once

#include <cstdint>
#include <vector>

#include <benchmark/benchmark.h>

#include "costmodel/cost_model.h"

namespace packpipe::bench {

/// Times sizes 1..state.range(0) of each shape in `shapes` in turn (their mbs is ignored), as one
/// query_rows call (`batch`) or one query() per size. Counter time_per_row: seconds per row.
inline void query_rows_benchmark(benchmark::State& state, const costmodel::CostModel& m,
                                 const std::vector<costmodel::Query>& shapes, bool batch) {
  const std::int64_t rows = state.range(0);
  std::vector<costmodel::LayerCost> out(static_cast<std::size_t>(rows));
  std::size_t i = 0;
  for (auto _ : state) {
    costmodel::Query q = shapes[i];
    q.mbs = 1;
    if (batch) {
      benchmark::DoNotOptimize(m.query_rows(q, rows, out.data()));
    } else {
      for (std::int64_t k = 0; k < rows; ++k) {
        q.mbs = 1 + k;
        out[static_cast<std::size_t>(k)] = m.query(q);
      }
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    if (++i == shapes.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations() * rows);
  state.counters["time_per_row"] = benchmark::Counter(
      static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

}  // namespace packpipe::bench
