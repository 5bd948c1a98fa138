// Per-row tensors that varlen attention kernels and masks need to keep packed samples apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "packing/packer.h"

namespace packpipe::packing {

/// Tensors of packed rows, concatenated row after row (each row padded to `padded_len` tokens).
struct RowTensors {
  std::vector<std::int32_t> cu_seqlens;    ///< cumulative sample boundaries over all rows, padding as its own segment
  std::vector<std::int32_t> position_ids;  ///< rows x padded_len; restart at 0 for every sample, 0 on padding
  std::vector<std::int32_t> segment_ids;   ///< rows x padded_len; 1, 2, ... per sample within a row, 0 on padding
  /// The longest segment cu_seqlens describes, a padding segment included: flash-attention's
  /// max_seqlen, which must be at least every segment's length (the kernel sizes its grid by it).
  std::int32_t max_seqlen = 0;
};

/// Tensors for the rows of `packing` over sample `lengths`, each row padded to `padded_len`
/// (0: the packing's capacity). Throws InvalidArgument if a row is longer than padded_len or a
/// size exceeds int32.
RowTensors row_tensors(const Packing& packing, const std::uint32_t* lengths, std::uint64_t padded_len = 0);

}  // namespace packpipe::packing
