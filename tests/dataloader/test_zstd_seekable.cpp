#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <xxhash.h>
#include <zstd.h>

#include "common/errors.h"
#include "dataloader/zstd_seekable.h"
#include "tests/support/temp_dir.h"

// Checks the exception type and its message (the expression runs twice).
#define REQUIRE_THROWS_TYPE_WITH(expr, type, matcher) \
  do {                                                \
    REQUIRE_THROWS_AS(expr, type);                    \
    REQUIRE_THROWS_WITH(expr, matcher);               \
  } while (0)

namespace {

using packpipe::dataloader::open_zstd_bin;
using packpipe::dataloader::ZstdSeekableOptions;
using packpipe::test::read_file;
using packpipe::test::TempDir;
using packpipe::test::write_file;
using Catch::Matchers::Contains;

// Token-like bytes: uint16 ids from a small vocabulary, so frames compress but not trivially.
std::string token_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> id(0, 999);
  std::string s(n, '\0');
  for (std::size_t i = 0; i + 1 < n; i += 2) {
    const int t = id(rng);
    s[i] = static_cast<char>(t & 0xFF);
    s[i + 1] = static_cast<char>(t >> 8);
  }
  if (n % 2 == 1) s[n - 1] = static_cast<char>(rng() & 0xFF);
  return s;
}

std::uint32_t le32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  std::memcpy(&v, s.data() + at, 4);  // test hosts are little endian, as the format
  return v;
}

void put_le32(std::string& s, std::size_t at, std::uint32_t v) { std::memcpy(&s[at], &v, 4); }

// Writes `data` to dir/name.bin, compresses it to dir/name.bin.zst and returns the .zst path.
std::string make_zst(const TempDir& dir, const std::string& name, const std::string& data,
                     const ZstdSeekableOptions& opt = {}) {
  const std::string in = dir.file(name + ".bin");
  const std::string out = dir.file(name + ".bin.zst");
  write_file(in, data);
  const std::uint64_t written = packpipe::dataloader::zstd_seekable_compress(in, out, opt);
  REQUIRE(written == std::filesystem::file_size(out));
  return out;
}

// Builds a seekable file by hand from arbitrary frames (irregular sizes, empty frames, frames
// without a content size in the header): the writer never produces these, other tools may.
std::string hand_made(const std::vector<std::string>& frames, bool checksum, bool content_size) {
  std::string file;
  std::string table;
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, content_size ? 1 : 0);
  for (const std::string& f : frames) {
    std::string c(ZSTD_compressBound(f.size()), '\0');
    const std::size_t n = ZSTD_compress2(cctx, &c[0], c.size(), f.data(), f.size());
    REQUIRE_FALSE(ZSTD_isError(n));
    file.append(c.data(), n);
    std::string e(checksum ? 12 : 8, '\0');
    put_le32(e, 0, static_cast<std::uint32_t>(n));
    put_le32(e, 4, static_cast<std::uint32_t>(f.size()));
    if (checksum) put_le32(e, 8, static_cast<std::uint32_t>(XXH64(f.data(), f.size(), 0)));
    table += e;
  }
  ZSTD_freeCCtx(cctx);
  std::string head(8, '\0');
  put_le32(head, 0, 0x184D2A5E);
  put_le32(head, 4, static_cast<std::uint32_t>(table.size() + 9));
  std::string foot(9, '\0');
  put_le32(foot, 0, static_cast<std::uint32_t>(frames.size()));
  foot[4] = checksum ? static_cast<char>(0x80) : '\0';
  put_le32(foot, 5, 0x8F92EAB1);
  return file + head + table + foot;
}

std::string read_all(const packpipe::dataloader::BinReader& r) {
  std::string s(r.size(), '\0');
  r.read(0, r.size(), &s[0]);
  return s;
}

std::string read_range(const packpipe::dataloader::BinReader& r, std::uint64_t off, std::uint64_t n) {
  std::string s(n, '\0');
  r.read(off, n, &s[0]);
  return s;
}

