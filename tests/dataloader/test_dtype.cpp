#include <catch2/catch.hpp>

#include "common/errors.h"
#include <algorithm>
#include <vector>

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

TEST_CASE("encode and decode tokens round trip for every dtype", "[interface][boundary]") {
  const std::int64_t ids[] = {0, 1, 100, 127};
  for (int code = 1; code <= 8; ++code) {
    const DType dt = dtype_from_code(code, "t");
    std::vector<std::uint8_t> buf(4 * dtype_size(dt));
    encode_tokens(ids, 4, dt, buf.data());
    std::int64_t back[4];
    decode_tokens(buf.data(), 4, dt, back);
    CHECK(std::equal(ids, ids + 4, back));
  }
  CHECK(fits_dtype(65535, DType::UInt16));
  CHECK_FALSE(fits_dtype(65536, DType::UInt16));
  CHECK_FALSE(fits_dtype(-1, DType::UInt8));
  CHECK(fits_dtype(-1, DType::Int8));
  CHECK_FALSE(fits_dtype((1ll << 53) + 1, DType::Float64));
}

TEST_CASE("encode_tokens names the token that does not fit", "[negative]") {
  const std::int64_t ids[] = {5, 70000};
  std::uint16_t out[2];
  REQUIRE_THROWS_WITH(encode_tokens(ids, 2, DType::UInt16, out),
                      Catch::Matchers::Contains("70000") && Catch::Matchers::Contains("position 1") &&
                          Catch::Matchers::Contains("uint16"));
}
