#include <catch2/catch.hpp>

#include <filesystem>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/mapped_file.h"
#include "dataloader/indexed_dataset.h"
#include "dataloader/multitask.h"
#include "tests/support/synthetic.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::dataloader;
using packpipe::test::Documents;
using packpipe::test::TempDir;
using packpipe::test::fixture;
using packpipe::test::read_file;
using packpipe::test::write_file;
using Catch::Matchers::Contains;

namespace {

constexpr std::int64_t kEod = 50256;

struct Record {
  std::vector<std::int64_t> input;
  std::vector<std::int64_t> target;
};

const std::vector<Record>& records() {
  static const std::vector<Record> recs = [] {
    std::vector<Record> out;
    std::ifstream in(fixture("megatron-small/records.jsonl"));
    REQUIRE(in);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line);
      out.push_back({j.at("input_ids").get<std::vector<std::int64_t>>(),
                     j.at("target_ids").get<std::vector<std::int64_t>>()});
    }
    return out;
  }();
  return recs;
}

std::vector<std::int64_t> cat(std::vector<std::int64_t> a, const std::vector<std::int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// Expected contents of one fixture, rebuilt from records.jsonl as its README describes.
struct Expected {
  std::string prefix;
  DType dtype;
  bool modes;
  Documents docs;                   // docs[d][s] = token ids
  std::vector<std::int8_t> seq_modes;
};

std::vector<Expected> expected_fixtures() {
  const auto& r = records();
  REQUIRE(r.size() == 144);
  std::vector<Expected> out;
  {
    Expected e{"wordnet_gpt2_text_document", DType::UInt16, false, {}, {}};
    for (int i = 0; i < 64; ++i) e.docs.push_back({cat(cat(r[i].input, r[i].target), {kEod})});
    out.push_back(e);
  }
  {
    Expected in{"wordnet_mt_inputs_document", DType::UInt16, false, {}, {}};
    Expected tg{"wordnet_mt_targets_document", DType::UInt16, false, {}, {}};
    for (int i = 0; i < 144; ++i) {
      in.docs.push_back({cat(r[i].input, {kEod})});
      tg.docs.push_back({cat(r[i].target, {kEod})});
    }
    out.push_back(in);
    out.push_back(tg);
  }
  {
    Expected e{"wordnet_multiseq_int32", DType::Int32, false, {}, {}};
    for (int i = 0; i < 48; ++i) e.docs.push_back({r[i].input, cat(r[i].target, {kEod})});
    out.push_back(e);
  }
  {
    Expected e{"wordnet_modes_uint16", DType::UInt16, true, {}, {}};
    for (int i = 0; i < 32; ++i) {
      e.docs.push_back({r[i].input, r[i].target});
      e.seq_modes.push_back(0);
      e.seq_modes.push_back(1);
    }
    out.push_back(e);
  }
  return out;
}

Expected expected_legacy() {
  const auto& r = records();
  Expected e{"wordnet_legacy_tntidx_int32", DType::Int32, false, {}, {}};
  for (int i = 0; i < 16; ++i) e.docs.push_back({r[i].input, cat(r[i].target, {kEod})});
  return e;
}

/// Token bytes of `tokens` in dtype `dt`.
std::vector<std::uint8_t> encode(const std::vector<std::int64_t>& tokens, DType dt) {
  const std::size_t item = dtype_size(dt);
  std::vector<std::uint8_t> out(tokens.size() * item);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int64_t v = tokens[i];
    std::uint8_t* p = out.data() + i * item;
    switch (dt) {
      case DType::UInt8: { auto x = static_cast<std::uint8_t>(v); std::memcpy(p, &x, item); break; }
      case DType::Int8: { auto x = static_cast<std::int8_t>(v); std::memcpy(p, &x, item); break; }
      case DType::Int16: { auto x = static_cast<std::int16_t>(v); std::memcpy(p, &x, item); break; }
      case DType::UInt16: { auto x = static_cast<std::uint16_t>(v); std::memcpy(p, &x, item); break; }
      case DType::Int32: { auto x = static_cast<std::int32_t>(v); std::memcpy(p, &x, item); break; }
      case DType::Int64: { std::memcpy(p, &v, item); break; }
      case DType::Float32: { auto x = static_cast<float>(v); std::memcpy(p, &x, item); break; }
      case DType::Float64: { auto x = static_cast<double>(v); std::memcpy(p, &x, item); break; }
    }
  }
  return out;
}

/// Token ids of `n` tokens of dtype `dt` at p.
std::vector<std::int64_t> decode(const void* data, std::uint64_t n, DType dt) {
  const std::size_t item = dtype_size(dt);
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::vector<std::int64_t> out(n);
  for (std::uint64_t i = 0; i < n; ++i, p += item) {
    switch (dt) {
      case DType::UInt8: out[i] = *p; break;
      case DType::Int8: { std::int8_t x; std::memcpy(&x, p, 1); out[i] = x; break; }
      case DType::Int16: { std::int16_t x; std::memcpy(&x, p, 2); out[i] = x; break; }
      case DType::UInt16: { std::uint16_t x; std::memcpy(&x, p, 2); out[i] = x; break; }
      case DType::Int32: { std::int32_t x; std::memcpy(&x, p, 4); out[i] = x; break; }
      case DType::Int64: { std::memcpy(&out[i], p, 8); break; }
      case DType::Float32: { float x; std::memcpy(&x, p, 4); out[i] = static_cast<std::int64_t>(x); break; }
      case DType::Float64: { double x; std::memcpy(&x, p, 8); out[i] = static_cast<std::int64_t>(x); break; }
    }
  }
  return out;
}