// Layout facts of a file produced by the writer with checksums.
struct Layout {
  std::size_t frames;
  std::size_t table_start;
  std::size_t entry(std::size_t f) const { return table_start + 8 + f * 12; }
  std::size_t frame_start(const std::string& file, std::size_t f) const {
    std::size_t at = 0;
    for (std::size_t i = 0; i < f; ++i) at += le32(file, entry(i));
    return at;
  }
};

Layout layout_of(const std::string& file) {
  const std::size_t frames = le32(file, file.size() - 9);
  return {frames, file.size() - (8 + frames * 12 + 9)};
}

}  // namespace

TEST_CASE("zstd seekable round trip of several sizes", "[zstd][interface][boundary]") {
  TempDir dir;
  const std::uint32_t fs = GENERATE(64u, 1024u);
  const bool checksum = GENERATE(true, false);
  ZstdSeekableOptions opt;
  opt.frame_size = fs;
  opt.checksum = checksum;
  const std::size_t sizes[] = {0, 1, fs, fs + 1u, 7u * fs + 13u};
  for (std::size_t size : sizes) {
    CAPTURE(fs, checksum, size);
    const std::string data = token_bytes(size, size * 31 + fs);
    const std::string zst = make_zst(dir, "d" + std::to_string(size), data, opt);

    const std::string back = dir.file("back.bin");
    CHECK(packpipe::dataloader::zstd_seekable_decompress(zst, back) == size);
    CHECK(read_file(back) == data);

    auto reader = open_zstd_bin(zst);
    CHECK(reader->size() == size);
    CHECK(reader->data() == nullptr);
    CHECK(reader->path() == zst);
    CHECK(read_all(*reader) == data);
    reader->verify();

    const auto info = packpipe::dataloader::zstd_seekable_info(zst);
    CHECK(info.decompressed_bytes == size);
    CHECK(info.compressed_bytes == std::filesystem::file_size(zst));
    CHECK(info.frames == (size + fs - 1) / fs);
    CHECK(info.frame_size == (size == 0 ? 0u : (size <= fs ? size : fs)));
    CHECK(info.checksums == checksum);
  }
}

TEST_CASE("zstd seekable default options: 256 KiB frames, checksums", "[zstd][interface]") {
  TempDir dir;
  const std::string data = token_bytes(3 * 256 * 1024 + 4098, 7);
  const std::string zst = make_zst(dir, "big", data);
  const auto info = packpipe::dataloader::zstd_seekable_info(zst);
  CHECK(info.frames == 4);
  CHECK(info.frame_size == 256u * 1024u);
  CHECK(info.checksums);
  CHECK(info.compressed_bytes < data.size());
  auto reader = open_zstd_bin(zst);
  CHECK(read_all(*reader) == data);
}

TEST_CASE("zstd seekable random reads match the original", "[zstd][interface]") {
  TempDir dir;
  ZstdSeekableOptions opt;
  opt.frame_size = 4096;
  const std::string data = token_bytes(20 * 4096 + 777, 11);
  const std::string zst = make_zst(dir, "r", data, opt);
  const std::size_t cache_frames = GENERATE(0u, 1u, 4u);
  CAPTURE(cache_frames);
  auto reader = open_zstd_bin(zst, cache_frames);
  std::mt19937_64 rng(99);
  for (int i = 0; i < 1500; ++i) {
    std::uint64_t n = 0;
    switch (i % 4) {
      case 0: n = rng() % 64; break;                // small, often inside one frame
      case 1: n = 4098; break;                      // 2049 uint16 tokens: spans a boundary
      case 2: n = rng() % (3 * 4096); break;        // up to several frames
      default: n = rng() % (data.size() + 1); break;  // anything
    }
    const std::uint64_t off = rng() % (data.size() - n + 1);
    CAPTURE(off, n);
    REQUIRE(read_range(*reader, off, n) == data.substr(off, n));
  }
}

