// Private to dataloader: the seek table of a zstd seekable file, parsed from a memory buffer, and
// single-frame decompression with all checks. Shared by zstd_seekable.cpp and the fuzzer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/mapped_file.h"

namespace packpipe::dataloader::detail {

inline constexpr std::uint32_t kSkippableMagic = 0x184D2A5E;
inline constexpr std::uint32_t kSeekableMagic = 0x8F92EAB1;
inline constexpr std::uint64_t kSkippableHeaderBytes = 8;  // magic + Frame_Size
inline constexpr std::uint64_t kFooterBytes = 9;           // Number_Of_Frames, Descriptor, magic
inline constexpr std::uint8_t kChecksumFlag = 0x80;
inline constexpr std::uint8_t kReservedBits = 0x7C;

/// Validated seek table. Holds prefix sums only (16 bytes per frame); checksums stay in the buffer.
struct SeekTable {
  std::vector<std::uint64_t> c_off;  ///< frames + 1 compressed offsets; c_off[0] == 0
  std::vector<std::uint64_t> d_off;  ///< frames + 1 decompressed offsets; d_off[0] == 0
  bool checksums = false;
  std::uint64_t entries_offset = 0;  ///< buffer offset of the first per-frame entry
  std::uint64_t table_bytes = 0;     ///< whole skippable frame, header and footer included
  std::uint32_t frame_size = 0;      ///< decompressed size of every frame but the last; 0 if irregular
  std::vector<std::uint32_t> sums;   ///< stored checksum of each frame (with `checksums`), read at parse

  std::uint64_t frames() const { return c_off.size() - 1; }
  std::uint64_t compressed_bytes() const { return c_off.back() + table_bytes; }
  std::uint64_t decompressed_bytes() const { return d_off.back(); }
  /// Index of the frame holding decompressed byte `offset` (< decompressed_bytes()).
  std::uint64_t frame_of(std::uint64_t offset) const;
  /// Stored checksum of frame f; only meaningful when `checksums`.
  std::uint32_t checksum(std::uint64_t f) const { return sums[f]; }
};

/// Parses and validates the seek table at the end of buffer [data, data + size); `name` (the file
/// path) starts every error message. Throws packpipe::Error. Touches only the table bytes.
SeekTable parse_seek_table(const std::uint8_t* data, std::uint64_t size, const std::string& name);
/// parse_seek_table of a mapped file: copies the footer, then the table, through the file's SIGBUS
/// guard (a file truncated under it is an Error naming it) and parses the copy.
SeekTable parse_seek_table(const MappedFile& file);

/// Decompresses frame f from its compressed bytes `src` (exactly c_off[f+1] - c_off[f] of them, e.g.
/// a guarded copy out of the mapped file) into dst (exactly d_off[f+1] - d_off[f] bytes) with this
/// thread's ZSTD_DCtx, checking the frame header's content size, the decompressed size and the
/// checksum. Throws packpipe::Error naming `name`, the frame and its compressed byte range.
void decompress_frame_bytes(const std::uint8_t* src, const SeekTable& table, std::uint64_t f, std::uint8_t* dst,
                            const std::string& name);
/// decompress_frame_bytes of frame f of the whole file `buffer`.
void decompress_frame(const std::uint8_t* buffer, const SeekTable& table, std::uint64_t f,
                      std::uint8_t* dst, const std::string& name);

}  // namespace packpipe::dataloader::detail
