#include <cmath>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "partition/pipeline.h"
#include "schedule/simulator.h"
#include "schedule/stage_costs.h"

using namespace packpipe::partition;
using namespace packpipe::schedule;
using namespace packpipe::plan;
namespace cm = packpipe::costmodel;

TEST_CASE("stage cost table: one entry per (micro-batch, stage), weight share of backward", "[interface]") {
  const cm::AnalyticCostModel cost(cm::load_model("gpt-6.7b"), cm::load_device("A100-40GB"));
  PipelineShape s;
  s.stages = 4;
  const auto vs = virtual_stages(cost.model(), s);
  MicroBatch a, b;
  a.samples = {0, 1};
  a.padded_len = 512;
  b.samples = {2};
  b.padded_len = 2048;
  const auto t = stage_cost_table(cost, s, vs, {a, b});
  REQUIRE(t.forward_ms.size() == 8);
  for (std::int64_t v = 0; v < 4; ++v) {
    CHECK(t.forward_ms[t.at(1, v)] > t.forward_ms[t.at(0, v)]);
    CHECK(t.backward_weight_ms[t.at(0, v)] > 0);
    CHECK(t.backward_weight_ms[t.at(0, v)] < t.backward_ms[t.at(0, v)]);
  }
  // The last stage also runs the LM head.
  CHECK(t.forward_ms[t.at(0, 3)] > t.forward_ms[t.at(0, 1)]);
  CHECK(t.static_bytes.size() == 4);
  CHECK(t.static_bytes[0] > t.static_bytes[1]);  // the embedding's parameters
  MicroBatch empty;
  REQUIRE_THROWS_WITH(stage_cost_table(cost, s, vs, {empty}), Catch::Matchers::Contains("micro-batch 0 is empty"));
}


TEST_CASE("stage cost table below a bound: the whole table, or none exactly where the lower bound reaches it",
          "[interface]") {
  const cm::AnalyticCostModel cost(cm::load_model("gpt-6.7b"), cm::load_device("A100-40GB"));
  for (const std::int64_t chunks : {1, 2}) {
    PipelineShape s;
    s.stages = 4;
    s.chunks = chunks;
    const auto vs = virtual_stages(cost.model(), s);
    std::vector<MicroBatch> mbs;
    for (std::uint32_t k = 0; k < 12; ++k) {
      MicroBatch mb;
      mb.samples = {k};
      mb.padded_len = 256 + 97 * k;  // unequal micro-batches
      mbs.push_back(mb);
    }
    const auto full = stage_cost_table(cost, s, vs, mbs);
    const double rank_work =
        makespan_lower_bounds(make_sim_problem(full, cost, s)).rank_work_ms;
    REQUIRE(rank_work > 0);
    // Above the rank work: the table, entry for entry.
    const auto above = stage_cost_table_below(cost, s, vs, mbs, std::nextafter(rank_work, 1e300));
    REQUIRE(above.has_value());
    CHECK(above->forward_ms == full.forward_ms);
    CHECK(above->backward_ms == full.backward_ms);
    CHECK(above->backward_weight_ms == full.backward_weight_ms);
    CHECK(above->stored_bytes == full.stored_bytes);
    CHECK(above->peak_bytes == full.peak_bytes);
    CHECK(above->send_bytes == full.send_bytes);
    CHECK(above->static_bytes == full.static_bytes);
    CHECK(stage_cost_table_below(cost, s, vs, mbs, std::numeric_limits<double>::infinity()).has_value());
    // At the rank work, or anywhere below it: none (the lower bound reaches the bound).
    CHECK_FALSE(stage_cost_table_below(cost, s, vs, mbs, rank_work).has_value());
    CHECK_FALSE(stage_cost_table_below(cost, s, vs, mbs, rank_work / 3).has_value());
    // An empty micro-batch before the bound is reached is refused as by stage_cost_table.
    std::vector<MicroBatch> bad{MicroBatch{}};
    REQUIRE_THROWS_WITH(stage_cost_table_below(cost, s, vs, bad, 1e300), Catch::Matchers::Contains("micro-batch 0 is empty"));
  }
}
