#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>

#include "common/errors.h"
#include "dataloader/gpt_samples.h"
#include "dataloader/indexed_dataset.h"
#include "tests/support/synthetic.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::dataloader;
using packpipe::test::TempDir;
using Catch::Matchers::Contains;

namespace {

/// Megatron's build_sample_idx (helpers.cpp) transcribed: rows of (position in the document
/// index, token offset), with add_extra_token_to_sequence = 1.
std::vector<std::pair<std::int64_t, std::int64_t>> megatron_sample_idx(const IndexedDataset& ds,
                                                                       const std::vector<std::int64_t>& doc_idx,
                                                                       std::int64_t seq_length,
                                                                       std::int64_t num_samples) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::int64_t doc_idx_index = 0, doc_offset = 0;
  out.emplace_back(0, 0);
  for (std::int64_t sample = 1; sample <= num_samples; ++sample) {
    std::int64_t remaining = seq_length + 1;
    while (remaining != 0) {
      const std::int64_t doc_id = doc_idx[static_cast<std::size_t>(doc_idx_index)];
      const std::int64_t doc_length = ds.sizes()[static_cast<std::uint64_t>(doc_id)] - doc_offset;
      remaining -= doc_length;
      if (remaining <= 0) {
        doc_offset += remaining + doc_length - 1;
        remaining = 0;
      } else {
        ++doc_idx_index;
        doc_offset = 0;
      }
    }
    out.emplace_back(doc_idx_index, doc_offset);
  }
  return out;
}

/// Megatron's GPTDataset lookup of sample k from sample_idx rows (pieces read with get()).
std::vector<std::uint8_t> megatron_sample(const IndexedDataset& ds, const std::vector<std::int64_t>& doc_idx,
                                          const std::vector<std::pair<std::int64_t, std::int64_t>>& rows,
                                          std::size_t k) {
  const auto [beg, beg_off] = rows[k];
  const auto [end, end_off] = rows[k + 1];
  std::vector<std::uint8_t> out;
  for (std::int64_t i = beg; i <= end; ++i) {
    const auto id = static_cast<std::uint64_t>(doc_idx[static_cast<std::size_t>(i)]);
    const std::uint64_t off = i == beg ? static_cast<std::uint64_t>(beg_off) : 0;
    const std::uint64_t stop = i == end ? static_cast<std::uint64_t>(end_off) + 1 : ds.length(id);
    std::vector<std::uint8_t> piece((stop - off) * ds.itemsize());
    ds.read(id, off, stop - off, piece.data());
    out.insert(out.end(), piece.begin(), piece.end());
  }
  return out;
}

/// All tokens of the sequences in `order`, concatenated (bytes).
std::vector<std::uint8_t> concatenation(const IndexedDataset& ds, const std::vector<std::int64_t>& order) {
  std::vector<std::uint8_t> out;
  for (auto id : order) {
    const auto bytes = ds.read(static_cast<std::uint64_t>(id));
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
  return out;
}

void check_against_megatron(const IndexedDataset& ds, const std::vector<std::int64_t>& order,
                            std::uint32_t seq_len) {
  const GptSampleIndex index(ds, order, seq_len);
  CHECK(index.seq_len() == seq_len);
  const auto all = concatenation(ds, order);
  const std::uint64_t tokens = all.size() / ds.itemsize();
  const std::uint64_t expected_samples = tokens == 0 ? 0 : (tokens - 1) / seq_len;
  REQUIRE(index.size() == expected_samples);
  const auto rows = megatron_sample_idx(ds, order, seq_len, static_cast<std::int64_t>(expected_samples));
  const std::size_t sample_bytes = (seq_len + 1) * ds.itemsize();
  std::vector<std::uint8_t> out(sample_bytes);
  for (std::uint64_t k = 0; k < index.size(); ++k) {
    INFO("sample " << k);
    index.assemble(k, out.data());
    // Window [k * seq_len, k * seq_len + seq_len + 1) of the concatenation ...
    const std::size_t at = k * seq_len * ds.itemsize();
    REQUIRE(std::memcmp(out.data(), all.data() + at, sample_bytes) == 0);
    // ... and exactly what Megatron's sample index and lookup produce.
    REQUIRE(megatron_sample(ds, order, rows, k) == out);
  }
}

}  // namespace

