// libFuzzer target: parse a zstd seekable seek table from memory, then decompress every frame and
// check frame lookup. Only packpipe's documented exception types may escape the library.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"
#include "dataloader/detail/zstd_seek_table.h"

namespace {
// Frames larger than this are skipped: a forged table can claim 4 GiB per frame.
constexpr std::uint64_t kMaxFrameBytes = 1u << 20;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace packpipe::dataloader::detail;
  const std::string name = "fuzz.bin.zst";
  try {
    const SeekTable table = parse_seek_table(data, size, name);
    if (table.c_off.back() + table.table_bytes != size) __builtin_trap();
    std::vector<std::uint8_t> buf;
    for (std::uint64_t f = 0; f < table.frames(); ++f) {
      const std::uint64_t start = table.d_off[f];
      const std::uint64_t n = table.d_off[f + 1] - start;
      if (n > 0 && table.frame_of(start) != f) __builtin_trap();
      if (n > 0 && table.frame_of(start + n - 1) != f) __builtin_trap();
      if (n > kMaxFrameBytes) continue;
      buf.resize(n);
      try {
        decompress_frame(data, table, f, buf.data(), name);
      } catch (const packpipe::Error&) {
        // A corrupt frame must not stop the others from being tried.
      }
    }
  } catch (const packpipe::Error&) {
  } catch (const packpipe::OutOfRange&) {
  } catch (const packpipe::InvalidArgument&) {
  }
  return 0;
}
