// Profile readers against the fixtures' field lists and units, synthesized files for the formats
// without fixtures (DynaPipe per-point files, Metis, AIOB), and bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <set>
#include <string>

#include "common/errors.h"
#include "tests/support/devices.h"
#include "costmodel/model.h"
#include "costmodel/profile_readers.h"
#include "costmodel/profiled.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::costmodel;
using packpipe::test::fixture;
using packpipe::test::read_file;

namespace {

const std::string kDyn = "dynapipe/derived_from_cost_models_pkl/";
const std::string kMini = "aceso/profiler/profiled-time-miniset/";
const double kMiB = 1048576.0;

std::size_t data_rows(const std::string& path) {
  const std::string text = read_file(path);
  std::size_t n = 0, start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) ++n;
    start = end + 1;
  }
  return n - 1;  // header
}

Profile parse_fixture(const std::string& rel) {
  const std::string path = fixture(rel);
  return parse_profile(read_file(path), path);
}

const ProfilePoint* find_point(const Profile& p, LayerKind k, std::int64_t tp, Recompute rc, std::int64_t mbs,
                               std::int64_t seq, std::int64_t dec, bool want_fwd) {
  for (const auto& x : p.points) {
    if (x.kind == k && x.tp == tp && x.rc == rc && x.mbs == mbs && x.seq == seq && x.dec_seq == dec &&
        std::isnan(want_fwd ? x.fwd_ms : x.bwd_ms) == false) {
      return &x;
    }
  }
  return nullptr;
}

const char* kGptMicrobench =
    "forward_encoder: 5.78 ms\n"
    "backward_encoder: 9.65 ms\n"
    "forward_postprocess: 12.5 ms\n"
    "backward_postprocess: 20.25 ms\n"
    "encoder_activation: 966.55 MB\n"
    "peak_encoder_activation: 3344.22 MB\n"
    "model_embedding: 417.66 MB\n"
    "model_encoder: 402.77 MB\n";

}  // namespace

TEST_CASE("DynaPipe timing grid: every row, units ms per layer, field mapping", "[interface]") {
  const Profile p = parse_fixture(kDyn + "gpt_6.7b_timing.csv");
  REQUIRE(p.points.size() == 4096);  // README: 4096 timing rows
  CHECK(p.model == "gpt_6.7b");
  std::set<std::int64_t> tps;
  std::set<Recompute> rcs;
  for (const auto& x : p.points) {
    tps.insert(x.tp);
    rcs.insert(x.rc);
    CHECK(x.dec_seq == 0);
    CHECK(std::isnan(x.fwd_ms) != std::isnan(x.bwd_ms));  // one train_stage per row
  }
  CHECK(tps == std::set<std::int64_t>{1, 2, 4, 8});
  CHECK(rcs.size() == 3);
  // "1,none,encoder,forward,2048,0,1,5.78" and "1,full,encoder,backward,2048,0,1,15.43"
  const ProfilePoint* f = find_point(p, LayerKind::Encoder, 1, Recompute::None, 1, 2048, 0, true);
  REQUIRE(f != nullptr);
  CHECK(f->fwd_ms == 5.78);
  const ProfilePoint* b = find_point(p, LayerKind::Encoder, 1, Recompute::Full, 1, 2048, 0, false);
  REQUIRE(b != nullptr);
  CHECK(b->bwd_ms == 15.43);
}

TEST_CASE("DynaPipe activation and model state: MB = 1e6 bytes", "[interface]") {
  const Profile a = parse_fixture(kDyn + "gpt_6.7b_activation.csv");
  REQUIRE(a.points.size() == data_rows(fixture(kDyn + "gpt_6.7b_activation.csv")));
  // "1,none,encoder,2048,0,1,966.55,3344.22"
  bool found = false;
  for (const auto& x : a.points) {
    if (x.tp == 1 && x.rc == Recompute::None && x.seq == 2048 && x.mbs == 1) {
      CHECK(x.stored_bytes == Approx(966.55e6));
      // DynaPipe's peak is the layer's absolute peak; packpipe keeps the transient above the stored bytes.
      CHECK(x.peak_bytes == Approx(3344.22e6 - 966.55e6));
      CHECK(std::isnan(x.fwd_ms));
      found = true;
    }
  }
  CHECK(found);
  const Profile m = parse_fixture(kDyn + "gpt_6.7b_model_state.csv");
  REQUIRE(m.params.size() == 24);
  CHECK(m.params[0].kind == LayerKind::Embedding);
  CHECK(m.params[0].rc == Recompute::Full);
  CHECK(m.params[0].bytes == Approx(417.80958904109565e6));
}

