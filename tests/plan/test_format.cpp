// Plan serialization: exact round trips (binary and JSON), clear errors on truncated or corrupt
// input, and the multi-iteration plan file read by iteration.
#include <algorithm>
#include <random>

#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "common/mapped_file.h"
#include "plan/builder.h"
#include "planner/planner.h"
#include "tests/support/synthetic_plans.h"
#include "plan/format.h"
#include "plan/validator.h"
#include "tests/support/old_plan_formats.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::plan;
using namespace packpipe::planner;
namespace syn = packpipe::test::synthetic;
using packpipe::test::TempDir;

namespace {

Plan random_plan_of(std::mt19937_64& rng) {
  static const char* kinds[] = {"gpipe", "1f1b", "zero-bubble"};
  const std::int64_t S = 1 + static_cast<std::int64_t>(rng() % 8);
  const std::int64_t C = 1 + static_cast<std::int64_t>(rng() % 2);
  const std::int64_t N = C > 1 ? S * (1 + static_cast<std::int64_t>(rng() % 3)) : 1 + static_cast<std::int64_t>(rng() % 16);
  const bool encdec = rng() % 2 == 0 && (S * C == 1 || (S * C) % 2 == 0);
  const char* kind = kinds[rng() % 3];
  Plan p = syn::random_plan(kind, S, C, N, rng(), false, encdec);
  if (rng() % 2) {  // sample refs and packed rows on some micro-batches
    // decoder-only plans: some refs are chunks of split samples (format 4), each its own dataset sample here
    const bool chunks = !encdec && rng() % 2 == 0;
    for (auto& mb : p.microbatches) {
      for (auto s : mb.samples) {
        mb.refs.push_back(SampleRef{s % 7, 1000000000000ull + s, chunks && s % 3 == 1 ? 512u * s + 1 : 0u});
      }
    }
  }
  if (rng() % 2) {  // a context length every sample is within (format 4)
    std::uint32_t longest = 0, longest_target = 0;
    for (const auto& mb : p.microbatches) {
      for (auto l : mb.lengths) longest = std::max(longest, l);
      for (auto l : mb.target_lengths) longest_target = std::max(longest_target, l);
    }
    p.max_seq_len = longest + static_cast<std::uint32_t>(rng() % 3);
    if (encdec) p.max_target_len = longest_target;
  }
  return p;
}

// The header of an uncompressed blob `b` rewritten for its body as it is now: `version`, the body
// sizes and the checksum.
void reheader(std::vector<std::uint8_t>& b, std::uint16_t version) {
  auto put = [&](std::size_t at, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
  };
  const std::uint64_t body = b.size() - 32;
  put(4, version, 2);
  put(8, body, 8);
  put(16, body, 8);
  put(24, XXH64(b.data() + 32, body, 0), 8);
}

// The blob of `p` as format 3 wrote it: format 4's body without its trailer (two zero varints and
// no offsets), version 3. `p` has no context length and no chunks.
std::vector<std::uint8_t> as_format3(const Plan& p) {
  std::vector<std::uint8_t> b = packpipe::test::plan_blob_v4(p);
  REQUIRE(b.size() > 35);
  REQUIRE(std::vector<std::uint8_t>(b.end() - 3, b.end()) == std::vector<std::uint8_t>{0, 0, 0});
  b.resize(b.size() - 3);
  reheader(b, 3);
  return b;
}

// `text` with its first `from` replaced by `to` (which must be there).
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  return text;
}

std::vector<std::uint8_t> bytes_of(const std::string& s) { return std::vector<std::uint8_t>(s.begin(), s.end()); }

}  // namespace

TEST_CASE("plan format: binary round trips are exact, compressed or not", "[interface]") {
  std::mt19937_64 rng(0xf0f0);
  for (int t = 0; t < 200; ++t) {
    const Plan p = random_plan_of(rng);
    for (bool compress : {false, true}) {
      EncodeOptions o;
      o.compress = compress;
      const auto a = encode_plan(p, o);
      const Plan q = decode_plan(a.data(), a.size());
      REQUIRE(q == p);
      REQUIRE(encode_plan(q, o) == a);
      REQUIRE(validate(q).ok());
    }
  }
}

TEST_CASE("plan format: JSON round trips are exact and agree with the binary form", "[interface]") {
  std::mt19937_64 rng(0xf0f1);
  for (int t = 0; t < 60; ++t) {
    const Plan p = random_plan_of(rng);
    const std::string j = plan_to_json(p);
    const Plan q = plan_from_json(j);
    REQUIRE(q == p);
    REQUIRE(plan_to_json(q) == j);
    REQUIRE(encode_plan(q) == encode_plan(p));
    CHECK(plan_to_json(p, -1) == plan_to_json(q, -1));
  }
}

