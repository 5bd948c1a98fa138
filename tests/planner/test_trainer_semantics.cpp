// What plans tell a trainer (plan format 2): stage layouts, balanced layer splits, loss tokens,
// the tied embedding's reduction, schedule filters and fallback; format-1 plans still read.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "plan/format.h"
#include "plan/validator.h"
#include "planner/planner.h"

using namespace packpipe::planner;
namespace part = packpipe::partition;
namespace sched = packpipe::schedule;
namespace pl = packpipe::plan;
namespace cm = packpipe::costmodel;

namespace {

part::BatchLengths batch(std::size_t n, std::uint64_t seed, bool encdec) {
  std::mt19937_64 rng(seed);
  part::BatchLengths b;
  for (std::size_t i = 0; i < n; ++i) {
    b.input.push_back(static_cast<std::uint32_t>(20 + rng() % 600));
    if (encdec) b.target.push_back(static_cast<std::uint32_t>(1 + rng() % 120));
  }
  return b;
}

PlannerOptions options(std::int64_t stages) {
  PlannerOptions o;
  o.shape.stages = stages;
  o.baselines = false;
  o.validate = true;
  return o;
}

}  // namespace

TEST_CASE("trainer plans: every stage's layers, embedding, head and loads", "[interface]") {
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  PlannerOptions o = options(4);
  o.shape.chunks = 2;
  o.shape.layers_per_stage = 3;
  const auto vs = part::virtual_stages(gpt.model(), o.shape);
  const IterationResult r = plan_iteration(batch(40, 1, false), nullptr, 0, gpt, vs, o);
  const pl::Plan& p = r.plans.front();
  REQUIRE(p.stages.size() == 8);
  for (std::uint32_t v = 0; v < 8; ++v) {
    CHECK(p.stages[v].encoder_begin == 3 * v);
    CHECK(p.stages[v].encoder_layers == 3);
    CHECK(p.stages[v].embedding == (v == 0));
    CHECK(p.stages[v].head == (v == 7));
    const std::uint8_t loads = v == 0 ? (pl::kLoadInputIds | pl::kLoadPositionIds) : v == 7 ? pl::kLoadLabels : 0;
    CHECK(p.stages[v].loads == loads);
  }
  CHECK(p.dtype == pl::Dtype::BF16);
  // Loads bring int64 token ids; every FWD carries its recompute mode.
  for (const auto& st : p.streams) {
    for (const auto& ins : st) {
      if (ins.op == pl::Opcode::LoadMb) CHECK(p.shapes[ins.shape].dtype == pl::Dtype::I64);
      if (ins.op == pl::Opcode::Forward) CHECK(ins.mode == p.recompute[p.at(ins.mb, ins.stage)]);
    }
  }
}

TEST_CASE("trainer plans: loss tokens by rule, targets only, and the weights they give", "[interface]") {
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  PlannerOptions o = options(2);
  o.shape.dp = 2;
  const auto vs = part::virtual_stages(gpt.model(), o.shape);
  part::BatchLengths b = batch(30, 2, false);
  // All tokens: n - 1 per sample.
  const IterationResult all = plan_iteration(b, nullptr, 0, gpt, vs, o);
  std::uint64_t expected = 0;
  for (auto n : b.input) expected += n - 1;
  double weights = 0;
  for (const auto& p : all.plans) {
    CHECK(p.global_loss_tokens == expected);
    for (const auto& mb : p.microbatches) {
      std::uint64_t mine = 0;
      for (std::size_t i = 0; i < mb.samples.size(); ++i) {
        CHECK(mb.lengths[i] == b.input[mb.samples[i]]);
        mine += mb.lengths[i] - 1;
      }
      CHECK(mb.loss_tokens == mine);
      CHECK(mb.loss_weight == static_cast<double>(mine) / static_cast<double>(expected));
      weights += mb.loss_weight;
    }
  }
  CHECK(weights == Approx(1.0));
  CHECK(pl::validate_replicas(all.plans).empty());
  // Targets only: the caller's counts, recorded with the mode.
  b.loss.assign(b.size(), 0);
  for (std::size_t i = 0; i < b.size(); i += 3) b.loss[i] = 7;
  o.loss_mode = pl::LossMode::Targets;
  const IterationResult tg = plan_iteration(b, nullptr, 0, gpt, vs, o);
  CHECK(tg.plans.front().loss_mode == pl::LossMode::Targets);
  CHECK(tg.plans.front().global_loss_tokens == 7 * ((b.size() + 2) / 3));
  // The same micro-batches and streams: only the weights and counts differ.
  CHECK(tg.plans.front().streams == all.plans.front().streams);
}