TEST_CASE("DynaPipe T5 grid: decoder keyed by (enc, dec), post-process by dec, repeats kept", "[interface]") {
  const Profile p = parse_fixture(kDyn + "t5_11b_timing.csv");
  REQUIRE(p.points.size() == data_rows(fixture(kDyn + "t5_11b_timing.csv")));
  // "1,none,decoder,backward,16,16,1,2.5"
  const ProfilePoint* d = find_point(p, LayerKind::Decoder, 1, Recompute::None, 1, 16, 16, false);
  REQUIRE(d != nullptr);
  CHECK(d->bwd_ms == 2.5);
  // T5 post-process rows have enc_seqlen 0: keyed by the decoder length.
  const ProfilePoint* pp = find_point(p, LayerKind::PostProcess, 1, Recompute::None, 1, 0, 16, false);
  REQUIRE(pp != nullptr);
  // The encoder at (16, mbs 1) is measured once per decoder length profiled: 9 forward rows.
  std::size_t repeats = 0;
  for (const auto& x : p.points) {
    if (x.kind == LayerKind::Encoder && x.seq == 16 && x.mbs == 1 && !std::isnan(x.fwd_ms)) ++repeats;
  }
  CHECK(repeats == 9);
}

TEST_CASE("Aceso op tables: layer = sum of the 13 GPT ops, µs to ms, MiB to bytes", "[interface]") {
  const Profile p = parse_fixture(kMini + "gpt_1_3B_mbs1_tp1_algo0.csv");
  CHECK(p.model == "gpt_1_3B");
  REQUIRE(p.points.size() == 3);  // embedding, encoder layer, post-process
  for (const auto& x : p.points) {
    CHECK(x.mbs == 1);
    CHECK(x.tp == 1);
    CHECK(x.variant == 0);
    CHECK(x.seq == 2048);
    if (x.kind == LayerKind::Embedding) {
      CHECK(x.fwd_ms == Approx(0.191468));  // encoder-embedding 191.468 µs
      CHECK(x.bwd_ms == Approx(1.601714));
    } else if (x.kind == LayerKind::Encoder) {
      const double fwd_us = 41.586 + 659.752 + 530.183 + 605.232 + 944.859 + 685.561 + 233.787 + 95.713 + 53.728 +
                            790.590 + 94.885 + 798.005 + 96.107;
      CHECK(x.fwd_ms == Approx(fwd_us / 1000));
      // activations without the softmax output (the dropout's input): MiB
      const double act = 8.016 + 24 + 256 + 384 + 8 + 8 + 12 + 8.016 + 32 + 32 + 8 + 12;
      CHECK(x.stored_bytes == Approx(act * kMiB));
      CHECK(x.peak_bytes == Approx(1024 * kMiB));  // attention-dropout bwd_reserved
    } else {
      REQUIRE(x.kind == LayerKind::PostProcess);
      CHECK(x.fwd_ms == Approx((60.588 + 9597.570) / 1000));
    }
  }
  bool emb_params = false;
  for (const auto& pp : p.params) {
    if (pp.kind == LayerKind::Embedding) {
      CHECK(pp.bytes == Approx(208 * kMiB));
      emb_params = true;
    }
  }
  CHECK(emb_params);
  const Profile t5 = parse_fixture(kMini + "t5_770M_mbs2_tp1_algo0.csv");
  bool dec = false;
  for (const auto& x : t5.points) {
    if (x.kind == LayerKind::Decoder) {
      dec = true;
      CHECK(x.seq == 2048);
      CHECK(x.dec_seq == 512);
      CHECK(x.mbs == 2);
    }
  }
  CHECK(dec);
}

