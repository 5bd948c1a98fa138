// The packing baseline (DynaPipe's "packing" comparison): pack to the longest length, then a
// fixed number of rows per micro-batch.
#include <algorithm>

#include "common/errors.h"
#include "packing/packer.h"
#include "partition/detail/work.h"

namespace packpipe::partition::detail {

std::vector<MicroBatch> packing_baseline(const Work& w, const std::vector<std::uint32_t>& ids, std::int64_t mbs) {
  std::vector<std::uint32_t> in(ids.size()), tg;
  std::uint64_t max_in = 0, max_tg = 0;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    in[k] = w.input[ids[k]];
    max_in = std::max<std::uint64_t>(max_in, in[k]);
  }
  packing::PackOptions po;
  po.algorithm = packing::Algorithm::BestFitDecreasing;
  po.capacity = std::max<std::uint64_t>(1, max_in);
  if (w.encdec()) {
    tg.resize(ids.size());
    for (std::size_t k = 0; k < ids.size(); ++k) {
      tg[k] = w.target[ids[k]];
      max_tg = std::max<std::uint64_t>(max_tg, tg[k]);
    }
    po.target_capacity = std::max<std::uint64_t>(1, max_tg);
  }
  const packing::Packing p = packing::pack(in.data(), in.size(), po, w.encdec() ? tg.data() : nullptr);
  std::vector<MicroBatch> out;
  const std::size_t rows = p.rows();
  for (std::size_t r0 = 0; r0 < rows; r0 += static_cast<std::size_t>(mbs)) {
    const std::size_t r1 = std::min(rows, r0 + static_cast<std::size_t>(mbs));
    MicroBatch mb;
    mb.row_offsets.push_back(0);
    for (std::size_t r = r0; r < r1; ++r) {
      for (std::uint64_t k = p.row_offsets[r]; k < p.row_offsets[r + 1]; ++k) mb.samples.push_back(ids[p.samples[k]]);
      mb.row_offsets.push_back(static_cast<std::uint32_t>(mb.samples.size()));
    }
    out.push_back(std::move(mb));
  }
  return out;
}

}  // namespace packpipe::partition::detail