/// Checks every sequence, the doc_idx and the modes of `ds` against `docs`.
void check_contents(const IndexedDataset& ds, const Documents& docs, const std::vector<std::int8_t>& modes) {
  std::uint64_t seq = 0;
  REQUIRE(ds.num_documents() == docs.size());
  REQUIRE(ds.doc_idx()[0] == 0);
  for (std::size_t d = 0; d < docs.size(); ++d) {
    for (const auto& s : docs[d]) {
      INFO("sequence " << seq);
      REQUIRE(seq < ds.size());
      REQUIRE(ds.length(seq) == s.size());
      const auto bytes = ds.read(seq);
      CHECK(decode(bytes.data(), s.size(), ds.dtype()) == s);
      if (!ds.compressed()) {
        const TokenSpan v = ds.view(seq);
        REQUIRE(v.length == s.size());
        CHECK(v.dtype == ds.dtype());
        if (!s.empty()) CHECK(decode(v.data, v.length, ds.dtype()) == s);
      }
      if (s.size() >= 3) {  // an inner slice
        std::vector<std::uint8_t> mid((s.size() - 2) * ds.itemsize());
        ds.read(seq, 1, s.size() - 2, mid.data());
        CHECK(decode(mid.data(), s.size() - 2, ds.dtype()) ==
              std::vector<std::int64_t>(s.begin() + 1, s.end() - 1));
      }
      if (!modes.empty()) {
        REQUIRE(ds.has_modes());
        CHECK(ds.modes()[seq] == modes[seq]);
      }
      ++seq;
    }
    CHECK(ds.doc_idx()[d + 1] == static_cast<std::int64_t>(seq));
  }
  CHECK(seq == ds.size());
}

/// Builds `e` with IndexedDatasetBuilder the way Megatron's preprocessing does (add_document).
void build_expected(const std::string& prefix, const Expected& e) {
  IndexedDatasetBuilder b(prefix, e.dtype, e.modes);
  std::size_t seq = 0;
  for (const auto& doc : e.docs) {
    std::vector<std::int64_t> flat;
    std::vector<std::int64_t> lengths;
    std::vector<std::int8_t> modes;
    for (const auto& s : doc) {
      flat.insert(flat.end(), s.begin(), s.end());
      lengths.push_back(static_cast<std::int64_t>(s.size()));
      if (e.modes) modes.push_back(e.seq_modes[seq]);
      ++seq;
    }
    const auto bytes = encode(flat, e.dtype);
    b.add_document(bytes.data(), lengths.data(), lengths.size(), e.modes ? modes.data() : nullptr);
  }
  b.finalize();
}

std::map<std::string, std::string> sha256sums() {
  std::map<std::string, std::string> out;
  std::istringstream in(read_file(fixture("megatron-small/SHA256SUMS")));
  std::string hash, name;
  while (in >> hash >> name) out[name] = hash;
  return out;
}

/// Copies a fixture pair into `dir` as `<dir>/<name>` and returns that prefix.
std::string copy_fixture(const TempDir& dir, const std::string& fixture_prefix, const std::string& name) {
  const std::string src = fixture("megatron-small/" + fixture_prefix);
  write_file(dir.file(name + ".idx"), read_file(src + ".idx"));
  write_file(dir.file(name + ".bin"), read_file(src + ".bin"));
  return dir.file(name);
}

template <typename T>
void poke(std::string& bytes, std::size_t offset, T value) {
  REQUIRE(offset + sizeof(T) <= bytes.size());
  std::memcpy(&bytes[offset], &value, sizeof(T));
}

// wordnet_gpt2_text_document: S = 64, D = 65, uint16.
constexpr std::uint64_t kS = 64;
constexpr std::size_t kPointersAt = 34 + 4 * kS;
constexpr std::size_t kDocIdxAt = 34 + 12 * kS;

}  // namespace

TEST_CASE("fixture headers match the reference table", "[interface][regression]") {
  struct Row {
    const char* prefix;
    IndexFormat format;
    DType dtype;
    std::uint64_t S, D, idx_bytes, bin_bytes;
    bool modes;
  };
  const Row rows[] = {
      {"wordnet_gpt2_text_document", IndexFormat::MMIDIDX, DType::UInt16, 64, 65, 1322, 2010, false},
      {"wordnet_mt_inputs_document", IndexFormat::MMIDIDX, DType::UInt16, 144, 145, 2922, 2356, false},
      {"wordnet_mt_targets_document", IndexFormat::MMIDIDX, DType::UInt16, 144, 145, 2922, 2312, false},
      {"wordnet_multiseq_int32", IndexFormat::MMIDIDX, DType::Int32, 96, 49, 1578, 2888, false},
      {"wordnet_modes_uint16", IndexFormat::MMIDIDX, DType::UInt16, 64, 33, 1130, 900, true},
      {"wordnet_legacy_tntidx_int32", IndexFormat::TNTIDX, DType::Int32, 32, 17, 976, 992, false},
  };
  for (const auto& row : rows) {
    INFO(row.prefix);
    const std::string prefix = fixture(std::string("megatron-small/") + row.prefix);
    const IndexedDataset ds(prefix);
    CHECK(ds.format() == row.format);
    CHECK(ds.version() == 1);
    CHECK(ds.dtype() == row.dtype);
    CHECK(ds.size() == row.S);
    CHECK(ds.num_documents() + 1 == row.D);
    CHECK(ds.doc_idx().size() == row.D);
    CHECK(packpipe::file_size(prefix + ".idx") == row.idx_bytes);
    CHECK(ds.bin().size() == row.bin_bytes);
    CHECK(ds.num_tokens() * ds.itemsize() == row.bin_bytes);
    CHECK(ds.has_modes() == row.modes);
    CHECK_FALSE(ds.compressed());
    CHECK(ds.verify().empty());
  }
  CHECK(std::string(format_name(IndexFormat::MMIDIDX)) == "MMIDIDX");
  CHECK(std::string(format_name(IndexFormat::TNTIDX)) == "TNTIDX");
}

TEST_CASE("every fixture sequence equals the token ids of records.jsonl", "[interface][regression]") {
  auto all = expected_fixtures();
  all.push_back(expected_legacy());
  for (const auto& e : all) {
    INFO(e.prefix);
    const IndexedDataset ds(fixture("megatron-small/" + e.prefix));
    check_contents(ds, e.docs, e.seq_modes);
  }
}

TEST_CASE("the builder reproduces every Megatron fixture byte for byte", "[interface][regression]") {
  TempDir dir;
  const auto sums = sha256sums();
  for (const auto& e : expected_fixtures()) {
    INFO(e.prefix);
    const std::string out = dir.file(e.prefix);
    build_expected(out, e);
    const std::string ref = fixture("megatron-small/" + e.prefix);
    CHECK(read_file(out + ".bin") == read_file(ref + ".bin"));
    CHECK(read_file(out + ".idx") == read_file(ref + ".idx"));
    CHECK(packpipe::test::sha256_file(out + ".idx") == sums.at(e.prefix + ".idx"));
    CHECK(packpipe::test::sha256_file(out + ".bin") == sums.at(e.prefix + ".bin"));
  }
}