TEST_CASE("Aceso prim and p2p tables, AICB log: communication samples", "[interface]") {
  const std::string prim = fixture(kMini + "prim_gpt_1_3B_all_gather_2gpus.csv");
  const Profile g = parse_profile(read_file(prim), prim);
  // rows stored as 1e9 ms are failures: skipped and noted
  CHECK(g.comm.size() + 3 == data_rows(prim));
  CHECK(g.notes.size() == 1);
  for (const auto& c : g.comm) {
    CHECK(c.collective == "all_gather");
    CHECK(c.group_size == 2);
  }
  const std::string p2p = fixture(kMini + "p2p_intra_node.csv");
  const Profile q = parse_profile(read_file(p2p), p2p);
  REQUIRE(q.comm.size() == 11);
  CHECK(q.comm[0].bytes == kMiB);  // 1 MiB at 7.41 GiB/s
  CHECK(q.comm[0].ms == Approx(kMiB / (7.41 * 1073741824.0) * 1e3));
  CHECK_FALSE(q.comm[0].inter_node);

  const std::string log = fixture("aicb/visualize/inputs/A100_example.csv");
  const Profile a = parse_profile(read_file(log), log);
  REQUIRE(!a.comm.empty());
  for (const auto& c : a.comm) {
    CHECK(c.group_size > 0);
    CHECK(c.ms >= 0);
  }
  const auto fits = fit_alpha_beta(a.comm);
  REQUIRE(!fits.empty());
  bool ag = false;
  for (const auto& f : fits) {
    CHECK(std::isfinite(f.alpha_ms));
    CHECK(f.alpha_ms >= 0);
    if (f.collective == "all_gather" && f.group_size == 2) {
      ag = true;
      CHECK(f.sizes > 1);
      CHECK(f.bytes_per_ms > 0);
    }
  }
  CHECK(ag);
}

TEST_CASE("DynaPipe per-point files: name, fields and units", "[interface]") {
  const std::string name = "microbench_tp2_hs4096_ah32_kv128_ffhs16384_sl2048_mbs4_rc_selective.txt";
  const Profile p = parse_profile(kGptMicrobench, name);
  REQUIRE(p.points.size() == 2);
  for (const auto& x : p.points) {
    CHECK(x.tp == 2);
    CHECK(x.rc == Recompute::Selective);
    CHECK(x.mbs == 4);
    CHECK(x.seq == 2048);
    if (x.kind == LayerKind::Encoder) {
      CHECK(x.fwd_ms == 5.78);
      CHECK(x.bwd_ms == 9.65);
      CHECK(x.stored_bytes == Approx(966.55e6));
      CHECK(x.peak_bytes == Approx(3344.22e6 - 966.55e6));  // the transient above the stored bytes
    } else {
      CHECK(x.kind == LayerKind::PostProcess);
      CHECK(x.fwd_ms == 12.5);
    }
  }
  REQUIRE(p.params.size() == 2);
  // Other time units convert exactly.
  const Profile us = parse_profile("forward_encoder: 5780 us\nbackward_encoder: 9650000 ns\n",
                                   "microbench_tp1_hs4096_ah32_kv128_ffhs16384_sl2048_mbs1.txt");
  REQUIRE(us.points.size() == 1);
  CHECK(us.points[0].fwd_ms == Approx(5.78));
  CHECK(us.points[0].bwd_ms == Approx(9.65));
  CHECK(us.points[0].rc == Recompute::None);
  // T5: the decoder length follows the encoder length in the name.
  const Profile t5 = parse_profile(
      "forward_encoder: 2.0 ms\nforward_decoder: 3.0 ms\ndecoder_activation: 9.29 MB\nforward_postprocess: 1 ms\n",
      "microbench_tp1_hs1024_ah128_kv128_ffhs65536_sl512_128_mbs2_rc_full_uniform.txt");
  REQUIRE(t5.points.size() == 3);
  for (const auto& x : t5.points) {
    CHECK(x.rc == Recompute::Full);
    if (x.kind == LayerKind::Decoder) {
      CHECK(x.seq == 512);
      CHECK(x.dec_seq == 128);
      CHECK(x.stored_bytes == Approx(9.29e6));
    }
    if (x.kind == LayerKind::PostProcess) {
      CHECK(x.seq == 0);
      CHECK(x.dec_seq == 128);
    }
    if (x.kind == LayerKind::Encoder) CHECK(x.dec_seq == 0);
  }
}

