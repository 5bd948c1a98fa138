// Varlen costs: a micro-batch packed into one row with varlen attention (costmodel::AttentionWork)
// on every cost model: equal segments cost what padded rows cost, attention follows the sums, more
// work never costs less, and impossible sums are refused.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "common/errors.h"
#include "tests/support/devices.h"
#include "costmodel/analytic.h"
#include "costmodel/profiled.h"
#include "costmodel/profile_readers.h"
#include "costmodel/stage_ops.h"
#include "tests/support/temp_dir.h"

namespace cm = packpipe::costmodel;
using packpipe::test::fixture;

namespace {

const std::string kDyn = "dynapipe/derived_from_cost_models_pkl/";

/// The query of one packed row of segments `lens` (and decoder segments `dec`).
cm::Query varlen(cm::LayerKind kind, const std::vector<std::int64_t>& lens, const std::vector<std::int64_t>& dec = {},
                 cm::Recompute rc = cm::Recompute::None) {
  cm::Query q;
  q.kind = kind;
  q.recompute = rc;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    const std::int64_t d = dec.empty() ? 0 : dec[i];
    q.seq += lens[i];
    q.dec_seq += d;
    q.attention.add(lens[i], d);
  }
  return q;
}

cm::Query dense(cm::LayerKind kind, std::int64_t mbs, std::int64_t seq, std::int64_t dec = 0,
                cm::Recompute rc = cm::Recompute::None) {
  cm::Query q;
  q.kind = kind;
  q.mbs = mbs;
  q.seq = seq;
  q.dec_seq = dec;
  q.recompute = rc;
  return q;
}

std::vector<std::unique_ptr<cm::CostModel>> gpt_models() {
  std::vector<std::unique_ptr<cm::CostModel>> out;
  out.push_back(std::make_unique<cm::AnalyticCostModel>(cm::load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB")));
  const std::vector<std::string> files = {fixture(kDyn + "gpt_6.7b_timing.csv"),
                                          fixture(kDyn + "gpt_6.7b_activation.csv")};
  out.push_back(cm::make_profiled_cost_model(files, cm::load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"),
                                             cm::ProfileInterpolation::Fit));
  out.push_back(cm::make_profiled_cost_model(files, cm::load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"),
                                             cm::ProfileInterpolation::Linear));
  return out;
}

}  // namespace

TEST_CASE("varlen: segments of one length cost what padded rows of that length cost", "[interface]") {
  for (const auto& m : gpt_models()) {
    INFO(m->describe());
    for (const std::int64_t len : {128, 512, 1024, 2048}) {
      for (const std::int64_t rows : {1, 2, 4}) {
        if (rows * len > 8192) continue;
        for (const cm::Recompute rc : {cm::Recompute::None, cm::Recompute::Selective, cm::Recompute::Full}) {
          const cm::LayerCost d = m->query(dense(cm::LayerKind::Encoder, rows, len, 0, rc));
          const cm::LayerCost v = m->query(varlen(cm::LayerKind::Encoder, std::vector<std::int64_t>(rows, len), {}, rc));
          CHECK(v.forward_ms == Approx(d.forward_ms).epsilon(1e-9));
          CHECK(v.backward_ms == Approx(d.backward_ms).epsilon(1e-9));
          CHECK(v.recompute_ms == Approx(d.recompute_ms).epsilon(1e-9));
          CHECK(v.stored_bytes == Approx(d.stored_bytes).epsilon(1e-9));
          CHECK(v.boundary_bytes == Approx(d.boundary_bytes).epsilon(1e-12));
        }
      }
    }
  }
}

TEST_CASE("varlen: attention follows the sums, and more work never costs less", "[boundary]") {
  std::mt19937_64 rng(7);
  for (const auto& m : gpt_models()) {
    INFO(m->describe());
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<std::int64_t> lens;
      const int n = 1 + static_cast<int>(rng() % 12);
      for (int i = 0; i < n; ++i) lens.push_back(16 + static_cast<std::int64_t>(rng() % 1500));
      std::vector<std::int64_t> more = lens;
      more.push_back(16 + static_cast<std::int64_t>(rng() % 1500));
      cm::LayerCost base, bigger;
      try {
        base = m->query(varlen(cm::LayerKind::Encoder, lens));
        bigger = m->query(varlen(cm::LayerKind::Encoder, more));
      } catch (const packpipe::InvalidArgument&) {
        // Only DynaPipe's interpolation refuses shapes (beyond its grid, at 1e100), as for padded rows.
        CHECK(m->describe().find("linear interpolation") != std::string::npos);
        continue;
      }
      // One more segment: more tokens and more attention.
      CHECK(bigger.total_ms() > base.total_ms());
      CHECK(bigger.stored_bytes > base.stored_bytes);
      // Two segments merged into one: the same tokens, more attention work.
      if (lens.size() >= 2) {
        std::vector<std::int64_t> merged(lens.begin() + 2, lens.end());
        merged.push_back(lens[0] + lens[1]);
        if (lens[0] + lens[1] <= 2048) {
          const cm::LayerCost longer = m->query(varlen(cm::LayerKind::Encoder, merged));
          CHECK(longer.total_ms() >= base.total_ms());
          CHECK(longer.stored_bytes >= base.stored_bytes * (1 - 1e-12));
        }
      }
      // The dense row of the same tokens (one long sequence, or the rows padded) costs at least as much.
      std::int64_t tokens = 0, longest = 0;
      for (auto l : lens) {
        tokens += l;
        longest = std::max(longest, l);
      }
      cm::LayerCost padded;
      try {
        padded = m->query(dense(cm::LayerKind::Encoder, n, longest));
      } catch (const packpipe::InvalidArgument&) {
        continue;  // beyond DynaPipe's grid: its interpolation refuses the padded rows (1e100)
      }
      CHECK(padded.total_ms() >= base.total_ms() * (1 - 1e-12));
      CHECK(padded.stored_bytes >= base.stored_bytes * (1 - 1e-12));
    }
  }
}

