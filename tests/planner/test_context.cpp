// The context length (planner/context.h): the loss count of whole samples, truncated ones and
// chunks; batch_lengths under truncate, drop and split; lengths given directly (plan_iteration,
// limit_lengths); the demo manifest planned and loaded under each policy with every position below
// the context length; determinism; the messages of what a model cannot take.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "dataloader/manifest.h"
#include "dataloader/multitask.h"
#include "dataloader/sampler.h"
#include "plan/format.h"
#include "plan/validator.h"
#include "planner/context.h"
#include "planner/epoch.h"
#include "planner/loader.h"

using namespace packpipe::planner;
namespace cm = packpipe::costmodel;
namespace dl = packpipe::dataloader;
namespace part = packpipe::partition;
namespace pl = packpipe::plan;
using Catch::Matchers::Contains;
using packpipe::SampleRef;

namespace {

const dl::MultiTaskDataset& demo() {
  static const dl::MultiTaskDataset d(dl::load_manifest(std::string(PACKPIPE_SOURCE_DIR) + "/data/demo/manifest.json"));
  return d;
}

const cm::AnalyticCostModel& gpt() {
  static const cm::AnalyticCostModel c(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
  return c;
}

const cm::AnalyticCostModel& t5() {
  static const cm::AnalyticCostModel c(cm::load_model("t5-770m"), cm::load_device("A100-80GB"));
  return c;
}

EpochSpec spec(std::uint64_t tokens, std::uint64_t iterations, std::uint64_t seed = 7) {
  EpochSpec s;
  s.sampler = dl::sampler_config(demo().manifest());
  s.sampler.seed = seed;
  s.sampler.global_batch_tokens = tokens;
  s.iterations = iterations;
  return s;
}

ContextLength context(std::uint32_t max_seq_len, SeqPolicy policy, std::uint32_t max_target_len = 0) {
  ContextLength c;
  c.max_seq_len = max_seq_len;
  c.max_target_len = max_target_len;
  c.policy = policy;
  return c;
}

/// The first global batch of the demo holding a sample longer than `tokens` (decoder-only count).
dl::GlobalBatch batch_with_long_sample(std::uint64_t tokens) {
  dl::Sampler sampler(demo(), spec(65536, 0).sampler);
  dl::GlobalBatch g;
  while (sampler.next_batch(g)) {
    for (const auto& r : g.samples) {
      if (std::uint64_t{demo().input_length(r)} + demo().target_length(r) > tokens) return g;
    }
  }
  FAIL("no batch of the demo holds a sample over " << tokens << " tokens");
  return g;
}

std::uint32_t whole(const SampleRef& r) { return demo().input_length(r) + demo().target_length(r); }

}  // namespace

TEST_CASE("context: loss tokens of whole samples, truncated ones and chunks", "[interface]") {
  using pl::LossMode;
  // A sample of 10 input and 6 target tokens.
  CHECK(decoder_only_loss(16, 10, 0, LossMode::AllTokens) == 15);
  CHECK(decoder_only_loss(16, 10, 0, LossMode::Targets) == 6);
  CHECK(decoder_only_loss(12, 10, 0, LossMode::Targets) == 2);  // truncated: 4 targets cut, 4 losses
  CHECK(decoder_only_loss(10, 10, 0, LossMode::Targets) == 0);  // only the input kept
  // Chunks of 5 are samples of their own: [0, 5) and [5, 10) hold input only (the first target token
  // would be predicted from position 9, the last of its chunk: no label there), [10, 15) starts
  // inside the target (4 labels), [15, 16) is one token (none).
  CHECK(decoder_only_loss(5, 10, 0, LossMode::Targets) == 0);
  CHECK(decoder_only_loss(5, 10, 5, LossMode::Targets) == 0);
  CHECK(decoder_only_loss(5, 10, 10, LossMode::Targets) == 4);
  CHECK(decoder_only_loss(1, 10, 15, LossMode::Targets) == 0);
  CHECK(decoder_only_loss(5, 10, 8, LossMode::Targets) == 3);  // straddles: positions 1, 2, 3 predict targets 0-2
  CHECK(decoder_only_loss(5, 10, 5, LossMode::AllTokens) == 4);
  // An empty input: every next token is a target token.
  CHECK(decoder_only_loss(8, 0, 0, LossMode::Targets) == 7);
  CHECK(decoder_only_loss(4, 0, 4, LossMode::Targets) == 3);
  CHECK(decoder_only_loss(0, 3, 0, LossMode::AllTokens) == 0);
}

TEST_CASE("context: batch_lengths truncates, drops or splits the samples over the context length", "[interface]") {
  constexpr std::uint32_t L = 1024;
  const dl::GlobalBatch g = batch_with_long_sample(L);
  std::size_t over = 0;
  std::uint64_t chunks = 0, tokens = 0;
  for (const auto& r : g.samples) {
    over += whole(r) > L ? 1 : 0;
    chunks += (whole(r) + L - 1) / L;
    tokens += whole(r);
  }
  REQUIRE(over > 0);
  for (const pl::LossMode loss : {pl::LossMode::AllTokens, pl::LossMode::Targets}) {
    INFO("loss " << pl::loss_mode_name(loss));
    const part::BatchLengths none = batch_lengths(demo(), g, false, 3, nullptr, loss);

    std::vector<SampleRef> refs;
    ContextReport r;
    const part::BatchLengths t = batch_lengths(demo(), g, false, 3, &refs, loss, context(L, SeqPolicy::Truncate), &r);
    CHECK(r.truncated == over);
    CHECK(r.dropped + r.split + r.chunks == 0);
    REQUIRE(t.size() == g.samples.size());
    CHECK(refs == g.samples);
    for (std::size_t k = 0; k < t.size(); ++k) {
      CHECK(t.input[k] == std::min(whole(g.samples[k]), L));
      CHECK(t.loss[k] == decoder_only_loss(t.input[k], demo().input_length(g.samples[k]), 0, loss));
      if (t.input[k] == none.input[k]) CHECK(t.loss[k] == none.loss[k]);
    }

    refs.clear();
    const part::BatchLengths d = batch_lengths(demo(), g, false, 3, &refs, loss, context(L, SeqPolicy::Drop), &r);
    CHECK(r.dropped == over);
    REQUIRE(r.dropped_samples.size() == over);
    REQUIRE(r.dropped_refs.size() == over);
    CHECK(d.size() == g.samples.size() - over);
    for (std::size_t k = 0; k < over; ++k) {
      CHECK(whole(g.samples[r.dropped_samples[k]]) > L);
      CHECK(r.dropped_refs[k] == g.samples[r.dropped_samples[k]]);
    }
    for (std::size_t k = 0; k < d.size(); ++k) CHECK(d.input[k] == whole(refs[k]));

    refs.clear();
    const part::BatchLengths s = batch_lengths(demo(), g, false, 3, &refs, loss, context(L, SeqPolicy::Split), &r);
    CHECK(r.split == over);
    CHECK(s.size() == chunks);
    CHECK(r.chunks == chunks - (g.samples.size() - over));  // the chunks the split samples became
    std::uint64_t sum = 0;
    std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> next;  // each sample's next chunk offset
    for (std::size_t k = 0; k < s.size(); ++k) {
      CHECK(s.input[k] <= L);
      CHECK(s.input[k] > 0);
      auto& at = next[{refs[k].task, refs[k].index}];
      CHECK(refs[k].offset == at);  // consecutive, in order
      at += s.input[k];
      CHECK(s.loss[k] == decoder_only_loss(s.input[k], demo().input_length(refs[k]), refs[k].offset, loss));
      sum += s.input[k];
    }
    CHECK(sum == tokens);  // no token lost
    for (const auto& [key, end] : next) CHECK(end == whole(SampleRef{key.first, key.second}));

    // The same batch with no context length: the lengths of old.
    refs.clear();
    const part::BatchLengths n = batch_lengths(demo(), g, false, 3, &refs, loss, ContextLength{}, &r);
    CHECK(n.input == none.input);
    CHECK(n.loss == none.loss);
    CHECK(r == ContextReport{});
  }
}

TEST_CASE("context: encoder-decoder samples are cut per side; split is refused", "[interface][negative]") {
  const dl::GlobalBatch g = batch_with_long_sample(1024);
  const ContextLength c = context(1024, SeqPolicy::Truncate, 64);
  ContextReport r;
  const part::BatchLengths none = batch_lengths(demo(), g, true, 0);
  const part::BatchLengths t = batch_lengths(demo(), g, true, 0, nullptr, pl::LossMode::AllTokens, c, &r);
  REQUIRE(t.size() == g.samples.size());
  std::uint64_t over = 0;
  for (std::size_t k = 0; k < t.size(); ++k) {
    CHECK(t.input[k] == std::min<std::uint32_t>(none.input[k], 1024));
    CHECK(t.target[k] == std::min<std::uint32_t>(none.target[k], 64));
    CHECK(t.loss[k] == std::min<std::uint32_t>(demo().target_length(g.samples[k]), t.target[k]));
    over += none.input[k] > 1024 || none.target[k] > 64 ? 1 : 0;
  }
  CHECK(r.truncated == over);
  REQUIRE(over > 0);
  // max_target_len alone limits the decoder side only.
  const part::BatchLengths dec = batch_lengths(demo(), g, true, 0, nullptr, pl::LossMode::AllTokens,
                                               context(0, SeqPolicy::Drop, 64), &r);
  CHECK(r.dropped > 0);
  for (std::size_t k = 0; k < dec.size(); ++k) CHECK(dec.target[k] <= 64);

  REQUIRE_THROWS_WITH(batch_lengths(demo(), g, true, 0, nullptr, pl::LossMode::AllTokens, context(1024, SeqPolicy::Split)),
                      Contains("seq_policy 'split' is for decoder-only models") && Contains("use 'truncate' or 'drop'"));
  REQUIRE_THROWS_WITH(batch_lengths(demo(), g, false, 0, nullptr, pl::LossMode::AllTokens,
                                    context(1024, SeqPolicy::Truncate, 64)),
                      Contains("max_target_len 64 is for encoder-decoder models"));
  // The planner refuses them before planning, naming the options as the caller set them.
  PlannerOptions o;
  o.baselines = false;
  o.shape.stages = 2;
  o.context = context(1024, SeqPolicy::Split);
  o.context.policy_option = "--seq-policy";
  REQUIRE_THROWS_WITH(EpochPlanner(demo(), t5(), o, spec(8192, 1)), Contains("--seq-policy 'split'"));
}

TEST_CASE("context: lengths given directly are truncated or dropped; sample ids stay the caller's", "[interface]") {
  part::BatchLengths b;
  b.input = {100, 3000, 40, 2000, 7};
  b.loss = {99, 2000, 39, 1999, 6};
  std::vector<SampleRef> refs = {{0, 1}, {0, 2}, {1, 3}, {1, 4}, {2, 5}};
  std::vector<std::uint32_t> kept;
  part::BatchLengths t = b;
  std::vector<SampleRef> tr = refs;
  ContextReport r = limit_lengths(t, &tr, context(1024, SeqPolicy::Truncate), 0, &kept);
  CHECK(r.truncated == 2);
  CHECK(t.input == std::vector<std::uint32_t>{100, 1024, 40, 1024, 7});
  CHECK(t.loss == std::vector<std::uint32_t>{99, 24, 39, 1023, 6});  // one loss token per token cut
  CHECK(tr == refs);
  CHECK(kept == std::vector<std::uint32_t>{0, 1, 2, 3, 4});
  part::BatchLengths d = b;
  std::vector<SampleRef> dr = refs;
  r = limit_lengths(d, &dr, context(1024, SeqPolicy::Drop), 0, &kept);
  CHECK(r.dropped == 2);
  CHECK(r.dropped_samples == std::vector<std::uint32_t>{1, 3});
  CHECK(r.dropped_refs == std::vector<SampleRef>{{0, 2}, {1, 4}});
  CHECK(d.input == std::vector<std::uint32_t>{100, 40, 7});
  CHECK(dr == std::vector<SampleRef>{{0, 1}, {1, 3}, {2, 5}});
  CHECK(kept == std::vector<std::uint32_t>{0, 2, 4});
  part::BatchLengths s = b;
  REQUIRE_THROWS_WITH(limit_lengths(s, nullptr, context(1024, SeqPolicy::Split), 5),
                      Contains("iteration 5: sample 1 has 3000 tokens, more than max_seq_len 1024") &&
                          Contains("not in lengths given directly"));

  // plan_iteration applies it: the micro-batches name positions in the lengths given, a dropped
  // sample in none of them; the trained lengths are 0 there; the plans record the context length.
  PlannerOptions o;
  o.baselines = false;
  o.validate = true;
  o.shape.stages = 2;
  o.context = context(1024, SeqPolicy::Drop);
  const auto vs = part::virtual_stages(gpt().model(), o.shape);
  const IterationResult dropped = plan_iteration(b, &refs, 0, gpt(), vs, o);
  CHECK(dropped.context.dropped == 2);
  CHECK(dropped.context.dropped_samples == std::vector<std::uint32_t>{1, 3});
  CHECK(dropped.samples == 3);
  CHECK(dropped.tokens == 147);
  CHECK(dropped.trained.input == std::vector<std::uint32_t>{100, 0, 40, 0, 7});
  CHECK(dropped.trained.loss == std::vector<std::uint32_t>{99, 0, 39, 0, 6});
  std::vector<std::uint32_t> ids;
  for (const auto& p : dropped.plans) {
    CHECK(p.max_seq_len == 1024);
    for (const auto& mb : p.microbatches) {
      for (std::size_t i = 0; i < mb.samples.size(); ++i) {
        ids.push_back(mb.samples[i]);
        CHECK(mb.refs[i] == refs[mb.samples[i]]);
        CHECK(mb.lengths[i] == b.input[mb.samples[i]]);
      }
    }
  }
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<std::uint32_t>{0, 2, 4});
  std::vector<std::uint32_t> partitioned;
  for (const auto& mb : dropped.partition.microbatches) partitioned.insert(partitioned.end(), mb.samples.begin(), mb.samples.end());
  std::sort(partitioned.begin(), partitioned.end());
  CHECK(partitioned == ids);