TEST_CASE("DynaPipe per-point files: strict names and units", "[negative]") {
  const std::string name = "microbench_tp1_hs4096_ah32_kv128_ffhs16384_sl2048_mbs1.txt";
  REQUIRE_THROWS_AS(parse_profile("forward_encoder: 5.78 MB\n", name), packpipe::Error);
  REQUIRE_THROWS_WITH(parse_profile("forward_encoder: 5.78 MB\n", name),
                      Catch::Matchers::Contains(name) && Catch::Matchers::Contains("line 1") &&
                          Catch::Matchers::Contains("expected unit ms"));
  REQUIRE_THROWS_WITH(parse_profile("forward_encoder: 1 ms\nencoder_activation: 3 ms\n", name),
                      Catch::Matchers::Contains("line 2") && Catch::Matchers::Contains("memory size"));
  REQUIRE_THROWS_WITH(parse_profile("forward_encodr: 1 ms\n", name),
                      Catch::Matchers::Contains("unknown field 'forward_encodr'"));
  REQUIRE_THROWS_WITH(parse_profile("forward_encoder: 1\n", name), Catch::Matchers::Contains("has no unit"));
  REQUIRE_THROWS_WITH(parse_profile("forward_encoder: fast ms\n", name),
                      Catch::Matchers::Contains("expected a number, found 'fast'"));
  REQUIRE_THROWS_WITH(parse_profile("forward_encoder: 1 ms\nforward_encoder: 2 ms\n", name),
                      Catch::Matchers::Contains("repeats line 1"));
  REQUIRE_THROWS_WITH(parse_profile("forward_decoder: 1 ms\n", name), Catch::Matchers::Contains("decoder-only"));
  REQUIRE_THROWS_AS(parse_profile(ProfileFormat::DynaPipeMicrobench, "forward_encoder: 1 ms\n",
                                  "microbench_tp1_hs4096_sl2048_mbs1.txt"),
                    packpipe::Error);
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeMicrobench, "forward_encoder: 1 ms\n",
                                    "microbench_tp0_hs4096_ah32_kv128_ffhs16384_sl2048_mbs1.txt"),
                      Catch::Matchers::Contains("'tp<positive integer>'"));
  REQUIRE_THROWS_WITH(parse_profile("", name), Catch::Matchers::Contains("no timing or activation fields"));
}