TEST_CASE("zstd seekable reads at frame boundaries", "[zstd][boundary]") {
  TempDir dir;
  ZstdSeekableOptions opt;
  opt.frame_size = 1000;
  const std::string data = token_bytes(5500, 3);
  const std::string zst = make_zst(dir, "b", data, opt);
  auto reader = open_zstd_bin(zst, 2);
  SECTION("partial then whole frame, whole frame then partial") {
    CHECK(read_range(*reader, 1500, 10) == data.substr(1500, 10));      // caches frame 1
    CHECK(read_range(*reader, 1000, 1000) == data.substr(1000, 1000));  // whole frame 1, cached
    CHECK(read_range(*reader, 3000, 1000) == data.substr(3000, 1000));  // whole frame 3, direct
    CHECK(read_range(*reader, 3999, 2) == data.substr(3999, 2));        // last of 3, first of 4
  }
  SECTION("whole multi-frame ranges") {
    CHECK(read_range(*reader, 1000, 3000) == data.substr(1000, 3000));
    CHECK(read_range(*reader, 999, 3002) == data.substr(999, 3002));
    CHECK(read_range(*reader, 0, 5500) == data);
  }
  SECTION("ends of the file") {
    CHECK(read_range(*reader, 5499, 1) == data.substr(5499, 1));
    CHECK(read_range(*reader, 5000, 500) == data.substr(5000, 500));  // short last frame, whole
    CHECK(read_range(*reader, 5500, 0).empty());
    CHECK(read_range(*reader, 0, 1) == data.substr(0, 1));
  }
  SECTION("more frames than the cache holds, revisited") {
    for (int round = 0; round < 3; ++round) {
      for (std::uint64_t f = 0; f < 6; ++f) {
        const std::uint64_t off = f * 1000 + 17;
        CHECK(read_range(*reader, off, 5) == data.substr(off, 5));
      }
    }
  }
}

TEST_CASE("zstd seekable irregular frames use the searched table", "[zstd][boundary]") {
  TempDir dir;
  const std::string all = token_bytes(2000, 5);
  const bool content_size = GENERATE(true, false);
  // Sizes 300, 0, 700, 1000: irregular, with an empty frame in the middle.
  const std::vector<std::string> frames = {all.substr(0, 300), std::string(), all.substr(300, 700),
                                           all.substr(1000, 1000)};
  const std::string path = dir.file("irr.bin.zst");
  write_file(path, hand_made(frames, true, content_size));
  const auto info = packpipe::dataloader::zstd_seekable_info(path);
  CHECK(info.frames == 4);
  CHECK(info.frame_size == 0);
  CHECK(info.decompressed_bytes == 2000);
  auto reader = open_zstd_bin(path);
  reader->verify();
  CHECK(read_all(*reader) == all);
  for (std::uint64_t off : {0u, 299u, 300u, 301u, 999u, 1000u, 1999u}) {
    for (std::uint64_t n : {1u, 2u, 700u}) {
      if (off + n > all.size()) continue;
      CAPTURE(off, n);
      CHECK(read_range(*reader, off, n) == all.substr(off, n));
    }
  }
  CHECK(packpipe::dataloader::zstd_seekable_decompress(path, dir.file("irr.bin")) == 2000);
  CHECK(read_file(dir.file("irr.bin")) == all);
}

TEST_CASE("zstd seekable concurrent reads from several threads", "[zstd][stress]") {
  TempDir dir;
  ZstdSeekableOptions opt;
  opt.frame_size = 2048;
  const std::string data = token_bytes(64 * 2048 + 100, 21);
  const std::string zst = make_zst(dir, "c", data, opt);
  auto reader = open_zstd_bin(zst, 3);
  constexpr int kThreads = 6;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      std::string buf;
      for (int i = 0; i < 400; ++i) {
        const std::uint64_t n = (i % 3 == 0) ? 4098 : rng() % 600;
        const std::uint64_t off = rng() % (data.size() - n + 1);
        buf.assign(n, '\0');
        reader->read(off, n, &buf[0]);
        if (buf != data.substr(off, n)) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) CHECK(mismatches[t] == 0);
}