TEST_CASE("trainer plans: a truncated decoder-only sample loses one loss token per token cut", "[regression]") {
  // Input 10 + target 5 = 15 tokens, truncated to 12: 3 tokens cut off the end of the target.
  part::BatchLengths b;
  b.input = {15, 15, 15, 8};
  b.loss = {5, 14, 2, 7};  // targets only, all tokens, a short target, all tokens
  part::Partition split;
  split.lengths = b;
  split.lengths.input = {12, 12, 12, 8};
  const part::BatchLengths t = trained_lengths(b, split);
  CHECK(t.input == split.lengths.input);
  CHECK(t.loss == std::vector<std::uint32_t>{2, 11, 0, 7});
  // Encoder-decoder: at most the truncated target's tokens.
  b.target = {6, 1, 9, 3};
  b.loss = {6, 0, 9, 3};
  split.lengths = b;
  split.lengths.target = {4, 1, 9, 2};
  CHECK(trained_lengths(b, split).loss == std::vector<std::uint32_t>{4, 0, 9, 2});
}

TEST_CASE("trainer plans: a tied embedding closes with REDUCE_TIED on the first and last ranks", "[interface]") {
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  for (const std::int64_t S : {1, 2, 4}) {
    PlannerOptions o = options(S);
    o.tied_embedding = true;
    const auto vs = part::virtual_stages(gpt.model(), o.shape);
    const IterationResult r = plan_iteration(batch(24, 3, false), nullptr, 0, gpt, vs, o);
    const pl::Plan& p = r.plans.front();
    CHECK(p.tied_embedding);
    for (std::uint32_t rank = 0; rank < p.ranks; ++rank) {
      std::size_t tied = 0, step = 0, at = 0;
      for (std::size_t i = 0; i < p.streams[rank].size(); ++i) {
        if (p.streams[rank][i].op == pl::Opcode::ReduceTied) {
          ++tied;
          at = i;
        }
        if (p.streams[rank][i].op == pl::Opcode::OptStep) step = i;
      }
      const bool ends = S > 1 && (rank == 0 || rank == static_cast<std::uint32_t>(S - 1));
      INFO("S=" << S << " rank " << rank);
      CHECK(tied == (ends ? 1u : 0u));
      if (ends) CHECK(at < step);
    }
  }
  const cm::AnalyticCostModel t5(cm::load_model("t5-770m"), cm::load_device("A100-80GB"));
  PlannerOptions o = options(2);
  o.tied_embedding = true;
  const auto vs = part::virtual_stages(t5.model(), o.shape);
  REQUIRE_THROWS_WITH(plan_iteration(batch(10, 4, true), nullptr, 0, t5, vs, o),
                      Catch::Matchers::Contains("tied embedding is supported for decoder-only"));
}

