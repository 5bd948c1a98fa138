#include <cmath>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "partition/pipeline.h"

using namespace packpipe::partition;
namespace cm = packpipe::costmodel;

TEST_CASE("virtual stages: decoder-only layers split evenly, embedding first, head last", "[interface]") {
  const cm::ModelSpec m = cm::load_model("gpt-6.7b");
  PipelineShape s;
  s.stages = 4;
  s.chunks = 2;
  const auto vs = virtual_stages(m, s);
  REQUIRE(vs.size() == 8);
  for (const auto& v : vs) {
    CHECK(v.layout.encoder_layers == 4);
    CHECK(v.rank == v.index % 4);
  }
  CHECK(vs.front().layout.has_embedding);
  CHECK(vs.back().layout.has_postprocess);
  CHECK_FALSE(vs[3].layout.has_postprocess);
  s.chunks = 3;
  REQUIRE_THROWS_AS(virtual_stages(m, s), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(virtual_stages(m, s), Catch::Matchers::Contains("do not divide"));
}

TEST_CASE("virtual stages: encoder-decoder puts the encoder first, the decoder second", "[interface]") {
  const cm::ModelSpec t5 = cm::load_model("t5-11b");
  PipelineShape s;
  s.stages = 4;
  const auto vs = virtual_stages(t5, s);
  CHECK(vs[0].layout.encoder_layers == 12);
  CHECK(vs[1].layout.encoder_layers == 12);
  CHECK(vs[2].layout.decoder_layers == 12);
  CHECK(vs[3].layout.decoder_layers == 12);
  CHECK(vs[3].layout.encoder_layers == 0);
  s.stages = 3;
  REQUIRE_THROWS_WITH(virtual_stages(t5, s), Catch::Matchers::Contains("even number"));
}

TEST_CASE("virtual stages: sizes are bounded and never plan more layers than the model has", "[negative]") {
  using Catch::Matchers::Contains;
  const cm::ModelSpec m = cm::load_model("gpt-6.7b");  // 32 layers, 32 heads
  const cm::ModelSpec t5 = cm::load_model("t5-11b");   // 24 + 24 layers
  PipelineShape s;
  s.stages = 4;
  s.layers_per_stage = 8;
  CHECK(virtual_stages(m, s).size() == 4);  // exactly the model
  s.layers_per_stage = 4;
  CHECK(virtual_stages(m, s).size() == 4);  // a slice of it
  s.layers_per_stage = 1000;                // used to plan a 4,000-layer model
  REQUIRE_THROWS_WITH(virtual_stages(m, s), Contains("= 4000 layers, more than the 32 layers of 'gpt-6.7b'") &&
                                                Contains("at most 8"));
  s.layers_per_stage = 9;
  REQUIRE_THROWS_AS(virtual_stages(m, s), packpipe::InvalidArgument);
  s.layers_per_stage = 0;
  s.stages = 2147483647;  // used to throw std::bad_alloc
  REQUIRE_THROWS_WITH(virtual_stages(m, s), Contains("stages must be in [1, 65536], found 2147483647"));
  s.stages = 64;
  REQUIRE_THROWS_WITH(virtual_stages(m, s), Contains("64 virtual stages exceed the 32 layers"));
  s.stages = 4;
  s.chunks = std::int64_t{1} << 40;
  REQUIRE_THROWS_WITH(virtual_stages(m, s), Contains("chunks must be in"));
  s.chunks = 1;
  for (auto* field : {&s.dp, &s.tp}) {
    *field = 0;
    REQUIRE_THROWS_AS(virtual_stages(m, s), packpipe::InvalidArgument);
    *field = std::int64_t{1} << 17;
    REQUIRE_THROWS_AS(virtual_stages(m, s), packpipe::InvalidArgument);
    *field = 1;
  }
  s.tp = 3;
  REQUIRE_THROWS_WITH(virtual_stages(m, s), Contains("tp 3 must divide the attention heads (32)"));
  s.tp = 1;
  for (double bad : {-1.0, 1e300, std::nan(""), HUGE_VAL}) {
    s.memory_limit_mb = bad;
    REQUIRE_THROWS_WITH(virtual_stages(m, s), Contains("memory limit (memory_mb / --memory-mb) must be in"));
  }
  s.memory_limit_mb = 0;
  s.zero_stage = 4;
  REQUIRE_THROWS_WITH(virtual_stages(m, s), Contains("ZeRO stage (zero / --zero) must be 0-3, found 4"));
  s.zero_stage = 1;
  // stage_layers: one entry per virtual stage, each in [1, kMaxStageLayers], before the model is looked at.
  s.stage_layers = {8, 8, 8};
  REQUIRE_THROWS_WITH(check_shape(s), Contains("stage_layers (--layer-split) lists 3 stages, the pipeline has 4"));
  s.stage_layers = {8, 8, 0, 16};
  REQUIRE_THROWS_WITH(check_shape(s), Contains("stage_layers[2] (--layer-split) must be in [1, 1048576], found 0"));
  s.stage_layers = {1, 1, 1, kMaxStageLayers + 1};
  REQUIRE_THROWS_WITH(check_shape(s), Contains("stage_layers[3] (--layer-split) must be in"));
  s.stage_layers = {kMaxStageLayers, kMaxStageLayers, kMaxStageLayers, kMaxStageLayers};
  check_shape(s);  // in range; the model's layers are virtual_stages' check
  REQUIRE_THROWS_WITH(virtual_stages(m, s), Contains("more than the 32 layers"));
  s.stage_layers = {5, 11, 10, 6};
  const auto uneven = virtual_stages(m, s);
  for (std::size_t v = 0; v < 4; ++v) CHECK(uneven[v].layout.encoder_layers == s.stage_layers[v]);
  s.stage_layers.clear();
  // Encoder-decoder: each half against its side's layers.
  PipelineShape e;
  e.stages = 4;
  e.layers_per_stage = 12;
  CHECK(virtual_stages(t5, e).size() == 4);
  e.layers_per_stage = 13;
  REQUIRE_THROWS_WITH(virtual_stages(t5, e), Contains("13 x 2 stages per side = 26 layers"));
  e.stages = 1;
  e.layers_per_stage = 25;
  REQUIRE_THROWS_AS(virtual_stages(t5, e), packpipe::InvalidArgument);
  e.layers_per_stage = 0;
  e.stages = 64;
  REQUIRE_THROWS_WITH(virtual_stages(t5, e), Contains("virtual stages exceed"));
}
