// A manifest opened: the datasets of every task, sample lengths and zero-copy sample access.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dataloader/indexed_dataset.h"
#include "dataloader/manifest.h"
#include "dataloader/sampler.h"

namespace packpipe::dataloader {

/// Tokens of one sample: input (the whole sample for decoder-only) and target (empty if none).
struct SampleView {
  SampleRef ref;
  TokenSpan input;
  TokenSpan target;
};

/// A sampler configuration with what the manifest says: train/valid/test fractions, samples per
/// epoch and, when every task gives one, the task weights. The caller sets seed, split and batch size.
SamplerConfig sampler_config(const Manifest& manifest);

/// Memory maps the process may still open: vm.max_map_count (/proc/sys/vm/max_map_count; 65530 if it
/// cannot be read) less the maps it holds now (/proc/self/maps).
std::uint64_t free_memory_maps();

/// Throws Error before any file is opened when `prefixes` dataset prefixes (2 maps each, `.idx` and
/// `.bin`) would not fit in `free_maps` with `headroom` maps to spare; the message names the
/// manifest, the counts, the limit (vm.max_map_count) and the ways out.
void check_memory_maps(const std::string& manifest, std::uint64_t prefixes, std::uint64_t free_maps,
                       std::uint64_t headroom = 1024);

class MultiTaskDataset : public SampleSource {
 public:
  /// Opens every prefix of the manifest; throws Error naming the task and file on a mismatch
  /// (paired prefixes with different document counts, dtypes that differ within a task, ...).
  /// Samples: Sequence = one per sequence over the concatenated shards; PairedPrefixes = document
  /// i of inputs with document i of targets (one sequence each); PairedSequences = the two
  /// sequences of document i (modes 0 then 1 if present). Per-document shape is checked at access
  /// (Error naming file and document); lengths come from the `.idx` arrays, read as IndexedDataset
  /// reads them (a `.idx` truncated under a live dataset is an Error naming it, never SIGBUS).
  /// A manifest whose prefixes need more memory maps than the process may open is refused before
  /// any is opened (check_memory_maps).
  explicit MultiTaskDataset(const Manifest& manifest);
  /// A one-task dataset of one prefix, layout Sequence.
  static MultiTaskDataset from_prefix(const std::string& prefix);
  ~MultiTaskDataset() override;
  MultiTaskDataset(MultiTaskDataset&&) noexcept;

  const Manifest& manifest() const { return manifest_; }
  std::size_t num_tasks() const override;
  std::uint64_t task_size(std::size_t task) const override;
  std::uint64_t sample_tokens(std::size_t task, std::uint64_t index) const override;
  /// True if task samples have a target part (paired layouts).
  bool encoder_decoder(std::size_t task) const;
  /// Throws OutOfRange naming the task, the index and the dataset's task count or the task's sample
  /// count unless (task, index) is a sample of this dataset.
  void check_sample(std::size_t task, std::uint64_t index) const;
  /// Input and target token counts of a sample; throws OutOfRange.
  std::uint32_t input_length(SampleRef ref) const;
  std::uint32_t target_length(SampleRef ref) const;
  /// Zero-copy views of a sample (plain `.bin`); Unsupported for `.bin.zst` (use read_sample).
  SampleView view(SampleRef ref) const;
  /// Copies a sample's input and target tokens (any storage) into the two vectors (bytes). Guarded:
  /// a `.bin` truncated under a live dataset is an Error naming the file (MappedFile::read), never SIGBUS.
  void read_sample(SampleRef ref, std::vector<std::uint8_t>& input, std::vector<std::uint8_t>& target) const;
  /// Copies input tokens [input_begin, input_begin + n_input) and target tokens [target_begin,
  /// target_begin + n_target) of a sample (any storage, guarded as read_sample) into the two vectors
  /// (bytes); ref.offset is not read (the ranges say where). Throws OutOfRange naming the sample when
  /// a range ends past its side.
  void read_range(SampleRef ref, std::uint64_t input_begin, std::uint64_t n_input, std::uint64_t target_begin,
                  std::uint64_t n_target, std::vector<std::uint8_t>& input, std::vector<std::uint8_t>& target) const;
  /// The first `n_input` input tokens and the first `n_target` target tokens (read_range from 0).
  void read_prefix(SampleRef ref, std::uint64_t n_input, std::uint64_t n_target, std::vector<std::uint8_t>& input,
                   std::vector<std::uint8_t>& target) const {
    read_range(ref, 0, n_input, 0, n_target, input, target);
  }
  /// True if any dataset is stored compressed.
  bool compressed() const;
  /// 64-bit identity of what this dataset delivers, computed once on open: the tasks in order (name,
  /// layout, weight when weighted), the manifest's split fractions and samples per epoch, each
  /// dataset file's name (not its folder: the data may move) with its dtype, its sequence, document
  /// and token counts and the lengths of up to 256 evenly spaced sequences (from the index). Two
  /// manifests with the same datasets but the tasks reordered, renamed or reweighted differ.
  /// Sampler states and loader states carry it; a state restores only into an equal one.
  std::uint64_t fingerprint() const override { return fingerprint_; }
  /// Token dtype of task t (all its shards, inputs and targets, share it); throws OutOfRange.
  DType dtype(std::size_t task) const;
  /// True if a dataset of task t is stored compressed (its samples need read_sample, not view).
  bool task_compressed(std::size_t task) const;

 private:
  struct Task;
  /// The task of `ref` after checking ref.task and ref.index; throws OutOfRange.
  const Task& checked(SampleRef ref) const;
  /// fingerprint(), computed.
  std::uint64_t identity() const;
  Manifest manifest_;
  std::vector<std::unique_ptr<Task>> tasks_;
  /// Per task, contiguous: the sizes of a one-shard sequence task held in memory (nullptr otherwise),
  /// so sample_tokens() reads one entry and one size whatever the task count (the sampler's hot path).
  struct Lengths {
    const std::uint8_t* sizes = nullptr;  ///< little-endian int32, possibly unaligned
    std::uint64_t count = 0;
  };
  std::vector<Lengths> lengths_;
  std::uint64_t fingerprint_ = 0;
};

}  // namespace packpipe::dataloader