TEST_CASE("trainer plans: balanced layer splits weigh the embedding and the head", "[interface]") {
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  part::PipelineShape shape;
  shape.stages = 4;
  const auto split = balanced_stage_layers(gpt, shape, 1, 2048);
  REQUIRE(split.size() == 4);
  CHECK(std::accumulate(split.begin(), split.end(), std::int64_t{0}) == gpt.model().num_layers);
  for (auto n : split) CHECK(n >= 1);
  CHECK(split.back() < split[1]);  // the head's stage holds fewer layers
  // No other split of contiguous layers has a smaller slowest stage.
  auto slowest = [&](const std::vector<std::int64_t>& s) {
    double worst = 0;
    for (std::size_t v = 0; v < s.size(); ++v) {
      cm::StageLayout l;
      l.encoder_layers = s[v];
      l.has_embedding = v == 0;
      l.has_postprocess = v + 1 == s.size();
      worst = std::max(worst, cm::stage_cost(gpt, l, 1, 1, 2048, 0, packpipe::Recompute::None).total_ms());
    }
    return worst;
  };
  const double best = slowest(split);
  const std::int64_t L = gpt.model().num_layers;
  for (std::int64_t a = 1; a < L; ++a)
    for (std::int64_t b = 1; a + b < L; ++b)
      for (std::int64_t c = 1; a + b + c < L; ++c) CHECK(slowest({a, b, c, L - a - b - c}) >= best - 1e-9);
  // Plans follow it.
  shape.stage_layers = split;
  PlannerOptions o = options(4);
  o.shape = shape;
  const auto vs = part::virtual_stages(gpt.model(), shape);
  const IterationResult r = plan_iteration(batch(20, 5, false), nullptr, 0, gpt, vs, o);
  for (std::size_t v = 0; v < 4; ++v) CHECK(r.plans.front().stages[v].encoder_layers == split[v]);
  shape.stage_layers = {5, 5, 5};
  REQUIRE_THROWS_WITH(part::virtual_stages(gpt.model(), shape),
                      Catch::Matchers::Contains("stage_layers (--layer-split) lists 3 stages"));
  shape.stage_layers = {20, 20, 1, 1};
  REQUIRE_THROWS_WITH(part::virtual_stages(gpt.model(), shape), Catch::Matchers::Contains("more than the 24 layers"));
}

