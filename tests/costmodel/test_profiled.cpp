// ProfiledCostModel on the DynaPipe and Aceso fixtures: grid hits, interpolation, clamping,
// extrapolation flags, refusals, repeated points, fallback, threads, and leave-one-out accuracy.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "tests/support/devices.h"
#include "costmodel/activation_fit.h"
#include "costmodel/analytic.h"
#include "costmodel/flops.h"
#include "costmodel/profiled.h"
#include "costmodel/profiled_linear.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::costmodel;
using packpipe::test::fixture;

namespace {

const std::string kDyn = "dynapipe/derived_from_cost_models_pkl/";

Profile gpt_profile() {
  return load_profiles({fixture(kDyn + "gpt_6.7b_timing.csv"), fixture(kDyn + "gpt_6.7b_activation.csv"),
                        fixture(kDyn + "gpt_6.7b_model_state.csv")});
}

Profile t5_profile() {
  return load_profiles({fixture(kDyn + "t5_11b_timing.csv"), fixture(kDyn + "t5_11b_activation.csv")});
}

std::vector<std::string> aceso_files(const std::string& dir, const std::string& model, std::vector<int> tps,
                                     std::vector<int> algos) {
  std::vector<std::string> out;
  for (int b : {1, 2, 4, 8}) {
    for (int tp : tps) {
      for (int a : algos) {
        out.push_back(fixture("aceso/profiler/" + dir + "/" + model + "_mbs" + std::to_string(b) + "_tp" +
                              std::to_string(tp) + "_algo" + std::to_string(a) + ".csv"));
      }
    }
  }
  return out;
}

Query make_query(LayerKind k, std::int64_t tp, Recompute rc, std::int64_t mbs, std::int64_t seq,
                 std::int64_t dec = 0) {
  Query q;
  q.kind = k;
  q.tp = tp;
  q.recompute = rc;
  q.mbs = mbs;
  q.seq = seq;
  q.dec_seq = dec;
  return q;
}

/// A fallback that answers everything with fixed numbers, standing in for the analytic model.
class StubModel final : public CostModel {
 public:
  LayerCost query(const Query&) const override {
    LayerCost c;
    c.forward_ms = 1;
    c.backward_ms = 2;
    c.stored_bytes = 3;
    c.time_source = Provenance::Analytic;
    c.memory_source = Provenance::Analytic;
    return c;
  }
  const ModelSpec& model() const override { return m_; }
  const DeviceSpec& device() const override { return d_; }
  const CommModel& comm() const override { return c_; }
  std::string describe() const override { return "stub"; }

 private:
  ModelSpec m_;
  DeviceSpec d_;
  CommModel c_;
};

}  // namespace

TEST_CASE("grid hits reproduce the profile and say Profiled", "[interface]") {
  const ProfiledCostModel cm(gpt_profile(), load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  CHECK(cm.profiled(LayerKind::Encoder, 1, Recompute::None));
  CHECK_FALSE(cm.profiled(LayerKind::Encoder, 16, Recompute::None));
  // "1,none,encoder,forward,2048,0,1,5.78", backward 9.65; stored 966.55 MB (README, reference doc)
  const LayerCost c = cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 2048));
  CHECK(c.forward_ms == Approx(5.78));
  CHECK(c.backward_ms == Approx(9.65));
  CHECK(c.recompute_ms == 0);
  CHECK(c.stored_bytes == Approx(966.55e6));
  CHECK(c.time_source == Provenance::Profiled);
  CHECK(c.memory_source == Provenance::Profiled);
  CHECK(c.boundary_bytes == Approx(1.0 * 2048 * 4096 * 2));
  // Full recompute: the profiled backward (15.43) includes the recomputed forward (5.83).
  const LayerCost f = cm.query(make_query(LayerKind::Encoder, 1, Recompute::Full, 1, 2048));
  CHECK(f.forward_ms == Approx(5.83));
  CHECK(f.recompute_ms == Approx(5.83));
  CHECK(f.backward_ms + f.recompute_ms == Approx(15.43));
  // Layers add.
  Query q4 = make_query(LayerKind::Encoder, 1, Recompute::None, 1, 2048);
  q4.num_layers = 4;
  const LayerCost c4 = cm.query(q4);
  CHECK(c4.forward_ms == Approx(4 * c.forward_ms));
  CHECK(c4.stored_bytes == Approx(4 * c.stored_bytes));
}