  o.context.policy = SeqPolicy::Truncate;
  const IterationResult truncated = plan_iteration(b, &refs, 0, gpt(), vs, o);
  CHECK(truncated.context.truncated == 2);
  CHECK(truncated.samples == 5);
  CHECK(truncated.trained.input == std::vector<std::uint32_t>{100, 1024, 40, 1024, 7});
  CHECK(truncated.trained.loss == std::vector<std::uint32_t>{99, 24, 39, 1023, 6});
  // Within the context length nothing changes but the record in the plans.
  o.context.max_seq_len = 4096;
  const IterationResult within = plan_iteration(b, &refs, 0, gpt(), vs, o);
  CHECK(within.context == ContextReport{});
  CHECK(within.trained.input == b.input);
  o.context = ContextLength{};
  const IterationResult plain = plan_iteration(b, &refs, 0, gpt(), vs, o);
  REQUIRE(plain.plans.size() == within.plans.size());
  for (std::size_t k = 0; k < plain.plans.size(); ++k) {
    pl::Plan p = within.plans[k];
    CHECK(p.max_seq_len == 4096);
    p.max_seq_len = 0;
    CHECK(p == plain.plans[k]);
  }
  o.context = context(4, SeqPolicy::Drop);
  REQUIRE_THROWS_WITH(plan_iteration(b, &refs, 2, gpt(), vs, o),
                      Contains("iteration 2: every sample of the global batch is over max_seq_len 4"));
}