TEST_CASE("trainer plans: schedule filters and the fallback of a named schedule", "[interface]") {
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  PlannerOptions o = options(4);
  o.allow_split_backward = false;
  const auto vs = part::virtual_stages(gpt.model(), o.shape);
  for (int t = 0; t < 6; ++t) {
    const IterationResult r = plan_iteration(batch(30, 10 + t, false), nullptr, 0, gpt, vs, o);
    CHECK(r.plans.front().schedule != "zero-bubble");
    for (const auto& st : r.plans.front().streams) {
      for (const auto& ins : st) CHECK(ins.op != pl::Opcode::BackwardInput);
    }
  }
  o.family = ScheduleFamily::Cyclic;
  const IterationResult c = plan_iteration(batch(30, 20, false), nullptr, 0, gpt, vs, o);
  CHECK((c.plans.front().schedule == "cyclic" || c.plans.front().schedule == "wait-free-cyclic"));
  // Interleaving: the partition's micro-batch count is a multiple of the stages (the count
  // constraint is in the search), for every batch and for both layouts.
  PlannerOptions il = options(4);
  il.shape.chunks = 2;
  il.schedule = "interleaved-1f1b";
  il.allow_split_backward = false;
  const auto vs2 = part::virtual_stages(gpt.model(), il.shape);
  using packpipe::Layout;
  using packpipe::LayoutSet;
  using packpipe::layout_bit;
  for (const LayoutSet layouts : {layout_bit(Layout::Padded), layout_bit(Layout::Packed),
                                  static_cast<LayoutSet>(layout_bit(Layout::Padded) | layout_bit(Layout::Packed))}) {
    il.partition.layouts = layouts;
    for (int t = 0; t < 10; ++t) {
      const IterationResult r = plan_iteration(batch(17 + t, 30 + t, false), nullptr, 0, gpt, vs2, il);
      CHECK(r.plans.front().schedule == "interleaved-1f1b");
      CHECK(r.plans.front().microbatches.size() % 4 == 0);
      CHECK(r.schedule_note.empty());
    }
  }
  // With data parallelism every replica runs a multiple of the stages (the replicas' split keeps
  // the counts even), on short and long-tail batches alike.
  il.partition.layouts = layout_bit(Layout::Padded) | layout_bit(Layout::Packed);
  for (const std::int64_t dp : {2, 3}) {
    PlannerOptions ild = il;
    ild.shape.dp = dp;
    for (int t = 0; t < 8; ++t) {
      part::BatchLengths b = batch(30 + 5 * t, 90 + t, false);
      if (t % 2 == 1) b.input.push_back(static_cast<std::uint32_t>(9000 + 1000 * t));
      const IterationResult r = plan_iteration(b, nullptr, 0, gpt, vs2, ild);
      REQUIRE(r.plans.size() == static_cast<std::size_t>(dp));
      std::size_t total = 0;
      for (const auto& p : r.plans) {
        CHECK(p.schedule == "interleaved-1f1b");
        CHECK(p.microbatches.size() % 4 == 0);
        CHECK(!p.microbatches.empty());
        for (const auto& mb : p.microbatches) total += mb.samples.size();
      }
      CHECK(total == b.input.size());
      CHECK(r.schedule_note.empty());
    }
  }
  // A batch too small for a multiple of the stages: an error naming the fallback, or the fallback.
  const auto tiny = batch(2, 40, false);
  REQUIRE_THROWS_WITH(plan_iteration(tiny, nullptr, 0, gpt, vs2, il), Catch::Matchers::Contains("allow a fallback"));
  il.fallback = true;
  const IterationResult r = plan_iteration(tiny, nullptr, 0, gpt, vs2, il);
  CHECK_THAT(r.schedule_note, Catch::Matchers::Contains("cannot run"));
  CHECK(r.plans.front().schedule != "interleaved-1f1b");
  CHECK(r.plans.front().schedule != "zero-bubble");  // the fallback keeps the filters
  // Slices are a choice, never forced on a schedule that cannot run them: a batch the search plans
  // with slices plans without them under a named interleaved 1F1B (without the fallback), and
  // with a list of allowed kinds that holds only it.
  {
    part::BatchLengths longb = batch(24, 77, false);
    longb.input.push_back(24000);
    longb.input.push_back(16000);
    auto sliced = [](const IterationResult& x) {
      for (const auto& mb : x.plans.front().microbatches) {
        if (mb.has_slices()) return true;
      }
      return false;
    };
    PlannerOptions searched = options(4);
    searched.shape.chunks = 2;
    searched.allow_split_backward = false;
    const IterationResult free = plan_iteration(longb, nullptr, 0, gpt, vs2, searched);
    REQUIRE(sliced(free));  // (what the named schedule must not get)
    PlannerOptions named = searched;
    named.schedule = "interleaved-1f1b";
    const IterationResult n = plan_iteration(longb, nullptr, 0, gpt, vs2, named);
    CHECK_FALSE(sliced(n));
    CHECK(n.plans.front().schedule == "interleaved-1f1b");
    CHECK(n.schedule_note.empty());
    PlannerOptions listed = searched;
    listed.search.schedules = {sched::ScheduleKind::Interleaved1F1B};
    const IterationResult l = plan_iteration(longb, nullptr, 0, gpt, vs2, listed);
    CHECK_FALSE(sliced(l));
    CHECK(l.plans.front().schedule == "interleaved-1f1b");
    // The 1F1B family with chunks: interleaved 1F1B is the only kind that runs the shape, so the
    // same holds, and the count is a multiple of the stages (as the CLI's --schedule-family 1f1b).
    PlannerOptions family = searched;
    family.family = ScheduleFamily::OneFOneB;
    for (const bool off : {false, true}) {
      family.partition.slicing = off ? part::SlicePolicy::Off : part::SlicePolicy::Auto;
      for (std::uint64_t seed : {77u, 78u, 79u}) {
        part::BatchLengths fb = batch(24 + seed % 3, seed, false);
        fb.input.push_back(24000);
        const IterationResult f = plan_iteration(fb, nullptr, 0, gpt, vs2, family);
        CHECK_FALSE(sliced(f));
        CHECK(f.plans.front().schedule == "interleaved-1f1b");
        CHECK(f.plans.front().microbatches.size() % 4 == 0);
      }
    }
    // With the fallback the slices stay a choice (the search runs them).
    named.fallback = true;
    CHECK(sliced(plan_iteration(longb, nullptr, 0, gpt, vs2, named)));
    // A sample that fits only sliced (oversize=slice) under a schedule that cannot run slices: refused,
    // naming the sample and why.
    PlannerOptions tight = searched;
    tight.schedule = "interleaved-1f1b";
    tight.shape.memory_limit_mb = 30000;
    tight.partition.oversize = part::OversizePolicy::Slice;
    part::BatchLengths huge = batch(8, 5, false);
    huge.input.push_back(60000);  // (over 30000 MB alone, within it in slices)
    PlannerOptions whole = searched;
    whole.shape.memory_limit_mb = 30000;
    whole.partition.slicing = part::SlicePolicy::Off;
    REQUIRE_THROWS_WITH(plan_iteration(huge, nullptr, 0, gpt, vs2, whole), Catch::Matchers::Contains("alone"));
    REQUIRE_THROWS_WITH(plan_iteration(huge, nullptr, 0, gpt, vs2, tight),
                        Catch::Matchers::Contains("sample 8 of the global batch") &&
                            Catch::Matchers::Contains("not run by interleaved-1f1b") &&
                            !Catch::Matchers::Contains("or slice"));
    PlannerOptions asked_error = tight;  // the same without --oversize slice
    asked_error.partition.oversize = part::OversizePolicy::Error;
    REQUIRE_THROWS_WITH(plan_iteration(huge, nullptr, 0, gpt, vs2, asked_error),
                        Catch::Matchers::Contains("not run by interleaved-1f1b") &&
                            !Catch::Matchers::Contains("or slice"));
    tight.fallback = true;  // sliced, under another schedule
    const IterationResult t = plan_iteration(huge, nullptr, 0, gpt, vs2, tight);
    CHECK(sliced(t));
    CHECK(t.plans.front().schedule != "interleaved-1f1b");
  }
  PlannerOptions bad = options(4);
  bad.schedule = "zero-bubble";
  bad.allow_split_backward = false;
  REQUIRE_THROWS_WITH(check_planner_options(bad), Catch::Matchers::Contains("splits the backward"));
  bad.schedule = "search";
  bad.family = ScheduleFamily::ZeroBubble;
  REQUIRE_THROWS_WITH(check_planner_options(bad), Catch::Matchers::Contains("no schedule is allowed"));
  for (const double g : {-0.1, 1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    PlannerOptions margin = options(4);
    margin.min_gain = g;
    REQUIRE_THROWS_WITH(check_planner_options(margin), Catch::Matchers::Contains("min_gain"));
  }
}

TEST_CASE("trainer plans: format-1 files and JSON still read, without the trainer's tables", "[interface][regression]") {
  const std::string dir = std::string(PACKPIPE_SOURCE_DIR) + "/tests/data/";
  const pl::PlanFileReader r(dir + "format1_t5_1f1b.plans");
  REQUIRE(r.size() > 0);
  const pl::Plan p = r.read(0);
  CHECK_FALSE(p.has_stage_specs());
  CHECK(pl::validate(p).ok());
  for (const auto& st : p.streams) {
    for (const auto& ins : st) {
      if (ins.op == pl::Opcode::Forward) CHECK(ins.mode == p.recompute[p.at(ins.mb, ins.stage)]);
    }
  }
  std::ifstream f(dir + "format1_zero_bubble.json");
  std::stringstream ss;
  ss << f.rdbuf();
  const pl::Plan q = pl::plan_from_json(ss.str(), "format1_zero_bubble.json");
  CHECK_FALSE(q.has_stage_specs());
  CHECK(pl::validate(q).ok());
  // A format-2 plan round-trips with its tables, binary and JSON.
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  PlannerOptions o = options(2);
  o.tied_embedding = true;
  const auto vs = part::virtual_stages(gpt.model(), o.shape);
  const pl::Plan x = plan_iteration(batch(12, 6, false), nullptr, 0, gpt, vs, o).plans.front();
  const auto blob = pl::encode_plan(x);
  CHECK(pl::decode_plan(blob.data(), blob.size()) == x);
  CHECK(pl::plan_from_json(pl::plan_to_json(x)) == x);
}

TEST_CASE("layouts: plans record each micro-batch's layout, round-trip it and validate it", "[interface][regression]") {
  const cm::AnalyticCostModel gpt(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  PlannerOptions o = options(2);
  o.baselines = false;
  const auto vs = part::virtual_stages(gpt.model(), o.shape);
  std::set<packpipe::Layout> seen;
  for (const packpipe::LayoutSet layouts :
       {packpipe::layout_bit(packpipe::Layout::Padded), packpipe::layout_bit(packpipe::Layout::Packed)}) {
    o.partition.layouts = layouts;
    const pl::Plan p = plan_iteration(batch(40, 21, false), nullptr, 0, gpt, vs, o).plans.front();
    REQUIRE(pl::validate(p).ok());
    for (const auto& mb : p.microbatches) {
      seen.insert(mb.layout);
      if (mb.layout == packpipe::Layout::Packed) {
        // one row of every sample back to back, no padding
        CHECK(mb.rows == 1);
        std::uint64_t tokens = 0;
        for (auto l : mb.lengths) tokens += l;
        CHECK(mb.padded_len == tokens);
      }
    }
    const auto blob = pl::encode_plan(p);
    CHECK(pl::decode_plan(blob.data(), blob.size()) == p);
    CHECK(pl::plan_from_json(pl::plan_to_json(p)) == p);
    // The layout is written: a plan with every layout flipped reads back flipped.
    pl::Plan flipped = p;
    for (auto& mb : flipped.microbatches) {
      mb.layout = mb.layout == packpipe::Layout::Packed ? packpipe::Layout::PackedMask : mb.layout;
    }
    if (!(flipped == p)) {
      const auto fb = pl::encode_plan(flipped);
      CHECK(pl::decode_plan(fb.data(), fb.size()).microbatches.front().layout == flipped.microbatches.front().layout);
    }
  }
  CHECK(seen.count(packpipe::Layout::Padded) == 1);
  CHECK(seen.count(packpipe::Layout::Packed) == 1);
  // Older plans: layouts implied by their rows (format 1 has packed rows as row offsets).
  const std::string dir = std::string(PACKPIPE_SOURCE_DIR) + "/tests/data/";
  const pl::Plan old = pl::PlanFileReader(dir + "format1_t5_1f1b.plans").read(0);
  for (const auto& mb : old.microbatches) {
    CHECK(mb.layout == (mb.row_offsets.empty() ? packpipe::Layout::Padded : packpipe::Layout::PackedMask));
  }
  // What the validator refuses: a packed micro-batch of several rows or of a row that is not its
  // samples' tokens, padded rows with row offsets, an unknown layout value.
  o.partition.layouts = packpipe::layout_bit(packpipe::Layout::Packed);
  const pl::Plan p = plan_iteration(batch(30, 22, false), nullptr, 0, gpt, vs, o).plans.front();
  REQUIRE(p.microbatches.front().layout == packpipe::Layout::Packed);
  pl::Plan bad = p;
  bad.microbatches.front().padded_len += 1;
  REQUIRE_THROWS_WITH(pl::validate_or_throw(bad), Catch::Matchers::Contains("layout packed"));
  bad = p;
  bad.microbatches.front().layout = packpipe::Layout::Padded;
  bad.microbatches.front().row_offsets = {0, static_cast<std::uint32_t>(bad.microbatches.front().samples.size())};
  REQUIRE_THROWS_WITH(pl::validate_or_throw(bad), Catch::Matchers::Contains("layout padded"));
  bad = p;
  bad.microbatches.front().layout = static_cast<packpipe::Layout>(7);
  REQUIRE_THROWS_WITH(pl::validate_or_throw(bad), Catch::Matchers::Contains("unknown layout"));
  std::string json = pl::plan_to_json(p);
  const auto at = json.find("\"layout\": \"packed\"");
  REQUIRE(at != std::string::npos);
  json.replace(at, std::string("\"layout\": \"packed\"").size(), "\"layout\": \"varlen\"");
  REQUIRE_THROWS_WITH(pl::plan_from_json(json), Catch::Matchers::Contains("layout"));
}