TEST_CASE("Metis per-(device, tp, batch) JSON: per-layer ms, parameters per GPU", "[interface]") {
  const std::string json = R"({
    "model": {"model_name": "GPT3", "num_layers": 4,
              "parameters": {"total_parameters_bytes": 1000, "parameters_per_layer_bytes": [400, 200, 200, 200]}},
    "execution_time": {"total_time_ms": 300.0, "forward_backward_time_ms": 292.8, "batch_generator_time_ms": 1.5,
                       "layernorm_grads_all_reduce_time_ms": 0.1, "embedding_grads_all_reduce_time_ms": 0.2,
                       "optimizer_time_ms": 12.0, "layer_compute_total_ms": [3.0, 30.0, 33.0, 60.0]},
    "execution_memory": {"total_memory": 53120, "layer_memory_total_mb": [100, 200, 200, 300]}})";
  ProfileReadOptions opt;
  opt.seq = 2048;
  const Profile p = parse_profile(json, "DeviceType.A100_tp2_bs4.json", opt);
  CHECK(p.device == "A100");
  CHECK(p.model == "GPT3");
  REQUIRE(p.points.size() == 4);
  CHECK(p.points[0].kind == LayerKind::Embedding);
  CHECK(p.points[3].kind == LayerKind::PostProcess);
  CHECK(p.points[1].kind == LayerKind::Encoder);
  for (const auto& x : p.points) {
    CHECK(x.tp == 2);
    CHECK(x.mbs == 4);
    CHECK(x.seq == 2048);
    if (x.kind == LayerKind::Embedding) CHECK(x.fwd_ms + x.bwd_ms == Approx(3.0));
    CHECK(x.bwd_ms == Approx(2 * x.fwd_ms));
    CHECK(std::isnan(x.stored_bytes));  // layer_memory_total_mb includes state: not activations
  }
  CHECK(p.points[1].fwd_ms == Approx(10.0));
  bool enc = false;
  for (const auto& pp : p.params) {
    if (pp.kind == LayerKind::Encoder) {
      enc = true;
      CHECK(pp.bytes == Approx(100.0));  // 200 bytes unsharded / tp 2
    }
  }
  CHECK(enc);
  SECTION("bad input") {
    REQUIRE_THROWS_AS(parse_profile(json, "DeviceType.A100_tp2_bs4.json"), packpipe::Error);
    REQUIRE_THROWS_WITH(parse_profile(json, "DeviceType.A100_tp2_bs4.json"),
                        Catch::Matchers::Contains("sequence length"));
    std::string bad = json;
    bad.replace(bad.find("layer_compute_total_ms"), 22, "layer_compute_ms");
    REQUIRE_THROWS_WITH(parse_profile(bad, "DeviceType.A100_tp2_bs4_seq2048.json"),
                        Catch::Matchers::Contains("DeviceType.A100_tp2_bs4_seq2048.json") &&
                            Catch::Matchers::Contains("missing field 'execution_time.layer_compute_total_ms'"));
    std::string short_list = json;
    short_list.replace(short_list.find("[100, 200, 200, 300]"), 20, "[100, 200]");
    REQUIRE_THROWS_WITH(parse_profile(short_list, "DeviceType.A100_tp2_bs4.json", opt),
                        Catch::Matchers::Contains("has 2 entries, expected model.num_layers = 4"));
    REQUIRE_THROWS_WITH(parse_profile("{not json", "DeviceType.A100_tp2_bs4.json", opt),
                        Catch::Matchers::Contains("malformed JSON"));
  }
}

TEST_CASE("AIOB computation times: µs, attention + MLP per layer, backward = forward", "[interface]") {
  std::string text = "train_iter:10\n";
  const char* kernels[] = {"Emb",          "layernorm",  "atten_qkv", "atten_flash",    "atten_linear", "layernorm2",
                           "mlp_linear_1", "mlp_gelu",   "mlp_linear_2", "layernorm_post", "logit_time", "param_time"};
  int avg = 100;
  for (const char* k : kernels) {
    text += std::string(k) + ":\n    time_gpu_max: 9999\n    time_gpu_min: 1\n    time_gpu_avg: " +
            std::to_string(avg) + "\n";
    avg += 100;
  }
  const Profile p = parse_profile(text, "llama_7b-tp2-pp1-mbs1-seq4096.txt");
  REQUIRE(p.points.size() == 3);
  for (const auto& x : p.points) {
    CHECK(x.tp == 2);
    CHECK(x.mbs == 1);
    CHECK(x.seq == 4096);
    CHECK(x.bwd_ms == x.fwd_ms);
    if (x.kind == LayerKind::Embedding) CHECK(x.fwd_ms == Approx(0.1));
    // layernorm..mlp_linear_2 = 200..900 µs
    if (x.kind == LayerKind::Encoder) CHECK(x.fwd_ms == Approx((200 + 300 + 400 + 500 + 600 + 700 + 800 + 900) / 1e3));
    if (x.kind == LayerKind::PostProcess) CHECK(x.fwd_ms == Approx((1000 + 1100) / 1e3));
  }
  std::string missing = text;
  missing.erase(missing.find("mlp_gelu:"), std::string("mlp_gelu:\n    time_gpu_max: 9999\n").size());
  REQUIRE_THROWS_AS(parse_profile(missing, "x_tp1_mbs1_seq2048.txt"), packpipe::Error);
  REQUIRE_THROWS_WITH(parse_profile(text, "aiob.txt"), Catch::Matchers::Contains("do not record the shape"));
  REQUIRE_THROWS_WITH(parse_profile("train_iter:1\nEmb:\n    time_gpu_mean: 3\n", "x_tp1_mbs1_seq2048.txt"),
                      Catch::Matchers::Contains("line 3") && Catch::Matchers::Contains("unknown field 'time_gpu_mean'"));
}

