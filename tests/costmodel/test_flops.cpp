#include <catch2/catch.hpp>

#include "common/errors.h"
#include "costmodel/flops.h"
#include "costmodel/model.h"

using namespace packpipe::costmodel;

TEST_CASE("presets match DynaPipe's experiment model configs", "[interface]") {
  const ModelSpec g = load_model("gpt-6.7b");
  CHECK(g.hidden == 4096);
  CHECK(g.heads == 32);
  CHECK(g.head_dim == 128);
  CHECK(g.ffn_hidden == 16384);
  const ModelSpec t = load_model("T5-11B");
  CHECK(t.arch == Architecture::EncoderDecoder);
  CHECK(t.hidden == 1024);
  CHECK(t.heads == 128);
  CHECK(t.ffn_hidden == 65536);
  CHECK(load_model("gpt-13b").hidden == 5140);
  for (const auto& n : model_preset_names()) CHECK_NOTHROW(validate(load_model(n)));
  for (const auto& n : device_preset_names()) CHECK_NOTHROW(validate(load_device(n)));
  CHECK(load_device("a100-40gb").peak_tflops == 312);
}

TEST_CASE("GPT-1.3B parameter count matches the BigScience closed form", "[interface]") {
  // P = l(12h^2 + 13h) + V h + s h + 2h with s = 2048 position embeddings: 1,317,654,528.
  const ModelSpec m = load_model("gpt-1.3b");
  const std::int64_t h = m.hidden;
  CHECK(m.layer_params() == 12 * h * h + 13 * h);
  CHECK(m.total_params() + 2048 * h == 1317654528);
}

TEST_CASE("forward FLOPs of a GPT layer: 24 b s h^2 (1 + s / 6h) for the standard shape", "[interface]") {
  const ModelSpec m = load_model("gpt-6.7b");
  const double b = 2, s = 2048, h = 4096;
  const LayerFlops f = forward_flops(m, LayerKind::Encoder, 2, 2048);
  CHECK(f.matmul == Approx(24 * b * s * h * h));
  CHECK(f.attention == Approx(4 * b * s * s * h));
  CHECK(forward_flops(m, LayerKind::PostProcess, 2, 2048).matmul == Approx(2 * b * s * h * m.vocab));
  CHECK(forward_flops(m, LayerKind::Embedding, 2, 2048).total() == 0);
}

