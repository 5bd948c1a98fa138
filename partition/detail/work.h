// Internal: pieces of the partitioner shared between its translation units. Not a public header.
#pragma once

#include <cstdint>
#include <vector>

#include "partition/detail/coster.h"

namespace packpipe::partition::detail {

/// Working lengths of one call (after truncation) and the options resolved.
struct Work {
  const std::uint32_t* input = nullptr;
  const std::uint32_t* target = nullptr;  ///< null for decoder-only
  std::int64_t round = 8;
  std::int64_t dec_extra = 2;
  bool encdec() const { return target != nullptr; }
  std::int64_t le_of(std::uint64_t max_input) const { return round_up(static_cast<std::int64_t>(max_input), round); }
  std::int64_t ld_of(std::uint64_t max_target) const {
    return encdec() ? round_up(static_cast<std::int64_t>(max_target) + dec_extra, round) : 0;
  }
};

/// Packing baseline: best-fit decreasing rows of the longest sample (packing::pack), then
/// `mbs` rows per micro-batch (samples and row_offsets only). Defined in partition_pack.cpp.
std::vector<MicroBatch> packing_baseline(const Work& w, const std::vector<std::uint32_t>& ids, std::int64_t mbs);

/// (S - 1) tau / c + sum / d, computed in DynaPipe's order of operations.
inline double objective(const PipelineShape& s, double tau, double sum) {
  return static_cast<double>(s.stages - 1) * tau / static_cast<double>(s.chunks) + sum / static_cast<double>(s.dp);
}

}  // namespace packpipe::partition::detail