TEST_CASE("packpipe profile file round-trips", "[interface]") {
  Profile p = parse_fixture(kDyn + "t5_11b_activation.csv");
  p.merge(parse_fixture(kDyn + "t5_11b_model_state.csv"));
  p.merge(parse_fixture(kMini + "p2p_intra_node.csv"));
  p.device = "A100-40GB";
  const std::string text = write_packpipe_profile(p);
  CHECK(detect_profile_format("out.json", text) == ProfileFormat::Packpipe);
  const Profile q = parse_profile(text, "out.json");
  REQUIRE(q.points.size() == p.points.size());
  REQUIRE(q.params.size() == p.params.size());
  REQUIRE(q.comm.size() == p.comm.size());
  CHECK(q.device == "A100-40GB");
  CHECK(q.model == "t5_11b");
  for (std::size_t i = 0; i < p.points.size(); ++i) {
    CHECK(q.points[i].kind == p.points[i].kind);
    CHECK(q.points[i].dec_seq == p.points[i].dec_seq);
    CHECK(q.points[i].stored_bytes == p.points[i].stored_bytes);
    CHECK(std::isnan(q.points[i].fwd_ms));
  }
  std::string bad_units = text;
  bad_units.replace(bad_units.find("\"ms\""), 4, "\"us\"");
  REQUIRE_THROWS_WITH(parse_profile(bad_units, "out.json"), Catch::Matchers::Contains("'units.time' must be \"ms\""));
}

TEST_CASE("folders: formats detected, other files skipped", "[interface]") {
  const Profile p = load_profiles({fixture("aceso/profiler/profiled-time-eurosys")});
  CHECK(p.sources.size() == 18);  // 16 GPT-13B op tables, 2 p2p tables
  CHECK(p.model == "gpt_13B");
  CHECK(p.comm.size() == 22);
  // The miniset folder holds GPT-1.3B and T5-770M grids: one model at a time.
  REQUIRE_THROWS_AS(load_profiles({fixture("aceso/profiler/profiled-time-miniset")}), packpipe::Error);
  REQUIRE_THROWS_WITH(load_profiles({fixture("aceso/profiler/profiled-time-miniset")}),
                      Catch::Matchers::Contains("t5_770M") && Catch::Matchers::Contains("load one model at a time"));
  REQUIRE_THROWS_AS(load_profiles({fixture("aceso/README.txt")}), packpipe::Error);
  REQUIRE_THROWS_WITH(load_profiles({fixture("aceso/README.txt")}), Catch::Matchers::Contains("not a recognised profile"));
  REQUIRE_THROWS_WITH(load_profiles({"/nonexistent/profile.csv"}), Catch::Matchers::Contains("no such file"));
}