TEST_CASE("model and device JSON files, and bad input", "[negative]") {
  const ModelSpec m = parse_model_json(
      R"({"num_layers": 16, "hidden_size": 4096, "num_attn_heads": 32, "kv_channels": 128, "ffn_hidden_size": 16384})",
      "gpt_6.7b_16l.json");
  CHECK(m.num_layers == 16);
  CHECK(m.arch == Architecture::DecoderOnly);
  const ModelSpec t = parse_model_json(
      R"({"encoder_num_layers": 12, "decoder_num_layers": 12, "hidden_size": 1024, "num_attn_heads": 128, "kv_channels": 128, "ffn_hidden_size": 65536})",
      "t5.json");
  CHECK(t.arch == Architecture::EncoderDecoder);
  // The activation dtype: unset unless the file names one of the four, refused otherwise.
  CHECK(m.activation_dtype.empty());
  CHECK(parse_model_json(R"({"num_layers": 2, "hidden": 64, "heads": 2, "dtype": "fp64"})", "m.json").activation_dtype ==
        "fp64");
  REQUIRE_THROWS_WITH(parse_model_json(R"({"num_layers": 2, "hidden": 64, "heads": 2, "dtype": "fp8"})", "m.json"),
                      Catch::Matchers::Contains("m.json") && Catch::Matchers::Contains("dtype must be one of fp16") &&
                          Catch::Matchers::Contains("'fp8'"));
  REQUIRE_THROWS_WITH(parse_model_json(R"({"num_layers": 2, "hidden": 64, "heads": 2, "dtype": 32})", "m.json"),
                      Catch::Matchers::Contains("'dtype' must be one of fp16, bf16, fp32, fp64") &&
                          Catch::Matchers::Contains("found 32"));
  REQUIRE_THROWS_AS(load_model("gpt-9b"), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(load_model("gpt-9b"), Catch::Matchers::Contains("gpt-6.7b"));
  REQUIRE_THROWS_WITH(parse_model_json(R"({"num_layers": 2, "hidden_size": -1, "num_attn_heads": 2})", "m.json"),
                      Catch::Matchers::Contains("m.json") && Catch::Matchers::Contains("hidden must be positive"));
  REQUIRE_THROWS_WITH(parse_model_json(R"({"num_layer": 2})", "m.json"), Catch::Matchers::Contains("unknown key 'num_layer'"));
  REQUIRE_THROWS_WITH(parse_device_json(R"({"peak_tflops": "fast"})", "d.json"),
                      Catch::Matchers::Contains("'peak_tflops' must be a number"));
  // A required field left out is named as missing (it was reported by the check of its default: "num_layers
  // must be positive, found 0"), with its aliases; a field of the wrong type is named first.
  REQUIRE_THROWS_WITH(parse_model_json("{}", "m.json"), Catch::Matchers::Contains("m.json: missing field 'num_layers'"));
  REQUIRE_THROWS_WITH(parse_model_json(R"({"num_layers": 2, "heads": 2})", "m.json"),
                      Catch::Matchers::Contains("missing field 'hidden' (or 'hidden_size')"));
  REQUIRE_THROWS_WITH(parse_model_json(R"({"num_layers": 2, "hidden": 64})", "m.json"),
                      Catch::Matchers::Contains("missing field 'heads'"));
  REQUIRE_THROWS_WITH(parse_model_json(R"({"encoder_layers": 2, "hidden": 64, "heads": 2})", "m.json"),
                      Catch::Matchers::Contains("missing field 'decoder_layers'"));
  REQUIRE_THROWS_WITH(parse_model_json(R"({"num_layers": 2, "hidden": "wide", "heads": 2})", "m.json"),
                      Catch::Matchers::Contains("'hidden' must be an integer"));
  REQUIRE_THROWS_WITH(parse_device_json("{}", "d.json"), Catch::Matchers::Contains("d.json: missing field 'peak_tflops'"));
  REQUIRE_THROWS_WITH(parse_device_json(R"({"peak_tflops": 1, "memory_gb": 1, "hbm_gbps": 1, "intra_node_gbps": 1})", "d.json"),
                      Catch::Matchers::Contains("missing field 'inter_node_gbps'"));
  REQUIRE_NOTHROW(parse_model_json(R"({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 2})", "m.json"));
  REQUIRE_THROWS_WITH(forward_flops(load_model("gpt-1.3b"), LayerKind::Decoder, 1, 16, 16),
                      Catch::Matchers::Contains("decoder-only"));
  REQUIRE_THROWS_WITH(forward_flops(load_model("gpt-1.3b"), LayerKind::Encoder, 0, 16),
                      Catch::Matchers::Contains("found 0"));
}

TEST_CASE("model files: a key and its alias, both architectures, heads that do not divide, sizes out of range",
          "[negative][regression]") {
  auto refused = [](const std::string& text, const std::string& says) {
    REQUIRE_THROWS_AS(parse_model_json(text, "m.json"), packpipe::InvalidArgument);
    REQUIRE_THROWS_WITH(parse_model_json(text, "m.json"), Catch::Matchers::Contains("m.json") && Catch::Matchers::Contains(says));
  };
  // C: a key and its alias are one field given twice (one used to be dropped)
  refused(R"({"num_layers": 2, "hidden": 256, "hidden_size": 512, "heads": 4})", "'hidden' and 'hidden_size'");
  refused(R"({"num_layers": 2, "hidden": 256, "heads": 4, "num_attention_heads": 4})", "'heads' and 'num_attention_heads'");
  refused(R"({"num_layers": 2, "hidden": 256, "heads": 4, "vocab": 10, "vocab_size": 10})", "'vocab' and 'vocab_size'");
  // B: num_layers beside encoder/decoder layers (num_layers used to be ignored)
  refused(R"({"num_layers": 2, "encoder_layers": 2, "decoder_layers": 2, "hidden": 256, "heads": 4})",
          "'num_layers' (a decoder-only model) and 'encoder_layers'");
  // D: a head width that drops hidden units; bytes per parameter out of range
  refused(R"({"num_layers": 2, "hidden": 256, "heads": 3})", "heads (3) does not divide hidden (256)");
  CHECK(parse_model_json(R"({"num_layers": 2, "hidden": 256, "heads": 3, "head_dim": 64})", "m.json").head_dim == 64);
  refused(R"({"num_layers": 2, "hidden": 256, "heads": 4, "bytes_per_param": 1000000000})", "bytes_per_param must be 1, 2, 4 or 8");
  refused(R"({"num_layers": 2, "hidden": 256, "heads": 4, "bytes_per_param": 3})", "bytes_per_param must be 1, 2, 4 or 8");
  // E: sizes whose products overflow (the optimizer state printed as 0 B)
  refused(R"({"num_layers": 2, "hidden": 1000000000000000000, "heads": 4})", "hidden must be at most");
  refused(R"({"num_layers": 2, "hidden": 256, "heads": 4, "ffn_hidden": 4611686018427387904})", "ffn_hidden must be at most");
  refused(R"({"num_layers": 100000, "hidden": 256, "heads": 4})", "num_layers must be at most");
  for (const auto& name : model_preset_names()) CHECK_NOTHROW(validate(load_model(name)));
}

TEST_CASE("model and device files name the attention kernel; presets run flash on GPUs", "[interface][negative]") {
  for (const auto& name : device_preset_names()) CHECK(load_device(name).attention == AttentionKernel::Flash);
  const DeviceSpec plain = parse_device_json(R"({"peak_tflops": 1, "memory_gb": 1, "hbm_gbps": 1, "intra_node_gbps": 1,
                                                 "inter_node_gbps": 1})", "d.json");
  CHECK(plain.attention == AttentionKernel::Eager);  // a file without the key keeps the formulas it was written for
  const DeviceSpec flash = parse_device_json(R"({"peak_tflops": 1, "memory_gb": 1, "hbm_gbps": 1, "intra_node_gbps": 1,
                                                 "inter_node_gbps": 1, "attention": "flash"})", "d.json");
  CHECK(flash.attention == AttentionKernel::Flash);
  const ModelSpec m = parse_model_json(R"({"num_layers": 2, "hidden": 256, "heads": 4, "attention": "eager"})", "m.json");
  REQUIRE(m.attention.has_value());
  CHECK(attention_kernel(m, flash) == AttentionKernel::Eager);  // the model's own wins
  CHECK(attention_kernel(load_model("gpt-1.3b"), flash) == AttentionKernel::Flash);
  REQUIRE_THROWS_WITH(parse_model_json(R"({"num_layers": 2, "hidden": 256, "heads": 4, "attention": "sdpa"})", "m.json"),
                      Catch::Matchers::Contains("m.json") && Catch::Matchers::Contains("'attention' must be one of eager, flash"));
  REQUIRE_THROWS_WITH(parse_device_json(R"({"attention": 1})", "d.json"),
                      Catch::Matchers::Contains("d.json") && Catch::Matchers::Contains("'attention' must be one of"));
}

