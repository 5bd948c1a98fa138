// Properties of the analytic cost model, static memory, the communication model and stage
// composition; and its distance to DynaPipe's profiled GPT-6.7B grid (loose bound, printed).
#include <atomic>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "tests/support/devices.h"
#include "costmodel/analytic.h"
#include "costmodel/cost_model.h"
#include "costmodel/factory.h"
#include "costmodel/flops.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::costmodel;

namespace {

AnalyticCostModel gpt(const char* name = "gpt-6.7b") { return AnalyticCostModel(load_model(name), packpipe::test::eager_device("A100-40GB")); }

Query enc(std::int64_t mbs, std::int64_t seq, Recompute rc = Recompute::None, std::int64_t tp = 1) {
  Query q;
  q.kind = LayerKind::Encoder;
  q.mbs = mbs;
  q.seq = seq;
  q.tp = tp;
  q.recompute = rc;
  return q;
}

/// The analytic constants without the activation calibration: stored activations are the closed forms.
AnalyticOptions closed_forms() {
  AnalyticOptions o;
  o.activation_token_bytes = o.activation_score_bytes = o.activation_layer_bytes = 0;
  return o;
}

}  // namespace

TEST_CASE("recompute and provenance names round-trip", "[interface]") {
  for (auto rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    CHECK(recompute_from_name(recompute_name(rc)) == rc);
  }
  CHECK(std::string(provenance_name(Provenance::Interpolated)) == "interpolated");
  CHECK(std::string(provenance_name(Provenance::Analytic)) == "analytic");
  REQUIRE_THROWS_AS(recompute_from_name("some"), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(recompute_from_name("some"), Catch::Matchers::Contains("unknown recompute mode 'some'"));
}

TEST_CASE("stored activations reproduce Korthikanti's closed forms", "[interface]") {
  const ModelSpec m = load_model("gpt-6.7b");
  const AnalyticCostModel cm(m, packpipe::test::eager_device("A100-40GB"), closed_forms());
  const AnalyticCostModel calibrated(m, packpipe::test::eager_device("A100-40GB"));
  const AnalyticOptions o;
  const double h = static_cast<double>(m.hidden), a = static_cast<double>(m.heads);
  for (std::int64_t t : {1, 2, 4, 8}) {
    for (std::int64_t b : {1, 3}) {
      for (std::int64_t s : {128, 2048}) {
        const double sbh = static_cast<double>(s * b) * h, td = static_cast<double>(t);
        // s b h (10 + 24 / t + 5 a s / (h t)) without recompute; s b h (10 + 24 / t) selective; 2 s b h full.
        CHECK(cm.query(enc(b, s, Recompute::None, t)).stored_bytes ==
              Approx(sbh * (10 + 24 / td + 5 * a * static_cast<double>(s) / (h * td))));
        CHECK(cm.query(enc(b, s, Recompute::Selective, t)).stored_bytes == Approx(sbh * (10 + 24 / td)));
        CHECK(cm.query(enc(b, s, Recompute::Full, t)).stored_bytes == Approx(2 * sbh));
        // The calibration adds the same bytes under every mode: per token and hidden unit, per
        // attention score, per layer.
        const double extra = o.activation_token_bytes * sbh +
                             o.activation_score_bytes * a * static_cast<double>(s * s * b) / td + o.activation_layer_bytes;
        for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
          CHECK(calibrated.query(enc(b, s, rc, t)).stored_bytes ==
                Approx(cm.query(enc(b, s, rc, t)).stored_bytes + extra));
        }
      }
    }
  }
  // tp = 1: s b h (34 + 5 a s / h), the paper's headline form.
  const double s = 2048;
  CHECK(layer_activation_bytes(m, LayerKind::Encoder, 1, 1, 2048, 0, Recompute::None) ==
        Approx(s * h * (34 + 5 * a * s / h)));
}