TEST_CASE("bad grids: missing column, wrong unit, empty grid, bad cell", "[negative]") {
  const std::string header = "tp,rc,lm_stage,train_stage,enc_seqlen,dec_seqlen,mbs,time_ms_per_layer\n";
  const std::string row = "1,none,encoder,forward,16,0,1,1.5\n";
  const std::string f = "gpt_timing.csv";
  CHECK(parse_profile(ProfileFormat::DynaPipeTiming, header + row, f).points.size() == 1);
  REQUIRE_THROWS_AS(parse_profile(ProfileFormat::DynaPipeTiming, "tp,rc,lm_stage,train_stage,enc_seqlen,dec_seqlen,"
                                                                 "time_ms_per_layer\n1,none,encoder,forward,16,0,1.5\n",
                                  f),
                    packpipe::Error);
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeTiming,
                                    "tp,rc,lm_stage,train_stage,enc_seqlen,dec_seqlen,time_ms_per_layer\n"
                                    "1,none,encoder,forward,16,0,1.5\n",
                                    f),
                      Catch::Matchers::Contains(f) && Catch::Matchers::Contains("line 1") &&
                          Catch::Matchers::Contains("missing column 'mbs'"));
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeTiming,
                                    "tp,rc,lm_stage,train_stage,enc_seqlen,dec_seqlen,mbs,time_us_per_layer\n" + row, f),
                      Catch::Matchers::Contains("missing column 'time_ms_per_layer'") &&
                          Catch::Matchers::Contains("'time_us_per_layer': wrong unit"));
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeActivation,
                                    "tp,rc,lm_stage,enc_seqlen,dec_seqlen,mbs,stored_activation_MiB_per_layer,"
                                    "peak_activation_MB\n1,none,encoder,16,0,1,0.3,5\n",
                                    "a.csv"),
                      Catch::Matchers::Contains("missing column 'stored_activation_MB_per_layer'") &&
                          Catch::Matchers::Contains("wrong unit"));
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeTiming, header, f), Catch::Matchers::Contains("empty grid"));
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeTiming, "", f), Catch::Matchers::Contains("empty file"));
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeTiming, header + row + "1,none,encoder,forward,16,0,x,2\n", f),
                      Catch::Matchers::Contains("line 3 column 'mbs'") && Catch::Matchers::Contains("found 'x'"));
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeTiming, header + "1,none,encoder,forward,16,0,0,2\n", f),
                      Catch::Matchers::Contains("line 2 column 'mbs': must be positive"));
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeTiming, header + "1,some,encoder,forward,16,0,1,2\n", f),
                      Catch::Matchers::Contains("column 'rc'"));
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeTiming, header + "1,none,encoder,forward,16,0,1\n", f),
                      Catch::Matchers::Contains("line 2: expected 8 columns, found 7"));
  REQUIRE_THROWS_WITH(parse_profile(ProfileFormat::DynaPipeTiming, header + "1,none,encoder,forward,16,0,1,-2\n", f),
                      Catch::Matchers::Contains("must not be negative"));
  // Aceso: an op table with a layer op missing
  const std::string aceso = read_file(fixture(kMini + "gpt_1_3B_mbs1_tp1_algo0.csv"));
  std::string short_layer = aceso;
  const auto pos = short_layer.find("enc-MLP-gelu");
  short_layer.erase(pos, short_layer.find('\n', pos) - pos + 1);
  REQUIRE_THROWS_WITH(parse_profile(short_layer, "gpt_1_3B_mbs1_tp1_algo0.csv"),
                      Catch::Matchers::Contains("expected 13 encoder-layer ops (enc-*), found 12"));
  REQUIRE_THROWS_WITH(parse_profile(aceso, "gpt_1_3B_mbsX_tp1_algo0.csv"),
                      Catch::Matchers::Contains("file name does not match"));
}

TEST_CASE("format detection names the file when nothing matches", "[negative]") {
  REQUIRE_THROWS_AS(detect_profile_format("notes.md", "# hello\n"), packpipe::Error);
  REQUIRE_THROWS_WITH(detect_profile_format("notes.md", "# hello\n"), Catch::Matchers::Contains("notes.md"));
  CHECK(detect_profile_format("x/gpt_6.7b_timing.csv", "tp,rc,lm_stage,train_stage,enc_seqlen\n") ==
        ProfileFormat::DynaPipeTiming);
  CHECK(detect_profile_format("p2p_inter_node.csv", "1,2\n3,4\n") == ProfileFormat::AcesoP2P);
}

namespace {

// The GPT-6.7B DynaPipe timing fixture with its rows filtered or edited by `edit` (a line in, a
// line out; "" drops the line), written to `path`.
std::string edited_timing(const std::string& path, const std::function<std::string(const std::string&)>& edit) {
  const std::string text = read_file(fixture("dynapipe/derived_from_cost_models_pkl/gpt_6.7b_timing.csv"));
  std::string out;
  std::size_t start = 0;
  bool header = true;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    const std::string e = header ? line : edit(line);
    header = false;
    if (!e.empty()) out += e + "\n";
    start = end + 1;
  }
  packpipe::test::write_file(path, out);
  return path;
}