TEST_CASE("zstd CLI decompresses seekable files to the original bytes", "[zstd][interface]") {
  TempDir dir;
  ZstdSeekableOptions opt;
  opt.frame_size = GENERATE(64u, 256u * 1024u);
  const std::size_t size = GENERATE(0u, 1u, 300000u);
  CAPTURE(opt.frame_size, size);
  const std::string data = token_bytes(size, size + 1);
  const std::string zst = make_zst(dir, "cli", data, opt);
  const std::string out = dir.file("cli.out");
  const std::string cmd = "zstd -q -d -f '" + zst + "' -o '" + out + "' 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  CHECK(read_file(out) == data);
}

TEST_CASE("zstd seekable corrupt frames name file, frame, range, expected and found",
          "[zstd][negative]") {
  TempDir dir;
  ZstdSeekableOptions opt;
  opt.frame_size = 1024;
  const std::string data = token_bytes(6 * 1024, 8);
  const std::string good = read_file(make_zst(dir, "g", data, opt));
  const Layout lay = layout_of(good);
  REQUIRE(lay.frames == 6);
  const std::string path = dir.file("bad.bin.zst");
  const std::size_t f3 = lay.frame_start(good, 3);
  const std::size_t f4 = lay.frame_start(good, 4);
  const std::string range3 = "frame 3 (compressed bytes " + std::to_string(f3) + ".." +
                             std::to_string(f4) + ")";

  SECTION("checksum mismatch") {
    std::string bad = good;
    const std::uint32_t real = le32(good, lay.entry(3) + 8);
    put_le32(bad, lay.entry(3) + 8, real ^ 0x00010000u);
    write_file(path, bad);
    auto reader = open_zstd_bin(path);
    CHECK(read_range(*reader, 0, 3 * 1024) == data.substr(0, 3 * 1024));  // frames 0..2 fine
    const std::string msg = path + ": " + range3 + ": checksum mismatch: " +
                            fmt::format("expected 0x{:08x}, found 0x{:08x}", real ^ 0x00010000u, real);
    REQUIRE_THROWS_TYPE_WITH(read_range(*reader, 3 * 1024 + 5, 10), packpipe::Error, Contains(msg));
    REQUIRE_THROWS_TYPE_WITH(read_range(*reader, 3 * 1024, 1024), packpipe::Error, Contains(msg));
    REQUIRE_THROWS_TYPE_WITH(reader->verify(), packpipe::Error,
                           Contains("1 of 6 frames failed") && Contains(msg));
    REQUIRE_THROWS_TYPE_WITH(packpipe::dataloader::zstd_seekable_decompress(path, dir.file("o.bin")),
                           packpipe::Error, Contains(msg));
    CHECK_FALSE(std::filesystem::exists(dir.file("o.bin")));
  }
  SECTION("flipped byte inside the frame data") {
    std::string bad = good;
    bad[(f3 + f4) / 2] = static_cast<char>(bad[(f3 + f4) / 2] ^ 0x5A);
    write_file(path, bad);
    auto reader = open_zstd_bin(path);
    // Either zstd detects it or the checksum does; both name the frame.
    REQUIRE_THROWS_TYPE_WITH(read_range(*reader, 3 * 1024, 100), packpipe::Error,
                           Contains(path) && Contains(range3));
  }
  SECTION("zstd error: frame shortened in the table") {
    std::string bad = good;
    const std::uint32_t c2 = le32(good, lay.entry(2));
    const std::uint32_t c3 = le32(good, lay.entry(3));
    put_le32(bad, lay.entry(2), c2 - 7);  // sums still add up
    put_le32(bad, lay.entry(3), c3 + 7);
    write_file(path, bad);
    auto reader = open_zstd_bin(path);
    REQUIRE_THROWS_TYPE_WITH(read_range(*reader, 2 * 1024, 10), packpipe::Error,
                           Contains(path) && Contains("frame 2 (compressed bytes") &&
                               Contains("zstd error") && Contains("expected 1024"));
    REQUIRE_THROWS_TYPE_WITH(read_range(*reader, 3 * 1024, 10), packpipe::Error,
                           Contains(path) && Contains("frame 3 (compressed bytes") &&
                               Contains("not a valid zstd frame header"));
  }
  SECTION("frame header content size disagrees with the table") {
    std::string bad = good;
    put_le32(bad, lay.entry(1) + 4, 1023);
    put_le32(bad, lay.entry(2) + 4, 1025);
    write_file(path, bad);
    auto reader = open_zstd_bin(path);
    REQUIRE_THROWS_TYPE_WITH(read_range(*reader, 1024, 10), packpipe::Error,
                           Contains(path) && Contains("frame 1 (compressed bytes") &&
                               Contains("content size disagrees") && Contains("expected 1023") &&
                               Contains("found 1024"));
  }
}

