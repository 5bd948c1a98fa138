// A calibrated cost model in every planner path: the partitioner, layer balancing, the schedule's
// cost table and the simulator. An identity calibration plans bit for bit as no calibration; a
// calibration that doubles every time doubles every predicted time and changes no decision.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "tests/support/devices.h"
#include "costmodel/analytic.h"
#include "costmodel/calibration.h"
#include "partition/partition.h"
#include "plan/format.h"
#include "planner/planner.h"
#include "schedule/stage_costs.h"

using namespace packpipe::partition;
using namespace packpipe::planner;
namespace cm = packpipe::costmodel;
namespace pl = packpipe::plan;
namespace sched = packpipe::schedule;

namespace {

BatchLengths batch(std::uint64_t seed, std::size_t n, bool enc_dec) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> len(std::log(200.0), 1.0);
  BatchLengths b;
  for (std::size_t i = 0; i < n; ++i) {
    b.input.push_back(static_cast<std::uint32_t>(std::clamp(len(rng), 1.0, 2048.0)));
    if (enc_dec) b.target.push_back(static_cast<std::uint32_t>(std::clamp(len(rng) / 4, 1.0, 512.0)));
  }
  return b;
}

// Every compute op kind's time a x base + b (three regions when `regions`, all alike); transfers
// at latency x a and bandwidth / a (fitted) when `transfers`.
cm::Calibration linear(const cm::CostModel& base, double a, double b, bool regions, bool transfers) {
  cm::Calibration c;
  c.base = {base.model().name, base.device().name, base.describe(), cm::cost_model_fingerprint(base)};
  for (std::size_t k = 0; k < 4; ++k) {
    cm::OpFit& f = c.compute[k];
    f.op = static_cast<cm::MeasuredOp>(k);
    f.fitted = true;
    f.global.a = a;
    f.global.b = b;
    if (!regions) continue;
    for (double centre : {9.0, 11.0, 13.5}) {
      cm::RegionFit r = f.global;
      r.center_log2_tokens = centre;
      f.regions.push_back(r);
    }
  }
  if (transfers) {
    const cm::CommModel& cc = base.comm();
    c.transfers[0] = {false, true, cc.intra_latency_ms * a, cc.intra_bytes_per_ms / a, 10, 2, 0, 0};
    c.transfers[1] = {true, true, cc.inter_latency_ms * a, cc.inter_bytes_per_ms / a, 10, 2, 0, 0};
  }
  return c;
}

