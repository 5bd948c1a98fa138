// Global batch assembly (guarded copies of the samples' tokens) and background prefetch on oneTBB.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dataloader/multitask.h"
#include "dataloader/sampler.h"

namespace packpipe::dataloader {

/// A global batch with its samples' tokens: copies held in `storage`, which the views in `samples`
/// point into; they stay valid while this object lives. Move-only: a copy's views would point into
/// the original's storage.
struct AssembledBatch {
  AssembledBatch() = default;
  AssembledBatch(AssembledBatch&&) noexcept = default;
  AssembledBatch& operator=(AssembledBatch&&) noexcept = default;
  AssembledBatch(const AssembledBatch&) = delete;
  AssembledBatch& operator=(const AssembledBatch&) = delete;

  GlobalBatch batch;
  std::vector<SampleView> samples;
  std::vector<std::vector<std::uint8_t>> storage;
};

/// Assembles `batch` from `dataset`: a copy of every sample's tokens through the guarded reads (a
/// `.bin` truncated under a live loader is an Error naming the file, never SIGBUS; `.bin.zst` is
/// decompressed). Thread-safe for concurrent calls on one dataset.
AssembledBatch assemble_batch(const MultiTaskDataset& dataset, GlobalBatch batch);

/// Runs the sampler and assembly ahead of the consumer on background threads (a oneTBB
/// parallel_pipeline: sample serially, assemble in parallel, deliver in order) and keeps up to
/// `depth` assembled batches ready. Delivers exactly the batches the sampler would, in order.
/// The most global batches a Prefetcher holds ready.
inline constexpr std::size_t kMaxPrefetchDepth = 1024;

class Prefetcher {
 public:
  /// Runs ahead of `sampler` from its current state and stops at the end of the epoch. The
  /// sampler must outlive the Prefetcher; each delivered batch advances it, so `sampler.state()`
  /// is always the state after the last batch next() returned (what a checkpoint must save),
  /// never the state of batches still in flight. A sampler feeds one Prefetcher at a time: a
  /// second one on it throws InvalidArgument until the first is destroyed. `depth` in
  /// [1, kMaxPrefetchDepth].
  Prefetcher(const MultiTaskDataset& dataset, Sampler& sampler, std::size_t depth = 4);
  /// Stops the background work (in-flight batches are dropped) and joins; never blocks on a
  /// consumer that stopped early. The sampler keeps the state of the last delivered batch.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  /// Next batch, blocking until ready; false at the end of the epoch (and on every later call).
  /// Rethrows an error of the sampler or of assembly (again on every later call). One consumer
  /// at a time: a call while another thread is inside next() throws InvalidArgument at once
  /// instead of waiting for a batch that only one of them could get.
  bool next(AssembledBatch& out);
  /// The sampler state after the last delivered batch (equal to the sampler's own state()).
  SamplerState state() const;

 private:
  struct Impl;
  Sampler* owner_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace packpipe::dataloader
