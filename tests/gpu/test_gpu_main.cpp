// GPU tests. Without a CUDA device this executable exits 77, which CTest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "common/config.h"
#include "common/cuda_probe.h"

TEST_CASE("device_count agrees with the build", "[gpu][interface]") {
  REQUIRE(packpipe::cuda::built_with_cuda());
  REQUIRE(packpipe::cuda::device_count() > 0);
}

int main(int argc, char** argv) {
  if (packpipe::cuda::device_count() == 0) {
    std::printf("no CUDA device (built with CUDA: %s): skipping GPU tests\n",
                packpipe::cuda::built_with_cuda() ? "yes" : "no");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
