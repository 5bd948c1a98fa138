// GPU tests. Without a CUDA device this executable exits 77, which CTest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/cuda_probe.h"
#include "plan/validator.h"
#include "runtime/cuda.h"
#include "runtime/nccl.h"
#include "runtime/report.h"
#include "tests/support/synthetic_plans.h"
#include "tests/support/temp_dir.h"

#if PACKPIPE_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace pl = packpipe::plan;
namespace rt = packpipe::runtime;
namespace syn = packpipe::test::synthetic;

TEST_CASE("device_count agrees with the build", "[gpu][interface]") {
  REQUIRE(packpipe::cuda::built_with_cuda());
  REQUIRE(packpipe::cuda::device_count() > 0);
}

TEST_CASE("cuda replay: plans of 4 and 8 stages run on one device with every payload checked", "[gpu]") {
  for (const std::int64_t S : {4, 8}) {
    for (const char* kind : {"1f1b", "zero-bubble", "gpipe"}) {
      const pl::Plan p = syn::random_plan(kind, S, 1, 2 * S, 31 + S);
      REQUIRE(pl::validate(p).ok());
      rt::ReplayOptions ro;
      ro.time_scale = 0.01;
      ro.payload_bytes = 4096;
      const rt::LocalRun run = rt::run_cuda_replay(p, 0, ro);
      REQUIRE(run.records.size() == static_cast<std::size_t>(S));
      for (std::size_t r = 0; r < run.records.size(); ++r) CHECK(run.records[r].times.size() == p.streams[r].size());
      const rt::RunSummary s = rt::summarize({{&p, run.records}}, ro.time_scale);
      std::printf("cuda replay %s S=%lld: measured %.3f ms, simulated %.3f ms (%.4f), %.2f us own per instruction\n",
                  kind, static_cast<long long>(S), s.measured_ms, s.simulated_ms, s.measured_ms / s.simulated_ms,
                  s.overhead_ns_per_instruction / 1e3);
      CHECK(s.measured_ms >= 0.9 * s.simulated_ms);
    }
  }
}

TEST_CASE("nccl: a one-rank communicator sends to and receives from itself", "[gpu]") {
  if (!rt::built_with_nccl()) {
    WARN("built without NCCL");
    return;
  }
#if PACKPIPE_HAS_CUDA
  packpipe::test::TempDir dir;
  rt::NcclOptions o;
  o.device = 0;
  o.timeout_s = 60;
  o.id_file = dir.path() + "/nccl.id";
  auto t = rt::nccl_transport(0, 1, o);
  const std::size_t n = 1 << 20;
  std::vector<std::uint8_t> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<std::uint8_t>(i * 131 + 7);
  void *a = nullptr, *b = nullptr;
  REQUIRE(cudaMalloc(&a, n) == cudaSuccess);
  REQUIRE(cudaMalloc(&b, n) == cudaSuccess);
  REQUIRE(cudaMemcpy(a, host.data(), n, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemset(b, 0, n) == cudaSuccess);
  rt::Buffer sa, sb;
  sa.data = a;
  sb.data = b;
  sa.bytes = sa.materialized = sb.bytes = sb.materialized = n;
  sa.kind = sb.kind = rt::MemoryKind::Device;
  sa.device = sb.device = 0;
  auto s = t->send(sa, 0, rt::Channel::Activation);
  auto r = t->recv(sb, 0, rt::Channel::Activation);
  const auto deadline = rt::Clock::now() + std::chrono::seconds(30);
  REQUIRE(s->wait(deadline) == rt::WaitStatus::Done);
  REQUIRE(r->wait(deadline) == rt::WaitStatus::Done);
  std::vector<std::uint8_t> back(n);
  REQUIRE(cudaMemcpy(back.data(), b, n, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back == host);
  cudaFree(a);
  cudaFree(b);
#endif
}

int main(int argc, char** argv) {
  if (packpipe::cuda::device_count() == 0) {
    std::printf("no CUDA device (built with CUDA: %s): skipping GPU tests\n",
                packpipe::cuda::built_with_cuda() ? "yes" : "no");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