TEST_CASE("add_item and end_document write the same bytes as add_document", "[interface]") {
  TempDir dir;
  const Expected e = expected_fixtures()[3];  // multiseq_int32
  {
    IndexedDatasetBuilder b(dir.file("x"), e.dtype);
    for (const auto& doc : e.docs) {
      for (const auto& s : doc) {
        const auto bytes = encode(s, e.dtype);
        b.add_item(bytes.data(), s.size());
      }
      b.end_document();
    }
    CHECK(b.num_sequences() == 96);
    CHECK(b.num_documents() == 48);
    CHECK(b.num_tokens() == 722);
    b.finalize();
  }
  const std::string ref = fixture("megatron-small/" + e.prefix);
  CHECK(read_file(dir.file("x.idx")) == read_file(ref + ".idx"));
  CHECK(read_file(dir.file("x.bin")) == read_file(ref + ".bin"));
}

TEST_CASE("a legacy TNTIDX dataset converts to MMIDIDX through add_index", "[interface][regression]") {
  TempDir dir;
  Expected e = expected_fixtures()[3];  // multiseq_int32 has the same layout for records 0..15
  e.docs.resize(16);
  build_expected(dir.file("direct"), e);
  {
    IndexedDatasetBuilder b(dir.file("converted"), DType::Int32);
    b.add_index(fixture("megatron-small/wordnet_legacy_tntidx_int32"));
    b.finalize();
  }
  CHECK(read_file(dir.file("converted.idx")) == read_file(dir.file("direct.idx")));
  CHECK(read_file(dir.file("converted.bin")) ==
        read_file(fixture("megatron-small/wordnet_legacy_tntidx_int32.bin")));
}

TEST_CASE("modes policy: Auto detects, Present and Absent force", "[interface][negative]") {
  const std::string plain = fixture("megatron-small/wordnet_gpt2_text_document");
  const std::string modes = fixture("megatron-small/wordnet_modes_uint16");
  IndexedDataset::Options present;
  present.modes = ModesPolicy::Present;
  IndexedDataset::Options absent;
  absent.modes = ModesPolicy::Absent;
  CHECK(IndexedDataset(modes, present).has_modes());
  CHECK_FALSE(IndexedDataset(plain, absent).has_modes());
  REQUIRE_THROWS_AS(IndexedDataset(plain, present), packpipe::Error);
  REQUIRE_THROWS_WITH(IndexedDataset(plain, present),
                      Contains(plain + ".idx") && Contains("with sequence modes") &&
                          Contains("expected 1386 bytes, found 1322"));
  REQUIRE_THROWS_WITH(IndexedDataset(modes, absent),
                      Contains(modes + ".idx") && Contains("expected 1066 bytes, found 1130"));
  REQUIRE_THROWS_WITH(IndexedDataset(fixture("megatron-small/wordnet_legacy_tntidx_int32"), present),
                      Contains("TNTIDX") && Contains("no sequence modes"));
}

TEST_CASE("a corrupt header is rejected with file, offset and expected versus found", "[negative]") {
  TempDir dir;
  const std::string prefix = copy_fixture(dir, "wordnet_gpt2_text_document", "w");
  const std::string idx = prefix + ".idx";
  const std::string good = read_file(idx);

  SECTION("wrong magic") {
    std::string b = good;
    b[0] = 'X';
    b[1] = '\x01';
    write_file(idx, b);
    REQUIRE_THROWS_AS(IndexedDataset(prefix), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix),
                        Contains(idx + ": bad magic at offset 0: expected 'MMIDIDX\\0\\0' or "
                                       "'TNTIDX\\0\\0', found 'X\\x01IDIDX\\0\\0'"));
  }
  SECTION("unsupported version") {
    std::string b = good;
    poke<std::uint64_t>(b, 9, 2);
    write_file(idx, b);
    REQUIRE_THROWS_AS(IndexedDataset(prefix), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix),
                        Contains(idx) && Contains("version at offset 9: expected 1, found 2"));
  }
  SECTION("unsupported dtype code") {
    std::string b = good;
    b[17] = 9;
    write_file(idx, b);
    REQUIRE_THROWS_AS(IndexedDataset(prefix), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix),
                        Contains(idx + " at offset 17") && Contains("unsupported dtype code 9"));
  }
  SECTION("truncated .idx") {
    write_file(idx, good.substr(0, good.size() - 1));
    REQUIRE_THROWS_AS(IndexedDataset(prefix), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix),
                        Contains(idx) && Contains("S=64, D=65") &&
                            Contains("expected 1322 bytes (without modes) or 1386 bytes (with modes), found 1321"));
    write_file(idx, good.substr(0, 20));
    REQUIRE_THROWS_WITH(IndexedDataset(prefix),
                        Contains(idx) && Contains("truncated MMIDIDX header: expected at least 34 bytes, found 20"));
    write_file(idx, good.substr(0, 5));
    REQUIRE_THROWS_WITH(IndexedDataset(prefix),
                        Contains(idx) && Contains("truncated header: expected at least 34 bytes, found 5"));
    write_file(idx, "");
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains("found 0"));
  }
  SECTION("a huge sequence count does not overflow the size formula") {
    std::string b = good;
    poke<std::uint64_t>(b, 18, ~std::uint64_t{0} / 4);
    write_file(idx, b);
    REQUIRE_THROWS_AS(IndexedDataset(prefix), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(idx) && Contains("overflows 64 bits"));
  }
  SECTION("doc_idx not ending at S") {
    std::string b = good;
    poke<std::int64_t>(b, kDocIdxAt + 8 * 64, 63);
    write_file(idx, b);
    REQUIRE_THROWS_AS(IndexedDataset(prefix), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix),
                        Contains(idx + ": doc_idx[64] at offset " + std::to_string(kDocIdxAt + 512) +
                                 ": expected 64 (the sequence count), found 63"));
  }
  SECTION("doc_idx not starting at 0") {
    std::string b = good;
    poke<std::int64_t>(b, kDocIdxAt, 1);
    write_file(idx, b);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(idx) && Contains("doc_idx[0]") &&
                                                    Contains("expected 0, found 1"));
  }
  SECTION("zero-length document index") {
    std::string b = good.substr(0, 34);
    poke<std::uint64_t>(b, 18, 0);
    poke<std::uint64_t>(b, 26, 0);
    write_file(idx, b);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(idx) && Contains("offset 26") && Contains("found 0"));
  }
}

