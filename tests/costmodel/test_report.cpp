// BigScience TFLOPs-per-GPU formula on its worked example, and the throughput report.
#include <catch2/catch.hpp>

#include "common/errors.h"
#include "costmodel/flops.h"
#include "costmodel/model.h"
#include "costmodel/report.h"

using namespace packpipe::costmodel;

TEST_CASE("BigScience worked example: Aceso's 4-GPU GPT-1.3B, GBS 512, 58.98 s per iteration", "[interface]") {
  const ModelSpec m = load_model("gpt-1.3b");
  const double p = bigscience_params(m, 2048);
  CHECK(p == 1317654528.0);
  CHECK(bigscience_tflops_per_gpu(p, 2048, 512, 58.98, 4, 4) == Approx(46.9).margin(0.05));
  CHECK(bigscience_tflops_per_gpu(p, 2048, 512, 58.98, 4, 3) == Approx(35.1).margin(0.05));
  // Megatron's exact count, 96 B s l h^2 (1 + s/6h + V/16lh) with recompute, adds the attention
  // term s / 6h that 4 x 2 P s B leaves out.
  const double h = 2048, s = 2048;
  const double exact = megatron_iteration_flops(m, 512, 2048, true) / (58.98 * 4 * 1e12);
  CHECK(exact == Approx(46.9 * (1 + s / (6 * h))).epsilon(0.05));
  CHECK(megatron_iteration_flops(m, 512, 2048, false) < megatron_iteration_flops(m, 512, 2048, true));
}

TEST_CASE("throughput report: tokens per second, TFLOPs per GPU and MFU", "[interface]") {
  const ModelSpec m = load_model("gpt-1.3b");
  const DeviceSpec d = load_device("V100-32GB");
  const double flops = 512 * training_flops(m, 1, 2048);
  const ThroughputReport r = throughput_report(flops, 512, 512 * 2048, 58.98, 4, d);
  CHECK(r.tokens_per_s == Approx(512 * 2048 / 58.98));
  CHECK(r.samples_per_s == Approx(512 / 58.98));
  CHECK(r.tflops_per_gpu == Approx(flops / (58.98 * 4 * 1e12)));
  CHECK(r.mfu == Approx(r.tflops_per_gpu / d.peak_tflops));
  // model FLOPs (3 x forward, no recompute, attention counted) match the factor-3 formula times
  // the attention term 1 + s / 6h
  CHECK(r.tflops_per_gpu == Approx(35.1 * (1 + 2048.0 / (6 * 2048))).epsilon(0.05));
}

TEST_CASE("report functions reject bad input", "[negative]") {
  REQUIRE_THROWS_AS(bigscience_tflops_per_gpu(1e9, 2048, 512, 0, 4), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(bigscience_tflops_per_gpu(1e9, 2048, 512, 0, 4), Catch::Matchers::Contains("iteration time"));
  REQUIRE_THROWS_WITH(bigscience_tflops_per_gpu(1e9, 2048, 512, 1, 0), Catch::Matchers::Contains("gpus"));
  REQUIRE_THROWS_WITH(bigscience_tflops_per_gpu(1e9, 2048, 512, 1, 4, 5), Catch::Matchers::Contains("factor"));
  REQUIRE_THROWS_WITH(bigscience_params(load_model("t5-11b"), 512), Catch::Matchers::Contains("encoder-decoder"));
  REQUIRE_THROWS_WITH(throughput_report(1, 1, 1, -1, 1, load_device("H200")), Catch::Matchers::Contains("iteration time"));
}
