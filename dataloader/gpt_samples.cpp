#include "dataloader/gpt_samples.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"

namespace packpipe::dataloader {

GptSampleIndex::GptSampleIndex(const IndexedDataset& dataset, std::vector<std::int64_t> sequence_order,
                               std::uint32_t seq_len)
    : dataset_(&dataset), order_(std::move(sequence_order)), seq_len_(seq_len) {
  PACKPIPE_CHECK_ARG(seq_len > 0, "GptSampleIndex over '{}': seq_len must be > 0", dataset.prefix());
  const std::uint64_t S = dataset.size();
  // Check every touched sequence once here, so assemble() can copy without per-piece checks.
  std::uint64_t total = 0;
  for (std::size_t pos = 0; pos < order_.size(); ++pos) {
    const std::int64_t id = order_[pos];
    PACKPIPE_CHECK_ARG(id >= 0 && static_cast<std::uint64_t>(id) < S,
                       "GptSampleIndex over '{}': sequence_order[{}] = {} is out of range [0, {})",
                       dataset.prefix(), pos, id, S);
    dataset.checked_pointer(static_cast<std::uint64_t>(id));
    total += dataset.length(static_cast<std::uint64_t>(id));
  }
  // Megatron: num_samples = (tokens - 1) // seq_len; sample k starts at token k * seq_len and
  // takes seq_len + 1 tokens, so consecutive samples share one token.
  if (total == 0) return;
  const std::uint64_t num_samples = (total - 1) / seq_len;
  if (num_samples == 0) return;
  starts_.reserve(num_samples + 1);
  const auto& sizes = dataset.sizes();
  std::uint64_t pos = 0;
  std::uint64_t pos_start = 0;  // global token index where order_[pos] begins
  for (std::uint64_t k = 0; k <= num_samples; ++k) {
    const std::uint64_t target = k * seq_len;
    // Row k of Megatron's sample_idx: (position, offset) of token target; never a
    // zero-length sequence and never an offset equal to the sequence length.
    while (pos_start + static_cast<std::uint64_t>(sizes[static_cast<std::uint64_t>(order_[pos])]) <= target) {
      pos_start += static_cast<std::uint64_t>(sizes[static_cast<std::uint64_t>(order_[pos])]);
      ++pos;
    }
    starts_.push_back({static_cast<std::int64_t>(pos), static_cast<std::int64_t>(target - pos_start)});
  }
}

void GptSampleIndex::assemble(std::uint64_t k, void* out) const {
  PACKPIPE_CHECK_RANGE(k < size(), "GptSampleIndex over '{}': sample {} out of range ({} samples)",
                       dataset_->prefix(), k, size());
  const IndexedDataset& ds = *dataset_;
  const std::uint64_t item = ds.itemsize();
  const auto& sizes = ds.sizes();
  auto* dst = static_cast<std::uint8_t*>(out);
  std::uint64_t remaining = static_cast<std::uint64_t>(seq_len_) + 1;
  std::uint64_t pos = static_cast<std::uint64_t>(starts_[k].order_pos);
  std::uint64_t offset = static_cast<std::uint64_t>(starts_[k].offset);
  while (remaining > 0) {
    PACKPIPE_ASSERT(pos < order_.size());
    const auto id = static_cast<std::uint64_t>(order_[pos]);
    const std::uint64_t len = static_cast<std::uint64_t>(sizes[id]);
    const std::uint64_t n = std::min(len - offset, remaining);
    if (n > 0) {
      ds.read(id, offset, n, dst);  // guarded: a truncated .bin is an Error, not SIGBUS
      dst += n * item;
      remaining -= n;
    }
    offset = 0;
    ++pos;
  }
}

}  // namespace packpipe::dataloader