TEST_CASE("GQA and gated MLP change the stored activations as derived", "[interface]") {
  ModelSpec m = load_model("llama-7b");
  m.kv_heads = 8;
  const double s = 1024, h = static_cast<double>(m.hidden), q = static_cast<double>(m.heads * m.head_dim);
  const double kv = static_cast<double>(m.kv_heads * m.head_dim), f = static_cast<double>(m.ffn_hidden);
  // replicated 10 s h, Q K V context 2(2q + 2kv) s, gated MLP three f-wide tensors 2 * 3 f s.
  CHECK(layer_activation_bytes(m, LayerKind::Encoder, 1, 1, 1024, 0, Recompute::Selective) ==
        Approx(s * (10 * h + 2 * (2 * q + 2 * kv) + 2 * 3 * f)));
  const AnalyticCostModel cm(m, packpipe::test::eager_device("H100-80GB"));
  CHECK(cm.query(enc(1, 1024)).forward_ms > 0);
}

TEST_CASE("T5 decoder layer: cross-attention memory and boundary with the encoder output", "[interface]") {
  const ModelSpec m = load_model("t5-11b");
  const AnalyticCostModel cm(m, packpipe::test::eager_device("A100-40GB"), closed_forms());
  Query q;
  q.kind = LayerKind::Decoder;
  q.mbs = 2;
  q.seq = 512;
  q.dec_seq = 128;
  const LayerCost c = cm.query(q);
  const double e = 2, b = 2, s = 512, d = 128, h = static_cast<double>(m.hidden), a = static_cast<double>(m.heads);
  const double qd = static_cast<double>(m.heads * m.head_dim);
  CHECK(c.boundary_bytes == Approx(e * b * (d + s) * h));
  const double expect = d * b * h * 15 + d * b * e * (4 * qd + 2 * qd + 2 * static_cast<double>(m.ffn_hidden)) +
                        s * b * e * 2 * qd + 5 * a * b * (d * d + d * s);
  CHECK(c.stored_bytes == Approx(expect));
  // longer encoder input: more decoder work (cross-attention keys and values)
  Query q2 = q;
  q2.seq = 1024;
  CHECK(cm.query(q2).forward_ms > c.forward_ms);
  CHECK(cm.query(q2).stored_bytes > c.stored_bytes);
}

TEST_CASE("time is monotone in mbs and seq; recompute orders time and memory", "[interface]") {
  const AnalyticCostModel cm = gpt();
  for (auto rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    for (std::int64_t tp : {1, 8}) {
      double prev_t = 0, prev_m = 0;
      for (std::int64_t b = 1; b <= 64; b *= 2) {
        const LayerCost c = cm.query(enc(b, 1024, rc, tp));
        CHECK(c.total_ms() > prev_t);
        CHECK(c.stored_bytes > prev_m);
        prev_t = c.total_ms();
        prev_m = c.stored_bytes;
      }
      prev_t = prev_m = 0;
      for (std::int64_t s = 16; s <= 8192; s *= 2) {
        const LayerCost c = cm.query(enc(2, s, rc, tp));
        CHECK(c.total_ms() > prev_t);
        CHECK(c.stored_bytes > prev_m);
        prev_t = c.total_ms();
        prev_m = c.stored_bytes;
      }
    }
  }
  for (std::int64_t s : {256, 2048, 8192}) {
    const LayerCost n = cm.query(enc(4, s, Recompute::None));
    const LayerCost sel = cm.query(enc(4, s, Recompute::Selective));
    const LayerCost full = cm.query(enc(4, s, Recompute::Full));
    CHECK(n.total_ms() < sel.total_ms());
    CHECK(sel.total_ms() < full.total_ms());
    CHECK(n.stored_bytes > sel.stored_bytes);
    CHECK(sel.stored_bytes > full.stored_bytes);
    CHECK(n.recompute_ms == 0);
    CHECK(full.recompute_ms == Approx(full.forward_ms));
    CHECK(n.peak_bytes <= sel.peak_bytes);
    CHECK(sel.peak_bytes <= full.peak_bytes);
  }
}

