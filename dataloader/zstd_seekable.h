// zstd seekable format (facebook/zstd contrib/seekable_format): independent zstd frames followed
// by a skippable frame holding the seek table. `zstd -d` on such a file returns the original bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dataloader/bin_reader.h"

namespace packpipe::dataloader {

struct ZstdSeekableOptions {
  std::uint32_t frame_size = 256 * 1024;  ///< uncompressed bytes per frame (last frame may be shorter)
  int level = 3;                          ///< zstd compression level
  bool checksum = true;                   ///< store XXH64 low 32 bits per frame in the seek table
};

/// Compresses `in_path` into seekable `out_path` in constant memory (one frame at a time, plus 12
/// bytes of seek table per frame); writes a temporary file renamed over `out_path` at the end.
/// Returns compressed bytes. Throws InvalidArgument on bad options, Error on I/O failure.
std::uint64_t zstd_seekable_compress(const std::string& in_path, const std::string& out_path,
                                     const ZstdSeekableOptions& options = {});
/// Decompresses seekable `in_path` to `out_path` (temporary file + rename), checking every frame
/// and checksum; returns bytes written.
std::uint64_t zstd_seekable_decompress(const std::string& in_path, const std::string& out_path);

/// Seek-table facts of a seekable file.
struct ZstdSeekableInfo {
  std::uint64_t compressed_bytes = 0;    ///< whole file, seek table included
  std::uint64_t decompressed_bytes = 0;
  std::uint64_t frames = 0;
  std::uint32_t frame_size = 0;  ///< uncompressed size of every frame but the last; 0 if irregular
  bool checksums = false;
};

/// Opens a seekable `.bin.zst` as a BinReader: reads touch one frame (two when a read spans a
/// frame boundary), decompressed frames are cached per thread (`cache_frames` per thread, LRU;
/// 0 disables caching). read() is thread-safe; data() is nullptr. Opening validates the seek
/// table only; each frame's header, size and checksum are checked when it is decompressed (every
/// frame by verify()). Throws Error naming the file and the field on a malformed seek table.
std::unique_ptr<BinReader> open_zstd_bin(const std::string& path, std::size_t cache_frames = 4);
/// Seek-table facts of `path`; throws Error as open_zstd_bin does.
ZstdSeekableInfo zstd_seekable_info(const std::string& path);

}  // namespace packpipe::dataloader
