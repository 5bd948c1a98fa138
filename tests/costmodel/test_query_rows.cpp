// CostModel::query_rows (batch queries over consecutive micro-batch sizes): every row is
// bit-identical to query() on the analytic and the profiled models (DynaPipe GPT-6.7B and
// T5-11B fixtures), the batch stops exactly at the first size query() refuses, and the
// default implementation keeps the same contract for any model.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "costmodel/profiled.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::costmodel;
using packpipe::test::fixture;

namespace {

const std::string kDyn = "dynapipe/derived_from_cost_models_pkl/";

std::vector<std::string> gpt_files() {
  return {fixture(kDyn + "gpt_6.7b_timing.csv"), fixture(kDyn + "gpt_6.7b_activation.csv"),
          fixture(kDyn + "gpt_6.7b_model_state.csv")};
}

std::vector<std::string> t5_files() {
  return {fixture(kDyn + "t5_11b_timing.csv"), fixture(kDyn + "t5_11b_activation.csv")};
}

Profile gpt_profile() { return load_profiles(gpt_files()); }
Profile t5_profile() { return load_profiles(t5_files()); }

/// With the analytic fallback for what the profile lacks.
std::unique_ptr<CostModel> gpt_with_fallback() {
  return make_profiled_cost_model(gpt_files(), load_model("gpt-6.7b"), load_device("A100-40GB"));
}
std::unique_ptr<CostModel> t5_with_fallback() {
  return make_profiled_cost_model(t5_files(), load_model("t5-11b"), load_device("A100-40GB"));
}

std::uint64_t bits(double x) {
  std::uint64_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

bool same(const LayerCost& a, const LayerCost& b) {
  return bits(a.forward_ms) == bits(b.forward_ms) && bits(a.backward_ms) == bits(b.backward_ms) &&
         bits(a.recompute_ms) == bits(b.recompute_ms) && bits(a.stored_bytes) == bits(b.stored_bytes) &&
         bits(a.peak_bytes) == bits(b.peak_bytes) && bits(a.boundary_bytes) == bits(b.boundary_bytes) &&
         a.time_source == b.time_source && a.memory_source == b.memory_source;
}

LayerCost sentinel() {
  LayerCost c;
  c.forward_ms = -1234.5;
  c.stored_bytes = -6789.0;
  return c;
}

std::string describe(const Query& q) {
  return fmt::format("{} tp {} rc {} layers {} mbs {} seq {} dec {}", layer_kind_name(q.kind), q.tp,
                     recompute_name(q.recompute), q.num_layers, q.mbs, q.seq, q.dec_seq);
}

/// Bounds of draw_query; 0 leaves that field at its default (not drawn).
struct Draw {
  std::uint64_t tp_log2 = 0;  ///< tp = 2^(0 .. tp_log2 - 1)
  std::uint64_t layers = 0;   ///< 1 .. layers
  std::uint64_t seq = 0, dec = 0, mbs = 0;
};

/// A random query: kind, recompute, then tp, layers, seq, dec_seq (encoder-decoder models only)
/// and mbs as `d` bounds them, drawn in that order.
Query draw_query(std::mt19937_64& rng, bool encdec, const Draw& d) {
  Query q;
  const auto kind_draw = rng() % 4;
  q.kind = static_cast<LayerKind>(kind_draw);
  const auto rc_draw = rng() % 3;
  q.recompute = static_cast<Recompute>(rc_draw);
  if (d.tp_log2) {
    const auto tp_draw = rng() % d.tp_log2;
    q.tp = std::int64_t{1} << tp_draw;
  }
  if (d.layers) {
    const auto layers_draw = rng() % d.layers;
    q.num_layers = 1 + static_cast<std::int64_t>(layers_draw);
  }
  const auto seq_draw = rng() % d.seq;
  q.seq = 1 + static_cast<std::int64_t>(seq_draw);
  const auto dec_draw = rng() % d.dec;
  q.dec_seq = encdec ? 1 + static_cast<std::int64_t>(dec_draw) : 0;
  const auto mbs_draw = rng() % d.mbs;
  q.mbs = 1 + static_cast<std::int64_t>(mbs_draw);
  return q;
}

/// Empty when query_rows(q, count) keeps its contract against query(), else what broke. `filled`
/// receives the number of rows returned. `later_refused`: also check that rows after the first
/// refused one are refused (monotone refusal, which the built-in models have).
std::string rows_mismatch(const CostModel& m, const Query& q, std::int64_t count, std::int64_t& filled,
                          bool later_refused = true, unsigned* sources_seen = nullptr) {
  std::vector<LayerCost> out(static_cast<std::size_t>(count) + 1, sentinel());
  const std::int64_t n = m.query_rows(q, count, out.data());
  filled = n;
  if (n < 0 || n > count) return fmt::format("returned {} for {} rows of {}", n, count, describe(q));
  Query r = q;
  for (std::int64_t k = 0; k < n; ++k) {
    r.mbs = q.mbs + k;
    LayerCost c;
    try {
      c = m.query(r);
    } catch (const packpipe::InvalidArgument& e) {
      return fmt::format("row {} filled but query() refuses {}: {}", k, describe(r), e.what());
    }
    if (sources_seen != nullptr) *sources_seen |= 1u << static_cast<unsigned>(c.time_source);
    if (!same(c, out[static_cast<std::size_t>(k)])) {
      const LayerCost& o = out[static_cast<std::size_t>(k)];
      return fmt::format("row {} differs for {}: fwd {} vs {}, bwd {} vs {}, rc {} vs {}, stored {} vs {}, "
                         "peak {} vs {}",
                         k, describe(r), o.forward_ms, c.forward_ms, o.backward_ms, c.backward_ms, o.recompute_ms,
                         c.recompute_ms, o.stored_bytes, c.stored_bytes, o.peak_bytes, c.peak_bytes);
    }
  }
  for (std::int64_t k = n; k <= count; ++k) {
    if (!same(out[static_cast<std::size_t>(k)], sentinel())) {
      return fmt::format("row {} written past {} for {}", k, n, describe(q));
    }
  }
  if (n < count) {
    for (std::int64_t k : {n, n + 1, count - 1}) {
      if (k >= count || (k > n && !later_refused)) continue;
      r.mbs = q.mbs + k;
      try {
        m.query(r);
        return fmt::format("stopped at row {} but query() answers row {} ({})", n, k, describe(r));
      } catch (const packpipe::InvalidArgument&) {
      }
    }
  }
  return {};
}

struct Sweep {
  std::vector<std::int64_t> tps, seqs, decs, starts;
  std::int64_t count = 0;
  std::vector<std::int64_t> layers = {1, 3};
};

/// Runs rows_mismatch over every kind, recompute mode and the sweep's axes; counts the batches
/// that were cut short and fully filled so that the caller can assert the sweep reached both.
struct SweepResult {
  std::string first_failure;
  std::size_t batches = 0, full = 0, partial = 0, empty = 0;
  unsigned sources = 0;  ///< bit per Provenance of the rows' time
  bool saw(Provenance p) const { return (sources >> static_cast<unsigned>(p)) & 1u; }
};

SweepResult sweep(const CostModel& m, const Sweep& s) {
  SweepResult res;
  for (auto kind : {LayerKind::Embedding, LayerKind::Encoder, LayerKind::Decoder, LayerKind::PostProcess}) {
    for (auto rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      for (auto tp : s.tps) {
        for (auto seq : s.seqs) {
          for (auto dec : s.decs) {
            for (auto start : s.starts) {
              Query q;
              q.kind = kind;
              q.recompute = rc;
              q.tp = tp;
              q.seq = seq;
              q.dec_seq = dec;
              q.mbs = start;
              q.num_layers = s.layers[res.batches % s.layers.size()];
              std::int64_t n = 0;
              // From mbs 0 on, row 0 is refused and row 1 answered: refusal is monotone only from 1.
              const std::string err = rows_mismatch(m, q, s.count, n, start > 0, &res.sources);
              ++res.batches;
              if (n == s.count) ++res.full;
              else if (n == 0) ++res.empty;
              else ++res.partial;
              if (!err.empty() && res.first_failure.empty()) res.first_failure = err;
            }
          }
        }
      }
    }
  }
  return res;
}

/// A model whose answers and refusals are known: forward_ms = mbs; mbs 6..9 refused
/// (InvalidArgument), mbs 42 a broken file (Error), everything else answered.
class KnownModel final : public CostModel {
 public:
  LayerCost query(const Query& q) const override {
    PACKPIPE_CHECK_ARG(q.mbs >= 1 && (q.mbs < 6 || q.mbs > 9), "mbs {} refused", q.mbs);
    PACKPIPE_CHECK(q.mbs != 42, "mbs {} breaks", q.mbs);
    LayerCost c;
    c.forward_ms = static_cast<double>(q.mbs);
    return c;
  }
  const ModelSpec& model() const override { return m_; }
  const DeviceSpec& device() const override { return d_; }
  const CommModel& comm() const override { return c_; }
  std::string describe() const override { return "known"; }

 private:
  ModelSpec m_;
  DeviceSpec d_;
  CommModel c_;
};

}  // namespace

TEST_CASE("query_rows equals query() bit for bit: analytic GPT-6.7B and T5-11B", "[interface]") {
  for (const char* name : {"gpt-6.7b", "t5-11b", "llama-7b"}) {
    INFO(name);
    const AnalyticCostModel m(load_model(name), load_device("A100-40GB"));
    const bool t5 = m.model().arch == Architecture::EncoderDecoder;
    Sweep s;
    s.tps = {1, 2, 8, 16, 3};  // 16 crosses nodes; 3 divides no head count: refused
    s.seqs = {1, 100, 2048, 5000};
    s.decs = t5 ? std::vector<std::int64_t>{0, 33, 512} : std::vector<std::int64_t>{0, 64};
    s.starts = {1, 77, 0};  // a batch from mbs 0 starts refused
    s.count = 70;
    const SweepResult r = sweep(m, s);
    CHECK(r.first_failure == "");
    CHECK(r.full > 0);
    CHECK(r.empty > 0);
  }
}

namespace {

/// The sweep on a profiled model with the analytic fallback and without: every batch keeps the
/// contract; some batches are full, some run into the refused sizes, some are refused at once;
/// every provenance shows up, Analytic only with the fallback.
void check_profiled_sweeps(const CostModel& with_fallback, const CostModel& bare, const Sweep& s) {
  for (const CostModel* m : {&with_fallback, &bare}) {
    INFO(m->describe());
    const SweepResult r = sweep(*m, s);
    CHECK(r.first_failure == "");
    CHECK(r.full > 0);
    CHECK(r.partial > 0);
    CHECK(r.empty > 0);
    CHECK(r.saw(Provenance::Profiled));
    CHECK(r.saw(Provenance::Interpolated));
    CHECK(r.saw(Provenance::Extrapolated));
    CHECK(r.saw(Provenance::Analytic) == (m == &with_fallback));
  }
}

}  // namespace

TEST_CASE("query_rows equals query() bit for bit: profiled GPT-6.7B", "[interface]") {
  const auto fb = gpt_with_fallback();
  const ProfiledCostModel bare(gpt_profile(), load_model("gpt-6.7b"), load_device("A100-40GB"));
  Sweep s;
  s.tps = {1, 2, 4, 8, 16};  // 16 not profiled: fallback, or refused without one
  // below the grid, on grid points, between them, above the largest (8192), beyond twice it
  s.seqs = {8, 16, 700, 2048, 6144, 12000, 16385};
  s.decs = {0};
  // mbs profiled 1..2048 (fewer for long sequences: extrapolated holes); refused above 4096
  s.starts = {1, 5, 250, 4000, 4097};
  s.count = 130;
  check_profiled_sweeps(*fb, bare, s);
}

TEST_CASE("query_rows equals query() bit for bit: profiled T5-11B", "[interface]") {
  const auto fb = t5_with_fallback();
  const ProfiledCostModel bare(t5_profile(), load_model("t5-11b"), load_device("A100-40GB"));
  Sweep s;
  s.tps = {1, 2};  // only tp 1 is profiled
  s.seqs = {8, 16, 300, 4096, 6000, 9000};
  s.decs = {0, 8, 100, 2048, 5000, 9000};
  s.starts = {1, 3, 500, 1000};  // mbs profiled 1..512: refused above 1024
  s.count = 100;
  check_profiled_sweeps(*fb, bare, s);
}

TEST_CASE("query_rows on random shapes and lengths agrees with query()", "[stress]") {
  const auto gpt = gpt_with_fallback();
  const auto t5 = t5_with_fallback();
  const AnalyticCostModel an(load_model("t5-11b"), load_device("A100-40GB"));
  std::mt19937_64 rng(20260311);
  std::string failure;
  for (int i = 0; i < 600; ++i) {
    const CostModel& m = i % 3 == 0 ? *gpt : (i % 3 == 1 ? *t5 : static_cast<const CostModel&>(an));
    const bool encdec = m.model().arch == Architecture::EncoderDecoder;
    Draw d;
    d.tp_log2 = 3;
    d.seq = 9000;
    d.dec = 5000;
    d.mbs = 1200;
    const Query q = draw_query(rng, encdec, d);
    const auto count_draw = rng() % 300;
    std::int64_t n = 0;
    const std::string err = rows_mismatch(m, q, static_cast<std::int64_t>(count_draw), n);
    if (!err.empty() && failure.empty()) failure = err;
  }
  CHECK(failure == "");
}

TEST_CASE("query_rows from many threads agree", "[stress]") {
  const auto m = gpt_with_fallback();
  std::vector<Query> qs;
  for (std::int64_t s : {20, 700, 2048, 5000}) {
    for (auto rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      Query q;
      q.tp = 2;
      q.recompute = rc;
      q.seq = s;
      qs.push_back(q);
    }
  }
  constexpr std::size_t kRows = 40;
  constexpr auto kCount = static_cast<std::int64_t>(kRows);
  std::vector<LayerCost> expect(qs.size() * kRows);
  for (std::size_t i = 0; i < qs.size(); ++i) REQUIRE(m->query_rows(qs[i], kCount, &expect[i * kRows]) == kCount);
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<LayerCost> out(kRows);
      for (int rep = 0; rep < 50; ++rep) {
        for (std::size_t i = 0; i < qs.size(); ++i) {
          if (m->query_rows(qs[i], kCount, out.data()) != kCount) ++bad[static_cast<std::size_t>(t)];
          for (std::size_t k = 0; k < kRows; ++k) {
            if (!same(out[k], expect[i * kRows + k])) {
              ++bad[static_cast<std::size_t>(t)];
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad == std::vector<int>(4, 0));
}

TEST_CASE("query_rows stops at the first refused size and says how many rows it filled", "[boundary]") {
  const ProfiledCostModel gpt(gpt_profile(), load_model("gpt-6.7b"), load_device("A100-40GB"));
  Query q;
  q.seq = 16;
  q.mbs = 4090;
  std::vector<LayerCost> out(20, sentinel());
  // 4090 .. 4096 answered (twice the largest profiled 2048), 4097 refused as query() refuses it.
  REQUIRE(gpt.query_rows(q, 20, out.data()) == 7);
  CHECK(same(out[6], [&] { Query r = q; r.mbs = 4096; return gpt.query(r); }()));
  CHECK(same(out[7], sentinel()));
  Query r = q;
  r.mbs = 4097;
  REQUIRE_THROWS_WITH(gpt.query(r), Catch::Matchers::Contains("mbs 4097"));
  // Rows refused for a reason that does not depend on mbs: nothing filled, nothing thrown.
  q.mbs = 1;
  q.seq = 16385;
  CHECK(gpt.query_rows(q, 20, out.data()) == 0);
  q.seq = 16;
  q.tp = 16;  // not profiled, no fallback
  CHECK(gpt.query_rows(q, 20, out.data()) == 0);
  q.tp = 1;
  q.mbs = 0;
  CHECK(gpt.query_rows(q, 20, out.data()) == 0);
  const AnalyticCostModel an(load_model("gpt-6.7b"), load_device("A100-40GB"));
  q.tp = 3;
  q.mbs = 1;
  CHECK(an.query_rows(q, 20, out.data()) == 0);
  q.tp = 1;
  CHECK(an.query_rows(q, 20, out.data()) == 20);
  // count 0 writes nothing, even without a buffer.
  CHECK(an.query_rows(q, 0, nullptr) == 0);
  CHECK(gpt.query_rows(q, 0, nullptr) == 0);
}

TEST_CASE("the default query_rows loops over query() with the same contract", "[interface]") {
  const KnownModel m;
  Query q;
  q.mbs = 1;
  std::vector<LayerCost> out(12, sentinel());
  REQUIRE(m.query_rows(q, 10, out.data()) == 5);  // mbs 6 refused
  for (int k = 0; k < 5; ++k) CHECK(out[static_cast<std::size_t>(k)].forward_ms == k + 1);
  CHECK(same(out[5], sentinel()));
  // Refusal need not be monotone for an arbitrary model: the batch still stops at the first one.
  q.mbs = 10;
  std::int64_t n = 0;
  CHECK(rows_mismatch(m, q, 10, n, false) == "");
  CHECK(n == 10);
  q.mbs = 3;
  CHECK(rows_mismatch(m, q, 10, n, false) == "");
  CHECK(n == 3);
  // Other errors are not refusals: they propagate.
  q.mbs = 40;
  REQUIRE_THROWS_AS(m.query_rows(q, 5, out.data()), packpipe::Error);
}

TEST_CASE("query_rows rejects a negative count, a missing buffer and an overflowing range", "[negative]") {
  const KnownModel known;
  const AnalyticCostModel an(load_model("gpt-6.7b"), load_device("A100-40GB"));
  const ProfiledCostModel pr(gpt_profile(), load_model("gpt-6.7b"), load_device("A100-40GB"));
  for (const CostModel* m : {static_cast<const CostModel*>(&known), static_cast<const CostModel*>(&an),
                             static_cast<const CostModel*>(&pr)}) {
    INFO(m->describe());
    Query q;
    q.seq = 128;
    LayerCost out[2];
    REQUIRE_THROWS_AS(m->query_rows(q, -1, out), packpipe::InvalidArgument);
    REQUIRE_THROWS_WITH(m->query_rows(q, -1, out), Catch::Matchers::Contains("count must not be negative, found -1"));
    REQUIRE_THROWS_WITH(m->query_rows(q, 2, nullptr), Catch::Matchers::Contains("out is null for 2 rows"));
    q.mbs = std::numeric_limits<std::int64_t>::max();
    REQUIRE_THROWS_WITH(m->query_rows(q, 2, out), Catch::Matchers::Contains("overflows"));
  }
}

namespace {

/// Empty when every answer of `m` for kinds it says ignore a length is the same with that length
/// changed (to another value or to 0), else the first query that differs.
std::string length_use_mismatch(const CostModel& m, std::mt19937_64& rng, int draws) {
  const bool encdec = m.model().arch == Architecture::EncoderDecoder;
  auto answer = [&](const Query& q, LayerCost& out) {
    try {
      out = m.query(q);
      return true;
    } catch (const packpipe::InvalidArgument&) {
      return false;
    }
  };
  Draw d;
  d.seq = 3000;
  d.dec = 1500;
  d.mbs = 64;
  for (int i = 0; i < draws; ++i) {
    const Query q = draw_query(rng, encdec, d);
    if (q.kind == LayerKind::Decoder && !encdec) continue;
    const LengthUse use = m.lengths_used(q.kind);
    LayerCost a;
    const bool ok = answer(q, a);
    for (int which = 0; which < 2; ++which) {
      if (which == 0 ? use.seq : (use.dec_seq || !encdec)) continue;
      for (int zero = 0; zero < 2; ++zero) {
        Query r = q;
        const auto other = 1 + static_cast<std::int64_t>(rng() % 2000);
        (which == 0 ? r.seq : r.dec_seq) = zero ? 0 : other;
        LayerCost b;
        const bool ok2 = answer(r, b);
        if (ok != ok2 || (ok && !same(a, b))) return describe(q) + " vs " + describe(r);
      }
    }
  }
  return "";
}

}  // namespace

TEST_CASE("lengths_used: answers ignore the lengths a model says it does not use", "[interface]") {
  const AnalyticCostModel gpt_a(load_model("gpt-6.7b"), load_device("A100-40GB"));
  const AnalyticCostModel t5_a(load_model("t5-11b"), load_device("A100-40GB"));
  const auto gpt = gpt_with_fallback();
  const auto t5 = t5_with_fallback();
  const ProfiledCostModel t5_alone(t5_profile(), load_model("t5-11b"), load_device("A100-40GB"), nullptr);
  // What the analytic model documents, and what the T5 fixture's grids give (their encoder grid
  // has no decoder axis, their post-process grid no encoder axis): sharing is possible.
  CHECK((!t5_a.lengths_used(LayerKind::Encoder).dec_seq && t5_a.lengths_used(LayerKind::Encoder).seq));
  CHECK((t5_a.lengths_used(LayerKind::PostProcess).dec_seq && !t5_a.lengths_used(LayerKind::PostProcess).seq));
  CHECK((t5_a.lengths_used(LayerKind::Decoder).seq && t5_a.lengths_used(LayerKind::Decoder).dec_seq));
  CHECK(!t5->lengths_used(LayerKind::Encoder).dec_seq);
  CHECK(!t5->lengths_used(LayerKind::PostProcess).seq);
  CHECK(!t5->lengths_used(LayerKind::Embedding).dec_seq);
  CHECK(!gpt_a.lengths_used(LayerKind::PostProcess).dec_seq);
  std::mt19937_64 rng(20261122);
  const std::vector<const CostModel*> models = {&gpt_a, &t5_a, gpt.get(), t5.get(), &t5_alone};
  for (const CostModel* m : models) {
    INFO(m->describe());
    CHECK(length_use_mismatch(*m, rng, 1500) == "");
  }
}

TEST_CASE("lengths_used: the default claims both lengths", "[interface]") {
  struct Plain final : CostModel {
    AnalyticCostModel inner{load_model("t5-11b"), load_device("A100-40GB")};
    LayerCost query(const Query& q) const override { return inner.query(q); }
    const ModelSpec& model() const override { return inner.model(); }
    const DeviceSpec& device() const override { return inner.device(); }
    const CommModel& comm() const override { return inner.comm(); }
    std::string describe() const override { return "plain"; }
  } plain;
  for (auto k : {LayerKind::Embedding, LayerKind::Encoder, LayerKind::Decoder, LayerKind::PostProcess}) {
    CHECK(plain.lengths_used(k).seq);
    CHECK(plain.lengths_used(k).dec_seq);
  }
}

TEST_CASE("memory_rows gives query()'s memory bit for bit, and stops where query_rows stops", "[interface]") {
  const AnalyticCostModel gpt_a(load_model("gpt-6.7b"), load_device("A100-40GB"));
  const AnalyticCostModel t5_a(load_model("t5-11b"), load_device("A100-40GB"));
  const auto gpt = gpt_with_fallback();
  const auto t5 = t5_with_fallback();
  const std::vector<const CostModel*> models = {&gpt_a, &t5_a, gpt.get(), t5.get()};
  std::mt19937_64 rng(7);
  int rows = 0;
  for (const CostModel* m : models) {
    const bool encdec = m->model().arch == Architecture::EncoderDecoder;
    Draw d;
    d.layers = 4;
    d.seq = 4000;
    d.dec = 1000;
    d.mbs = 80;
    for (int i = 0; i < 200; ++i) {
      const Query q = draw_query(rng, encdec, d);
      if (q.kind == LayerKind::Decoder && !encdec) continue;
      const std::int64_t count = 1 + static_cast<std::int64_t>(rng() % 60);
      std::vector<LayerCost> full(static_cast<std::size_t>(count)), mem(static_cast<std::size_t>(count));
      const std::int64_t n_full = m->query_rows(q, count, full.data());
      const std::int64_t n_mem = m->memory_rows(q, count, mem.data());
      INFO(m->describe() << ": " << describe(q));
      REQUIRE(n_mem == n_full);
      for (std::int64_t k = 0; k < n_mem; ++k) {
        const auto& a = full[static_cast<std::size_t>(k)];
        const auto& b = mem[static_cast<std::size_t>(k)];
        REQUIRE(bits(a.stored_bytes) == bits(b.stored_bytes));
        REQUIRE(bits(a.peak_bytes) == bits(b.peak_bytes));
        REQUIRE(a.memory_source == b.memory_source);
        ++rows;
      }
    }
  }
  CHECK(rows > 10000);
}