TEST_CASE("between grid points: Interpolated, between the neighbours", "[interface]") {
  const ProfiledCostModel cm(gpt_profile(), load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  const auto lo = cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 2048));
  const auto hi = cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 4096));
  const auto mid = cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 3072));
  CHECK(mid.time_source == Provenance::Interpolated);
  CHECK(mid.memory_source == Provenance::Interpolated);
  CHECK(mid.forward_ms > lo.forward_ms);
  CHECK(mid.forward_ms < hi.forward_ms);
  CHECK(mid.stored_bytes > lo.stored_bytes);
  CHECK(mid.stored_bytes < hi.stored_bytes);
  const auto b3 = cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 3, 512));
  CHECK(b3.time_source == Provenance::Interpolated);
  CHECK(b3.forward_ms > cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 2, 512)).forward_ms);
  CHECK(b3.forward_ms < cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 4, 512)).forward_ms);
}

TEST_CASE("below the grid clamps, above it flags, beyond twice it refuses", "[boundary]") {
  const ProfiledCostModel cm(gpt_profile(), load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  // seq 8 < 16: the latency floor of the smallest profiled shape.
  const auto at16 = cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 16));
  const auto at8 = cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 8));
  CHECK(at8.forward_ms == Approx(at16.forward_ms));
  CHECK(at8.time_source == Provenance::Interpolated);
  // mbs 16 at seq 2048: profiled only up to 8 there (OOM beyond): extrapolated.
  const auto hole = cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 16, 2048));
  CHECK(hole.time_source == Provenance::Extrapolated);
  CHECK(hole.forward_ms > cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 8, 2048)).forward_ms);
  // seq 12288 > 8192 (largest) but < 2 x 8192.
  CHECK(cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 12288)).time_source == Provenance::Extrapolated);
  CHECK_NOTHROW(cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 4096, 16)));
  REQUIRE_THROWS_AS(cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 4097, 16)), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 4097, 16)),
                      Catch::Matchers::Contains("mbs 4097") && Catch::Matchers::Contains("2048"));
  REQUIRE_THROWS_WITH(cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 16385)),
                      Catch::Matchers::Contains("seq 16385") && Catch::Matchers::Contains("8192"));
}