TEST_CASE("data files that disagree with the index are rejected", "[negative]") {
  TempDir dir;
  const std::string prefix = copy_fixture(dir, "wordnet_gpt2_text_document", "w");
  const std::string idx = prefix + ".idx";
  const std::string good = read_file(idx);

  SECTION("truncated .bin") {
    const std::string bin = read_file(prefix + ".bin");
    write_file(prefix + ".bin", bin.substr(0, bin.size() - 2));
    REQUIRE_THROWS_AS(IndexedDataset(prefix), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix),
                        Contains(idx) && Contains(prefix + ".bin should have 2010 bytes, found 2008"));
  }
  SECTION("missing .bin") {
    std::remove((prefix + ".bin").c_str());
    REQUIRE_THROWS_AS(IndexedDataset(prefix), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(prefix + ".bin") && Contains(prefix + ".bin.zst") &&
                                                    Contains("exists"));
  }
  SECTION("missing .idx") {
    std::remove(idx.c_str());
    REQUIRE_THROWS_AS(IndexedDataset(prefix), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(idx));
  }
  SECTION("sizes and pointers that disagree") {
    std::string b = good;
    const IndexedDataset orig(fixture("megatron-small/wordnet_gpt2_text_document"));
    const std::int64_t p5 = orig.pointers()[5];
    poke<std::int64_t>(b, kPointersAt + 8 * 5, p5 + 2);
    write_file(idx, b);
    const IndexedDataset ds(prefix);  // O(1) open does not look at sequence 5
    CHECK(ds.length(4) == orig.length(4));
    CHECK(ds.checked_pointer(4) == static_cast<std::uint64_t>(orig.pointers()[4]));
    const std::string msg = idx + ": sequence 5: pointer expected " + std::to_string(p5) +
                            " (end of sequence 4), found " + std::to_string(p5 + 2);
    REQUIRE_THROWS_AS(ds.checked_pointer(5), packpipe::Error);
    REQUIRE_THROWS_WITH(ds.checked_pointer(5), Contains(msg));
    REQUIRE_THROWS_WITH(ds.read(5), Contains(msg));
    REQUIRE_THROWS_WITH(ds.view(5), Contains(msg));
    REQUIRE_THROWS_WITH(ds.checked_pointer(6), Contains("sequence 6: pointer expected"));
    const auto problems = ds.verify();
    REQUIRE(problems.size() == 1);
    CHECK(problems[0].file == idx);
    CHECK_THAT(problems[0].message, Contains("sequence 5: pointer expected " + std::to_string(p5) +
                                             " (prefix sum of sizes x 2 bytes), found " +
                                             std::to_string(p5 + 2)));
  }
  SECTION("a size that disagrees with the next pointer") {
    std::string b = good;
    poke<std::int32_t>(b, 34 + 4 * 3, 1000);
    write_file(idx, b);
    // Refused at open: the sizes no longer fill the .bin.
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains("sizes add up to 1986 tokens") && Contains("1005 tokens"));
    IndexedDataset::Options lazy;
    lazy.check_sizes = false;  // what verify() opens with
    const IndexedDataset ds(prefix, lazy);
    REQUIRE_THROWS_WITH(ds.checked_pointer(3), Contains("sequence 3") && Contains("past the end"));
    REQUIRE_THROWS_WITH(ds.checked_pointer(4), Contains("sequence 4: pointer expected"));
    const auto problems = ds.verify(5);
    CHECK(problems.size() == 5);  // every later pointer disagrees: capped at max_problems
    const auto all = ds.verify();
    REQUIRE(all.size() == 61);  // pointers 4..63 and the .bin size
    CHECK(all.back().file == prefix + ".bin");
    CHECK_THAT(all.back().message, Contains("expected 3972 bytes") && Contains("found 2010"));
  }
  SECTION("a size of 0 or 2^31 - 1 is refused at open, before any sampler or partition uses it") {
    for (const std::int32_t v : {0, 2147483647}) {
      std::string b = good;
      poke<std::int32_t>(b, 34 + 4 * 7, v);
      write_file(idx, b);
      REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(idx) && Contains("the index is corrupt"));
    }
  }
  SECTION("a negative size") {
    std::string b = good;
    poke<std::int32_t>(b, 34 + 4 * 2, -1);
    write_file(idx, b);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains("sequence 2: size -1 tokens, expected 0..1005"));
    IndexedDataset::Options lazy;
    lazy.check_sizes = false;
    const IndexedDataset ds(prefix, lazy);
    REQUIRE_THROWS_AS(ds.length(2), packpipe::Error);
    REQUIRE_THROWS_WITH(ds.length(2), Contains(idx + ": sequence 2: size expected >= 0, found -1"));
    REQUIRE_THROWS_WITH(ds.checked_pointer(3), Contains("sequence 2: size expected >= 0, found -1"));
  }
  SECTION("a pointer past the end") {
    std::string b = good;
    poke<std::int64_t>(b, kPointersAt + 8 * 10, 1000000);
    write_file(idx, b);
    const IndexedDataset ds(prefix);
    REQUIRE_THROWS_AS(ds.read(10), packpipe::Error);
    REQUIRE_THROWS_WITH(ds.read(10), Contains(idx + ": sequence 10: pointer 1000000 + ") &&
                                         Contains("past the end of " + prefix + ".bin (2010 bytes)"));
    poke<std::int64_t>(b, kPointersAt + 8 * 10, -4);
    write_file(idx, b);
    const IndexedDataset ds2(prefix);
    REQUIRE_THROWS_WITH(ds2.view(10), Contains("sequence 10: pointer -4") && Contains("past the end"));
  }
  SECTION("the last pointer past the end is caught at open") {
    std::string b = good;
    poke<std::int64_t>(b, kPointersAt + 8 * 63, 4000);
    write_file(idx, b);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix),
                        Contains(idx) && Contains("last sequence (63)") && Contains("found 2010"));
  }
  SECTION("a non-monotone doc_idx is reported by verify") {
    std::string b = good;
    poke<std::int64_t>(b, kDocIdxAt + 8 * 10, 30);
    write_file(idx, b);
    const IndexedDataset ds(prefix);
    const auto problems = ds.verify();
    REQUIRE(problems.size() == 1);
    CHECK(problems[0].file == idx);
    CHECK_THAT(problems[0].message, Contains("doc_idx[11]: expected >= 30 (non-decreasing), found 11"));
  }
}