ProfiledCostModel gpt_from(const std::vector<std::string>& paths) {
  return ProfiledCostModel(load_profiles(paths), load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB"));
}

}  // namespace

TEST_CASE("profiles that would cost a shape at 0 ms or NaN are refused, naming what is missing", "[negative][profiles]") {
  packpipe::test::TempDir dir;
  using Catch::Matchers::Contains;
  SECTION("missing backward rows") {
    const auto f = edited_timing(dir.file("gpt_6.7b_timing.csv"),
                                 [](const std::string& l) { return l.find(",backward,") != std::string::npos ? "" : l; });
    REQUIRE_THROWS_WITH(gpt_from({f}), Contains("forward times but no backward times") && Contains("gpt_6.7b_timing.csv"));
  }
  SECTION("zero forward times") {
    const auto f = edited_timing(dir.file("gpt_6.7b_timing.csv"), [](const std::string& l) {
      if (l.find(",forward,") == std::string::npos) return l;
      return l.substr(0, l.rfind(',')) + ",0";
    });
    REQUIRE_THROWS_WITH(gpt_from({f}), Contains("forward time (ms) is 0") && Contains("expected a time in (0, 1e+09] ms"));
  }
  SECTION("negative, non-finite and overflowing times") {
    // (1e308 ms per layer was accepted: the stage's time overflowed to inf, printed as null)
    for (const char* v : {"-1", "nan", "inf", "1e308", "2e9"}) {
      const auto f = edited_timing(dir.file("gpt_6.7b_timing.csv"), [&](const std::string& l) {
        if (l.find(",backward,") == std::string::npos || l.find(",1,full,") == 0) return l;
        return l.substr(0, l.rfind(',')) + "," + v;
      });
      REQUIRE_THROWS_AS(gpt_from({f}), packpipe::Error);
    }
  }
  SECTION("a UTF-8 byte-order mark is read, not skipped") {
    const std::string text = read_file(fixture("dynapipe/derived_from_cost_models_pkl/gpt_6.7b_timing.csv"));
    std::filesystem::create_directories(dir.file("bom"));
    packpipe::test::write_file(dir.file("bom/gpt_6.7b_timing.csv"), "\xEF\xBB\xBF" + text);
    const ProfiledCostModel with_bom = gpt_from({dir.file("bom")});
    const ProfiledCostModel plain = gpt_from({fixture("dynapipe/derived_from_cost_models_pkl/gpt_6.7b_timing.csv")});
    Query q;
    q.kind = LayerKind::Encoder;
    q.mbs = 2;
    q.seq = 1024;
    q.num_layers = 4;
    REQUIRE(with_bom.query(q).forward_ms == plain.query(q).forward_ms);
    REQUIRE(with_bom.profiled(LayerKind::Encoder, 1, Recompute::None));
  }
  SECTION("an empty file in a profile folder is an error, not a skip") {
    std::filesystem::create_directories(dir.file("folder"));
    packpipe::test::write_file(dir.file("folder/gpt_6.7b_timing.csv"),
                               read_file(fixture("dynapipe/derived_from_cost_models_pkl/gpt_6.7b_timing.csv")));
    packpipe::test::write_file(dir.file("folder/gpt_6.7b_activation.csv"), "");
    REQUIRE_THROWS_WITH(load_profiles({dir.file("folder")}), Contains("gpt_6.7b_activation.csv") && Contains("empty"));
  }
  SECTION("a profile of another model") {
    REQUIRE_THROWS_WITH(
        ProfiledCostModel(load_profiles({fixture("dynapipe/derived_from_cost_models_pkl/t5_11b_timing.csv")}),
                          load_model("gpt-6.7b"), packpipe::test::eager_device("A100-40GB")),
        Contains("measured model 't5_11b'") && Contains("'gpt-6.7b'"));
  }
}