TEST_CASE("GPT samples match Megatron's build_sample_idx on the fixture", "[interface][regression]") {
  const IndexedDataset ds(packpipe::test::fixture("megatron-small/wordnet_gpt2_text_document"));
  std::vector<std::int64_t> order(ds.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  SECTION("one epoch in order") { check_against_megatron(ds, order, 32); }
  SECTION("three shuffled epochs") {
    std::mt19937_64 rng(Catch::rngSeed());
    std::vector<std::int64_t> epochs;
    for (int e = 0; e < 3; ++e) {
      std::shuffle(order.begin(), order.end(), rng);
      epochs.insert(epochs.end(), order.begin(), order.end());
    }
    const std::uint32_t seq_len = GENERATE(1u, 2u, 7u, 16u, 100u, 1004u);
    check_against_megatron(ds, epochs, seq_len);
  }
}

TEST_CASE("GPT samples cross empty and short sequences", "[interface][stress]") {
  TempDir dir;
  const DType dtype = GENERATE(DType::UInt16, DType::Int32, DType::Int64);
  std::mt19937_64 rng(Catch::rngSeed() + static_cast<unsigned>(dtype));
  packpipe::test::write_documents(dir.file("r"), dtype, packpipe::test::random_documents(rng, 60, 3, 12, 1000));
  const IndexedDataset ds(dir.file("r"));
  std::uniform_int_distribution<std::int64_t> pick(0, static_cast<std::int64_t>(ds.size()) - 1);
  std::vector<std::int64_t> order(300);
  for (auto& id : order) id = pick(rng);
  for (std::uint32_t seq_len : {1u, 3u, 8u, 33u}) check_against_megatron(ds, order, seq_len);
}

TEST_CASE("GPT sample index boundaries", "[boundary]") {
  const IndexedDataset ds(packpipe::test::fixture("megatron-small/wordnet_gpt2_text_document"));
  const std::uint32_t len0 = ds.length(0);
  SECTION("exactly seq_len + 1 tokens give one sample") {
    const GptSampleIndex index(ds, {0}, len0 - 1);
    CHECK(index.size() == 1);
    std::vector<std::uint8_t> out(len0 * ds.itemsize());
    index.assemble(0, out.data());
    CHECK(out == ds.read(0));
  }
  SECTION("seq_len tokens give none") {
    CHECK(GptSampleIndex(ds, {0}, len0).size() == 0);
    CHECK(GptSampleIndex(ds, {}, 4).size() == 0);
  }
  SECTION("a sample ending exactly at a sequence end") {
    // Two sequences, first sample = all of seq 0 plus one token: the second starts at its last token.
    check_against_megatron(ds, {0, 1, 2}, len0);
    check_against_megatron(ds, {0, 1, 2}, len0 - 1);
  }
}

TEST_CASE("GPT sample index rejects bad arguments and corrupt data", "[negative]") {
  const std::string prefix = packpipe::test::fixture("megatron-small/wordnet_gpt2_text_document");
  const IndexedDataset ds(prefix);
  REQUIRE_THROWS_AS(GptSampleIndex(ds, {0, 1}, 0), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(GptSampleIndex(ds, {0, 1}, 0), Contains("seq_len must be > 0"));
  REQUIRE_THROWS_AS(GptSampleIndex(ds, {0, 64}, 4), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(GptSampleIndex(ds, {0, 5, 64}, 4),
                      Contains("sequence_order[2] = 64 is out of range [0, 64)"));
  REQUIRE_THROWS_WITH(GptSampleIndex(ds, {-1}, 4), Contains("sequence_order[0] = -1"));
  const GptSampleIndex index(ds, {0, 1, 2}, 8);
  std::vector<std::uint8_t> out(9 * 2);
  REQUIRE_THROWS_AS(index.assemble(index.size(), out.data()), packpipe::OutOfRange);
  REQUIRE_THROWS_WITH(index.assemble(index.size(), out.data()),
                      Contains("sample " + std::to_string(index.size()) + " out of range"));

  TempDir dir;
  std::string idx = packpipe::test::read_file(prefix + ".idx");
  const std::int64_t bad = 2;
  std::memcpy(&idx[34 + 4 * 64 + 8 * 3], &bad, 8);  // pointer of sequence 3
  packpipe::test::write_file(dir.file("w.idx"), idx);
  packpipe::test::write_file(dir.file("w.bin"), packpipe::test::read_file(prefix + ".bin"));
  const IndexedDataset corrupt(dir.file("w"));
  CHECK(GptSampleIndex(corrupt, {0, 1, 2}, 8).size() > 0);
  REQUIRE_THROWS_AS(GptSampleIndex(corrupt, {0, 1, 2, 3}, 8), packpipe::Error);
  REQUIRE_THROWS_WITH(GptSampleIndex(corrupt, {0, 3}, 8), Contains("sequence 3: pointer expected"));
}