TEST_CASE("non-positive sizes and unprofiled axes", "[negative]") {
  const ProfiledCostModel cm(gpt_profile(), load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  REQUIRE_THROWS_AS(cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 0, 16)), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 0, 16)),
                      Catch::Matchers::Contains("mbs must be positive, found 0"));
  REQUIRE_THROWS_WITH(cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, -5)),
                      Catch::Matchers::Contains("seq must not be negative, found -5"));
  REQUIRE_THROWS_WITH(cm.query(make_query(LayerKind::Encoder, 0, Recompute::None, 1, 16)),
                      Catch::Matchers::Contains("tp must be positive"));
  Query zero_layers = make_query(LayerKind::Encoder, 1, Recompute::None, 1, 16);
  zero_layers.num_layers = 0;
  REQUIRE_THROWS_WITH(cm.query(zero_layers), Catch::Matchers::Contains("num_layers must be positive"));
  REQUIRE_THROWS_WITH(cm.query(make_query(LayerKind::Encoder, 16, Recompute::None, 1, 16)),
                      Catch::Matchers::Contains("tp 16") && Catch::Matchers::Contains("not profiled"));
  REQUIRE_THROWS_WITH(cm.query(make_query(LayerKind::Decoder, 1, Recompute::None, 1, 16, 16)),
                      Catch::Matchers::Contains("decoder-only"));
  // A profile of another model (here an encoder-decoder one), and an empty profile.
  REQUIRE_THROWS_WITH(ProfiledCostModel(t5_profile(), load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB")),
                      Catch::Matchers::Contains("measured model 't5_11b'"));
  REQUIRE_THROWS_AS(ProfiledCostModel(Profile{}, load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB")),
                    packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(ProfiledCostModel(Profile{}, load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB")),
                      Catch::Matchers::Contains("no grid points"));
}

TEST_CASE("unprofiled discrete axes go to the fallback and say Analytic", "[interface]") {
  const ProfiledCostModel cm(gpt_profile(), load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"),
                             std::make_unique<StubModel>());
  const auto c = cm.query(make_query(LayerKind::Encoder, 16, Recompute::None, 1, 2048));
  CHECK(c.time_source == Provenance::Analytic);
  CHECK(c.forward_ms == 1);
  // Embedding time is not in the DynaPipe timing grid.
  CHECK(cm.query(make_query(LayerKind::Embedding, 1, Recompute::None, 1, 2048)).time_source == Provenance::Analytic);
  // Post-process time is profiled, its memory is not: memory from the fallback.
  const auto pp = cm.query(make_query(LayerKind::PostProcess, 1, Recompute::None, 1, 2048));
  CHECK(pp.time_source == Provenance::Profiled);
  CHECK(pp.memory_source == Provenance::Analytic);
  CHECK(pp.stored_bytes == 3);
}

TEST_CASE("T5: decoder grid over (enc, dec), repeated encoder points resolve to the median", "[interface]") {
  const Profile p = t5_profile();
  const ProfiledCostModel cm(p, load_model("t5-11b"), packpipe::test::eager_device("A100-40GB"));
  std::vector<double> fwd;
  for (const auto& x : p.points) {
    if (x.kind == LayerKind::Encoder && x.seq == 16 && x.mbs == 1 && !std::isnan(x.fwd_ms)) fwd.push_back(x.fwd_ms);
  }
  REQUIRE(fwd.size() == 9);
  std::sort(fwd.begin(), fwd.end());
  const auto e = cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 16, 64));
  CHECK(e.forward_ms == Approx(fwd[4]));
  CHECK(e.time_source == Provenance::Profiled);
  const auto d = cm.query(make_query(LayerKind::Decoder, 1, Recompute::None, 2, 256, 128));
  CHECK(d.time_source == Provenance::Profiled);
  const auto di = cm.query(make_query(LayerKind::Decoder, 1, Recompute::None, 2, 384, 96));
  CHECK(di.time_source == Provenance::Interpolated);
  CHECK(std::isfinite(di.forward_ms));
  CHECK(di.forward_ms > 0);
  const auto pp = cm.query(make_query(LayerKind::PostProcess, 1, Recompute::None, 1, 999, 16));
  CHECK(pp.time_source == Provenance::Profiled);  // keyed by the decoder length only
  REQUIRE_THROWS_WITH(cm.query(make_query(LayerKind::Decoder, 1, Recompute::None, 1, 16, 0)),
                      Catch::Matchers::Contains("dec_seq must be positive"));
}

TEST_CASE("queries from many threads agree", "[stress]") {
  const ProfiledCostModel cm(gpt_profile(), load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  std::vector<double> expect;
  std::vector<Query> qs;
  for (std::int64_t b : {1, 3, 5, 16}) {
    for (std::int64_t s : {20, 700, 2048, 5000}) {
      for (auto rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        qs.push_back(make_query(LayerKind::Encoder, 2, rc, b, s));
        expect.push_back(cm.query(qs.back()).total_ms());
      }
    }
  }
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 200; ++rep) {
        for (std::size_t i = 0; i < qs.size(); ++i) {
          if (cm.query(qs[i]).total_ms() != expect[i]) ++bad[static_cast<std::size_t>(t)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad == std::vector<int>(4, 0));
}

TEST_CASE("measured p2p replaces the device's link figures", "[interface]") {
  Profile p = load_profiles(aceso_files("profiled-time-eurosys", "gpt_13B", {1}, {0}));
  p.merge(load_profiles({fixture("aceso/profiler/profiled-time-eurosys/p2p_intra_node.csv")}));
  const DeviceSpec dev = packpipe::test::eager_device("V100-32GB");
  const ProfiledCostModel cm(p, load_model("gpt-13b"), dev);
  REQUIRE(cm.comm_fits().size() == 1);
  CHECK(cm.comm().intra_bytes_per_ms == cm.comm_fits()[0].bytes_per_ms);
  CHECK(cm.comm().inter_bytes_per_ms == Approx(dev.inter_node_gbps * 1e6));
  // 17.22 .. 42.46 GiB/s measured: the fitted bandwidth lies in that range (bytes per ms).
  CHECK(cm.comm().intra_bytes_per_ms > 17.0 * 1073741824.0 / 1e3);
  CHECK(cm.comm().intra_bytes_per_ms < 43.0 * 1073741824.0 / 1e3);
}

TEST_CASE("packpipe profile file gives the same answers", "[regression]") {
  const Profile p = gpt_profile();
  packpipe::test::TempDir dir;
  packpipe::test::write_file(dir.file("gpt.json"), write_packpipe_profile(p));
  const ProfiledCostModel a(p, load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  const ProfiledCostModel b(load_profiles({dir.file("gpt.json")}), load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  for (std::int64_t s : {16, 100, 3000}) {
    const auto qa = a.query(make_query(LayerKind::Encoder, 4, Recompute::Selective, 3, s));
    const auto qb = b.query(make_query(LayerKind::Encoder, 4, Recompute::Selective, 3, s));
    CHECK(qa.forward_ms == qb.forward_ms);
    CHECK(qa.stored_bytes == qb.stored_bytes);
  }
}

namespace {

/// The five fixture grids of the accuracy goal, with the model presets their FLOPs come from.
std::vector<std::pair<std::string, Profile>> goal_profiles() {
  return {{"gpt-6.7b", gpt_profile()},
          {"t5-11b", t5_profile()},
          {"gpt-1.3b", load_profiles(aceso_files("profiled-time-miniset", "gpt_1_3B", {1, 2, 4}, {0, 1}))},
          {"gpt-13b", load_profiles(aceso_files("profiled-time-eurosys", "gpt_13B", {1, 2, 4, 8}, {0}))},
          {"t5-770m", load_profiles(aceso_files("profiled-time-miniset", "t5_770M", {1, 2, 4}, {0}))}};
}

}  // namespace

// A measured property of the method on real data (docs/design/003-costmodel-profiles.md, section 5):
// it fails if a change makes any of the five grids worse than DynaPipe's linear rule.
TEST_CASE("leave-one-out: lower error than linear interpolation on all five fixture grids", "[regression]") {
  for (const auto& [model, profile] : goal_profiles()) {
    INFO(model);
    const LooReport r = leave_one_out(profile, load_model(model));
    CHECK(r.model == model);
    CHECK(r.all.points >= 24);
    CHECK(r.all.time_predictions == 2 * r.all.points);  // forward and backward of every removal
    CHECK(r.all.memory_predictions > 0);
    for (double v : {r.all.time_mape, r.all.memory_mape, r.all.linear_time_mape, r.all.linear_memory_mape}) {
      CHECK(std::isfinite(v));
    }
    CHECK(r.all.time_mape < r.all.linear_time_mape);
    CHECK(r.all.memory_mape < r.all.linear_memory_mape);
    if (model == "gpt-6.7b" || model == "t5-11b") {
      CHECK(r.all.points > 100);
      CHECK(r.all.peak_memory_mape < r.all.linear_peak_memory_mape);
    }
    CHECK_FALSE(r.by_stage_rc.empty());
    CHECK_FALSE(r.groups.empty());
  }
}

TEST_CASE("grid hits reproduce every measured median on the five fixture grids", "[interface]") {
  using Key = std::tuple<LayerKind, std::int64_t, Recompute, std::int64_t, std::int64_t, std::int64_t>;
  for (const auto& [model, profile] : goal_profiles()) {
    INFO(model);
    const ProfiledCostModel cm(profile, load_model(model), packpipe::test::eager_device("A100-40GB"));
    // Medians of repeated measurements, computed here independently of the model.
    std::map<Key, std::array<std::vector<double>, 4>> values;
    for (const auto& p : profile.points) {
      if (p.variant != 0) continue;
      auto& v = values[{p.kind, p.tp, p.rc, p.mbs, p.seq, p.dec_seq}];
      const double f[4] = {p.fwd_ms, p.bwd_ms, p.stored_bytes, p.peak_bytes};
      for (int i = 0; i < 4; ++i) {
        if (!std::isnan(f[i])) v[static_cast<std::size_t>(i)].push_back(f[i]);
      }
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      const std::size_t n = v.size();
      return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    };
    std::size_t checked = 0;
    for (const auto& [key, v] : values) {
      const auto [kind, tp, rc, mbs, seq, dec] = key;
      INFO(layer_kind_name(kind) << " tp " << tp << " mbs " << mbs << " seq " << seq << " dec " << dec);
      const LayerCost c = cm.query(make_query(kind, tp, rc, mbs, seq, dec));
      if (!v[0].empty()) {
        CHECK(c.time_source == Provenance::Profiled);
        CHECK(c.forward_ms == Approx(median(v[0])).epsilon(1e-9));
      }
      if (!v[1].empty() && rc == Recompute::None) CHECK(c.backward_ms == Approx(median(v[1])).epsilon(1e-9));
      if (!v[1].empty() && rc != Recompute::None && c.backward_ms > 0) {
        CHECK(c.backward_ms + c.recompute_ms == Approx(median(v[1])).epsilon(1e-9));
      }
      if (!v[2].empty()) {
        CHECK(c.memory_source == Provenance::Profiled);
        CHECK(c.stored_bytes == Approx(median(v[2])).epsilon(1e-9));
      }
      if (!v[3].empty()) CHECK(c.peak_bytes == Approx(median(v[3])).epsilon(1e-9));
      ++checked;
    }
    CHECK(checked >= 24);
  }
}

TEST_CASE("a grid that the features describe exactly is interpolated exactly", "[interface]") {
  // Time = launch latency + FLOPs at two rates, memory = constant + linear and quadratic token
  // terms: both forms of the residual are then 1 (ratio) or 0 (difference) everywhere.
  const ModelSpec m = load_model("gpt-6.7b");
  auto time_ms = [&](std::int64_t b, std::int64_t s) {
    const LayerFlops f = forward_flops(m, LayerKind::Encoder, b, s);
    return 0.05 + f.matmul / 150e9 + f.attention / 90e9;
  };
  auto stored = [](std::int64_t b, std::int64_t s) {
    const double bs = static_cast<double>(b) * static_cast<double>(s);
    return 4e6 + 3000.0 * bs + 2.0 * bs * static_cast<double>(s);
  };
  Profile p;
  for (std::int64_t b : {1, 2, 4, 8}) {
    for (std::int64_t s : {256, 512, 1024, 2048}) {
      ProfilePoint x;
      x.mbs = b;
      x.seq = s;
      x.fwd_ms = time_ms(b, s);
      x.bwd_ms = 2 * time_ms(b, s);
      x.stored_bytes = stored(b, s);
      x.peak_bytes = 1.5 * stored(b, s);
      p.points.push_back(x);
    }
  }
  const ProfiledCostModel cm(p, m, packpipe::test::eager_device("A100-40GB"));
  for (const auto& [b, s] : std::vector<std::pair<std::int64_t, std::int64_t>>{{3, 768}, {5, 1500}, {7, 300}, {2, 2000}}) {
    INFO("mbs " << b << " seq " << s);
    const LayerCost c = cm.query(make_query(LayerKind::Encoder, 1, Recompute::None, b, s));
    CHECK(c.time_source == Provenance::Interpolated);
    CHECK(c.forward_ms == Approx(time_ms(b, s)).epsilon(1e-9));
    CHECK(c.backward_ms == Approx(2 * time_ms(b, s)).epsilon(1e-9));
    CHECK(c.stored_bytes == Approx(stored(b, s)).epsilon(1e-9));
    CHECK(c.peak_bytes == Approx(1.5 * stored(b, s)).epsilon(1e-9));
  }
  // Leave-one-out: exact for ours; linear interpolation misses the curvature in seq.
  const LooReport r = leave_one_out(p, m);
  CHECK(r.all.points == 16);  // mbs 2, 4 in each of 4 rows; seq 512, 1024 in each of 4 columns
  CHECK(r.all.time_mape < 1e-7);
  CHECK(r.all.memory_mape < 1e-7);
  CHECK(r.all.linear_time_mape > 0.1);
  CHECK(r.all.linear_memory_mape > 0.1);
}

TEST_CASE("leave-one-out on the Aceso grids: mbs 2 and 4 from their neighbours", "[regression]") {
  const Profile p = load_profiles(aceso_files("profiled-time-miniset", "gpt_1_3B", {1, 2, 4}, {0, 1}));
  const LooReport r = leave_one_out(p, load_model("gpt-1.3b"));
  // 6 grids (tp 1, 2, 4 x algo 0, 1) x 3 kinds (embedding, layer, post-process) x 2 interior sizes
  CHECK(r.all.points == 36);
  for (const auto& g : r.groups) CHECK(g.axis == "mbs");
  CHECK(std::isfinite(r.all.time_mape));
  CHECK(std::isfinite(r.all.linear_time_mape));
  CHECK(std::isfinite(r.all.memory_mape));
  // Four sizes per grid and measurement noise: both rules land within a few percent.
  CHECK(r.all.time_mape < 5.0);
  CHECK(r.all.linear_time_mape < 5.0);
  REQUIRE_THROWS_AS(leave_one_out(load_profiles({fixture("aceso/profiler/profiled-time-miniset/gpt_1_3B_mbs1_tp1_algo0.csv")}),
                                  load_model("gpt-1.3b")),
                    packpipe::InvalidArgument);
}

TEST_CASE("make_profiled_cost_model: analytic fallback for unprofiled axes", "[interface]") {
  const auto cm = make_profiled_cost_model({fixture(kDyn + "gpt_6.7b_timing.csv"), fixture(kDyn + "gpt_6.7b_activation.csv")},
                                           load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  const auto hit = cm->query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 2048));
  CHECK(hit.time_source == Provenance::Profiled);
  CHECK(hit.forward_ms == Approx(5.78));
  const auto tp16 = cm->query(make_query(LayerKind::Encoder, 16, Recompute::None, 1, 2048));
  CHECK(tp16.time_source == Provenance::Analytic);
  CHECK(tp16.forward_ms > 0);
  const auto emb = cm->query(make_query(LayerKind::Embedding, 1, Recompute::None, 1, 2048));
  CHECK(emb.time_source == Provenance::Analytic);
  // Post-process memory is not in the activation grid: the analytic model answers it.
  CHECK(cm->query(make_query(LayerKind::PostProcess, 1, Recompute::None, 1, 2048)).memory_source == Provenance::Analytic);
  CHECK(cm->describe().find("fallback analytic") != std::string::npos);
  REQUIRE_THROWS_AS(make_profiled_cost_model({fixture("aceso/README.txt")}, load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB")),
                    packpipe::Error);
}

TEST_CASE("analytic activations: within 3% of DynaPipe's profiled ones once calibrated, never below by more than the margin",
          "[regression]") {
  const ModelSpec gpt = load_model("gpt-6.7b"), t5 = load_model("t5-11b");
  const Profile pg = gpt_profile(), pt = t5_profile();
  const AnalyticOptions calibrated;  // the defaults carry the calibration
  AnalyticOptions closed = calibrated;
  closed.activation_token_bytes = closed.activation_score_bytes = closed.activation_layer_bytes = 0;
  for (const auto& [prof, model] : {std::pair{&pg, &gpt}, std::pair{&pt, &t5}}) {
    const ActivationReport after = activation_error(*prof, *model, calibrated);
    INFO(model->name);
    CHECK(after.all.mean_abs_pct < 3.0);
    CHECK(after.all.beyond_margin == 0);
    for (const auto& g : after.groups) {
      INFO(layer_kind_name(g.kind) << " " << recompute_name(g.rc));
      CHECK(g.mean_abs_pct < 3.0);
      CHECK(g.beyond_margin == 0);
      CHECK(g.worst_above_pct < 3.0);  // calibrated up to the profiles, not past them
    }
  }
  // The closed forms alone are below the profiles: GPT by 13% on average (30% under full
  // recompute) and past the margin at 18 points.
  const ActivationReport before = activation_error(pg, gpt, closed);
  CHECK(before.all.mean_abs_pct > 10.0);
  CHECK(before.all.worst_above_pct == 0.0);
  CHECK(before.all.beyond_margin > 0);
  // The defaults are the fit over both profiles, rounded.
  const AnalyticOptions fit = fit_activation({{&pg, &gpt}, {&pt, &t5}}, closed);
  CHECK(fit.activation_token_bytes == Approx(calibrated.activation_token_bytes).epsilon(0.02));
  CHECK(fit.activation_score_bytes == Approx(calibrated.activation_score_bytes).epsilon(0.02));
  CHECK(fit.activation_layer_bytes == Approx(calibrated.activation_layer_bytes).epsilon(0.02));
  CHECK(fit.max_efficiency == closed.max_efficiency);  // the other constants are kept
  // The analytic model's queries store what the report measures.
  const AnalyticCostModel a(gpt, packpipe::test::eager_device("A100-40GB"));
  Query q = make_query(LayerKind::Encoder, 1, Recompute::Selective, 4, 1024);
  q.num_layers = 3;
  CHECK(a.query(q).stored_bytes ==
        Approx(3 * layer_activation_bytes(gpt, LayerKind::Encoder, 1, 4, 1024, 0, Recompute::Selective, &calibrated)));
  // Too few points to fit: refused, naming the count.
  Profile few;
  few.points.push_back(pg.points.front());
  REQUIRE_THROWS_WITH(fit_activation({{&few, &gpt}}, closed), Catch::Matchers::Contains("at least 8"));
  REQUIRE_THROWS_AS(activation_error(Profile{}, gpt, closed), packpipe::InvalidArgument);
}

TEST_CASE("make_profiled_cost_model fits the fallback's activation calibration to the profile", "[interface]") {
  const auto cm = make_profiled_cost_model({fixture(kDyn + "t5_11b_timing.csv"), fixture(kDyn + "t5_11b_activation.csv")},
                                           load_model("t5-11b"), packpipe::test::eager_device("A100-40GB"));
  const auto& notes = dynamic_cast<const ProfiledCostModel&>(*cm).profile().notes;
  CHECK(std::any_of(notes.begin(), notes.end(),
                    [](const std::string& n) { return n.find("activation calibration fitted on 427") != std::string::npos; }));
}

TEST_CASE("T5: recompute modes the profile lacks come from its profiled forward, not the analytic model", "[interface]") {
  const ModelSpec m = load_model("t5-11b");
  const auto model = make_profiled_cost_model(
      {fixture(kDyn + "t5_11b_timing.csv"), fixture(kDyn + "t5_11b_activation.csv")}, m, packpipe::test::eager_device("A100-40GB"));
  const auto& cm = dynamic_cast<const ProfiledCostModel&>(*model);
  const AnalyticCostModel analytic(m, packpipe::test::eager_device("A100-40GB"));
  for (LayerKind kind : {LayerKind::Encoder, LayerKind::Decoder, LayerKind::PostProcess}) {
    CHECK(cm.profiled(kind, 1, Recompute::None));
    for (Recompute rc : {Recompute::Selective, Recompute::Full}) {
      CHECK_FALSE(cm.profiled(kind, 1, rc));
      CHECK(cm.derived(kind, 1, rc));
    }
  }
  // Grid shapes and shapes between them (decoder lengths 128, 160).
  for (std::int64_t dec : {128, 160}) {
    for (LayerKind kind : {LayerKind::Encoder, LayerKind::Decoder}) {
      const Query none = make_query(kind, 1, Recompute::None, 4, 512, dec);
      const LayerCost n = cm.query(none);
      INFO(layer_kind_name(kind) << " dec " << dec);
      Query q = none;
      q.recompute = Recompute::Full;
      const LayerCost f = cm.query(q);
      CHECK(f.time_source == Provenance::Derived);
      CHECK(f.memory_source == Provenance::Derived);
      // Full: the profiled forward again during backward; backward itself as profiled.
      CHECK(f.forward_ms == Approx(n.forward_ms).epsilon(1e-6));
      CHECK(f.recompute_ms == Approx(f.forward_ms));
      CHECK(f.backward_ms == Approx(n.backward_ms).epsilon(1e-6));
      q.recompute = Recompute::Selective;
      const LayerCost s = cm.query(q);
      CHECK(s.time_source == Provenance::Derived);
      CHECK(s.forward_ms == Approx(n.forward_ms).epsilon(1e-6));
      CHECK(s.recompute_ms > 0);
      CHECK(s.recompute_ms < 0.5 * s.forward_ms);  // the attention share of the FLOPs
      CHECK(s.backward_ms == Approx(n.backward_ms).epsilon(1e-6));
      CHECK(n.total_ms() < s.total_ms());
      CHECK(s.total_ms() < f.total_ms());
      // Memory: the profiled bytes less what the mode does not keep (the analytic difference).
      Query full = none;
      full.recompute = Recompute::Full;
      const double drop_full = analytic.query(none).stored_bytes - analytic.query(full).stored_bytes;
      CHECK(f.stored_bytes == Approx(n.stored_bytes - drop_full).epsilon(1e-6));
      CHECK(s.stored_bytes < n.stored_bytes);
      CHECK(f.stored_bytes < s.stored_bytes);
    }
  }
  // The post-process recomputes nothing: every mode costs what none costs.
  const LayerCost pn = cm.query(make_query(LayerKind::PostProcess, 1, Recompute::None, 4, 512, 128));
  const LayerCost pf = cm.query(make_query(LayerKind::PostProcess, 1, Recompute::Full, 4, 512, 128));
  CHECK(pf.time_source == Provenance::Derived);
  CHECK(pf.total_ms() == Approx(pn.total_ms()).epsilon(1e-6));
  CHECK(pf.recompute_ms == 0);
  // GPT measures every mode: nothing is derived.
  const auto gpt = make_profiled_cost_model({fixture(kDyn + "gpt_6.7b_timing.csv")}, load_model("gpt-6.7b"),
                                            packpipe::test::eager_device("A100-40GB"));
  CHECK_FALSE(dynamic_cast<const ProfiledCostModel&>(*gpt).derived(LayerKind::Encoder, 1, Recompute::Full));
  CHECK(gpt->query(make_query(LayerKind::Encoder, 1, Recompute::Full, 4, 512)).time_source == Provenance::Profiled);
}

TEST_CASE("linear interpolation: DynaPipe's rule on the raw grid, refusing what it costs at 1e100", "[interface]") {
  const ModelSpec gpt = load_model("gpt-6.7b");
  const auto model = make_profiled_cost_model(
      {fixture(kDyn + "gpt_6.7b_timing.csv"), fixture(kDyn + "gpt_6.7b_activation.csv"),
       fixture(kDyn + "gpt_6.7b_model_state.csv")},
      gpt, packpipe::test::eager_device("A100-40GB"), ProfileInterpolation::Linear);
  CHECK(model->describe().find("DynaPipe's linear interpolation") != std::string::npos);
  // Grid nodes: "1,none,encoder,forward,512,0,2,2.52" and backward 4.43; stored 230.01 MB, peak
  // 912.32 MB (absolute; the transient is the rest).
  const LayerCost a = model->query(make_query(LayerKind::Encoder, 1, Recompute::None, 2, 512));
  CHECK(a.forward_ms == Approx(2.52));
  CHECK(a.backward_ms == Approx(4.43));
  CHECK(a.stored_bytes == Approx(230.01e6));
  CHECK(a.stored_bytes + a.peak_bytes == Approx(912.32e6));
  // Between nodes, linear in the raw size: mbs 3 halfway between 2 and 4 (forward 4.69 at 4).
  const LayerCost mid = model->query(make_query(LayerKind::Encoder, 1, Recompute::None, 3, 512));
  CHECK(mid.forward_ms == Approx((2.52 + 4.69) / 2));
  CHECK(mid.stored_bytes == Approx((230.01e6 + 459.88e6) / 2));
  // Full recompute: DynaPipe's backward includes the forward; reported apart, the sum unchanged.
  const LayerCost full = model->query(make_query(LayerKind::Encoder, 1, Recompute::Full, 2, 512));
  CHECK(full.recompute_ms == Approx(full.forward_ms));
  CHECK(full.total_ms() > a.total_ms());
  // Beyond the largest profiled value (mbs 1 at seq 8192) and beyond 8192: refused, as DynaPipe's
  // 1e100 would make the window infeasible.
  CHECK(model->query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 8192)).forward_ms == Approx(44.23));
  REQUIRE_THROWS_WITH(model->query(make_query(LayerKind::Encoder, 1, Recompute::None, 2, 8192)),
                      Catch::Matchers::Contains("beyond the profiled grid"));
  REQUIRE_THROWS_AS(model->query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 9000)), packpipe::InvalidArgument);
  // The embedding is not profiled: the analytic fallback answers. Model state as profiled.
  CHECK(model->query(make_query(LayerKind::Embedding, 1, Recompute::None, 2, 512)).time_source == Provenance::Analytic);
  CHECK(model->layer_param_bytes(LayerKind::Encoder, 1) == Approx(402.77e6));
  CHECK(std::isnan(model->layer_param_bytes(LayerKind::Decoder, 1)));
  // T5: repeated nodes resolve to their maximum (the encoder's backward at mbs 1, seq 512 was
  // measured at 3.37 .. 3.54 ms), and the modes the profile lacks are derived node by node.
  const ModelSpec t5 = load_model("t5-11b");
  const auto lin5 = make_profiled_cost_model({fixture(kDyn + "t5_11b_timing.csv"), fixture(kDyn + "t5_11b_activation.csv")},
                                             t5, packpipe::test::eager_device("A100-40GB"), ProfileInterpolation::Linear);
  const LayerCost e = lin5->query(make_query(LayerKind::Encoder, 1, Recompute::None, 1, 512, 128));
  CHECK(e.backward_ms == Approx(3.54));
  const LayerCost ef = lin5->query(make_query(LayerKind::Encoder, 1, Recompute::Full, 1, 512, 128));
  CHECK(ef.time_source == Provenance::Derived);
  CHECK(ef.forward_ms == Approx(e.forward_ms));
  CHECK(ef.backward_ms == Approx(e.backward_ms));
  CHECK(ef.recompute_ms == Approx(e.forward_ms));
  CHECK(ef.stored_bytes < e.stored_bytes);
  CHECK(dynamic_cast<const LinearProfiledCostModel&>(*lin5).derived(LayerKind::Decoder, 1, Recompute::Selective));
  // The interpolation is named in the one name table.
  CHECK(profile_interpolation_from_name("linear") == ProfileInterpolation::Linear);
  REQUIRE_THROWS_WITH(profile_interpolation_from_name("cubic"), Catch::Matchers::Contains("fit, linear"));
}

TEST_CASE("derived recompute modes against the ones GPT-6.7B measures", "[regression]") {
  // The GPT profile without its selective and full grids: the derived modes at tp 1 against the
  // measured ones. Stored bytes: the closed forms' differences are the profile's; full recompute's
  // time is the forward again; peaks are the conservative side.
  Profile none_only = gpt_profile();
  const Profile full = gpt_profile();
  none_only.points.erase(std::remove_if(none_only.points.begin(), none_only.points.end(),
                                        [](const ProfilePoint& p) { return p.rc != Recompute::None; }),
                         none_only.points.end());
  const ModelSpec m = load_model("gpt-6.7b");
  const DeviceSpec d = packpipe::test::eager_device("A100-40GB");
  const ProfiledCostModel derived(none_only, m, d, std::make_unique<AnalyticCostModel>(m, d));
  const ProfiledCostModel measured(full, m, d);
  const Query sel = make_query(LayerKind::Encoder, 1, Recompute::Selective, 1, 2048);
  const Query fq = make_query(LayerKind::Encoder, 1, Recompute::Full, 1, 2048);
  CHECK(derived.query(sel).time_source == Provenance::Derived);
  CHECK(derived.query(sel).stored_bytes == Approx(measured.query(sel).stored_bytes).epsilon(0.002));  // 295.5 MB
  CHECK(derived.query(fq).stored_bytes == Approx(measured.query(fq).stored_bytes).epsilon(0.01));     // 27.0 MB
  CHECK(derived.query(fq).total_ms() == Approx(measured.query(fq).total_ms()).epsilon(0.01));         // 21.2 ms
  double err = 0;
  int n = 0;
  for (std::int64_t seq : {256, 512, 1024, 2048}) {
    for (std::int64_t mbs : {1, 2, 4}) {
      Query q = fq;
      q.seq = seq;
      q.mbs = mbs;
      const LayerCost a = derived.query(q), b = measured.query(q);
      err += std::abs(a.total_ms() / b.total_ms() - 1);
      ++n;
      CHECK(a.stored_bytes + a.peak_bytes >= b.stored_bytes + b.peak_bytes);  // conservative peak
    }
  }
  CHECK(err / n < 0.03);
}