TEST_CASE("plan format 4: the context length and chunk offsets round-trip; formats 1-3 still read",
          "[interface][regression]") {
  Plan p = syn::random_plan("1f1b", 2, 1, 6, 9);
  for (auto& mb : p.microbatches) {
    mb.refs.assign(mb.samples.size(), SampleRef{1, 77, 0});
  }
  // One dataset sample split into consecutive chunks across the micro-batches.
  std::uint32_t at = 0, longest = 0;
  for (auto& mb : p.microbatches) {
    for (std::size_t i = 0; i < mb.samples.size(); ++i) {
      mb.refs[i].offset = at;
      at += mb.lengths[i];
      longest = std::max(longest, mb.lengths[i]);
    }
  }
  p.max_seq_len = longest;
  REQUIRE(validate(p).ok());
  const auto blob = encode_plan(p);
  const Plan q = decode_plan(blob.data(), blob.size());
  CHECK(q == p);
  CHECK(q.max_seq_len == longest);
  CHECK(q.microbatches.back().refs.back().offset == p.microbatches.back().refs.back().offset);
  const std::string j = plan_to_json(p);
  CHECK(j.find("\"max_seq_len\": " + std::to_string(longest)) != std::string::npos);
  CHECK(j.find("\"max_target_len\"") == std::string::npos);  // decoder-only: none written
  CHECK(plan_from_json(j) == p);
  CHECK(plan_to_json(plan_from_json(j)) == j);

  // A format-3 blob (no trailer) reads as a plan with no context length and no offsets.
  Plan whole = syn::random_plan("zero-bubble", 3, 1, 5, 4);
  for (auto& mb : whole.microbatches) {
    for (auto s : mb.samples) mb.refs.push_back(SampleRef{0, s});
  }
  const auto v3 = as_format3(whole);
  const Plan r = decode_plan(v3.data(), v3.size(), "v3.plan");
  CHECK(r == whole);
  CHECK(r.max_seq_len == 0);
  // Format 3 JSON takes neither field, nor a ref of three entries.
  std::string js = plan_to_json(whole, -1);
  const auto version = js.find("\"version\":5");
  REQUIRE(version != std::string::npos);
  js.replace(version, 11, "\"version\":3");
  CHECK(plan_from_json(js) == whole);
  auto with = [&](const std::string& from, const std::string& to) { return replaced(js, from, to); };
  REQUIRE_THROWS_WITH(plan_from_json(with("\"iteration\":", "\"max_seq_len\":8,\"iteration\":"), "v3.json"),
                      Catch::Matchers::Contains("/max_seq_len") && Catch::Matchers::Contains("format 4 has"));
  const auto first_ref = js.find("\"refs\":[[");
  REQUIRE(first_ref != std::string::npos);
  std::string three = js;
  three.insert(three.find(']', first_ref), ",5");  // the first ref gets an offset
  REQUIRE_THROWS_WITH(plan_from_json(three, "v3.json"),
                      Catch::Matchers::Contains("/refs/0") && Catch::Matchers::Contains("expected [task, index], found 3"));
  // Format 4 reads it.
  three.replace(three.find("\"version\":3"), 11, "\"version\":4");
  const Plan chunked = plan_from_json(three, "v4.json");
  CHECK(chunked.microbatches.front().refs.front().offset == 5);
  // A corrupt trailer is an error naming the field.
  std::vector<std::uint8_t> bad = packpipe::test::plan_blob_v4(whole);
  REQUIRE(bad.back() == 0);  // has_offsets
  bad.back() = 2;
  REQUIRE_THROWS_WITH(decode_plan(bad.data(), bad.size(), "x.plan", false),
                      Catch::Matchers::Contains("x.plan") && Catch::Matchers::Contains("field 'has_offsets'") &&
                          Catch::Matchers::Contains("expected 0 or 1, found 2"));
  // Canonical: offsets that are all 0 are not written (the same plan would re-encode otherwise).
  bad.back() = 1;
  std::size_t refs = 0;
  for (const auto& mb : whole.microbatches) refs += mb.refs.size();
  bad.insert(bad.end(), refs, 0);
  reheader(bad, 4);
  REQUIRE_THROWS_WITH(decode_plan(bad.data(), bad.size(), "x.plan"),
                      Catch::Matchers::Contains("field 'has_offsets'") && Catch::Matchers::Contains("every offset is 0"));
  // format 1-2 files still read (tests/data and the fuzz corpus hold them)
  const std::string corpus = std::string(PACKPIPE_SOURCE_DIR) + "/tests/fuzz/corpus/plan/";
  for (const char* f : {"cli_dp2_replicas.plans", "file_interleaved_encdec.plans", "gpipe_2x3.plan"}) {
    const PlanFileReader old(corpus + f);
    for (std::size_t i = 0; i < old.size(); ++i) {
      const Plan o = old.read(i);
      CHECK(o.max_seq_len == 0);
      for (const auto& mb : o.microbatches) {
        for (const auto& ref : mb.refs) CHECK(ref.offset == 0);
      }
    }
  }
}