TEST_CASE("indices and slices out of range throw OutOfRange naming the index", "[negative][boundary]") {
  const std::string prefix = fixture("megatron-small/wordnet_gpt2_text_document");
  const IndexedDataset ds(prefix);
  const std::string msg = "sequence index 64 out of range (dataset has 64 sequences)";
  REQUIRE_THROWS_AS(ds.length(64), packpipe::OutOfRange);
  REQUIRE_THROWS_WITH(ds.length(64), Contains(prefix + ".idx") && Contains(msg));
  REQUIRE_THROWS_AS(ds.checked_pointer(64), packpipe::OutOfRange);
  REQUIRE_THROWS_AS(ds.view(64), packpipe::OutOfRange);
  REQUIRE_THROWS_AS(ds.read(64), packpipe::OutOfRange);
  REQUIRE_THROWS_WITH(ds.read(~std::uint64_t{0}), Contains("sequence index 18446744073709551615"));
  std::vector<std::uint8_t> buf(64);
  const std::uint32_t len0 = ds.length(0);
  ds.read(0, len0, 0, buf.data());  // empty slice at the end is fine
  REQUIRE_THROWS_AS(ds.read(0, 1, len0, buf.data()), packpipe::OutOfRange);
  REQUIRE_THROWS_WITH(ds.read(0, 1, len0, buf.data()),
                      Contains("sequence 0: slice [1, 1 + " + std::to_string(len0) + ") is outside its " +
                               std::to_string(len0) + " tokens"));
  REQUIRE_THROWS_AS(ds.read(0, ~std::uint64_t{0}, 2, buf.data()), packpipe::OutOfRange);
}

TEST_CASE("legacy TNTIDX corruption is rejected", "[negative]") {
  TempDir dir;
  const std::string prefix = copy_fixture(dir, "wordnet_legacy_tntidx_int32", "t");
  const std::string idx = prefix + ".idx";
  const std::string good = read_file(idx);
  SECTION("truncated") {
    write_file(idx, good.substr(0, good.size() - 8));
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(idx) && Contains("N=32, s=32, doc_count=17") &&
                                                    Contains("expected 976 bytes, found 968"));
  }
  SECTION("element size disagrees with the dtype") {
    std::string b = good;
    poke<std::uint64_t>(b, 24, 2);
    write_file(idx, b);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix),
                        Contains(idx) && Contains("element size at offset 24: expected 4 (dtype int32), found 2"));
  }
  SECTION("unsupported version and dtype") {
    std::string b = good;
    poke<std::uint64_t>(b, 8, 3);
    write_file(idx, b);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains("TNTIDX version at offset 8: expected 1, found 3"));
    b = good;
    poke<std::uint64_t>(b, 16, 10);
    write_file(idx, b);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(idx + " at offset 16") && Contains("dtype code 10"));
  }
  SECTION("data_offsets that go backwards") {
    std::string b = good;
    const std::size_t data_off = 56 + 8 * 33;
    poke<std::int64_t>(b, data_off + 8 * 5, 1);
    write_file(idx, b);
    REQUIRE_THROWS_AS(IndexedDataset(prefix), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(idx) && Contains("data_offsets[5]"));
  }
  SECTION("sizes that disagree with data_offsets") {
    std::string b = good;
    const std::size_t sizes_off = 56 + 16 * 33;
    poke<std::int64_t>(b, sizes_off + 8 * 7, 99);
    write_file(idx, b);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(idx) && Contains("item 7: sizes give 99 elements"));
  }
  SECTION("doc_idx not ending at N") {
    std::string b = good;
    poke<std::int64_t>(b, good.size() - 8, 31);
    write_file(idx, b);
    REQUIRE_THROWS_WITH(IndexedDataset(prefix), Contains(idx) && Contains("doc_idx[16]") &&
                                                    Contains("expected 32 (the item count), found 31"));
  }
}

TEST_CASE("every truncation and header byte flip of a fixture index throws a packpipe error",
          "[boundary][negative]") {
  // With ModesPolicy::Auto the modes file cut before its modes is a valid file without modes.
  const std::pair<const char*, ModesPolicy> cases[] = {{"wordnet_modes_uint16", ModesPolicy::Present},
                                                       {"wordnet_legacy_tntidx_int32", ModesPolicy::Auto}};
  for (const auto& [name, policy] : cases) {
    const std::string bytes = read_file(fixture(std::string("megatron-small/") + name + ".idx"));
    const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
    CHECK(parse_index(data, bytes.size(), name, policy).num_sequences > 0);
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      std::vector<std::uint8_t> copy(data, data + n);  // exact-size buffer for ASan
      REQUIRE_THROWS_AS(parse_index(copy.data(), n, name, policy), packpipe::Error);
    }
    for (std::size_t pos = 0; pos < 64; ++pos) {
      for (int bit = 0; bit < 8; ++bit) {
        std::vector<std::uint8_t> copy(data, data + bytes.size());
        copy[pos] = static_cast<std::uint8_t>(copy[pos] ^ (1u << bit));
        try {
          (void)parse_index(copy.data(), copy.size(), name);
        } catch (const packpipe::Error&) {
        }
      }
    }
  }
}

TEST_CASE("empty datasets and zero-length sequences", "[boundary]") {
  TempDir dir;
  SECTION("no documents") {
    IndexedDatasetBuilder(dir.file("e"), DType::UInt16).finalize();
    CHECK(read_file(dir.file("e.idx")).size() == 34 + 8);
    CHECK(read_file(dir.file("e.bin")).empty());
    const IndexedDataset ds(dir.file("e"));
    CHECK(ds.size() == 0);
    CHECK(ds.num_documents() == 0);
    CHECK(ds.num_tokens() == 0);
    CHECK_FALSE(ds.has_modes());
    CHECK(ds.verify().empty());
    REQUIRE_THROWS_AS(ds.length(0), packpipe::OutOfRange);
  }
  SECTION("empty sequences and empty documents") {
    {
      IndexedDatasetBuilder b(dir.file("z"), DType::Int64);
      b.add_item(nullptr, 0);
      b.end_document();
      b.end_document();  // a document without sequences
      const std::int64_t t[2] = {7, 8};
      b.add_item(t, 2);
      b.add_item(nullptr, 0);
      b.finalize();  // closes the open document
    }
    const IndexedDataset ds(dir.file("z"));
    CHECK(ds.size() == 3);
    CHECK(ds.num_documents() == 3);
    CHECK(ds.doc_idx()[1] == 1);
    CHECK(ds.doc_idx()[2] == 1);
    CHECK(ds.doc_idx()[3] == 3);
    CHECK(ds.view(0).length == 0);
    CHECK(ds.read(2).empty());
    CHECK(decode(ds.view(1).data, 2, DType::Int64) == std::vector<std::int64_t>{7, 8});
    CHECK(ds.verify().empty());
  }
  SECTION("a non-empty .bin for an empty index") {
    IndexedDatasetBuilder(dir.file("e"), DType::UInt16).finalize();
    write_file(dir.file("e.bin"), "xx");
    REQUIRE_THROWS_WITH(IndexedDataset(dir.file("e")), Contains("expected 0 bytes, found 2"));
  }
}

