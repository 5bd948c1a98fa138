// The packing baseline: best-fit decreasing rows of a token capacity, a fixed number of rows per
// micro-batch, flattened under varlen attention (HF flattening, Megatron THD) or kept as dense rows
// under a block mask (DynaPipe's "packing" comparison).
#include <algorithm>

#include "common/errors.h"
#include "packing/packer.h"
#include "partition/detail/work.h"

namespace packpipe::partition::detail {

std::vector<MicroBatch> packing_baseline(const Work& w, const std::vector<std::uint32_t>& ids, std::int64_t mbs,
                                         std::uint64_t capacity, Layout layout) {
  std::vector<std::uint32_t> in(ids.size()), tg;
  std::uint64_t max_in = 0, max_tg = 0;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    in[k] = w.input[ids[k]];
    max_in = std::max<std::uint64_t>(max_in, in[k]);
  }
  PACKPIPE_CHECK_ARG(capacity == 0 || capacity >= max_in,
                     "method 'packing': capacity {} (capacity / --capacity) is below the longest sample's {} tokens; "
                     "use a larger capacity (or 0 for the longest sample's)",
                     capacity, max_in);
  packing::PackOptions po;
  po.algorithm = packing::Algorithm::BestFitDecreasing;
  po.capacity = std::max<std::uint64_t>(1, capacity != 0 ? capacity : max_in);
  if (w.encdec()) {
    tg.resize(ids.size());
    for (std::size_t k = 0; k < ids.size(); ++k) {
      tg[k] = w.target[ids[k]];
      max_tg = std::max<std::uint64_t>(max_tg, tg[k]);
    }
    // Decoder rows in proportion to the encoder rows' capacity (the longest target at least).
    const std::uint64_t scaled = max_in > 0 && capacity != 0 ? max_tg * capacity / max_in : max_tg;
    po.target_capacity = std::max<std::uint64_t>(1, std::max(scaled, max_tg));
  }
  const packing::Packing p = packing::pack(in.data(), in.size(), po, w.encdec() ? tg.data() : nullptr);
  std::vector<MicroBatch> out;
  const std::size_t rows = p.rows();
  if (mbs > 0) out.reserve((rows + static_cast<std::size_t>(mbs) - 1) / static_cast<std::size_t>(mbs));
  for (std::size_t r0 = 0; r0 < rows; r0 += static_cast<std::size_t>(mbs)) {
    const std::size_t r1 = std::min(rows, r0 + static_cast<std::size_t>(mbs));
    MicroBatch mb;
    mb.layout = layout;
    mb.row_offsets.push_back(0);
    for (std::size_t r = r0; r < r1; ++r) {
      for (std::uint64_t k = p.row_offsets[r]; k < p.row_offsets[r + 1]; ++k) mb.samples.push_back(ids[p.samples[k]]);
      mb.row_offsets.push_back(static_cast<std::uint32_t>(mb.samples.size()));
    }
    if (layout == Layout::Packed) mb.row_offsets.clear();  // flattened: finalize makes the one row
    out.push_back(std::move(mb));
  }
  return out;
}

}  // namespace packpipe::partition::detail