struct Case {
  std::shared_ptr<const cm::CostModel> base;
  PlannerOptions options;
  BatchLengths lengths;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int k = 0; k < 3; ++k) {
    Case c;
    const bool t5 = k == 2;
    c.base = std::make_shared<cm::AnalyticCostModel>(cm::load_model(t5 ? "t5-770m" : "gpt-1.3b"),
                                                     packpipe::test::eager_device("A100-40GB"));
    c.options.shape.stages = t5 ? 2 : 4;
    c.options.shape.layers_per_stage = t5 ? 6 : 4;
    c.options.shape.dp = k == 1 ? 2 : 1;
    c.options.baseline_mbs = {2, 8};
    if (k == 1) c.options.partition.method = PartitionMethod::DynaPipe;
    c.lengths = batch(100 + static_cast<std::uint64_t>(k), 160, t5);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

TEST_CASE("an identity calibration gives bit-identical plans to the uncalibrated model", "[calibration]") {
  for (const Case& c : cases()) {
    const cm::CalibratedCostModel id(c.base, linear(*c.base, 1.0, 0.0, true, true));
    const auto vs = virtual_stages(c.base->model(), c.options.shape);
    const IterationResult a = plan_iteration(c.lengths, nullptr, 3, *c.base, vs, c.options);
    const IterationResult b = plan_iteration(c.lengths, nullptr, 3, id, vs, c.options);
    REQUIRE(a.plans.size() == b.plans.size());
    for (std::size_t k = 0; k < a.plans.size(); ++k) CHECK(pl::encode_plan(a.plans[k]) == pl::encode_plan(b.plans[k]));
    CHECK(a.packpipe.iteration_ms == b.packpipe.iteration_ms);
    REQUIRE(a.baselines.size() == b.baselines.size());
    for (std::size_t g = 0; g < a.baselines.size(); ++g) {
      CHECK(a.baselines[g].figures.iteration_ms == b.baselines[g].figures.iteration_ms);
    }
    CHECK(balanced_stage_layers(*c.base, c.options.shape, 1, 2048, 512) ==
          balanced_stage_layers(id, c.options.shape, 1, 2048, 512));
  }
}

TEST_CASE("a calibrated model changes the partitioner's and the simulator's times alike", "[calibration]") {
  for (const Case& c : cases()) {
    INFO("case: " << c.base->model().name << " dp " << c.options.shape.dp << " method " << partition_method_name(c.options.partition.method));
    // twice every op and every transfer: every predicted time doubles, no decision changes
    const cm::CalibratedCostModel twice(c.base, linear(*c.base, 2.0, 0.0, false, true));
    const auto vs = virtual_stages(c.base->model(), c.options.shape);
    const Partition p1 = partition(c.lengths, *c.base, c.options.shape, vs, c.options.partition);
    const Partition p2 = partition(c.lengths, twice, c.options.shape, vs, c.options.partition);
    REQUIRE(p1.microbatches.size() == p2.microbatches.size());
    for (std::size_t m = 0; m < p1.microbatches.size(); ++m) {
      CHECK(p1.microbatches[m].samples == p2.microbatches[m].samples);
      CHECK(p2.microbatches[m].time_ms == Approx(2 * p1.microbatches[m].time_ms).epsilon(1e-12));
    }
    CHECK(p2.sum_time_ms == Approx(2 * p1.sum_time_ms).epsilon(1e-12));
    // (DynaPipe charges caps on a fixed 5 ms grid: its objective does not scale exactly)
    if (c.options.partition.method == PartitionMethod::DP) CHECK(p2.objective_ms == Approx(2 * p1.objective_ms).epsilon(1e-12));
    const auto t1 = sched::stage_cost_table(*c.base, c.options.shape, vs, p1.microbatches);
    const auto t2 = sched::stage_cost_table(twice, c.options.shape, vs, p1.microbatches);
    for (std::size_t i = 0; i < t1.forward_ms.size(); ++i) {
      CHECK(t2.forward_ms[i] == 2 * t1.forward_ms[i]);
      CHECK(t2.backward_ms[i] == 2 * t1.backward_ms[i]);
      CHECK(t2.op_ms(pl::OpKind::BackwardInput, i) == Approx(2 * t1.op_ms(pl::OpKind::BackwardInput, i)).epsilon(1e-12));
      CHECK(t2.backward_weight_ms[i] == Approx(2 * t1.backward_weight_ms[i]).epsilon(1e-12));
    }
    const IterationResult a = plan_iteration(c.lengths, nullptr, 0, *c.base, vs, c.options);
    const IterationResult b = plan_iteration(c.lengths, nullptr, 0, twice, vs, c.options);
    CHECK(b.packpipe.iteration_ms == Approx(2 * a.packpipe.iteration_ms).epsilon(1e-9));
    REQUIRE(a.plans.size() == b.plans.size());
    for (std::size_t k = 0; k < a.plans.size(); ++k) {
      CHECK(a.plans[k].microbatches == b.plans[k].microbatches);
      CHECK(a.plans[k].streams == b.plans[k].streams);
      CHECK(b.plans[k].makespan_ms == Approx(2 * a.plans[k].makespan_ms).epsilon(1e-9));
    }
    // a calibration with an intercept shifts small micro-batches most: the plan's time grows, and
    // the simulated makespan is the calibrated cost table's
    const cm::CalibratedCostModel slower(c.base, linear(*c.base, 1.1, 2.0, true, false));
    const IterationResult s = plan_iteration(c.lengths, nullptr, 0, slower, vs, c.options);
    CHECK(s.packpipe.iteration_ms > 1.1 * a.packpipe.iteration_ms);
  }
}

TEST_CASE("a calibration's attention term prices padded and packed micro-batches alike in the partitioner and the "
          "simulator", "[calibration]") {
  const Case c = cases()[0];
  // the attention part three times the model's (gamma 2) for F and B, the token-linear part as is
  cm::Calibration cal = linear(*c.base, 1.0, 0.0, false, false);
  cal.compute[0].attention_gamma = 2.0;
  cal.compute[1].attention_gamma = 2.0;
  const cm::CalibratedCostModel slow_attention(c.base, cal);
  const auto vs = virtual_stages(c.base->model(), c.options.shape);
  for (packpipe::Layout only : {packpipe::Layout::Padded, packpipe::Layout::Packed}) {
    PartitionOptions o = c.options.partition;
    o.layouts = packpipe::layout_bit(only);
    const Partition base = partition(c.lengths, *c.base, c.options.shape, vs, o);
    const Partition p = partition(c.lengths, slow_attention, c.options.shape, vs, o);
    CHECK(p.sum_time_ms > base.sum_time_ms);
    // each micro-batch's time is its slowest stage's calibrated forward + backward, as the
    // schedule's cost table prices it (the partitioner's share per stage is the table's)
    const auto t = sched::stage_cost_table(slow_attention, c.options.shape, vs, p.microbatches);
    for (std::size_t m = 0; m < p.microbatches.size(); ++m) {
      double slowest = 0;
      for (std::int64_t v = 0; v < t.vstages; ++v) {
        const std::size_t i = t.at(static_cast<std::int64_t>(m), v);
        slowest = std::max(slowest, t.forward_ms[i] + t.backward_ms[i]);
      }
      INFO("micro-batch " << m << " layout " << packpipe::layout_name(p.microbatches[m].layout));
      CHECK(p.microbatches[m].layout == only);
      CHECK(p.microbatches[m].time_ms == Approx(slowest).epsilon(1e-9));
    }
  }
}