TEST_CASE("plan format: instructions take a few bytes each", "[interface]") {
  Plan p = syn::random_plan("1f1b", 8, 1, 40, 1);
  const std::size_t n = p.instruction_count();
  const auto full = encode_plan(p);
  // Streams alone: strip everything else and compare sizes.
  Plan bare = p;
  for (auto& s : bare.streams) s.clear();
  const auto head = encode_plan(bare);
  const double per = static_cast<double>(full.size() - head.size()) / static_cast<double>(n);
  CHECK(per < 8.0);
  CHECK(per > 1.0);
  EncodeOptions z;
  z.compress = true;
  CHECK(encode_plan(p, z).size() < full.size());
}

TEST_CASE("plan format: every truncation of a plan is a clear error, never a crash", "[negative]") {
  const Plan p = syn::random_plan("zero-bubble", 3, 1, 4, 2, false, false);
  for (bool compress : {false, true}) {
    EncodeOptions o;
    o.compress = compress;
    const auto a = encode_plan(p, o);
    for (std::size_t n = 0; n < a.size(); ++n) {
      REQUIRE_THROWS_AS(decode_plan(a.data(), n, "x.plan"), packpipe::Error);
    }
    REQUIRE_THROWS_WITH(decode_plan(a.data(), 10, "x.plan"), Catch::Matchers::Contains("x.plan") &&
                                                                 Catch::Matchers::Contains("truncated"));
    REQUIRE_THROWS_WITH(decode_plan(a.data(), a.size() - 1, "x.plan"), Catch::Matchers::Contains("stored_size"));
  }
}

TEST_CASE("plan format: corrupt bytes are caught by the checksum, or by field checks without it", "[negative]") {
  const Plan p = syn::random_plan("1f1b", 4, 1, 6, 3);
  const auto a = encode_plan(p);
  std::mt19937_64 rng(11);
  int field_errors = 0;
  for (int t = 0; t < 300; ++t) {
    auto b = a;
    const std::size_t i = 32 + rng() % (b.size() - 32);
    b[i] ^= static_cast<std::uint8_t>(1 + rng() % 255);
    REQUIRE_THROWS_WITH(decode_plan(b.data(), b.size(), "c.plan"), Catch::Matchers::Contains("checksum"));
    try {
      const Plan q = decode_plan(b.data(), b.size(), "c.plan", false);
      (void)validate(q);  // never crashes on whatever decodes
    } catch (const packpipe::Error& e) {
      ++field_errors;
      CHECK(std::string(e.what()).find("c.plan: offset") != std::string::npos);
    }
  }
  CHECK(field_errors > 0);
  SECTION("magic, version and flags") {
    auto b = a;
    b[0] = 'X';
    REQUIRE_THROWS_WITH(decode_plan(b.data(), b.size(), "m.plan"), Catch::Matchers::Contains("field 'magic'"));
    b = a;
    b[4] = 9;
    REQUIRE_THROWS_WITH(decode_plan(b.data(), b.size(), "m.plan"), Catch::Matchers::Contains("field 'version'") &&
                                                                      Catch::Matchers::Contains("found 9"));
    b = a;
    b[6] = 4;
    REQUIRE_THROWS_WITH(decode_plan(b.data(), b.size(), "m.plan"), Catch::Matchers::Contains("field 'flags'"));
  }
}

TEST_CASE("plan format: JSON errors name the field and expected versus found", "[negative]") {
  const Plan p = syn::random_plan("gpipe", 2, 1, 2, 4);
  std::string j = plan_to_json(p, -1);
  REQUIRE_THROWS_WITH(plan_from_json("{", "j.json"), Catch::Matchers::Contains("j.json") && Catch::Matchers::Contains("malformed JSON"));
  auto replace = [&](const std::string& from, const std::string& to) { return replaced(j, from, to); };
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"op\":\"FWD\"", "\"op\":\"FORWARD\""), "j.json"),
                      Catch::Matchers::Contains("/op") && Catch::Matchers::Contains("FORWARD"));
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"ranks\":2", "\"ranks\":\"two\""), "j.json"),
                      Catch::Matchers::Contains("/ranks") && Catch::Matchers::Contains("non-negative integer"));
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"dtype\":\"bf16\"", "\"dtype\":\"fp8\""), "j.json"),
                      Catch::Matchers::Contains("dtype") && Catch::Matchers::Contains("fp8"));
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"op\":\"OPT_STEP\"", "\"op\":\"OPT_STEP\",\"mb\":1"), "j.json"),
                      Catch::Matchers::Contains("has no field 'mb'"));
  REQUIRE_THROWS_AS(plan_from_json(plan_to_json(p, -1, 1)), packpipe::Error);
  // Regression (found by fuzz_plan): a number overflowing a double is an Error, not a crash.
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"iteration\":4", "\"iteration\":0.17e2385"), "j.json"),
                      Catch::Matchers::Contains("j.json") && Catch::Matchers::Contains("malformed JSON"));
  // A repeated key is refused (the last one would silently win), naming the key and the file.
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"iteration\":4", "\"iteration\":4,\"iteration\":5"), "j.json"),
                      Catch::Matchers::Contains("j.json") && Catch::Matchers::Contains("iteration"));
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"padded_len\":", "\"tokens\":1,\"padded_len\":"), "j.json"),
                      Catch::Matchers::Contains("j.json") && Catch::Matchers::Contains("tokens"));
  // Nesting deeper than any plan is refused before it can exhaust the stack.
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"iteration\":4", "\"iteration\":" + std::string(100000, '[')), "j.json"),
                      Catch::Matchers::Contains("j.json"));
  // An unknown (e.g. misspelt) field is refused rather than dropped, at every level.
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"iteration\":4", "\"iteration\":4,\"extra\":1"), "j.json"),
                      Catch::Matchers::Contains("/extra") && Catch::Matchers::Contains("unknown field"));
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"samples\":", "\"refz\":[],\"samples\":"), "j.json"),
                      Catch::Matchers::Contains("/microbatches/0/refz") && Catch::Matchers::Contains("unknown field"));
  REQUIRE_THROWS_WITH(plan_from_json(replace("\"dtype\":\"bf16\"", "\"dtype\":\"bf16\",\"stride\":2"), "j.json"),
                      Catch::Matchers::Contains("/shapes/") && Catch::Matchers::Contains("unknown field"));
}

