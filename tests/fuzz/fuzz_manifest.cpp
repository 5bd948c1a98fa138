// libFuzzer target: manifest JSON parsing without file-system access, plus a round trip.
// Only packpipe exception types are expected; anything else (or a crash) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/errors.h"
#include "dataloader/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace packpipe::dataloader;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Manifest m = parse_manifest(text, "fuzz.json", "base", /*check_files=*/false);
    // A parsed manifest must serialise and parse back to the same tasks.
    const Manifest back = parse_manifest(manifest_to_json(m), "roundtrip.json", "", false);
    if (back.tasks.size() != m.tasks.size() || back.weighted != m.weighted) std::abort();
    for (std::size_t t = 0; t < m.tasks.size(); ++t) {
      if (back.tasks[t].name != m.tasks[t].name || back.tasks[t].layout != m.tasks[t].layout ||
          back.tasks[t].prefixes != m.tasks[t].prefixes ||
          back.tasks[t].target_prefixes != m.tasks[t].target_prefixes) {
        std::abort();
      }
    }
  } catch (const packpipe::InvalidArgument&) {
  } catch (const packpipe::OutOfRange&) {
  } catch (const packpipe::Error&) {
  }
  return 0;
}
