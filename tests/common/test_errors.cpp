#include <catch2/catch.hpp>

#include "common/cuda_probe.h"
#include "common/errors.h"
#include "common/mapped_file.h"
#include "tests/support/temp_dir.h"

using packpipe::Error;

TEST_CASE("PACKPIPE_CHECK messages carry text and location", "[interface][negative]") {
  auto f = [](int x) { PACKPIPE_CHECK_ARG(x > 0, "x must be positive, found {}", x); return x; };
  REQUIRE(f(3) == 3);
  REQUIRE_THROWS_AS(f(-2), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(f(-2), Catch::Matchers::Contains("x must be positive, found -2") &&
                                 Catch::Matchers::Contains("test_errors.cpp:"));
}

TEST_CASE("checked arithmetic detects overflow", "[boundary][negative]") {
  REQUIRE(packpipe::mul_checked(1ull << 31, 1ull << 31, "x") == (1ull << 62));
  REQUIRE_THROWS_WITH(packpipe::mul_checked(1ull << 33, 1ull << 33, "bin size"),
                      Catch::Matchers::Contains("bin size"));
  REQUIRE_THROWS_AS(packpipe::add_checked(~0ull, 1, "x"), Error);
}

TEST_CASE("PACKPIPE_ASSERT reports an internal error", "[negative]") {
  auto g = [](int x) { PACKPIPE_ASSERT(x == 1); };
  REQUIRE_NOTHROW(g(1));
  REQUIRE_THROWS_AS(g(2), std::logic_error);
}

TEST_CASE("MappedFile maps, and names the path on failure", "[interface][negative]") {
  packpipe::test::TempDir dir;
  packpipe::test::write_file(dir.file("a"), "hello");
  packpipe::MappedFile m(dir.file("a"));
  REQUIRE(m.size() == 5);
  REQUIRE(std::string(reinterpret_cast<const char*>(m.data()), 5) == "hello");
  packpipe::test::write_file(dir.file("empty"), "");
  packpipe::MappedFile e(dir.file("empty"));
  REQUIRE(e.size() == 0);
  REQUIRE(e.data() == nullptr);
  REQUIRE_THROWS_WITH(packpipe::MappedFile(dir.file("missing")),
                      Catch::Matchers::Contains("missing") && Catch::Matchers::Contains("No such file"));
  REQUIRE_THROWS_WITH(packpipe::MappedFile(dir.path()), Catch::Matchers::Contains("expected a regular file"));
}

TEST_CASE("device_count is zero without CUDA", "[interface]") {
  if (!packpipe::cuda::built_with_cuda()) REQUIRE(packpipe::cuda::device_count() == 0);
  REQUIRE(packpipe::cuda::device_count() >= 0);
}