TEST_CASE("plan file: written one iteration at a time, read by iteration", "[interface]") {
  TempDir dir;
  const std::string path = dir.file("epoch.plans");
  std::vector<Plan> plans;
  {
    EncodeOptions o;
    o.compress = true;
    PlanFileWriter w(path, o);
    for (std::uint64_t it = 0; it < 12; ++it) {
      Plan p = syn::random_plan(it % 2 ? "1f1b" : "zero-bubble", 4, 1, 4 + static_cast<std::int64_t>(it), 100 + it);
      p.iteration = 1000 + it;
      w.append(p);
      plans.push_back(p);
    }
    CHECK(w.plans_written() == 12);
    w.close();
  }
  const PlanFileReader r(path);
  REQUIRE(r.size() == 12);
  for (std::size_t i = 12; i-- > 0;) {
    CHECK(r.iteration(i) == 1000 + i);
    CHECK(r.read(i) == plans[i]);
    CHECK(r.read_iteration(1000 + i) == plans[i]);
  }
  CHECK(r.find(5) == -1);
  REQUIRE_THROWS_AS(r.read_iteration(5), packpipe::OutOfRange);
  REQUIRE_THROWS_WITH(r.read_iteration(5), Catch::Matchers::Contains("iterations 1000 .. 1011"));
  REQUIRE_THROWS_AS(r.read(12), packpipe::OutOfRange);
}

TEST_CASE("plan file: a single binary plan or a JSON plan opens as a file of one plan", "[interface]") {
  TempDir dir;
  const Plan p = syn::random_plan("gpipe", 2, 2, 4, 9);
  packpipe::test::write_file(dir.file("one.plan"), [&] {
    const auto b = encode_plan(p);
    return std::string(b.begin(), b.end());
  }());
  packpipe::test::write_file(dir.file("one.json"), plan_to_json(p));
  for (const char* name : {"one.plan", "one.json"}) {
    const PlanFileReader r(dir.file(name));
    REQUIRE(r.size() == 1);
    CHECK(r.read(0) == p);
    CHECK(r.read_iteration(p.iteration) == p);
  }
}

TEST_CASE("plan file: truncated files and bad indexes are clear errors", "[negative]") {
  TempDir dir;
  const std::string path = dir.file("t.plans");
  {
    PlanFileWriter w(path);
    for (int i = 0; i < 3; ++i) w.append(syn::random_plan("1f1b", 2, 1, 3, static_cast<std::uint64_t>(i)));
  }  // destroyed without close(): a run that failed mid-epoch leaves no file
  REQUIRE_FALSE(packpipe::file_exists(path));
  {
    PlanFileWriter w(path);
    for (int i = 0; i < 3; ++i) {
      Plan p = syn::random_plan("1f1b", 2, 1, 3, static_cast<std::uint64_t>(i));
      p.iteration = static_cast<std::uint64_t>(i);
      w.append(p);
    }
    w.close();
  }
  const std::string bytes = packpipe::test::read_file(path);
  REQUIRE(PlanFileReader(path).size() == 3);
  // Every truncation either fails to open or, if the footer survives by chance, fails to read.
  for (std::size_t n = 0; n < bytes.size(); n += 7) {
    const auto b = bytes_of(bytes.substr(0, n));
    REQUIRE_THROWS_AS(PlanFileReader::from_memory(b.data(), b.size(), "t.plans"), packpipe::Error);
  }
  const auto cut = bytes_of(bytes.substr(0, bytes.size() - 5));
  REQUIRE_THROWS_WITH(PlanFileReader::from_memory(cut.data(), cut.size(), "t.plans"),
                      Catch::Matchers::Contains("t.plans") && Catch::Matchers::Contains("footer"));
  auto bad = bytes_of(bytes);
  bad[bad.size() - 64 + 8] ^= 0x40;  // index offset
  REQUIRE_THROWS_WITH(PlanFileReader::from_memory(bad.data(), bad.size(), "t.plans"), Catch::Matchers::Contains("field 'index'"));
  REQUIRE_THROWS_WITH(PlanFileReader::from_memory(reinterpret_cast<const std::uint8_t*>("GARBAGE!"), 8, "g"),
                      Catch::Matchers::Contains("expected 'PPLF'"));
  REQUIRE_THROWS_AS(PlanFileReader(dir.file("missing.plans")), packpipe::Error);
}

