#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "costmodel/calibration.h"
#include "partition/pipeline.h"
#include "schedule/simulator.h"
#include "schedule/stage_costs.h"

using namespace packpipe::partition;
using namespace packpipe::schedule;
using namespace packpipe::plan;
namespace cm = packpipe::costmodel;

namespace {

// Two tables column for column (the input-gradient column too: empty in both uncalibrated).
void check_same_table(const StageCostTable& a, const StageCostTable& b) {
  CHECK(a.forward_ms == b.forward_ms);
  CHECK(a.backward_ms == b.backward_ms);
  CHECK(a.backward_weight_ms == b.backward_weight_ms);
  CHECK(a.backward_input_ms == b.backward_input_ms);
  CHECK(a.stored_bytes == b.stored_bytes);
  CHECK(a.peak_bytes == b.peak_bytes);
  CHECK(a.send_bytes == b.send_bytes);
  CHECK(a.static_bytes == b.static_bytes);
}

}  // namespace

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
    check_same_table(*above, full);
    CHECK(stage_cost_table_below(cost, s, vs, mbs, std::numeric_limits<double>::infinity()).has_value());
    // At the rank work, or anywhere below it: none (the lower bound reaches the bound).
    CHECK_FALSE(stage_cost_table_below(cost, s, vs, mbs, rank_work).has_value());
    CHECK_FALSE(stage_cost_table_below(cost, s, vs, mbs, rank_work / 3).has_value());
    // An empty micro-batch before the bound is reached is refused as by stage_cost_table.
    std::vector<MicroBatch> bad{MicroBatch{}};
    REQUIRE_THROWS_WITH(stage_cost_table_below(cost, s, vs, bad, 1e300), Catch::Matchers::Contains("micro-batch 0 is empty"));
  }
}

// A calibrated model fits the input-gradient half on its own: a table that may stop grows its
// columns entry by entry, and the middle stages (laid out alike) share their entries; every column
// is the full table's, and the bounds it stops at count the lesser backward (I + W under B here).
TEST_CASE("stage cost table below a bound, calibrated: the halves fitted apart, entry for entry", "[interface]") {
  const auto base = std::make_shared<cm::AnalyticCostModel>(cm::load_model("gpt-6.7b"), cm::load_device("A100-40GB"));
  cm::Calibration cal;
  cal.base = {base->model().name, base->device().name, base->describe(), cm::cost_model_fingerprint(*base)};
  cm::OpFit& input = cal.compute[static_cast<std::size_t>(cm::MeasuredOp::BackwardInput)];
  input.op = cm::MeasuredOp::BackwardInput;
  input.fitted = true;
  input.global.a = 0.5;  // I measured at half the base's: I + W under B
  const cm::CalibratedCostModel cost(base, cal);
  PipelineShape s;
  s.stages = 6;
  s.layers_per_stage = 2;
  const auto vs = virtual_stages(cost.model(), s);
  std::vector<MicroBatch> mbs;
  for (std::uint32_t k = 0; k < 9; ++k) {
    MicroBatch mb;
    mb.samples = {k, k + 9};
    mb.padded_len = 128 + 61 * k;
    mbs.push_back(mb);
  }
  const auto full = stage_cost_table(cost, s, vs, mbs);
  REQUIRE(full.backward_input_ms.size() == full.backward_ms.size());
  const MakespanBounds lb = makespan_lower_bounds(make_sim_problem(full, cost, s));
  const auto above = stage_cost_table_below(cost, s, vs, mbs, std::nextafter(lb.rank_work_ms, 1e300));
  REQUIRE(above.has_value());
  check_same_table(*above, full);
  CHECK_FALSE(stage_cost_table_below(cost, s, vs, mbs, lb.rank_work_ms).has_value());
  std::vector<double> f_plus_b(static_cast<std::size_t>(s.stages), 0.0);  // what the rank work counted before
  for (std::int64_t mb = 0; mb < full.microbatches; ++mb) {
    for (std::int64_t v = 0; v < full.vstages; ++v) {
      const std::size_t i = full.at(mb, v);
      CHECK(full.backward_input_ms[i] > 0);
      CHECK(full.backward_input_ms[i] + full.backward_weight_ms[i] < full.backward_ms[i]);
      f_plus_b[static_cast<std::size_t>(v % s.stages)] += full.forward_ms[i] + full.backward_ms[i];
    }
  }
  CHECK(lb.rank_work_ms < *std::max_element(f_plus_b.begin(), f_plus_b.end()));
}