TEST_CASE("backward is about backward_factor x forward for large shapes; the floor for tiny ones", "[interface]") {
  const AnalyticCostModel cm = gpt();
  const LayerCost big = cm.query(enc(16, 2048));
  CHECK(big.backward_ms / big.forward_ms == Approx(cm.options().backward_factor).epsilon(0.02));
  AnalyticOptions two;
  two.backward_factor = 2.0;
  const AnalyticCostModel cm2(load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"), two);
  const LayerCost big2 = cm2.query(enc(16, 2048));
  CHECK(big2.backward_ms / big2.forward_ms == Approx(2.0).epsilon(0.02));
  const LayerCost tiny = cm.query(enc(1, 16));
  CHECK(tiny.forward_ms == Approx(cm.options().layer_overhead_ms).epsilon(0.01));
  // num_layers scales times and stored bytes, not the one-layer transient peak
  Query q = enc(2, 512);
  const LayerCost one = cm.query(q);
  q.num_layers = 5;
  const LayerCost five = cm.query(q);
  CHECK(five.forward_ms == Approx(5 * one.forward_ms));
  CHECK(five.stored_bytes == Approx(5 * one.stored_bytes));
  CHECK(five.peak_bytes == Approx(one.peak_bytes));
  CHECK(five.boundary_bytes == Approx(2.0 * 2 * 512 * 4096));
  CHECK(five.time_source == Provenance::Analytic);
}

TEST_CASE("efficiency falls for small shapes and with tensor parallelism", "[interface]") {
  const AnalyticCostModel cm = gpt();
  CHECK(cm.efficiency(16, 4096) < cm.efficiency(1024, 4096));
  CHECK(cm.efficiency(1024, 4096) < cm.efficiency(65536, 4096));
  CHECK(cm.efficiency(1e9, 1e9) == Approx(cm.options().max_efficiency).epsilon(1e-3));
  // achieved TFLOP/s per GPU falls with tp for the same shape (narrower GEMMs plus all-reduces)
  const double f = forward_flops(cm.model(), LayerKind::Encoder, 8, 2048).total();
  double prev = 1e30;
  for (std::int64_t tp : {1, 2, 4, 8}) {
    const double per_gpu = f / static_cast<double>(tp) / cm.query(enc(8, 2048, Recompute::None, tp)).forward_ms;
    CHECK(per_gpu < prev);
    prev = per_gpu;
  }
}

TEST_CASE("query rejects bad input naming the argument", "[negative]") {
  const AnalyticCostModel cm = gpt();
  REQUIRE_THROWS_AS(cm.query(enc(0, 128)), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(cm.query(enc(0, 128)), Catch::Matchers::Contains("mbs"));
  REQUIRE_THROWS_WITH(cm.query(enc(1, 0)), Catch::Matchers::Contains("seq"));
  REQUIRE_THROWS_WITH(cm.query(enc(1, 128, Recompute::None, 0)), Catch::Matchers::Contains("tp must be positive"));
  REQUIRE_THROWS_WITH(cm.query(enc(1, 128, Recompute::None, 3)), Catch::Matchers::Contains("tp (3) must divide"));
  Query q = enc(1, 128);
  q.num_layers = 0;
  REQUIRE_THROWS_WITH(cm.query(q), Catch::Matchers::Contains("num_layers"));
  q = enc(1, 128);
  q.kind = LayerKind::Decoder;
  q.dec_seq = 16;
  REQUIRE_THROWS_AS(cm.query(q), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(cm.query(q), Catch::Matchers::Contains("decoder-only"));
  q = enc(1, 128);
  q.dec_seq = 16;
  REQUIRE_THROWS_WITH(cm.query(q), Catch::Matchers::Contains("dec_seq must be 0"));
  const AnalyticCostModel t5(load_model("t5-770m"), packpipe::test::eager_device("V100-32GB"));
  q = enc(1, 128);
  q.kind = LayerKind::Decoder;
  REQUIRE_THROWS_WITH(t5.query(q), Catch::Matchers::Contains("dec_seq (decoder length) must be positive"));
  AnalyticOptions bad;
  bad.max_efficiency = 1.5;
  REQUIRE_THROWS_AS(AnalyticCostModel(load_model("gpt-1.3b"), packpipe::test::eager_device("A100-40GB"), bad), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(AnalyticCostModel(load_model("gpt-1.3b"), packpipe::test::eager_device("A100-40GB"), bad),
                      Catch::Matchers::Contains("max_efficiency"));
  REQUIRE_THROWS_WITH(make_cost_model({"gpt-99b", "A100-40GB", {}, ""}), Catch::Matchers::Contains("unknown model 'gpt-99b'"));
}

TEST_CASE("static memory: 16 bytes per parameter divided by dp per ZeRO stage", "[interface]") {
  const double p = 1e9;
  const StaticMemory z0 = static_memory(p, 8, 0);
  CHECK(z0.total() == Approx(16 * p));
  const StaticMemory z1 = static_memory(p, 8, 1);
  CHECK(z1.optimizer_bytes == Approx(12 * p / 8));
  CHECK(z1.grads_bytes == Approx(2 * p));
  const StaticMemory z2 = static_memory(p, 8, 2);
  CHECK(z2.grads_bytes == Approx(2 * p / 8));
  CHECK(z2.params_bytes == Approx(2 * p));
  const StaticMemory z3 = static_memory(p, 8, 3);
  CHECK(z3.total() == Approx(16 * p / 8));
  CHECK(static_memory(p, 1, 3).total() == Approx(z0.total()));
  REQUIRE_THROWS_AS(static_memory(p, 0, 0), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(static_memory(p, 0, 0), Catch::Matchers::Contains("dp"));
  REQUIRE_THROWS_WITH(static_memory(p, 2, 4),
                      Catch::Matchers::Contains("ZeRO stage (zero / --zero) must be 0, 1, 2 or 3"));
}

TEST_CASE("stage composition sums layers and includes embedding and head where they live", "[interface]") {
  const AnalyticCostModel cm = gpt();
  const ModelSpec& m = cm.model();
  StageLayout first{8, 0, true, false}, last{8, 0, false, true}, middle{8, 0, false, false};
  Query q = enc(2, 1024);
  q.num_layers = 8;
  const LayerCost layers = cm.query(q);
  Query qe = enc(2, 1024);
  qe.kind = LayerKind::Embedding;
  Query qp = enc(2, 1024);
  qp.kind = LayerKind::PostProcess;
  const LayerCost emb = cm.query(qe), post = cm.query(qp);
  const LayerCost cf = stage_cost(cm, first, 1, 2, 1024, 0, Recompute::None);
  const LayerCost cl = stage_cost(cm, last, 1, 2, 1024, 0, Recompute::None);
  const LayerCost cmid = stage_cost(cm, middle, 1, 2, 1024, 0, Recompute::None);
  CHECK(cmid.forward_ms == Approx(layers.forward_ms));
  CHECK(cf.forward_ms == Approx(layers.forward_ms + emb.forward_ms));
  CHECK(cl.backward_ms == Approx(layers.backward_ms + post.backward_ms));
  CHECK(cf.stored_bytes == Approx(layers.stored_bytes + emb.stored_bytes));
  CHECK(cmid.peak_bytes == Approx(layers.peak_bytes));
  CHECK(cl.peak_bytes >= post.peak_bytes);
  CHECK(cf.boundary_bytes == Approx(layers.boundary_bytes));
  CHECK(cl.boundary_bytes == 0);
  CHECK(cf.time_source == Provenance::Analytic);
  // static memory: layers / tp, the tied embedding on the first and last stage, one copy when both
  const StaticMemory sm = stage_static_memory(m, middle, 2, 1, 0);
  CHECK(sm.params_bytes == Approx(2.0 * 8 * static_cast<double>(m.layer_params()) / 2));
  const StaticMemory sf = stage_static_memory(m, first, 1, 1, 0);
  CHECK(sf.params_bytes == Approx(2.0 * (8 * static_cast<double>(m.layer_params()) + static_cast<double>(m.embedding_params()))));
  const StaticMemory whole = stage_static_memory(m, StageLayout{m.num_layers, 0, true, true}, 1, 1, 0);
  CHECK(whole.params_bytes == Approx(2.0 * static_cast<double>(m.total_params())));
  REQUIRE_THROWS_WITH(stage_cost(cm, StageLayout{0, 2, false, false}, 1, 2, 1024, 0, Recompute::None),
                      Catch::Matchers::Contains("decoder-only"));
  REQUIRE_THROWS_WITH(stage_cost(cm, StageLayout{}, 1, 2, 1024, 0, Recompute::None),
                      Catch::Matchers::Contains("no layers"));
  // encoder-decoder stage: encoder and decoder layers together
  const AnalyticCostModel t5(load_model("t5-770m"), packpipe::test::eager_device("A100-40GB"));
  const LayerCost ct5 = stage_cost(t5, StageLayout{2, 2, true, true}, 1, 2, 512, 128, Recompute::Selective);
  CHECK(ct5.total_ms() > 0);
  CHECK(ct5.boundary_bytes == 0);
}

TEST_CASE("alpha-beta communication formulas", "[interface]") {
  const DeviceSpec d = packpipe::test::eager_device("A100-40GB");
  const CommModel c = CommModel::from_device(d);
  CHECK(c.intra_latency_ms == Approx(d.intra_node_latency_us / 1e3));
  CHECK(c.intra_bytes_per_ms == Approx(d.intra_node_gbps * 1e6));
  const double bytes = 64e6;
  CHECK(c.p2p_ms(bytes) == Approx(c.intra_latency_ms + bytes / c.intra_bytes_per_ms));
  CHECK(c.p2p_ms(bytes, true) == Approx(c.inter_latency_ms + bytes / c.inter_bytes_per_ms));
  CHECK(c.p2p_ms(bytes, true) > c.p2p_ms(bytes));
  for (std::int64_t n : {2, 4, 8}) {
    const double nd = static_cast<double>(n);
    CHECK(c.all_reduce_ms(bytes, n) ==
          Approx(2 * (nd - 1) * (c.intra_latency_ms + bytes / nd / c.intra_bytes_per_ms)));
    CHECK(c.all_gather_ms(bytes, n) == Approx((nd - 1) * (c.intra_latency_ms + bytes / nd / c.intra_bytes_per_ms)));
    CHECK(c.reduce_scatter_ms(bytes, n, true) == Approx(c.all_gather_ms(bytes, n, true)));
    CHECK(c.all_reduce_ms(bytes, n) == Approx(c.all_gather_ms(bytes, n) + c.reduce_scatter_ms(bytes, n)));
  }
  CHECK(c.all_reduce_ms(bytes, 1) == 0);
  REQUIRE_THROWS_AS(c.all_reduce_ms(bytes, 0), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(c.p2p_ms(-1), Catch::Matchers::Contains("bytes"));
}

TEST_CASE("queries are deterministic and thread-safe", "[stress]") {
  const auto cm = make_cost_model({"gpt-13b", "H100-80GB", {}, ""});
  std::vector<double> expect;
  for (std::int64_t b = 1; b <= 16; ++b) expect.push_back(cm->query(enc(b, 100 * b, Recompute::Selective, 4 + 0 * b)).total_ms());
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int rep = 0; rep < 2000; ++rep) {
        const std::int64_t b = 1 + rep % 16;
        if (cm->query(enc(b, 100 * b, Recompute::Selective, 4)).total_ms() != expect[static_cast<std::size_t>(b - 1)]) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches == 0);
}

TEST_CASE("analytic model against DynaPipe's GPT-6.7B profile (A100-40GB)", "[regression]") {
  // ms per layer; DynaPipe's backward includes the recompute. Loose bounds: the figures per stage
  // and recompute mode are in the design note (benchmarks/analytic_vs_profile.cpp).
  std::ifstream in(std::string(PACKPIPE_FIXTURES_DIR) + "/dynapipe/derived_from_cost_models_pkl/gpt_6.7b_timing.csv");
  REQUIRE(in.good());
  const AnalyticCostModel cm = gpt();
  std::string line;
  std::getline(in, line);
  double sum = 0;
  int n = 0;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::vector<std::string> c;
    std::string cell;
    while (std::getline(ss, cell, ',')) c.push_back(cell);
    REQUIRE(c.size() == 8);
    Query q = enc(std::stoll(c[6]), std::stoll(c[4]), recompute_from_name(c[1]), std::stoll(c[0]));
    q.kind = layer_kind_from_name(c[2]);
    const LayerCost r = cm.query(q);
    const double pred = c[3] == "backward" ? r.backward_ms + r.recompute_ms : r.forward_ms;
    const double actual = std::stod(c[7]);
    sum += std::fabs(pred - actual) / actual;
    ++n;
  }
  REQUIRE(n == 4096);
  const double mape = 100 * sum / n;
  INFO("GPT-6.7B time MAPE " << mape << "% over " << n << " points");
  CHECK(mape < 25);
}

TEST_CASE("queries above the size limits are refused, never computed in overflowing arithmetic", "[negative]") {
  const AnalyticCostModel cm(load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
  Query q;
  q.kind = LayerKind::Encoder;
  q.mbs = 2147483647;
  q.seq = 2147483647;
  REQUIRE_THROWS_WITH(cm.query(q), Catch::Matchers::Contains("above the limit"));
  q.mbs = 1;
  REQUIRE_THROWS_WITH(cm.query(q), Catch::Matchers::Contains("seq 2147483647"));
  q.seq = 1 << 20;
  q.mbs = 1 << 13;  // 2^33 tokens
  REQUIRE_THROWS_WITH(cm.query(q), Catch::Matchers::Contains("tokens is above the limit"));
  q.mbs = 1;
  q.num_layers = 1 << 20;
  REQUIRE_THROWS_WITH(cm.query(q), Catch::Matchers::Contains("num_layers"));
  q.num_layers = 1;
  LayerCost rows[4];
  q.mbs = kMaxQueryMbs - 1;
  q.seq = 1;
  REQUIRE_THROWS_AS(cm.query_rows(q, 4, rows), packpipe::InvalidArgument);  // the last row is above
  q.mbs = 4;
  q.seq = 1024;
  const LayerCost ok = cm.query(q);
  REQUIRE((std::isfinite(ok.forward_ms) && ok.forward_ms > 0 && ok.stored_bytes > 0));
}

TEST_CASE("device files carry the analytic model's constants; bad ones name the file and field", "[interface][negative]") {
  packpipe::test::TempDir dir;
  // A CPU described by a file, constants in an "analytic" object: parsed, applied by every path
  // that builds the analytic model from the device (the constructor, make_cost_model).
  const std::string cpu = dir.file("cpu.json");
  packpipe::test::write_file(cpu, R"({"name": "cpu-test", "peak_tflops": 0.05, "memory_gb": 16, "hbm_gbps": 20,
    "intra_node_gbps": 5, "inter_node_gbps": 1, "gpus_per_node": 1,
    "analytic": {"max_efficiency": 0.5, "half_efficiency_tokens": 64, "half_efficiency_width": 32,
                 "attention_efficiency": 0.8, "memory_traffic": 1.5, "layer_overhead_ms": 0.02,
                 "recompute_overhead_ms": 0.01, "backward_factor": 2.0, "tp_communication": false}})");
  const DeviceSpec d = load_device(cpu);
  CHECK(d.name == "cpu-test");
  CHECK(d.analytic.max_efficiency == 0.5);
  CHECK(d.analytic.half_efficiency_tokens == 64);
  CHECK(d.analytic.half_efficiency_width == 32);
  CHECK(d.analytic.attention_efficiency == 0.8);
  CHECK(d.analytic.memory_traffic == 1.5);
  CHECK(d.analytic.layer_overhead_ms == 0.02);
  CHECK(d.analytic.recompute_overhead_ms == 0.01);
  CHECK(d.analytic.backward_factor == 2.0);
  CHECK(!d.analytic.tp_communication);
  const ModelSpec m = load_model("gpt-350m");
  const AnalyticCostModel from_device(m, d);
  CHECK(from_device.options().max_efficiency == 0.5);
  CHECK(from_device.efficiency(1e12, 1e12) == Approx(0.5));
  const auto factory = make_cost_model({"gpt-350m", cpu, {}});
  Query q = enc(4, 256);
  q.recompute = Recompute::Full;
  const LayerCost a = from_device.query(q), b = factory->query(q);
  CHECK(a.forward_ms == b.forward_ms);
  CHECK(a.backward_ms == b.backward_ms);
  // The constants change the answers: backward = backward_factor x forward on compute-bound shapes.
  CHECK(a.backward_ms == Approx(2.0 * a.forward_ms).epsilon(0.01));
  // Flat keys work the same; missing constants keep the defaults.
  const std::string flat = dir.file("flat.json");
  packpipe::test::write_file(flat, R"({"peak_tflops": 0.05, "memory_gb": 16, "hbm_gbps": 20, "intra_node_gbps": 5,
    "inter_node_gbps": 1, "layer_overhead_ms": 0.02, "backward_factor": 2.0})");
  const DeviceSpec f = load_device(flat);
  CHECK(f.analytic.layer_overhead_ms == 0.02);
  CHECK(f.analytic.backward_factor == 2.0);
  CHECK(f.analytic.max_efficiency == AnalyticOptions{}.max_efficiency);
  // Presets carry the defaults.
  CHECK(packpipe::test::eager_device("H100-80GB").analytic.layer_overhead_ms == AnalyticOptions{}.layer_overhead_ms);

  auto refused = [&](const std::string& name, const std::string& text, const std::string& says) {
    const std::string path = dir.file(name);
    packpipe::test::write_file(path, text);
    REQUIRE_THROWS_AS(load_device(path), packpipe::InvalidArgument);
    REQUIRE_THROWS_WITH(load_device(path), Catch::Matchers::Contains(path) && Catch::Matchers::Contains(says));
  };
  const std::string base = R"("peak_tflops": 1, "memory_gb": 16, "hbm_gbps": 20, "intra_node_gbps": 5, "inter_node_gbps": 1)";
  refused("eff.json", "{" + base + R"(, "analytic": {"max_efficiency": 1.5}})",
          "'analytic.max_efficiency' must be in (0, 1], found 1.5");
  refused("neg.json", "{" + base + R"(, "layer_overhead_ms": -1})", "'layer_overhead_ms' must be a finite number >= 0, found -1");
  refused("bwd.json", "{" + base + R"(, "analytic": {"backward_factor": 0}})", "'analytic.backward_factor' must be a finite number > 0");
  refused("type.json", "{" + base + R"(, "analytic": {"memory_traffic": "fast"}})",
          "'analytic.memory_traffic' must be a number, found \"fast\"");
  refused("flag.json", "{" + base + R"(, "analytic": {"tp_communication": 1}})",
          "'analytic.tp_communication' must be true or false, found 1");
  refused("unknown.json", "{" + base + R"(, "analytic": {"max_efficency": 0.5}})", "unknown key 'analytic.max_efficency'");
  refused("twice.json", "{" + base + R"(, "backward_factor": 2, "analytic": {"backward_factor": 2}})",
          "'backward_factor' is given twice");
  refused("object.json", "{" + base + R"(, "analytic": [1]})", "'analytic' must be an object");
}

TEST_CASE("flash kernel: no stored scores, a log-sum-exp per query, causal half the attention FLOPs",
          "[interface]") {
  const ModelSpec m = load_model("llama-7b");
  const DeviceSpec flash_dev = load_device("H100-80GB");
  const AnalyticCostModel flash(m, flash_dev);
  const AnalyticCostModel eager(m, packpipe::test::eager_device("H100-80GB"));
  REQUIRE(flash.attention() == AttentionKernel::Flash);
  REQUIRE(eager.attention() == AttentionKernel::Eager);
  const double h = static_cast<double>(m.hidden), a = static_cast<double>(m.heads);
  for (std::int64_t s : {2048, 8192, 32768}) {
    const double sd = static_cast<double>(s);
    const LayerCost f = flash.query(enc(1, s));
    const LayerCost e = eager.query(enc(1, s));
    // Korthikanti's 5 a s^2 bytes are the difference (up to the fp32 lse and the score calibration term).
    const AnalyticOptions& o = flash_dev.analytic;
    const double lse = 4 * a * sd;
    CHECK(e.stored_bytes - f.stored_bytes ==
          Approx(5 * a * sd * sd + o.activation_score_bytes * a * sd * sd - lse).epsilon(1e-9));
    // stored grows linearly in s under flash: about 34 s h plus the calibration per token
    const LayerCost f2 = flash.query(enc(2, s));
    CHECK(f2.stored_bytes - f.stored_bytes == Approx(f.stored_bytes - o.activation_layer_bytes).epsilon(1e-9));
    CHECK(f.stored_bytes < 40 * sd * h);
    // selective recompute keeps what none keeps and recomputes nothing under flash
    const LayerCost fs = flash.query(enc(1, s, Recompute::Selective));
    CHECK(fs.stored_bytes == f.stored_bytes);
    CHECK(fs.recompute_ms == 0);
    CHECK(fs.forward_ms == f.forward_ms);
    // no s x s tensor in the transient peak
    CHECK(f.peak_bytes < e.peak_bytes);
    CHECK(f.peak_bytes < 2 * 2 * sd * static_cast<double>(3 * m.ffn_hidden));
  }
  // executed attention: half the square for causal self-attention, the whole for a T5 encoder
  const FlopsShape fs = flops_shape(m, LayerKind::Encoder, 4096);
  CHECK(executed_attention_flops(m, fs, 1, {}, AttentionKernel::Flash) ==
        Approx(0.5 * executed_attention_flops(m, fs, 1, {}, AttentionKernel::Eager)));
  CHECK(executed_attention_flops(m, fs, 1, {}, AttentionKernel::Eager) == forward_flops(m, LayerKind::Encoder, 1, 4096).attention);
  const ModelSpec t5 = load_model("t5-770m");
  const FlopsShape te = flops_shape(t5, LayerKind::Encoder, 512);
  CHECK(executed_attention_flops(t5, te, 2, {}, AttentionKernel::Flash) ==
        executed_attention_flops(t5, te, 2, {}, AttentionKernel::Eager));
  // the long row costs far less under flash (no score traffic, causal half)
  CHECK(flash.query(enc(1, 32768)).total_ms() < 0.5 * eager.query(enc(1, 32768)).total_ms());
}

TEST_CASE("a slice's cost grows with its prefix; its kept keys and values are stored", "[interface]") {
  const ModelSpec m = load_model("llama-7b");
  for (const bool use_flash : {true, false}) {
    const AnalyticCostModel cm(m, use_flash ? load_device("H100-80GB") : packpipe::test::eager_device("H100-80GB"));
    auto slice = [&](std::int64_t len, std::int64_t kept) {
      Query q = enc(1, len);
      q.attention.add_slice(len, kept);
      return cm.query(q);
    };
    double prev_time = 0, prev_stored = 0;
    for (std::int64_t kept : {0, 1024, 4096, 16384, 65536}) {
      const LayerCost c = slice(4096, kept);
      CHECK(c.total_ms() > prev_time);
      CHECK(c.stored_bytes > prev_stored);
      prev_time = c.total_ms();
      prev_stored = c.stored_bytes;
    }
    // what the kept prefix adds to stored: at least its keys and values (2 e kv p)
    const double kv = static_cast<double>(m.kv_heads * m.head_dim);
    CHECK(slice(4096, 16384).stored_bytes - slice(4096, 0).stored_bytes >= 2 * 2 * kv * 16384);
    // A sample cut in two slices does the whole sample's model FLOPs
    const FlopsShape f1 = flops_shape(m, LayerKind::Encoder, 3000), f2 = flops_shape(m, LayerKind::Encoder, 5000);
    AttentionWork w1, w2;
    w1.add_slice(3000, 0);
    w2.add_slice(5000, 3000);
    CHECK(f1.at(1, w1).attention + f2.at(1, w2).attention ==
          Approx(forward_flops(m, LayerKind::Encoder, 1, 8000).attention));
    // and executes less attention than the whole under eager (the upper blocks are skipped), the same under flash
    const double whole = executed_attention_flops(m, flops_shape(m, LayerKind::Encoder, 8000), 1, {}, cm.attention());
    const double parts = executed_attention_flops(m, f1, 1, w1, cm.attention()) +
                         executed_attention_flops(m, f2, 1, w2, cm.attention());
    if (use_flash) {
      CHECK(parts == Approx(whole));
    } else {
      CHECK(parts < whole);
    }
  }
  // impossible slice sums are refused
  const AnalyticCostModel cm(m, load_device("H100-80GB"));
  Query bad = enc(1, 100);
  bad.attention.self = 100 * 100;
  bad.attention.prefix = 5;
  bad.attention.prefix_tokens = 10;  // more kept tokens than query x kept
  REQUIRE_THROWS_WITH(cm.query(bad), Catch::Matchers::Contains("prefix_tokens"));
}
