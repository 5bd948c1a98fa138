#include "packing/rows.h"

#include <algorithm>
#include <limits>

#include "common/errors.h"

namespace packpipe::packing {

RowTensors row_tensors(const Packing& packing, const std::uint32_t* lengths, std::uint64_t padded_len) {
  const std::uint64_t width = padded_len > 0 ? padded_len : packing.capacity;
  const std::size_t rows = packing.rows();
  PACKPIPE_CHECK_ARG(width > 0, "padded length must be positive");
  PACKPIPE_CHECK_ARG(static_cast<double>(rows) * static_cast<double>(width) <
                         static_cast<double>(std::numeric_limits<std::int32_t>::max()),
                     "{} rows x {} tokens exceed int32 positions", rows, width);
  RowTensors t;
  t.position_ids.assign(rows * width, 0);
  t.segment_ids.assign(rows * width, 0);
  t.cu_seqlens.push_back(0);
  std::int64_t offset = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    std::uint64_t used = 0;
    std::int32_t segment = 0;
    // (the row's whole token count, checked before it is laid out: the message names what it holds)
    std::uint64_t holds = 0;
    for (auto k = packing.row_offsets[r]; k < packing.row_offsets[r + 1]; ++k) holds += lengths[packing.samples[k]];
    PACKPIPE_CHECK_ARG(holds <= width, "row {} holds {} tokens, more than the padded length {}", r, holds, width);
    for (auto k = packing.row_offsets[r]; k < packing.row_offsets[r + 1]; ++k) {
      const std::uint32_t len = lengths[packing.samples[k]];
      ++segment;
      for (std::uint32_t p = 0; p < len; ++p) {
        t.position_ids[r * width + used + p] = static_cast<std::int32_t>(p);
        t.segment_ids[r * width + used + p] = segment;
      }
      used += len;
      offset += len;
      t.cu_seqlens.push_back(static_cast<std::int32_t>(offset));
      t.max_seqlen = std::max(t.max_seqlen, static_cast<std::int32_t>(len));
    }
    if (used < width) {  // padding is a segment of its own, so attention never mixes it in
      offset += static_cast<std::int64_t>(width - used);
      t.cu_seqlens.push_back(static_cast<std::int32_t>(offset));
      // flash-attn sizes its grid by max_seqlen: it must cover every segment cu_seqlens describes.
      t.max_seqlen = std::max(t.max_seqlen, static_cast<std::int32_t>(width - used));
    }
  }
  return t;
}

}  // namespace packpipe::packing