namespace {

std::uint64_t get_le(const std::string& b, std::size_t at) {
  std::uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | static_cast<std::uint8_t>(b[at + static_cast<std::size_t>(k)]);
  return v;
}
void put_le(std::string& b, std::size_t at, std::uint64_t v) {
  for (int k = 0; k < 8; ++k) b[at + static_cast<std::size_t>(k)] = static_cast<char>((v >> (8 * k)) & 0xFF);
}
// Recomputes the index-and-footer checksum after an edit, as a deliberate forger would.
void reseal(std::string& b) {
  const std::size_t foot = b.size() - 64;
  const std::size_t index = static_cast<std::size_t>(get_le(b, foot + 8));
  put_le(b, foot + 48, XXH64(b.data() + index, foot - index + 48, 0));
}
std::string plan_file_of(const std::string& path, int iterations, int replicas) {
  PlanFileWriter w(path);
  for (int it = 0; it < iterations; ++it) {
    for (int r = 0; r < replicas; ++r) {
      Plan p = syn::random_plan("1f1b", 2, 1, 3, static_cast<std::uint64_t>(10 * it + r));
      p.iteration = static_cast<std::uint64_t>(it);
      p.replica = static_cast<std::uint32_t>(r);
      p.dp = static_cast<std::uint32_t>(replicas);
      w.append(p);
    }
  }
  w.close();
  return packpipe::test::read_file(path);
}
PlanFileReader open_bytes(const std::string& b) {
  return PlanFileReader::from_memory(reinterpret_cast<const std::uint8_t*>(b.data()), b.size(), "f.plans");
}
void read_all(const PlanFileReader& r) {
  for (std::size_t i = 0; i < r.size(); ++i) (void)r.read(i);
}

}  // namespace

TEST_CASE("plan file: the index and footer are checksummed, and each blob matches its entry", "[negative]") {
  TempDir dir;
  const std::string good = plan_file_of(dir.file("f.plans"), 4, 2);
  REQUIRE_NOTHROW(read_all(open_bytes(good)));
  const std::size_t foot = good.size() - 64;
  const std::size_t index = static_cast<std::size_t>(get_le(good, foot + 8));
  SECTION("any edit of the index without resealing") {
    for (std::size_t at = index; at < foot + 48; at += 3) {
      std::string b = good;
      b[at] = static_cast<char>(b[at] ^ 0x01);
      REQUIRE_THROWS_AS(open_bytes(b), packpipe::Error);
    }
  }
  SECTION("an entry redirected to another plan, resealed") {
    std::string b = good;
    // Entry 4 (iteration 2, replica 0) points at entry 6's blob (iteration 3) and vice versa.
    const std::uint64_t o4 = get_le(b, index + 24 * 4 + 8), s4 = get_le(b, index + 24 * 4 + 16);
    const std::uint64_t o6 = get_le(b, index + 24 * 6 + 8), s6 = get_le(b, index + 24 * 6 + 16);
    put_le(b, index + 24 * 4 + 8, o6);
    put_le(b, index + 24 * 4 + 16, s6);
    put_le(b, index + 24 * 6 + 8, o4);
    put_le(b, index + 24 * 6 + 16, s4);
    reseal(b);
    REQUIRE_THROWS_AS(read_all(open_bytes(b)), packpipe::Error);
  }
  SECTION("an entry's iteration relabelled, resealed") {
    std::string b = good;
    put_le(b, index + 24 * 4, 3);  // iteration 2 shown as 3
    reseal(b);
    REQUIRE_THROWS_AS(read_all(open_bytes(b)), packpipe::Error);
  }
  SECTION("an entry removed, resealed") {
    for (std::size_t gone = 0; gone < 8; ++gone) {
      std::string b = good.substr(0, index + 24 * gone) + good.substr(index + 24 * (gone + 1));
      const std::size_t f = b.size() - 64;
      put_le(b, f, 7);  // the count, made to agree
      reseal(b);
      REQUIRE_THROWS_AS(read_all(open_bytes(b)), packpipe::Error);
    }
  }
  SECTION("the completeness flag") {
    PlanFileReader r = open_bytes(good);
    CHECK(r.complete());
    CHECK(r.first_iteration() == 0);
    CHECK(r.iterations() == 4);
  }
}

