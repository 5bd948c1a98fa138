// A temporary directory removed with its contents when the object dies (tests only).
#pragma once

#include <string>

namespace packpipe::test {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  /// path() + "/" + name
  std::string file(const std::string& name) const;

 private:
  std::string path_;
};

/// Whole file as bytes; throws std::runtime_error if unreadable.
std::string read_file(const std::string& path);
/// Writes bytes to a file (truncating).
void write_file(const std::string& path, const std::string& bytes);
/// Path of a file under ../shared/fixtures.
std::string fixture(const std::string& relative);
/// Hex SHA-256 of a file (tests compare against fixture SHA256SUMS).
std::string sha256_file(const std::string& path);

}  // namespace packpipe::test
