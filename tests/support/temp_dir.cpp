#include "tests/support/temp_dir.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace packpipe::test {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "packpipe-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::file(const std::string& name) const { return path_ + "/" + name; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write " + path);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string fixture(const std::string& relative) {
  return std::string(PACKPIPE_FIXTURES_DIR) + "/" + relative;
}

std::string sha256_file(const std::string& path) {
  std::string cmd = "sha256sum '" + path + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("cannot run sha256sum");
  char buf[65] = {0};
  size_t n = std::fread(buf, 1, 64, p);
  ::pclose(p);
  if (n != 64) throw std::runtime_error("sha256sum failed for " + path);
  return std::string(buf, 64);
}

}  // namespace packpipe::test