TEST_CASE("plan file: an epoch that stops early is marked incomplete; writers are exclusive", "[negative]") {
  TempDir dir;
  const std::string path = dir.file("e.plans");
  {
    PlanFileWriter w(path);
    w.expect_iterations(0, 5);
    for (int it = 0; it < 3; ++it) {
      Plan p = syn::random_plan("gpipe", 2, 1, 3, static_cast<std::uint64_t>(it));
      p.iteration = static_cast<std::uint64_t>(it);
      w.append(p);
    }
    // A second writer of the same file is refused while this one writes.
    REQUIRE_THROWS_WITH(PlanFileWriter(path), Catch::Matchers::Contains("another process is writing"));
    Plan late = syn::random_plan("gpipe", 2, 1, 3, 9);
    late.iteration = 9;
    REQUIRE_THROWS_AS(w.append(late), packpipe::InvalidArgument);  // outside the declared iterations
    w.close();
  }
  const PlanFileReader r(path);
  CHECK_FALSE(r.complete());
  CHECK(r.iterations() == 3);
  CHECK(r.expected_iterations() == 5);
  // The flag is covered by the checksum: setting it by hand is refused.
  std::string b = packpipe::test::read_file(path);
  b[b.size() - 64 + 40] = 1;
  REQUIRE_THROWS_WITH(open_bytes(b), Catch::Matchers::Contains("checksum"));
  reseal(b);
  REQUIRE_THROWS_WITH(open_bytes(b), Catch::Matchers::Contains("marked complete with 3 of 5"));
}

TEST_CASE("plan file: a file truncated while open is an Error when read, not SIGBUS", "[negative]") {
  TempDir dir;
  const std::string path = dir.file("t.plans");
  plan_file_of(path, 40, 1);
  const PlanFileReader r(path);
  REQUIRE(::truncate(path.c_str(), 100) == 0);
  REQUIRE_THROWS_WITH(r.read(r.size() - 1), Catch::Matchers::Contains("t.plans") && Catch::Matchers::Contains("SIGBUS"));
}

TEST_CASE("plan file writer: refuses at once what no reader opens", "[negative][regression]") {
  TempDir dir;
  const std::string path = dir.file("w.plans");
  auto plan = [](std::uint64_t iteration, std::uint32_t replica, std::uint32_t dp) {
    Plan p = syn::random_plan("1f1b", 2, 1, 3, iteration);
    p.iteration = iteration;
    p.replica = replica;
    p.dp = dp;
    return p;
  };
  using Catch::Matchers::Contains;
  {
    PlanFileWriter w(path);
    w.append(plan(0, 0, 1));
    REQUIRE_THROWS_WITH(w.append(plan(2, 0, 1)), Contains("iteration 2 appended after iteration 0") &&
                                                      Contains("expected iteration 0 or 1"));
    REQUIRE_THROWS_WITH(w.append(plan(0, 0, 1)), Contains("iteration 0 replica 0 after its replica 0"));
    REQUIRE_THROWS_AS(w.append(plan(1, 1, 2)), packpipe::InvalidArgument);  // a new iteration starts at replica 0
    CHECK(w.plans_written() == 1);  // nothing refused was written
    w.append(plan(1, 0, 1));
    w.close();
    CHECK(PlanFileReader(path).size() == 2);
  }
  {
    PlanFileWriter w(path);
    w.append(plan(0, 0, 2));
    w.append(plan(0, 1, 2));
    w.append(plan(1, 0, 2));
    REQUIRE_THROWS_WITH(w.append(plan(2, 0, 2)), Contains("iteration 1 holds 1 replicas, iteration 0 held 2"));
    REQUIRE_THROWS_WITH(w.close(), Contains("the last iteration 1 holds 1 replicas, iteration 0 held 2"));
    w.append(plan(1, 1, 2));
    REQUIRE_THROWS_WITH(w.append(plan(1, 2, 3)), Contains("iteration 0 had only 2 replicas"));
    REQUIRE_THROWS_WITH(w.append(plan(2, 3, 2)), Contains("replica 3 of a plan of 2 replicas"));
    w.close();
    const PlanFileReader r(path);
    CHECK(r.size() == 4);
    CHECK(r.read_iteration(1, 1).replica == 1);
  }
  {
    PlanFileWriter w(path);
    w.expect_iterations(3, 2);
    REQUIRE_THROWS_WITH(w.append(plan(4, 0, 1)), Contains("the declared first iteration is 3"));
    w.append(plan(3, 0, 1));
    w.append(plan(4, 0, 1));
    w.close();
    CHECK(PlanFileReader(path).complete());
  }
  // A reader of this process holds the path (the plans being read are an input): a writer is
  // refused at once, by the file's identity (another spelling of the path too), and nothing changes.
  {
    const PlanFileReader before(path);
    const Plan first = before.read(0);
    REQUIRE_THROWS_WITH(PlanFileWriter(path), Contains("is open for reading by a PlanFileReader") && Contains(path));
    REQUIRE_THROWS_WITH(PlanFileWriter(dir.file("./w.plans")), Contains("is open for reading"));
    CHECK(before.read(0) == first);
    CHECK(PlanFileReader(path).size() == 2);
  }
  // Once the reader is gone the path is an output like any other.
  {
    PlanFileWriter w(path);
    w.append(plan(7, 0, 1));
    w.close();
  }
  CHECK(PlanFileReader(path).read(0).iteration == 7);
}