TEST_CASE("varlen: the analytic model charges attention by the sums exactly", "[interface]") {
  const cm::AnalyticCostModel m(cm::load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  // 4 x 512 tokens as one dense sequence of 2048 against four segments: the linear parts are the
  // same, so the stored bytes differ by the score terms only (proportional to the sums).
  const cm::LayerCost one = m.query(dense(cm::LayerKind::Encoder, 1, 2048));
  const cm::LayerCost four = m.query(varlen(cm::LayerKind::Encoder, {512, 512, 512, 512}));
  const cm::LayerCost eight = m.query(varlen(cm::LayerKind::Encoder, {256, 256, 256, 256, 256, 256, 256, 256}));
  const double s1 = 2048.0 * 2048, s4 = 4 * 512.0 * 512, s8 = 8 * 256.0 * 256;
  CHECK((one.stored_bytes - four.stored_bytes) / (one.stored_bytes - eight.stored_bytes) ==
        Approx((s1 - s4) / (s1 - s8)).epsilon(1e-9));
  CHECK(four.boundary_bytes == one.boundary_bytes);
  // FLOPs: forward_flops of the shape with the sums.
  const cm::LayerFlops f =
      cm::forward_flops(m.model(), cm::LayerKind::Encoder, cm::MicroShape{1, 2048, 0, {4 * 512 * 512, 0, 0}});
  const cm::LayerFlops g = cm::forward_flops(m.model(), cm::LayerKind::Encoder, 4, 512);
  CHECK(f.matmul == Approx(g.matmul));
  CHECK(f.attention == Approx(g.attention));
}

TEST_CASE("varlen: encoder-decoder rows charge self-, decoder- and cross-attention by their sums", "[interface]") {
  const cm::AnalyticCostModel t5(cm::load_model("t5-11b"), packpipe::test::eager_device("A100-40GB"));
  // Equal segments against padded rows, decoder layers included.
  for (const cm::LayerKind k : {cm::LayerKind::Encoder, cm::LayerKind::Decoder, cm::LayerKind::PostProcess}) {
    const cm::LayerCost d = t5.query(dense(k, 3, 256, 64));
    const cm::LayerCost v = t5.query(varlen(k, {256, 256, 256}, {64, 64, 64}));
    CHECK(v.total_ms() == Approx(d.total_ms()).epsilon(1e-9));
    CHECK(v.stored_bytes == Approx(d.stored_bytes).epsilon(1e-9));
  }
  // Unequal pairs cost less than their padded rows.
  const cm::LayerCost pv = t5.query(varlen(cm::LayerKind::Decoder, {900, 40, 300}, {10, 200, 64}));
  const cm::LayerCost pd = t5.query(dense(cm::LayerKind::Decoder, 3, 900, 200));
  CHECK(pv.total_ms() < pd.total_ms());
  CHECK(pv.stored_bytes < pd.stored_bytes);
}

TEST_CASE("varlen: impossible attention sums are refused naming them", "[negative]") {
  const cm::AnalyticCostModel m(cm::load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  cm::Query q = varlen(cm::LayerKind::Encoder, {100, 100});
  q.attention.self = 100;  // below the tokens (every segment holds a token)
  REQUIRE_THROWS_WITH(m.query(q), Catch::Matchers::Contains("attention sums"));
  q.attention.self = 200 * 200 + 1;  // above the dense row's
  REQUIRE_THROWS_WITH(m.query(q), Catch::Matchers::Contains("attention sums"));
  q = varlen(cm::LayerKind::Encoder, {100, 100});
  q.attention.dec_self = 5;  // decoder sums on a decoder-only model
  REQUIRE_THROWS_AS(m.query(q), packpipe::InvalidArgument);
  // A varlen query is one micro-batch: query_rows over sizes refuses it.
  std::vector<cm::LayerCost> rows(3);
  q = varlen(cm::LayerKind::Encoder, {100, 100});
  REQUIRE_THROWS_WITH(m.query_rows(q, 3, rows.data()), Catch::Matchers::Contains("one micro-batch"));
  CHECK(m.query_rows(q, 1, rows.data()) == 1);
  CHECK(rows[0].forward_ms == m.query(q).forward_ms);
}

TEST_CASE("varlen: stage op times and calibration tokens read the shape", "[interface]") {
  const cm::AnalyticCostModel m(cm::load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  const cm::StageLayout layout{4, 0, true, false};
  cm::MicroShape packed{1, 1024, 0, {}};
  for (int i = 0; i < 4; ++i) packed.attention.add(256, 0);
  const cm::MicroShape padded{4, 256, 0, {}};
  const cm::StageOpTimes a = cm::stage_op_times(m, layout, 1, packed, cm::Recompute::None);
  const cm::StageOpTimes b = cm::stage_op_times(m, layout, 1, padded, cm::Recompute::None);
  CHECK(a.forward_ms == Approx(b.forward_ms).epsilon(1e-9));
  CHECK(a.backward_weight_ms == Approx(b.backward_weight_ms).epsilon(1e-9));
  CHECK(cm::shape_tokens(m.model(), packed) == cm::shape_tokens(m.model(), padded));
}