TEST_CASE("zstd seekable malformed seek tables are rejected at open", "[zstd][negative]") {
  TempDir dir;
  ZstdSeekableOptions opt;
  opt.frame_size = 512;
  const std::string good = read_file(make_zst(dir, "g", token_bytes(5 * 512 + 3, 4), opt));
  const Layout lay = layout_of(good);
  REQUIRE(lay.frames == 6);
  const std::string path = dir.file("bad.bin.zst");
  auto expect_open_error = [&](const std::string& bytes, const std::string& what) {
    write_file(path, bytes);
    REQUIRE_THROWS_TYPE_WITH(open_zstd_bin(path), packpipe::Error, Contains(path) && Contains(what));
    REQUIRE_THROWS_TYPE_WITH(packpipe::dataloader::zstd_seekable_info(path), packpipe::Error,
                           Contains(path) && Contains(what));
  };

  SECTION("bad seekable magic") {
    std::string bad = good;
    bad.back() = static_cast<char>(bad.back() ^ 1);
    expect_open_error(bad, "bad seekable magic at byte offset " + std::to_string(good.size() - 4) +
                               ": expected 0x8F92EAB1, found 0x8E92EAB1");
  }
  SECTION("truncated file") {
    expect_open_error(good.substr(0, good.size() - 3), "bad seekable magic");
    expect_open_error(good.substr(0, 10), "file is 10 bytes, too short");
    expect_open_error(std::string(), "file is 0 bytes, too short");
  }
  SECTION("frame bytes missing") {
    // The table survives but a frame lost bytes: the sizes no longer add up.
    std::string bad = good.substr(0, 100) + good.substr(120);
    expect_open_error(bad, "add up to " + std::to_string(lay.table_start) + " bytes");
  }
  SECTION("bad skippable magic") {
    std::string bad = good;
    bad[lay.table_start] = static_cast<char>(bad[lay.table_start] ^ 0x10);
    expect_open_error(bad, "bad skippable magic of the seek table at byte offset " +
                               std::to_string(lay.table_start) +
                               ": expected 0x184D2A5E, found 0x184D2A4E");
  }
  SECTION("reserved descriptor bits set") {
    std::string bad = good;
    bad[good.size() - 5] = static_cast<char>(0x80 | 0x04);
    expect_open_error(bad, "reserved bits set: expected 0x00 under mask 0x7C, found descriptor 0x84");
  }
  SECTION("frame count larger than the file") {
    std::string bad = good;
    put_le32(bad, good.size() - 9, 1000000);
    expect_open_error(bad, "seek table of 1000000 frames needs 12000017 bytes but the file has only");
  }
  SECTION("frame count disagrees with the table") {
    std::string bad = good;
    put_le32(bad, good.size() - 9, 5);
    expect_open_error(bad, "bad skippable magic");
  }
  SECTION("Frame_Size field wrong") {
    std::string bad = good;
    put_le32(bad, lay.table_start + 4, le32(good, lay.table_start + 4) + 1);
    expect_open_error(bad, "Frame_Size at byte offset " + std::to_string(lay.table_start + 4) +
                               ": expected " + std::to_string(6 * 12 + 9) + " for 6 frames, found " +
                               std::to_string(6 * 12 + 9 + 1));
  }
  SECTION("compressed sizes do not add up") {
    std::string bad = good;
    put_le32(bad, lay.entry(4), le32(good, lay.entry(4)) + 1);
    expect_open_error(bad, "add up to " + std::to_string(lay.table_start + 1) + " bytes, plus the " +
                               std::to_string(6 * 12 + 9 + 8) + "-byte seek table = " +
                               std::to_string(good.size() + 1) + ", but the file is " +
                               std::to_string(good.size()) + " bytes");
  }
  SECTION("zero compressed size") {
    std::string t(8 + 8 + 9, '\0');  // one frame entry {0, 0}, no frame bytes
    put_le32(t, 0, 0x184D2A5E);
    put_le32(t, 4, 8 + 9);
    put_le32(t, 16, 1);
    put_le32(t, 21, 0x8F92EAB1);
    expect_open_error(t, "seek table entry of frame 0 (byte offset 8): compressed size 0");
  }
}