TEST_CASE("context: the demo planned and loaded under each policy keeps every position below 1024",
          "[interface][regression]") {
  // The crash: a model with 1,024 positions indexed past its table at the demo's first
  // iterations. Every plan's lengths and every position id a loader emits stay below 1024.
  constexpr std::uint32_t L = 1024;
  for (const SeqPolicy policy : {SeqPolicy::Truncate, SeqPolicy::Drop, SeqPolicy::Split}) {
    INFO("seq_policy " << seq_policy_name(policy));
    PlannerOptions o;
    o.baselines = false;
    o.validate = true;
    o.shape.stages = 2;
    o.shape.dp = 2;
    o.context = context(L, policy);
    o.partition.method = part::PartitionMethod::Tokens;  // the method, its 64-token budget too small
    o.partition.token_budget = 64;
    auto planner = std::make_unique<EpochPlanner>(demo(), gpt(), o, spec(32768, 4));
    RankLoaderOptions lo;
    lo.rank = -1;  // every rank's loads
    RankLoader loader(demo(), std::move(planner), lo);
    RankIteration it;
    std::uint64_t loads = 0, positions = 0, over_before = 0;
    while (loader.next(it)) {
      REQUIRE(it.plan.max_seq_len == L);
      for (const auto& mb : it.plan.microbatches) {
        for (const auto len : mb.lengths) CHECK(len <= L);
        for (const auto& ref : mb.refs) over_before += whole(ref) > L ? 1 : 0;
      }
      for (const auto& t : it.loads) {
        ++loads;
        for (const auto p : t.position_ids) {
          CHECK(p >= 0);
          CHECK(p < L);
          ++positions;
        }
      }
      for (std::size_t m = 0; m < it.plan.microbatches.size(); ++m) {
        for (const auto p : microbatch_layout(it.plan, m).position_ids) CHECK(p < static_cast<std::int32_t>(L));
      }
    }
    CHECK(loads > 0);
    CHECK(positions > 0);
    // Samples over the context length were in these batches: truncated or split ones are planned,
    // dropped ones are not.
    if (policy == SeqPolicy::Drop) {
      CHECK(over_before == 0);
    } else {
      CHECK(over_before > 0);
    }
  }
}

TEST_CASE("context: the same inputs give byte-identical plans whatever the threads", "[interface]") {
  PlannerOptions o;
  o.baselines = false;
  o.shape.stages = 2;
  o.context = context(512, SeqPolicy::Split);
  std::vector<std::vector<std::uint8_t>> runs[2];
  for (int threads : {1, 2}) {
    EpochOptions eo;
    eo.threads = threads;
    eo.encode = true;
    EpochPlanner p(demo(), gpt(), o, spec(16384, 6, 11), eo);
    p.run([&](PlannedIteration& it) {
      for (auto& b : it.blobs) runs[threads - 1].push_back(std::move(b));
    });
  }
  REQUIRE(runs[0].size() == 6);
  CHECK(runs[0] == runs[1]);
  // and the chunks are in the plans: some ref with an offset, decoded back
  bool chunk = false;
  for (const auto& b : runs[0]) {
    const pl::Plan p = pl::decode_plan(b.data(), b.size());
    CHECK(pl::validate(p).ok());
    for (const auto& mb : p.microbatches) {
      for (const auto& r : mb.refs) chunk = chunk || r.offset > 0;
    }
  }
  CHECK(chunk);
}
