#include <catch2/catch.hpp>

#include "common/errors.h"
#include "packing/rows.h"

using namespace packpipe::packing;

namespace {
Packing two_rows() {
  // row 0: samples 2 (3 tokens) and 0 (2 tokens); row 1: sample 1 (4 tokens); capacity 6.
  Packing p;
  p.capacity = 6;
  p.samples = {2, 0, 1};
  p.row_offsets = {0, 2, 3};
  p.row_tokens = {5, 4};
  return p;
}
}  // namespace

TEST_CASE("row tensors restart positions per sample and mark padding", "[interface]") {
  const std::uint32_t lengths[] = {2, 4, 3};
  const RowTensors t = row_tensors(two_rows(), lengths);
  CHECK(t.position_ids == std::vector<std::int32_t>{0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 0, 0});
  CHECK(t.segment_ids == std::vector<std::int32_t>{1, 1, 1, 2, 2, 0, 1, 1, 1, 1, 0, 0});
  // boundaries: 3, 5, padding to 6, then 6 + 4 = 10, padding to 12
  CHECK(t.cu_seqlens == std::vector<std::int32_t>{0, 3, 5, 6, 10, 12});
  CHECK(t.max_seqlen == 4);
}

TEST_CASE("row tensors reject rows longer than the padded length", "[negative]") {
  const std::uint32_t lengths[] = {2, 4, 3};
  REQUIRE_THROWS_AS(row_tensors(two_rows(), lengths, 4), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(row_tensors(two_rows(), lengths, 4), Catch::Matchers::Contains("row 0 holds 5 tokens"));
}