namespace {

// A plan whose sample refs index a dataset of fingerprint `fingerprint` with `tasks`.
Plan plan_of_dataset(std::uint64_t iteration, std::uint64_t fingerprint,
                     const std::shared_ptr<const std::vector<DatasetTask>>& tasks) {
  Plan p = syn::random_plan("1f1b", 2, 1, 3, iteration);
  p.iteration = iteration;
  for (auto& mb : p.microbatches) {
    for (auto s : mb.samples) mb.refs.push_back(SampleRef{s % 2, s});
  }
  p.dataset.fingerprint = fingerprint;
  p.dataset.tasks = tasks;
  return p;
}

}  // namespace

TEST_CASE("plan format 5: the dataset's fingerprint round-trips; format 4 reads as unknown", "[interface][regression]") {
  using Catch::Matchers::Contains;
  const auto tasks = std::make_shared<const std::vector<DatasetTask>>(std::vector<DatasetTask>{{"qa", 100}});
  const Plan p = plan_of_dataset(4, 0x0123456789abcdefull, tasks);
  for (const bool compress : {false, true}) {
    EncodeOptions o;
    o.compress = compress;
    const auto b = encode_plan(p, o);
    const Plan q = decode_plan(b.data(), b.size());
    CHECK(q == p);
    CHECK(q.dataset.fingerprint == p.dataset.fingerprint);
    CHECK(q.dataset.tasks == nullptr);  // a plan stores the fingerprint; a plan file the tasks, once
    CHECK(encode_plan(q, o) == b);
  }
  Plan other = p;
  other.dataset.fingerprint ^= 1;
  CHECK(other != p);  // plans of two datasets differ

  const std::string j = plan_to_json(p, -1);
  CHECK(j.find("\"dataset\":\"0123456789abcdef\"") != std::string::npos);
  CHECK(plan_from_json(j) == p);
  CHECK(plan_to_json(plan_from_json(j), -1) == j);
  Plan unknown = p;
  unknown.dataset = {};
  CHECK(plan_to_json(unknown).find("\"dataset\"") == std::string::npos);  // unknown: no field
  for (const char* bad : {"\"0123456789ABCDEF\"", "\"0000000000000000\"", "\"123456789abcdef\"", "\"0x23456789abcdef\"",
                          "17"}) {
    CAPTURE(bad);
    REQUIRE_THROWS_WITH(plan_from_json(replaced(j, "\"0123456789abcdef\"", bad), "d.json"),
                        Contains("d.json") && Contains("field '/dataset'"));
  }
  REQUIRE_THROWS_WITH(plan_from_json(replaced(j, "\"version\":5", "\"version\":4"), "v4.json"),
                      Contains("field '/dataset'") && Contains("format 5 does"));

  // A format-4 blob reads as the same plan with the dataset unknown; its JSON as well.
  const auto v4 = packpipe::test::plan_blob_v4(p);
  const Plan r = decode_plan(v4.data(), v4.size(), "v4.plan");
  CHECK_FALSE(r.dataset.known());
  CHECK(r == unknown);
  CHECK(plan_from_json(replaced(plan_to_json(unknown, -1), "\"version\":5", "\"version\":4")) == unknown);
  // Eight bytes behind a format-4 body are not a fingerprint there: the body must end.
  std::vector<std::uint8_t> longer = encode_plan(p);
  reheader(longer, 4);
  REQUIRE_THROWS_WITH(decode_plan(longer.data(), longer.size(), "x.plan"),
                      Contains("x.plan") && Contains("expected the end of the body, found 8 more bytes"));
}