TEST_CASE("builder temporary files: spilled during the build, removed after", "[interface]") {
  TempDir dir;
  const std::string prefix = dir.file("b");
  // The spill files: `b.idx.tmp-<array>-XXXXXX`, new names that never replace an existing file.
  const auto spills = [&] {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      const std::string name = e.path().filename().string();
      for (const char* stem : {"b.idx.tmp-sizes-", "b.idx.tmp-pointers-", "b.idx.tmp-docidx-", "b.idx.tmp-modes-"}) {
        if (name.rfind(stem, 0) == 0) out.push_back(name);
      }
    }
    return out;
  };
  SECTION("a file with a spill file's stem is never replaced") {
    write_file(prefix + ".idx.tmp-sizes", "a user's file");
    IndexedDatasetBuilder b(prefix, DType::UInt8);
    const std::uint8_t t[2] = {1, 2};
    b.add_item(t, 2);
    b.finalize();
    CHECK(read_file(prefix + ".idx.tmp-sizes") == "a user's file");
  }
  SECTION("finalize") {
    IndexedDatasetBuilder b(prefix, DType::UInt8, true);
    const std::uint8_t t[3] = {1, 2, 3};
    b.add_item(t, 3, 1);
    b.end_document();
    CHECK(spills().size() == 4);  // sizes, pointers, document index, modes
    CHECK_FALSE(packpipe::file_exists(prefix + ".idx"));
    b.finalize();
    CHECK(spills().empty());
    CHECK_FALSE(packpipe::file_exists(prefix + ".idx.tmp"));
    REQUIRE_THROWS_AS(b.finalize(), packpipe::InvalidArgument);
    REQUIRE_THROWS_AS(b.add_item(t, 3), packpipe::InvalidArgument);
    REQUIRE_THROWS_AS(b.end_document(), packpipe::InvalidArgument);
    const IndexedDataset ds(prefix);
    CHECK(ds.has_modes());
    CHECK(ds.modes()[0] == 1);
  }
  SECTION("destroyed without finalize") {
    write_file(prefix + ".idx", "previous index");
    write_file(prefix + ".bin", "previous tokens");
    {
      IndexedDatasetBuilder b(prefix, DType::UInt8);
      const std::uint8_t t[3] = {1, 2, 3};
      b.add_item(t, 3);
      // A second builder of the same prefix is refused while this one writes.
      REQUIRE_THROWS_WITH(IndexedDatasetBuilder(prefix, DType::UInt8), Contains("another process is writing"));
      CHECK(read_file(prefix + ".bin") == "previous tokens");  // nothing visible before finalize
    }
    CHECK(spills().empty());
    // The previous dataset is untouched and no temporary is left beside it.
    CHECK(read_file(prefix + ".idx") == "previous index");
    CHECK(read_file(prefix + ".bin") == "previous tokens");
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
      CHECK(e.path().filename().string().find(".lock") == std::string::npos);
    }
  }
  SECTION("bad arguments") {
    IndexedDatasetBuilder b(prefix, DType::UInt8);
    const std::int64_t lengths[2] = {1, -1};
    const std::uint8_t t[1] = {1};
    REQUIRE_THROWS_WITH(b.add_document(t, lengths, 2), Contains("lengths[1] = -1"));
    REQUIRE_THROWS_AS(b.add_item(nullptr, 3), packpipe::InvalidArgument);
    REQUIRE_THROWS_WITH(b.add_item(t, std::uint64_t{1} << 31), Contains("int32"));
  }
  SECTION("unwritable location") {
    REQUIRE_THROWS_AS(IndexedDatasetBuilder(dir.file("no/such/dir/x"), DType::UInt8), packpipe::Error);
    REQUIRE_THROWS_WITH(IndexedDatasetBuilder(dir.file("no/such/dir/x"), DType::UInt8),
                        Contains(dir.file("no/such/dir/x.bin")));
  }
}

TEST_CASE("merging rejects mismatched inputs naming both files", "[negative]") {
  TempDir dir;
  std::mt19937_64 rng(7);
  const Documents docs = packpipe::test::random_documents(rng, 5, 3, 10, 100);
  packpipe::test::write_documents(dir.file("u16"), DType::UInt16, docs);
  packpipe::test::write_documents(dir.file("i32"), DType::Int32, docs);
  packpipe::test::write_documents(dir.file("m16"), DType::UInt16, docs, true);
  REQUIRE_THROWS_AS(merge_datasets({dir.file("u16"), dir.file("i32")}, dir.file("out")), packpipe::Error);
  REQUIRE_THROWS_WITH(merge_datasets({dir.file("u16"), dir.file("i32")}, dir.file("out")),
                      Contains(dir.file("u16")) && Contains(dir.file("i32")) && Contains("uint16") &&
                          Contains("int32"));
  REQUIRE_THROWS_WITH(merge_datasets({dir.file("u16"), dir.file("m16")}, dir.file("out")),
                      Contains(dir.file("u16")) && Contains(dir.file("m16")) && Contains("modes"));
  CHECK_FALSE(packpipe::file_exists(dir.file("out.bin")));  // checked before writing
  REQUIRE_THROWS_AS(merge_datasets({}, dir.file("out")), packpipe::InvalidArgument);
  IndexedDatasetBuilder b(dir.file("b"), DType::UInt16);
  REQUIRE_THROWS_WITH(b.add_index(dir.file("i32")), Contains(dir.file("i32")) && Contains(dir.file("b")) &&
                                                        Contains("dtype int32"));
  REQUIRE_THROWS_WITH(b.add_index(dir.file("m16")), Contains(dir.file("m16")) && Contains("has sequence modes"));
  REQUIRE_THROWS_AS(b.add_index(dir.file("missing")), packpipe::Error);
}

