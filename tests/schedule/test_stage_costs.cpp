#include <cmath>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "partition/pipeline.h"
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

