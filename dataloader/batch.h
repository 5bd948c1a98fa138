// Global batch assembly (views into the memory maps) and background prefetch on oneTBB.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dataloader/multitask.h"
#include "dataloader/sampler.h"

namespace packpipe::dataloader {

/// A global batch with its samples' tokens: views into `.bin` maps, or copies held in `storage`
/// for compressed datasets. Views stay valid while the dataset lives.
struct AssembledBatch {
  GlobalBatch batch;
  std::vector<SampleView> samples;
  std::vector<std::vector<std::uint8_t>> storage;
};

/// Assembles `batch` from `dataset`: zero-copy for `.bin`, decompressed copies for `.bin.zst`.
AssembledBatch assemble_batch(const MultiTaskDataset& dataset, GlobalBatch batch);

/// Runs the sampler and assembly ahead of the consumer on background threads (a oneTBB
/// parallel_pipeline: sample serially, assemble in parallel, deliver in order) and keeps up to
/// `depth` assembled batches ready. Delivers exactly the batches the sampler would, in order.
class Prefetcher {
 public:
  /// Takes over `sampler` (copied) from its current state; stops at the end of the epoch.
  Prefetcher(const MultiTaskDataset& dataset, const Sampler& sampler, std::size_t depth = 4);
  /// Stops the background work and joins.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  /// Next batch, blocking until ready; false at the end of the epoch. Rethrows a background error.
  bool next(AssembledBatch& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace packpipe::dataloader
