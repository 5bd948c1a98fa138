#include <catch2/catch.hpp>

#include "common/errors.h"
#include "dataloader/dtype.h"

using namespace packpipe::dataloader;

TEST_CASE("dtype codes, sizes and names follow Megatron", "[interface]") {
  const std::pair<int, std::pair<std::size_t, std::string>> table[] = {
      {1, {1, "uint8"}}, {2, {1, "int8"}},    {3, {2, "int16"}},   {4, {4, "int32"}},
      {5, {8, "int64"}}, {6, {8, "float64"}}, {7, {4, "float32"}}, {8, {2, "uint16"}}};
  for (const auto& [code, expected] : table) {
    DType dt = dtype_from_code(code, "t");
    CHECK(dtype_size(dt) == expected.first);
    CHECK(dtype_name(dt) == expected.second);
    CHECK(dtype_from_name(expected.second) == dt);
  }
  CHECK(optimal_dtype(50257) == DType::UInt16);
  CHECK(optimal_dtype(65500) == DType::Int32);
}

TEST_CASE("bad dtype codes and names are rejected with the value", "[negative]") {
  REQUIRE_THROWS_WITH(dtype_from_code(9, "x.idx"),
                      Catch::Matchers::Contains("x.idx") && Catch::Matchers::Contains("dtype code 9"));
  REQUIRE_THROWS_AS(dtype_from_code(0, "x"), packpipe::Error);
  REQUIRE_THROWS_AS(dtype_from_name("uint32"), packpipe::InvalidArgument);
}
