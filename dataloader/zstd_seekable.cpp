#include "dataloader/zstd_seekable.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <xxhash.h>
#include <zstd.h>

#include "common/errors.h"
#include "common/file_io.h"
#include "common/mapped_file.h"
#include "common/zstd_check.h"
#include "dataloader/detail/zstd_seek_table.h"

namespace packpipe::dataloader {

namespace detail {

namespace {

std::uint32_t load_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

void store_u32(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
  p[2] = static_cast<std::uint8_t>(v >> 16);
  p[3] = static_cast<std::uint8_t>(v >> 24);
}

std::uint32_t checksum32(const void* data, std::size_t n) {
  return static_cast<std::uint32_t>(XXH64(data, n, 0) & 0xFFFFFFFFu);
}

struct DCtxHolder {
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  ~DCtxHolder() { ZSTD_freeDCtx(ctx); }
};

// One decompression context per thread, shared by every reader: a context per reader and thread
// would cost ~100 KiB each with hundreds of datasets open.
ZSTD_DCtx* thread_dctx() {
  thread_local DCtxHolder holder;
  PACKPIPE_CHECK(holder.ctx != nullptr, "ZSTD_createDCtx failed (out of memory)");
  return holder.ctx;
}

std::string frame_label(const std::string& name, const SeekTable& t, std::uint64_t f) {
  return fmt::format("{}: frame {} (compressed bytes {}..{})", name, f, t.c_off[f], t.c_off[f + 1]);
}

}  // namespace

std::uint64_t SeekTable::frame_of(std::uint64_t offset) const {
  if (frame_size != 0) return std::min<std::uint64_t>(offset / frame_size, frames() - 1);
  // Last frame starting at or before offset; skips empty frames sharing the same start.
  auto it = std::upper_bound(d_off.begin(), d_off.end(), offset);
  return static_cast<std::uint64_t>(it - d_off.begin()) - 1;
}

namespace {

// The seek table of a file of `size` bytes from `tail`, its last `tail_size` bytes: the whole file, or
// at least the seek table (error offsets are the file's).
SeekTable parse_tail(const std::uint8_t* tail, std::uint64_t tail_size, std::uint64_t size, const std::string& name) {
  const std::uint64_t base = size - tail_size;  // file offset of tail[0]
  auto at = [&](std::uint64_t off) { return tail + (off - base); };
  PACKPIPE_CHECK(size >= kSkippableHeaderBytes + kFooterBytes,
                 "{}: file is {} bytes, too short for a zstd seekable seek table (at least {} bytes)"
                 " (truncated file?)",
                 name, size, kSkippableHeaderBytes + kFooterBytes);
  const std::uint8_t* footer = at(size - kFooterBytes);
  const std::uint32_t magic = load_u32(footer + 5);
  PACKPIPE_CHECK(magic == kSeekableMagic,
                 "{}: bad seekable magic at byte offset {}: expected 0x{:08X}, found 0x{:08X} "
                 "(not a zstd seekable file, or truncated)",
                 name, size - 4, kSeekableMagic, magic);
  const std::uint8_t descriptor = footer[4];
  PACKPIPE_CHECK((descriptor & kReservedBits) == 0,
                 "{}: seek table descriptor at byte offset {} has reserved bits set: expected "
                 "0x00 under mask 0x{:02X}, found descriptor 0x{:02X}",
                 name, size - 5, kReservedBits, descriptor);
  SeekTable t;
  t.checksums = (descriptor & kChecksumFlag) != 0;
  const std::uint64_t frames = load_u32(footer);
  const std::uint64_t entry = t.checksums ? 12 : 8;
  const std::uint64_t payload = frames * entry + kFooterBytes;  // < 2^36: no overflow
  t.table_bytes = kSkippableHeaderBytes + payload;
  PACKPIPE_CHECK(t.table_bytes <= size,
                 "{}: seek table of {} frames needs {} bytes but the file has only {} (truncated "
                 "file or corrupt frame count)",
                 name, frames, t.table_bytes, size);
  PACKPIPE_CHECK(t.table_bytes <= tail_size, "{}: the seek table changed while it was read (is another process "
                 "writing the file?)", name);
  const std::uint64_t table_start = size - t.table_bytes;
  const std::uint32_t skip_magic = load_u32(at(table_start));
  PACKPIPE_CHECK(skip_magic == kSkippableMagic,
                 "{}: bad skippable magic of the seek table at byte offset {}: expected 0x{:08X}, "
                 "found 0x{:08X} (frame count {} in the footer may be corrupt)",
                 name, table_start, kSkippableMagic, skip_magic, frames);
  const std::uint32_t frame_size_field = load_u32(at(table_start + 4));
  PACKPIPE_CHECK(frame_size_field == payload,
                 "{}: seek table Frame_Size at byte offset {}: expected {} for {} frames, found {}",
                 name, table_start + 4, payload, frames, frame_size_field);
  t.entries_offset = table_start + kSkippableHeaderBytes;

  t.c_off.resize(frames + 1);
  t.d_off.resize(frames + 1);
  t.c_off[0] = 0;
  t.d_off[0] = 0;
  bool uniform = frames > 0;
  std::uint32_t first_d = 0;
  for (std::uint64_t f = 0; f < frames; ++f) {
    const std::uint8_t* e = at(t.entries_offset + f * entry);
    const std::uint32_t csize = load_u32(e);
    const std::uint32_t dsize = load_u32(e + 4);
    PACKPIPE_CHECK(csize > 0, "{}: seek table entry of frame {} (byte offset {}): compressed size 0",
                   name, f, t.entries_offset + f * entry);
    // Sums of u32 over < 2^32 frames cannot overflow u64.
    t.c_off[f + 1] = t.c_off[f] + csize;
    t.d_off[f + 1] = t.d_off[f] + dsize;
    if (t.checksums) t.sums.push_back(load_u32(e + 8));
    if (f == 0) {
      first_d = dsize;
      uniform = dsize > 0;
    } else if (f + 1 < frames) {
      uniform = uniform && dsize == first_d;
    } else {
      uniform = uniform && dsize > 0 && dsize <= first_d;
    }
  }
  PACKPIPE_CHECK(t.c_off[frames] == table_start,
                 "{}: compressed frame sizes in the seek table add up to {} bytes, plus the {}-byte "
                 "seek table = {}, but the file is {} bytes",
                 name, t.c_off[frames], t.table_bytes, t.c_off[frames] + t.table_bytes, size);
  t.frame_size = uniform ? first_d : 0;
  return t;
}

}  // namespace

SeekTable parse_seek_table(const std::uint8_t* data, std::uint64_t size, const std::string& name) {
  return parse_tail(data, size, size, name);
}

SeekTable parse_seek_table(const MappedFile& file) {
  // Footer first (it gives the table's size), then the table: two guarded copies, nothing else read.
  const std::uint64_t size = file.size();
  std::uint64_t want = std::min(size, kSkippableHeaderBytes + kFooterBytes);
  if (size >= kSkippableHeaderBytes + kFooterBytes) {
    std::uint8_t footer[kFooterBytes];
    file.read(size - kFooterBytes, kFooterBytes, footer);
    const std::uint64_t entry = (footer[4] & kChecksumFlag) != 0 ? 12 : 8;
    want = std::min(size, kSkippableHeaderBytes + load_u32(footer) * entry + kFooterBytes);
  }
  std::vector<std::uint8_t> tail(want);
  file.read(size - want, want, tail.data());
  return parse_tail(tail.data(), want, size, file.path());
}

void decompress_frame(const std::uint8_t* buffer, const SeekTable& t, std::uint64_t f,
                      std::uint8_t* dst, const std::string& name) {
  decompress_frame_bytes(buffer + t.c_off[f], t, f, dst, name);
}

void decompress_frame_bytes(const std::uint8_t* src, const SeekTable& t, std::uint64_t f, std::uint8_t* dst,
                            const std::string& name) {
  const std::size_t csize = t.c_off[f + 1] - t.c_off[f];
  const std::size_t dsize = t.d_off[f + 1] - t.d_off[f];
  const unsigned long long header_size = ZSTD_getFrameContentSize(src, csize);
  if (header_size == ZSTD_CONTENTSIZE_ERROR) {
    PACKPIPE_THROW(Error, "{}: not a valid zstd frame header (first bytes 0x{:08X})",
                   frame_label(name, t, f), csize >= 4 ? load_u32(src) : 0u);
  }
  if (header_size != ZSTD_CONTENTSIZE_UNKNOWN && header_size != dsize) {
    PACKPIPE_THROW(Error,
                   "{}: frame header content size disagrees with the seek table: expected {}, "
                   "found {}",
                   frame_label(name, t, f), dsize, header_size);
  }
  const std::size_t got =
      PACKPIPE_CHECK_ZSTD(ZSTD_decompressDCtx(thread_dctx(), dst, dsize, src, csize),
                          "{}: decompression failed (expected {} decompressed bytes)",
                          frame_label(name, t, f), dsize);
  if (got != dsize) {
    PACKPIPE_THROW(Error, "{}: decompressed size mismatch: expected {}, found {}",
                   frame_label(name, t, f), dsize, got);
  }
  if (t.checksums) {
    const std::uint32_t expected = t.checksum(f);
    const std::uint32_t found = checksum32(dst, dsize);
    if (expected != found) {
      PACKPIPE_THROW(Error, "{}: checksum mismatch: expected 0x{:08x}, found 0x{:08x}",
                     frame_label(name, t, f), expected, found);
    }
  }
}

}  // namespace detail

namespace {

using detail::SeekTable;

using AtomicOutput = AtomicFile;  // temporary beside the output, renamed on commit

class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    PACKPIPE_CHECK(fd_ >= 0, "cannot open '{}': {}", path, std::strerror(errno));
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// Fills up to n bytes (fewer only at end of file); returns the count.
  std::size_t read_full(void* out, std::size_t n) {
    auto* p = static_cast<char*>(out);
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(fd_, p + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      PACKPIPE_CHECK(r >= 0, "cannot read '{}' at byte offset {}: {}", path_, offset_ + got,
                     std::strerror(errno));
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    offset_ += got;
    return got;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t offset_ = 0;
};

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

constexpr std::uint64_t kNoFrame = std::numeric_limits<std::uint64_t>::max();

// Decompressed frames of one reader on one thread, least recently used evicted first.
struct FrameCache {
  struct Slot {
    std::uint64_t frame = kNoFrame;
    std::uint64_t last_use = 0;
    std::vector<std::uint8_t> bytes;
  };
  std::vector<Slot> slots;
  std::uint64_t tick = 0;

  Slot* find(std::uint64_t f) {
    for (Slot& s : slots) {
      if (s.frame == f) {
        s.last_use = ++tick;
        return &s;
      }
    }
    return nullptr;
  }
  Slot& victim(std::size_t capacity) {
    if (slots.size() < capacity) return slots.emplace_back();
    Slot* v = &slots[0];
    for (Slot& s : slots) {
      if (s.last_use < v->last_use) v = &s;
    }
    return *v;
  }
};

// Frame f of `file` into dst from a copy of its compressed bytes made through MappedFile::read: a
// .bin.zst truncated under a live reader is an Error naming the file, never a SIGBUS inside zstd.
void decompress_guarded(const MappedFile& file, const SeekTable& table, std::uint64_t f, std::uint8_t* dst) {
  thread_local std::vector<std::uint8_t> frame;
  frame.resize(table.c_off[f + 1] - table.c_off[f]);
  file.read(table.c_off[f], frame.size(), frame.data());
  file.check_unchanged();  // truncated into the frame's page: zeros, not SIGBUS (named as truncation)
  detail::decompress_frame_bytes(frame.data(), table, f, dst, file.path());
}

class ZstdBinReader final : public BinReader {
 public:
  ZstdBinReader(const std::string& path, std::size_t cache_frames)
      : file_(path),
        table_(detail::parse_seek_table(file_)),
        cache_frames_(cache_frames) {}

  std::uint64_t size() const override { return table_.decompressed_bytes(); }
  const std::uint8_t* data() const override { return nullptr; }
  const std::string& path() const override { return file_.path(); }

  void read(std::uint64_t offset, std::uint64_t n, void* out) const override {
    const std::uint64_t total = size();
    PACKPIPE_CHECK_RANGE(offset <= total && n <= total - offset,
                         "{}: read of {} bytes at offset {} is past the end ({} bytes)",
                         file_.path(), n, offset, total);
    if (n == 0) return;
    auto* dst = static_cast<std::uint8_t*>(out);
    FrameCache& cache = caches_.local();
    std::uint64_t f = table_.frame_of(offset);
    while (n > 0) {
      const std::uint64_t start = table_.d_off[f];
      const std::uint64_t fsize = table_.d_off[f + 1] - start;
      const std::uint64_t in_frame = offset - start;
      const std::uint64_t take = std::min(n, fsize - in_frame);
      if (take > 0) {
        if (const FrameCache::Slot* hit = cache.find(f)) {
          std::memcpy(dst, hit->bytes.data() + in_frame, take);
        } else if (take == fsize) {
          // The whole frame is wanted: decompress straight into the caller's buffer.
          decompress(f, dst);
        } else {
          FrameCache::Slot& slot = cache.victim(std::max<std::size_t>(cache_frames_, 1));
          slot.frame = kNoFrame;  // stays invalid if decompression throws
          slot.bytes.resize(fsize);
          decompress(f, slot.bytes.data());
          std::memcpy(dst, slot.bytes.data() + in_frame, take);
          if (cache_frames_ > 0) {
            slot.frame = f;
            slot.last_use = ++cache.tick;
          }
        }
        dst += take;
        offset += take;
        n -= take;
      }
      ++f;
    }
  }

  void verify() const override {
    // Frames in parallel; every failure is collected so none is lost to TBB's first-exception rule.
    std::mutex mu;
    std::vector<std::pair<std::uint64_t, std::string>> failures;
    tbb::parallel_for(tbb::blocked_range<std::uint64_t>(0, table_.frames(), 16),
                      [&](const tbb::blocked_range<std::uint64_t>& r) {
                        std::vector<std::uint8_t> buf;
                        for (std::uint64_t f = r.begin(); f != r.end(); ++f) {
                          try {
                            buf.resize(table_.d_off[f + 1] - table_.d_off[f]);
                            decompress(f, buf.data());
                          } catch (const Error& e) {
                            std::lock_guard<std::mutex> lock(mu);
                            failures.emplace_back(f, e.what());
                          }
                        }
                      });
    if (failures.empty()) return;
    std::sort(failures.begin(), failures.end());
    std::string msg = fmt::format("{}: {} of {} frames failed verification", file_.path(),
                                  failures.size(), table_.frames());
    constexpr std::size_t kShown = 8;
    for (std::size_t i = 0; i < failures.size() && i < kShown; ++i) {
      msg += "\n  " + failures[i].second;
    }
    if (failures.size() > kShown) msg += fmt::format("\n  ... and {} more", failures.size() - kShown);
    throw Error(msg);
  }

 private:
  void decompress(std::uint64_t f, std::uint8_t* dst) const { decompress_guarded(file_, table_, f, dst); }

  MappedFile file_;
  SeekTable table_;
  std::size_t cache_frames_;
  mutable tbb::enumerable_thread_specific<FrameCache> caches_;
};

}  // namespace

std::uint64_t zstd_seekable_compress(const std::string& in_path, const std::string& out_path,
                                     const ZstdSeekableOptions& options) {
  constexpr std::uint32_t kMaxFrameSize = 1u << 30;
  PACKPIPE_CHECK_ARG(options.frame_size > 0 && options.frame_size <= kMaxFrameSize,
                     "zstd seekable frame_size must be in [1, {}], found {}", kMaxFrameSize,
                     options.frame_size);
  PACKPIPE_CHECK_ARG(options.level >= ZSTD_minCLevel() && options.level <= ZSTD_maxCLevel(),
                     "zstd level must be in [{}, {}], found {}", ZSTD_minCLevel(), ZSTD_maxCLevel(),
                     options.level);
  std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx(ZSTD_createCCtx());
  PACKPIPE_CHECK(cctx != nullptr, "ZSTD_createCCtx failed (out of memory)");

  check_output_is_not_input(out_path, {in_path}, "compressed output");
  InputFile in(in_path);
  AtomicOutput out(out_path);
  std::vector<std::uint8_t> src(options.frame_size);
  std::vector<std::uint8_t> dst(ZSTD_compressBound(options.frame_size));
  const std::uint64_t entry = options.checksum ? 12 : 8;
  std::vector<std::uint8_t> entries;  // the seek table grows by 8 or 12 bytes per frame
  std::uint64_t frames = 0;
  for (;;) {
    const std::size_t got = in.read_full(src.data(), src.size());
    if (got == 0) break;
    PACKPIPE_CHECK(frames < std::numeric_limits<std::uint32_t>::max(),
                   "{}: more than {} frames of {} bytes; use a larger frame_size", in_path,
                   std::numeric_limits<std::uint32_t>::max() - 1, options.frame_size);
    const std::size_t csize = PACKPIPE_CHECK_ZSTD(
        ZSTD_compressCCtx(cctx.get(), dst.data(), dst.size(), src.data(), got, options.level),
        "{}: compression of frame {} failed", in_path, frames);
    out.write(dst.data(), csize);
    const std::size_t at = entries.size();
    entries.resize(at + entry);
    detail::store_u32(&entries[at], static_cast<std::uint32_t>(csize));
    detail::store_u32(&entries[at + 4], static_cast<std::uint32_t>(got));
    if (options.checksum) detail::store_u32(&entries[at + 8], detail::checksum32(src.data(), got));
    ++frames;
    if (got < src.size()) break;
  }
  std::uint8_t header[detail::kSkippableHeaderBytes];
  detail::store_u32(header, detail::kSkippableMagic);
  detail::store_u32(header + 4, static_cast<std::uint32_t>(entries.size() + detail::kFooterBytes));
  std::uint8_t footer[detail::kFooterBytes];
  detail::store_u32(footer, static_cast<std::uint32_t>(frames));
  footer[4] = options.checksum ? detail::kChecksumFlag : 0;
  detail::store_u32(footer + 5, detail::kSeekableMagic);
  out.write(header, sizeof header);
  out.write(entries.data(), entries.size());
  out.write(footer, sizeof footer);
  const std::uint64_t total = out.written();
  out.commit();
  return total;
}

std::uint64_t zstd_seekable_decompress(const std::string& in_path, const std::string& out_path) {
  check_output_is_not_input(out_path, {in_path}, "decompressed output");
  MappedFile file(in_path);
  const SeekTable table = detail::parse_seek_table(file);
  AtomicOutput out(out_path);
  file.advise(0, file.size(), true);
  std::vector<std::uint8_t> buf;
  for (std::uint64_t f = 0; f < table.frames(); ++f) {
    buf.resize(table.d_off[f + 1] - table.d_off[f]);
    decompress_guarded(file, table, f, buf.data());
    out.write(buf.data(), buf.size());
  }
  const std::uint64_t total = out.written();
  out.commit();
  return total;
}

std::unique_ptr<BinReader> open_zstd_bin(const std::string& path, std::size_t cache_frames) {
  return std::make_unique<ZstdBinReader>(path, cache_frames);
}

ZstdSeekableInfo zstd_seekable_info(const std::string& path) {
  MappedFile file(path);
  const SeekTable table = detail::parse_seek_table(file);
  ZstdSeekableInfo info;
  info.compressed_bytes = table.compressed_bytes();
  info.decompressed_bytes = table.decompressed_bytes();
  info.frames = table.frames();
  info.frame_size = table.frame_size;
  info.checksums = table.checksums;
  return info;
}

}  // namespace packpipe::dataloader