TEST_CASE("plan file format 3: the file records its plans' dataset once; plans of another are refused",
          "[interface][negative][regression]") {
  using Catch::Matchers::Contains;
  TempDir dir;
  const auto tasks =
      std::make_shared<const std::vector<DatasetTask>>(std::vector<DatasetTask>{{"qa", 48}, {"text", 30}});
  const std::string path = dir.file("d.plans");
  {
    PlanFileWriter w(path);
    w.expect_iterations(0, 3);
    w.append(plan_of_dataset(0, 0xfeed, tasks));
    const Plan foreign = plan_of_dataset(1, 0xbeef, tasks);
    REQUIRE_THROWS_AS(w.append(foreign), packpipe::InvalidArgument);
    REQUIRE_THROWS_WITH(w.append(foreign), Contains("d.plans") && Contains("iteration 1 replica 0") &&
                                               Contains("indexes dataset 000000000000beef, the file's plans dataset "
                                                        "000000000000feed"));
    CHECK(w.plans_written() == 1);  // nothing refused was written
    REQUIRE_THROWS_WITH(w.set_dataset(foreign.dataset), Contains("set_dataset") && Contains("000000000000beef"));
    Plan renamed = plan_of_dataset(1, 0xfeed, std::make_shared<const std::vector<DatasetTask>>(
                                                  std::vector<DatasetTask>{{"qa", 48}, {"prose", 30}}));
    REQUIRE_THROWS_WITH(w.append(renamed), Contains("other tasks"));
    Plan anonymous = plan_of_dataset(1, 0, nullptr);  // refs given without their dataset: it joins
    w.append(anonymous);
    w.append(plan_of_dataset(2, 0xfeed, nullptr));
    CHECK(w.dataset().fingerprint == 0xfeed);
    w.close();
  }
  const PlanFileReader r(path);
  REQUIRE(r.dataset().fingerprint == 0xfeed);
  CHECK(r.dataset().task_list() == *tasks);
  CHECK(r.read(0).dataset.task_list() == *tasks);  // a plan read gets the file's tasks
  CHECK_FALSE(r.read(1).dataset.known());          // a plan that names none stays so
  CHECK(r.read(2).dataset.task_list() == *tasks);

  // Canonical: the plans read, written again, make the same bytes.
  {
    PlanFileWriter w(dir.file("again.plans"));
    w.expect_iterations(0, 3);
    for (std::size_t i = 0; i < r.size(); ++i) w.append(r.read(i));
    w.close();
  }
  const std::string bytes = packpipe::test::read_file(path);
  CHECK(packpipe::test::read_file(dir.file("again.plans")) == bytes);

  // The record is covered by the checksum; a forger who reseals it is caught at the plan.
  const std::size_t foot = bytes.size() - 64;
  const std::size_t record = static_cast<std::size_t>(get_le(bytes, foot + 8)) + 24 * 3;
  REQUIRE(get_le(bytes, record) == 0xfeed);
  std::string b = bytes;
  put_le(b, record, 0xbeef);
  REQUIRE_THROWS_WITH(open_bytes(b), Contains("checksum"));
  reseal(b);
  const PlanFileReader forged = open_bytes(b);
  REQUIRE_THROWS_WITH(forged.read(0), Contains("f.plans") && Contains("the plan indexes dataset 000000000000feed, "
                                                                      "the file records dataset 000000000000beef"));
  // The flag and the record go together.
  b = bytes;
  b[foot + 40] = static_cast<char>(b[foot + 40] & ~2);
  reseal(b);
  REQUIRE_THROWS_WITH(open_bytes(b), Contains("field 'index'"));
  b = bytes;
  b[foot + 40] = static_cast<char>(b[foot + 40] | 4);
  reseal(b);
  REQUIRE_THROWS_WITH(open_bytes(b), Contains("field 'flags'") && Contains("unknown bits 0x4"));
  // The header's flags (u16 at offset 6, none defined) and the footer's version, each named with what it found
  // (the flags were never read: a bit flip there was the only one of the file's bytes a validate accepted).
  for (const int at : {6, 7}) {
    b = bytes;
    b[static_cast<std::size_t>(at)] = static_cast<char>(b[static_cast<std::size_t>(at)] ^ 0x10);
    REQUIRE_THROWS_WITH(open_bytes(b), Contains("offset 6: field 'flags': expected 0") && Contains("found 0x10"));
  }
  b = bytes;
  b[b.size() - 1] = static_cast<char>(b[b.size() - 1] ^ 1);
  REQUIRE_THROWS_WITH(open_bytes(b), Contains("field 'footer version': expected 3 (the header's), found 16777219"));
  b = bytes;
  b[record + 8] = 120;  // task count: more than the record holds
  reseal(b);
  REQUIRE_THROWS_WITH(open_bytes(b), Contains("field 'dataset.tasks'"));
  put_le(b, record, 0);
  b[record + 8] = 2;
  reseal(b);
  REQUIRE_THROWS_WITH(open_bytes(b), Contains("field 'dataset.fingerprint'") && Contains("found 0"));
}

TEST_CASE("plan file format 2 (no dataset record, format-4 plans) is still read", "[interface][regression]") {
  const auto tasks = std::make_shared<const std::vector<DatasetTask>>(std::vector<DatasetTask>{{"qa", 48}});
  std::vector<Plan> plans;
  for (std::uint64_t it = 0; it < 3; ++it) plans.push_back(plan_of_dataset(it, 0xfeed, tasks));
  const std::string old = packpipe::test::plan_file_v2(plans);
  const PlanFileReader r = open_bytes(old);
  CHECK_FALSE(r.dataset().known());
  CHECK(r.complete());
  REQUIRE(r.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    Plan want = plans[i];
    want.dataset = {};
    CHECK(r.read(i) == want);
  }
  // Format 2 has no dataset flag.
  std::string b = old;
  b[b.size() - 64 + 40] = 3;
  reseal(b);
  REQUIRE_THROWS_WITH(open_bytes(b), Catch::Matchers::Contains("unknown bits 0x2"));
}