TEST_CASE("merging into one of the inputs is refused and destroys nothing", "[negative][data-loss]") {
  TempDir dir;
  std::mt19937_64 rng(11);
  const Documents docs = packpipe::test::random_documents(rng, 5, 3, 10, 100);
  packpipe::test::write_documents(dir.file("A"), DType::UInt16, docs);
  packpipe::test::write_documents(dir.file("B"), DType::UInt16, docs);
  const std::string idx = read_file(dir.file("A.idx")), bin = read_file(dir.file("A.bin"));
  REQUIRE(::symlink(dir.file("A.idx").c_str(), dir.file("L.idx").c_str()) == 0);
  REQUIRE(::symlink(dir.file("A.bin").c_str(), dir.file("L.bin").c_str()) == 0);
  REQUIRE(::link(dir.file("A.bin").c_str(), dir.file("H.bin").c_str()) == 0);
  // The output as the first input, the second, through "./", a symbolic link and a hard link.
  for (const std::string& out : {dir.file("A"), dir.path() + "/./A", dir.file("L"), dir.file("H")}) {
    for (const auto& inputs : {std::vector<std::string>{dir.file("A"), dir.file("B")},
                               std::vector<std::string>{dir.file("B"), dir.file("A")}}) {
      REQUIRE_THROWS_WITH(merge_datasets(inputs, out), Contains("destroy the input"));
    }
    IndexedDatasetBuilder b(out, DType::UInt16);  // rewriting A (or a link to it) from A
    REQUIRE_THROWS_WITH(b.add_index(dir.file("A")), Contains("destroy the input"));
  }
  CHECK(read_file(dir.file("A.idx")) == idx);
  CHECK(read_file(dir.file("A.bin")) == bin);
  CHECK(IndexedDataset(dir.file("A")).size() == IndexedDataset(dir.file("B")).size());
}

TEST_CASE("add_index rejects a corrupt input", "[negative]") {
  TempDir dir;
  const std::string prefix = copy_fixture(dir, "wordnet_gpt2_text_document", "w");
  std::string b = read_file(prefix + ".idx");
  poke<std::int64_t>(b, kPointersAt + 8 * 7, 0);
  write_file(prefix + ".idx", b);
  IndexedDatasetBuilder builder(dir.file("out"), DType::UInt16);
  REQUIRE_THROWS_AS(builder.add_index(prefix), packpipe::Error);
  REQUIRE_THROWS_WITH(builder.add_index(prefix), Contains(prefix + ".idx: sequence 7: pointer expected"));
}

TEST_CASE("random documents of every dtype read back equal", "[interface][stress]") {
  const DType dtype = GENERATE(DType::UInt8, DType::Int8, DType::Int16, DType::Int32, DType::Int64,
                               DType::Float64, DType::Float32, DType::UInt16);
  const bool with_modes = GENERATE(false, true);
  const std::int64_t vocab = dtype == DType::Int8 ? 128
                             : dtype == DType::UInt8 ? 256
                             : dtype == DType::Int16 ? 32768
                             : dtype == DType::UInt16 ? 65536
                                                      : 1 << 24;
  std::mt19937_64 rng(Catch::rngSeed() + static_cast<unsigned>(dtype) * 2 + with_modes);
  const Documents docs = packpipe::test::random_documents(rng, 40, 4, 60, vocab);
  TempDir dir;
  packpipe::test::write_documents(dir.file("r"), dtype, docs, with_modes);
  const IndexedDataset ds(dir.file("r"));
  CHECK(ds.dtype() == dtype);
  std::vector<std::int8_t> modes;
  if (with_modes) {
    for (const auto& d : docs) {
      for (std::size_t s = 0; s < d.size(); ++s) modes.push_back(static_cast<std::int8_t>(s & 1));
    }
  }
  check_contents(ds, docs, modes);
  CHECK(ds.has_modes() == with_modes);
  CHECK(ds.verify().empty());
}

TEST_CASE("merging random datasets equals building them in one go", "[interface][stress]") {
  const DType dtype = GENERATE(DType::UInt16, DType::Int32, DType::Float64);
  const bool with_modes = GENERATE(false, true);
  std::mt19937_64 rng(Catch::rngSeed() + static_cast<unsigned>(dtype) * 2 + with_modes);
  TempDir dir;
  Documents all;
  std::vector<std::string> parts;
  std::uniform_int_distribution<std::size_t> ndocs(0, 30);
  for (int p = 0; p < 5; ++p) {
    const Documents docs = packpipe::test::random_documents(rng, p == 2 ? 0 : ndocs(rng), 3, 50, 30000);
    parts.push_back(dir.file("part" + std::to_string(p)));
    packpipe::test::write_documents(parts.back(), dtype, docs, with_modes);
    all.insert(all.end(), docs.begin(), docs.end());
  }
  // write_documents alternates modes within each document, so the concatenation matches.
  packpipe::test::write_documents(dir.file("whole"), dtype, all, with_modes);
  merge_datasets(parts, dir.file("merged"));
  CHECK(read_file(dir.file("merged.bin")) == read_file(dir.file("whole.bin")));
  CHECK(read_file(dir.file("merged.idx")) == read_file(dir.file("whole.idx")));
  // Sequences added before add_index join its first document, as in Megatron.
  {
    IndexedDatasetBuilder b(dir.file("mixed"), dtype, with_modes);
    b.add_index(parts[0]);
    b.add_index(parts[1]);
    b.finalize();
  }
  const IndexedDataset mixed(dir.file("mixed"));
  const IndexedDataset p0(parts[0]);
  const IndexedDataset p1(parts[1]);
  CHECK(mixed.size() == p0.size() + p1.size());
  CHECK(mixed.num_documents() == p0.num_documents() + p1.num_documents());
  CHECK(mixed.verify().empty());
}

TEST_CASE("datasets move and report their prefix", "[interface]") {
  const std::string prefix = fixture("megatron-small/wordnet_mt_inputs_document");
  IndexedDataset a(prefix);
  const std::uint32_t len = a.length(3);
  IndexedDataset b(std::move(a));
  CHECK(b.prefix() == prefix);
  CHECK(b.length(3) == len);
  CHECK(b.itemsize() == 2);
  CHECK(b.bin().path() == prefix + ".bin");
}

