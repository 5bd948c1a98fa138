// The epoch planner: every iteration of an epoch planned in parallel and delivered in order, the
// one rule from a global batch to lengths, determinism, resumption and error order.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "dataloader/manifest.h"
#include "dataloader/multitask.h"
#include "plan/format.h"
#include "planner/epoch.h"

using namespace packpipe::planner;
namespace cm = packpipe::costmodel;
namespace dl = packpipe::dataloader;
namespace pl = packpipe::plan;

namespace {

const dl::MultiTaskDataset& demo() {
  static const dl::MultiTaskDataset d(dl::load_manifest(std::string(PACKPIPE_SOURCE_DIR) + "/data/demo/manifest.json"));
  return d;
}

EpochSpec spec(std::uint64_t samples, std::uint64_t tokens = 0, std::uint64_t seed = 5) {
  EpochSpec s;
  s.sampler = dl::sampler_config(demo().manifest());
  s.sampler.seed = seed;
  s.sampler.global_batch_samples = samples;
  s.sampler.global_batch_tokens = tokens;
  return s;
}

PlannerOptions options(std::int64_t stages = 2, std::int64_t dp = 1) {
  PlannerOptions o;
  o.shape.stages = stages;
  o.shape.dp = dp;
  o.baselines = false;
  return o;
}

std::vector<PlannedIteration> drain(EpochPlanner& p) {
  std::vector<PlannedIteration> out;
  PlannedIteration it;
  while (p.next(it)) out.push_back(std::move(it));
  return out;
}

std::vector<std::uint8_t> bytes(const PlannedIteration& it) {
  std::vector<std::uint8_t> b;
  for (const auto& p : it.result.plans) {
    const auto e = pl::encode_plan(p);
    b.insert(b.end(), e.begin(), e.end());
  }
  return b;
}

}  // namespace

TEST_CASE("epoch planner: in order, every sampled batch once, the same bits whatever the threads", "[interface]") {
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  EpochSpec s = spec(0, 8192);
  s.iterations = 12;
  EpochOptions one;
  one.threads = 1;
  EpochPlanner a(demo(), gpt, options(2, 2), s, one);
  const auto x = drain(a);
  REQUIRE(x.size() == 12);
  REQUIRE(a.iterations() == 12);
  EpochOptions many;
  many.threads = 2;
  many.depth = 1;
  many.encode = true;
  EpochPlanner b(demo(), gpt, options(2, 2), s, many);
  std::vector<PlannedIteration> y;
  b.run([&](PlannedIteration& it) { y.push_back(std::move(it)); });
  REQUIRE(y.size() == x.size());
  dl::Sampler sampler(demo(), s.sampler);
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(x[i].iteration == i);
    CHECK(y[i].iteration == i);
    CHECK(bytes(x[i]) == bytes(y[i]));
    REQUIRE(y[i].blobs.size() == y[i].result.plans.size());
    for (std::size_t k = 0; k < y[i].blobs.size(); ++k) CHECK(y[i].blobs[k] == pl::encode_plan(y[i].result.plans[k]));
    // The sampler's batch, through the one rule.
    dl::GlobalBatch g;
    REQUIRE(sampler.next_batch(g));
    CHECK(x[i].refs == g.samples);
    CHECK(x[i].lengths.input == batch_lengths(demo(), g, false, i).input);
    std::uint64_t tokens = 0;
    for (auto t : x[i].lengths.input) tokens += t;
    CHECK(x[i].result.tokens == tokens);
    // Every token of every sample of the batch in exactly one micro-batch of the partition (a sliced
    // sample's spans cover it once).
    std::vector<std::uint64_t> seen(x[i].lengths.size(), 0);
    for (const auto& mb : x[i].result.partition.microbatches) {
      for (std::size_t e = 0; e < mb.samples.size(); ++e) {
        seen[mb.samples[e]] += mb.has_slices() ? mb.spans[e].length : x[i].lengths.input[mb.samples[e]];
      }
    }
    for (std::size_t smp = 0; smp < seen.size(); ++smp) CHECK(seen[smp] == x[i].lengths.input[smp]);
  }
}

TEST_CASE("epoch planner: encoder-decoder lengths give an empty side one token", "[interface]") {
  dl::Sampler sampler(demo(), spec(64).sampler);
  dl::GlobalBatch g;
  REQUIRE(sampler.next_batch(g));
  std::vector<packpipe::SampleRef> refs;
  const auto b = batch_lengths(demo(), g, true, 0, &refs);
  REQUIRE(b.input.size() == g.samples.size());
  REQUIRE(b.target.size() == g.samples.size());
  REQUIRE(refs == g.samples);
  bool empty_target = false;
  for (std::size_t i = 0; i < g.samples.size(); ++i) {
    const auto in = demo().input_length(g.samples[i]), tg = demo().target_length(g.samples[i]);
    CHECK(b.input[i] == std::max<std::uint32_t>(in, 1));
    CHECK(b.target[i] == std::max<std::uint32_t>(tg, 1));
    empty_target = empty_target || tg == 0;
  }
  CHECK(empty_target);  // the demo has decoder-only tasks: the rule is exercised
  const auto d = batch_lengths(demo(), g, false, 0);
  for (std::size_t i = 0; i < g.samples.size(); ++i) {
    CHECK(d.input[i] == demo().input_length(g.samples[i]) + demo().target_length(g.samples[i]));
  }
  CHECK(d.target.empty());
}

