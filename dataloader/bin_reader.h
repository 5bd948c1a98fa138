// Random-access byte source for the token data of a dataset: a plain `.bin` (memory map) or a
// seekable-zstd `.bin.zst`. Offsets are byte offsets into the uncompressed `.bin`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace packpipe::dataloader {

class BinReader {
 public:
  virtual ~BinReader() = default;
  /// Size in bytes of the uncompressed `.bin`.
  virtual std::uint64_t size() const = 0;
  /// Copies bytes [offset, offset + n) into out; throws OutOfRange past the end, Error on a corrupt
  /// frame. Thread-safe.
  virtual void read(std::uint64_t offset, std::uint64_t n, void* out) const = 0;
  /// Pointer to the mapped bytes for zero-copy views, or nullptr when the data is compressed.
  virtual const std::uint8_t* data() const = 0;
  /// File this reader reads from.
  virtual const std::string& path() const = 0;
  /// Full integrity check (frame checksums for `.bin.zst`); throws Error naming file and frame.
  virtual void verify() const = 0;
};

/// Memory-maps a plain `.bin`.
std::unique_ptr<BinReader> open_plain_bin(const std::string& path);
/// Opens `<prefix>.bin` if it exists, else `<prefix>.bin.zst`; throws Error naming both if neither.
std::unique_ptr<BinReader> open_bin(const std::string& prefix);

}  // namespace packpipe::dataloader