TEST_CASE("zstd seekable reads past the end throw OutOfRange", "[zstd][negative][boundary]") {
  TempDir dir;
  ZstdSeekableOptions opt;
  opt.frame_size = 256;
  const std::string zst = make_zst(dir, "e", token_bytes(1000, 2), opt);
  auto reader = open_zstd_bin(zst);
  char buf[16];
  REQUIRE_THROWS_TYPE_WITH(reader->read(995, 6, buf), packpipe::OutOfRange,
                         Contains(zst) && Contains("read of 6 bytes at offset 995") &&
                             Contains("(1000 bytes)"));
  REQUIRE_THROWS_TYPE_WITH(reader->read(1001, 0, buf), packpipe::OutOfRange,
                         Contains("read of 0 bytes at offset 1001"));
  REQUIRE_THROWS_AS(reader->read(~0ull, 2, buf), packpipe::OutOfRange);
  REQUIRE_THROWS_AS(reader->read(2, ~0ull, buf), packpipe::OutOfRange);
  reader->read(1000, 0, buf);  // empty read at the end is fine
}

TEST_CASE("zstd seekable compress rejects bad arguments and leaves no file", "[zstd][negative]") {
  TempDir dir;
  write_file(dir.file("in.bin"), token_bytes(100, 1));
  ZstdSeekableOptions opt;
  SECTION("frame_size 0") {
    opt.frame_size = 0;
    REQUIRE_THROWS_TYPE_WITH(
        packpipe::dataloader::zstd_seekable_compress(dir.file("in.bin"), dir.file("o.zst"), opt),
        packpipe::InvalidArgument, Contains("frame_size must be in [1, 1073741824], found 0"));
  }
  SECTION("level out of range") {
    opt.level = 1000;
    REQUIRE_THROWS_TYPE_WITH(
        packpipe::dataloader::zstd_seekable_compress(dir.file("in.bin"), dir.file("o.zst"), opt),
        packpipe::InvalidArgument, Contains("found 1000"));
  }
  SECTION("missing input") {
    REQUIRE_THROWS_TYPE_WITH(
        packpipe::dataloader::zstd_seekable_compress(dir.file("nope.bin"), dir.file("o.zst")),
        packpipe::Error, Contains(dir.file("nope.bin")));
  }
  SECTION("missing zst") {
    REQUIRE_THROWS_TYPE_WITH(open_zstd_bin(dir.file("nope.bin.zst")), packpipe::Error,
                           Contains(dir.file("nope.bin.zst")));
  }
  std::size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  CHECK(entries == 1);  // only in.bin: no output, no temporary left behind
}