TEST_CASE("epoch planner: a resumed run plans the same iterations as an uninterrupted one", "[interface]") {
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  EpochSpec s = spec(48);
  EpochPlanner full(demo(), gpt, options(), s);
  const auto all = drain(full);
  REQUIRE(all.size() == full.iterations());
  REQUIRE(full.iterations() == full.epoch_iterations());
  REQUIRE(all.size() > 6);
  s.first_iteration = 4;
  s.iterations = 3;
  EpochPlanner part(demo(), gpt, options(), s);
  REQUIRE(part.iterations() == 3);
  const auto tail = drain(part);
  REQUIRE(tail.size() == 3);
  for (std::size_t i = 0; i < tail.size(); ++i) {
    CHECK(tail[i].iteration == 4 + i);
    CHECK(bytes(tail[i]) == bytes(all[4 + i]));
  }
  s.first_iteration = all.size();  // resumed at the end: nothing left
  s.iterations = 0;
  EpochPlanner end(demo(), gpt, options(), s);
  CHECK(end.iterations() == 0);
  PlannedIteration it;
  CHECK_FALSE(end.next(it));
  s.first_iteration = all.size() + 1;
  REQUIRE_THROWS_WITH(EpochPlanner(demo(), gpt, options(), s), Catch::Matchers::Contains("past the end"));
}

TEST_CASE("epoch planner: iterations before a failing one are delivered, then its error", "[negative]") {
  // 1 MB of memory: no sample fits, so the first iteration fails, naming itself.
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  PlannerOptions o = options();
  o.shape.memory_limit_mb = 30000;  // the model state fits; long samples may not
  o.partition.oversize = packpipe::partition::OversizePolicy::Error;
  EpochSpec s = spec(0, 65536);
  EpochPlanner ok(demo(), gpt, o, s);
  const auto all = drain(ok);
  REQUIRE(!all.empty());
  o.shape.memory_limit_mb = 1;
  EpochPlanner bad(demo(), gpt, o, s);
  PlannedIteration it;
  REQUIRE_THROWS_WITH(bad.next(it), Catch::Matchers::Contains("model state"));
  REQUIRE_THROWS_WITH(bad.next(it), Catch::Matchers::Contains("model state"));  // again on later calls
}

TEST_CASE("epoch planner: a consumer that stops early never hangs; bad settings are refused", "[negative]") {
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  const auto t0 = std::chrono::steady_clock::now();
  {
    EpochOptions eo;
    eo.depth = 1;
    EpochPlanner p(demo(), gpt, options(), spec(16), eo);
    PlannedIteration it;
    REQUIRE(p.next(it));
  }  // destroyed with iterations in flight
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
  REQUIRE_THROWS_AS(EpochPlanner(demo(), gpt, options(), spec(16, 4096)), packpipe::InvalidArgument);
  REQUIRE_THROWS_AS(EpochPlanner(demo(), gpt, options(), spec(0, 0)), packpipe::InvalidArgument);
  PlannerOptions bad = options();
  bad.schedule = "pipedream";
  REQUIRE_THROWS_WITH(EpochPlanner(demo(), gpt, bad, spec(16)), Catch::Matchers::Contains("pipedream"));
  EpochPlanner p(demo(), gpt, options(), spec(16));
  p.run([](PlannedIteration&) {});
  PlannedIteration it;
  REQUIRE_THROWS_WITH(p.next(it), Catch::Matchers::Contains("after run()"));
}

TEST_CASE("epoch planner: sample_batch is the planner's batch", "[interface]") {
  const EpochSpec s = spec(0, 4096);
  dl::Sampler sampler(demo(), s.sampler);
  dl::GlobalBatch g;
  for (int i = 0; i < 3; ++i) REQUIRE(sampler.next_batch(g));
  const SampledBatch b = sample_batch(demo(), s, 2, false);
  CHECK(b.iteration == 2);
  CHECK(b.refs == g.samples);
  REQUIRE_THROWS_WITH(sample_batch(demo(), s, 1u << 30, false), Catch::Matchers::Contains("past the end"));
}

TEST_CASE("epoch planner: epoch_iterations is the whole epoch's count under a token budget capped by iterations",
          "[interface]") {
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  EpochSpec s = spec(0, 4096);
  EpochPlanner whole(demo(), gpt, options(), s);
  REQUIRE(whole.iterations() == whole.epoch_iterations());
  REQUIRE(whole.epoch_iterations() > 4);
  s.iterations = 2;
  EpochPlanner capped(demo(), gpt, options(), s);
  CHECK(capped.iterations() == 2);
  CHECK(capped.epoch_iterations() == whole.epoch_iterations());  // was 2: the dry run stopped at the cap
  s.first_iteration = 3;
  EpochPlanner later(demo(), gpt, options(), s);
  CHECK(later.iterations() == 2);
  CHECK(later.epoch_iterations() == whole.epoch_iterations());
}
