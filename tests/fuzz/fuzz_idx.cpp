// libFuzzer target: parse_index on arbitrary bytes with every ModesPolicy. packpipe's error types
// are the expected outcome for bad input; a crash, a sanitizer report or any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/errors.h"
#include "dataloader/indexed_dataset.h"

using namespace packpipe::dataloader;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Exact-size copy: ASan then flags any read past the end.
  const std::vector<std::uint8_t> bytes(data, data + size);
  for (ModesPolicy policy : {ModesPolicy::Auto, ModesPolicy::Present, ModesPolicy::Absent}) {
    try {
      const IndexView v = parse_index(bytes.data(), bytes.size(), "fuzz.idx", policy);
      // Touch every element the views claim, so a view past the buffer is caught.
      std::uint64_t sum = 0;  // unsigned: wraps instead of overflowing on garbage values
      for (std::uint64_t i = 0; i < v.num_sequences; ++i) {
        sum += static_cast<std::uint64_t>(v.sizes[i]) + static_cast<std::uint64_t>(v.pointers[i]);
      }
      for (std::uint64_t k = 0; k < v.doc_idx.size(); ++k) sum += static_cast<std::uint64_t>(v.doc_idx[k]);
      if (v.has_modes) {
        for (std::uint64_t i = 0; i < v.num_sequences; ++i) sum += static_cast<std::uint64_t>(v.modes[i]);
      }
      if (v.doc_idx.size() != v.num_documents + 1) __builtin_trap();
      volatile std::uint64_t sink = sum;
      (void)sink;
    } catch (const packpipe::Error&) {
    } catch (const packpipe::InvalidArgument&) {
    } catch (const packpipe::OutOfRange&) {
    }
  }
  return 0;
}
