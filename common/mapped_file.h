// Read-only memory map of a whole file (RAII). Opening maps; it reads nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace packpipe {

class MappedFile {
 public:
  MappedFile() = default;
  /// Maps `path` read-only; throws Error naming the path and the OS reason on failure.
  /// An empty file maps to size() == 0 and data() == nullptr.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  /// First byte of the mapping; valid while this object lives.
  const std::uint8_t* data() const { return data_; }
  /// File size in bytes at the time of mapping.
  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// Copies [offset, offset + n) to `out`. A file that another process truncated after it was
  /// mapped raises SIGBUS on access; here that becomes an Error naming the file and its size now.
  /// Throws OutOfRange for a range past the mapped size.
  void read(std::uint64_t offset, std::uint64_t n, void* out) const;
  /// Throws Error naming the file if its size on disk is no longer the mapped size (it was
  /// truncated, grown or replaced in place since it was mapped).
  void check_unchanged() const;
  /// Hints the kernel about the access pattern of [offset, offset + length): sequential or random.
  void advise(std::uint64_t offset, std::uint64_t length, bool sequential) const;

 private:
  void reset() noexcept;
  const std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::string path_;
};

/// Copies n bytes from src to dst; returns false (copying an unspecified part) if the copy hit a
/// SIGBUS, i.e. src lies in a mapping whose file was truncated. Thread-safe.
bool guarded_copy(void* dst, const void* src, std::size_t n) noexcept;

/// Size in bytes of the file at `path`; throws Error naming the path if it cannot be read.
std::uint64_t file_size(const std::string& path);
/// True if `path` names an existing regular file.
bool file_exists(const std::string& path);

}  // namespace packpipe
