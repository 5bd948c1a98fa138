// Megatron GPTDataset-style samples: fixed-length windows of seq_len + 1 tokens read across
// document boundaries from a given document order (build_sample_idx semantics).
#pragma once

#include <cstdint>
#include <vector>

#include "dataloader/indexed_dataset.h"

namespace packpipe::dataloader {

class GptSampleIndex {
 public:
  /// Walks `sequence_order` (sequence ids, e.g. a shuffled list repeated per epoch), consuming
  /// seq_len + 1 tokens per sample with a one-token overlap between consecutive samples.
  /// Memory: 16 bytes per sample. Throws InvalidArgument if seq_len == 0 or an id is out of range.
  GptSampleIndex(const IndexedDataset& dataset, std::vector<std::int64_t> sequence_order,
                 std::uint32_t seq_len);
  /// Number of complete samples.
  std::uint64_t size() const { return starts_.empty() ? 0 : starts_.size() - 1; }
  std::uint32_t seq_len() const { return seq_len_; }
  /// Copies the seq_len + 1 tokens of sample k into out ((seq_len + 1) * itemsize bytes).
  void assemble(std::uint64_t k, void* out) const;

 private:
  struct Start {
    std::int64_t order_pos;  ///< position in sequence_order
    std::int64_t offset;     ///< token offset within that sequence
  };
  const IndexedDataset* dataset_;
  std::vector<std::int64_t> order_;
  std::vector<Start> starts_;
  std::uint32_t seq_len_;
};

}  // namespace packpipe::dataloader