TEST_CASE("flops_shape(kind, seq, dec).at(b) is forward_flops bit for bit", "[interface]") {
  // at() is the batch-query form of forward_flops; the two must round identically.
  std::size_t compared = 0, differing = 0;
  for (const char* name : {"gpt-6.7b", "llama-7b", "t5-11b", "t5-770m"}) {
    const ModelSpec m = load_model(name);
    const bool encdec = m.arch == Architecture::EncoderDecoder;
    for (auto kind : {LayerKind::Embedding, LayerKind::Encoder, LayerKind::Decoder, LayerKind::PostProcess}) {
      if (kind == LayerKind::Decoder && !encdec) continue;
      for (std::int64_t seq : {1, 17, 512, 3001, 8192}) {
        for (std::int64_t dec : {1, 64, 999}) {
          const std::int64_t d = encdec ? dec : 0;
          const FlopsShape fs = flops_shape(m, kind, seq, d);
          for (std::int64_t b : {1, 2, 3, 7, 64, 255, 1000, 4097}) {
            const LayerFlops want = forward_flops(m, kind, b, seq, d);
            const LayerFlops got = fs.at(static_cast<double>(b));
            ++compared;
            if (!(got.matmul == want.matmul && got.attention == want.attention)) ++differing;
          }
        }
      }
    }
  }
  CHECK(compared > 1000);
  CHECK(differing == 0);
  REQUIRE_THROWS_WITH(flops_shape(load_model("gpt-1.3b"), LayerKind::Decoder, 16, 16),
                      Catch::Matchers::Contains("decoder-only"));
  REQUIRE_THROWS_AS(flops_shape(load_model("gpt-1.3b"), LayerKind::Encoder, 0), packpipe::InvalidArgument);
}