namespace {

/// The message of the packpipe::Error that `f` throws ("" if it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const packpipe::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("an .idx truncated under a live dataset is an Error naming it, never SIGBUS", "[negative][regression]") {
  TempDir dir;
  const std::string prefix = dir.file("t");
  const std::string idx = prefix + ".idx";
  std::mt19937_64 rng(11);
  // Documents of one or two sequences with modes: every index array spans several pages.
  packpipe::test::write_documents(prefix, DType::UInt16, packpipe::test::random_documents(rng, 3000, 2, 30, 30000),
                                  true);
  const IndexedDataset ds(prefix);
  REQUIRE(ds.has_modes());
  const std::uint64_t S = ds.size();
  REQUIRE(packpipe::file_size(idx) > 4 * 4096);
  std::vector<std::uint32_t> lengths(S);
  for (std::uint64_t i = 0; i < S; ++i) lengths[i] = ds.length(i);
  // (a Catch matcher combination holds its parts by reference: each is built in its own CHECK)
  SECTION("to nothing") {
    std::filesystem::resize_file(idx, 0);  // another process truncates the index
    // The sizes were copied at open: lengths, sampling and planning go on.
    for (std::uint64_t i = 0; i < S; ++i) REQUIRE(ds.length(i) == lengths[i]);
    CHECK_THAT(error_of([&] { (void)ds.read(S / 2); }), Contains(idx) && Contains("truncated"));
    CHECK_THAT(error_of([&] { (void)ds.checked_pointer(0); }), Contains(idx) && Contains("truncated"));
    CHECK_THAT(error_of([&] { (void)ds.pointers()[1]; }), Contains(idx) && Contains("truncated"));
    CHECK_THAT(error_of([&] { (void)ds.doc_idx()[ds.num_documents()]; }), Contains(idx) && Contains("truncated"));
    CHECK_THAT(error_of([&] { (void)ds.modes()[0]; }), Contains(idx) && Contains("truncated"));
    CHECK_THAT(error_of([&] { (void)ds.verify(); }), Contains(idx) && Contains("truncated"));
  }
  SECTION("to its first page") {
    std::filesystem::resize_file(idx, 4096);
    CHECK(ds.length(S - 1) == lengths[S - 1]);
    CHECK_THAT(error_of([&] { (void)ds.read(S - 1); }), Contains(idx) && Contains("truncated"));
    CHECK_THAT(error_of([&] { (void)ds.doc_idx()[ds.num_documents()]; }), Contains(idx) && Contains("truncated"));
  }
  SECTION("a paired-sequences task reads documents and modes through the same guard") {
    const MultiTaskDataset mt = [&] {
      Manifest m;
      m.path = "test.json";
      TaskSpec t;
      t.name = "pairs";
      t.layout = TaskLayout::PairedSequences;
      t.prefixes = {dir.file("pairs")};
      m.tasks = {t};
      // modes 0 then 1 in each document, checked at every access
      packpipe::test::write_documents(dir.file("pairs"), DType::UInt16, Documents(400, {{1, 2, 3}, {4, 5}}), true);
      return MultiTaskDataset(m);
    }();
    REQUIRE(mt.input_length(packpipe::SampleRef{0, 399}) == 3);
    std::filesystem::resize_file(dir.file("pairs.idx"), 0);
    CHECK_THAT(error_of([&] { (void)mt.input_length(packpipe::SampleRef{0, 399}); }), Contains(dir.file("pairs.idx")) && Contains("truncated"));
    std::vector<std::uint8_t> in, tg;
    CHECK_THAT(error_of([&] { mt.read_sample(packpipe::SampleRef{0, 0}, in, tg); }), Contains(dir.file("pairs.idx")) && Contains("truncated"));
  }
}

TEST_CASE("a legacy TNTIDX index is read into memory at open: truncating it later loses nothing", "[regression]") {
  TempDir dir;
  const std::string from = fixture("megatron-small/wordnet_legacy_tntidx_int32");
  const std::string prefix = dir.file("legacy");
  std::filesystem::copy_file(from + ".idx", prefix + ".idx");
  std::filesystem::copy_file(from + ".bin", prefix + ".bin");
  const IndexedDataset ds(prefix);
  REQUIRE(ds.format() == IndexFormat::TNTIDX);
  std::vector<std::vector<std::uint8_t>> before;
  for (std::uint64_t i = 0; i < ds.size(); ++i) before.push_back(ds.read(i));
  std::filesystem::resize_file(prefix + ".idx", 0);
  for (std::uint64_t i = 0; i < ds.size(); ++i) REQUIRE(ds.read(i) == before[i]);
  CHECK(ds.doc_idx()[ds.num_documents()] == static_cast<std::int64_t>(ds.size()));
  CHECK(ds.verify().empty());
}

TEST_CASE("index arrays: the sizes are a copy in memory, the rest reads the map through its guard", "[interface]") {
  const IndexedDataset ds(fixture("megatron-small/wordnet_modes_uint16"));
  CHECK_FALSE(ds.sizes().guarded());
  CHECK(ds.pointers().guarded());
  CHECK(ds.doc_idx().guarded());
  CHECK(ds.modes().guarded());
  std::vector<std::int64_t> p(ds.size());
  ds.pointers().copy(0, ds.size(), p.data());
  for (std::uint64_t i = 0; i < ds.size(); ++i) REQUIRE(p[i] == static_cast<std::int64_t>(ds.checked_pointer(i)));
}

TEST_CASE("a .bin truncated into a page that is read gives an Error naming it, never the page's zeros",
          "[negative][regression]") {
  // Reading a mapped file past its new end but within its new last page gives zeros, not SIGBUS:
  // every token read checks that the file still has the size it was opened with.
  TempDir dir;
  const std::string prefix = dir.file("z");
  std::mt19937_64 rng(5);
  packpipe::test::write_documents(prefix, DType::UInt16, packpipe::test::random_documents(rng, 400, 1, 20, 200));
  const IndexedDataset ds(prefix);
  REQUIRE(packpipe::file_size(prefix + ".bin") > 4096);
  std::uint64_t victim = 0;  // a sequence wholly inside the first page, past byte 100
  while (victim < ds.size() && ds.checked_pointer(victim) < 100) ++victim;
  REQUIRE(ds.checked_pointer(victim) + 2 * ds.length(victim) < 4096);
  std::filesystem::resize_file(prefix + ".bin", 100);
  CHECK_THAT(error_of([&] { (void)ds.read(victim); }), Contains(prefix + ".bin") && Contains("truncated"));
}
