#include "dataloader/bin_reader.h"

#include <cstring>

#include "common/errors.h"
#include "common/mapped_file.h"
#include "dataloader/zstd_seekable.h"

namespace packpipe::dataloader {

namespace {

class PlainBinReader final : public BinReader {
 public:
  explicit PlainBinReader(const std::string& path) : file_(path) {}
  std::uint64_t size() const override { return file_.size(); }
  void read(std::uint64_t offset, std::uint64_t n, void* out) const override {
    PACKPIPE_CHECK_RANGE(offset <= file_.size() && n <= file_.size() - offset,
                         "{}: read of {} bytes at offset {} is past the end ({} bytes)", file_.path(),
                         n, offset, file_.size());
    file_.read(offset, n, out);  // bounds-checked; a truncated file is an Error, not SIGBUS
    // A file truncated into the page these bytes lie on reads zeros there, not SIGBUS: the copy is
    // trusted only if the file still has the size it was opened with.
    file_.check_unchanged();
  }
  const std::uint8_t* data() const override { return file_.data(); }
  const std::string& path() const override { return file_.path(); }
  void verify() const override {}

 private:
  MappedFile file_;
};

}  // namespace

std::unique_ptr<BinReader> open_plain_bin(const std::string& path) {
  return std::make_unique<PlainBinReader>(path);
}

std::unique_ptr<BinReader> open_bin(const std::string& prefix) {
  const std::string plain = prefix + ".bin";
  if (file_exists(plain)) return open_plain_bin(plain);
  const std::string zst = prefix + ".bin.zst";
  if (file_exists(zst)) return open_zstd_bin(zst);
  PACKPIPE_THROW(Error, "dataset '{}': neither '{}' nor '{}' exists", prefix, plain, zst);
}

}  // namespace packpipe::dataloader
