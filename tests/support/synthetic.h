// Synthetic data for tests: random token datasets on disk and in-memory sample sources.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dataloader/dtype.h"
#include "dataloader/sampler.h"

namespace packpipe::test {

/// Sample lengths per task, in memory (no files): a SampleSource for sampler property tests.
class SyntheticSource : public dataloader::SampleSource {
 public:
  explicit SyntheticSource(std::vector<std::vector<std::uint32_t>> lengths)
      : lengths_(std::move(lengths)) {}
  /// `tasks` tasks of random sizes in [1, max_task_size] with log-normal lengths clipped to [1, max_len].
  static SyntheticSource random(std::mt19937_64& rng, std::size_t tasks, std::uint64_t max_task_size,
                                std::uint32_t max_len);
  std::size_t num_tasks() const override { return lengths_.size(); }
  std::uint64_t task_size(std::size_t t) const override { return lengths_[t].size(); }
  std::uint64_t sample_tokens(std::size_t t, std::uint64_t i) const override { return lengths_[t][i]; }

 private:
  std::vector<std::vector<std::uint32_t>> lengths_;
};

/// Documents of random token sequences: doc d has sequences[d] (each a vector of token ids).
using Documents = std::vector<std::vector<std::vector<std::int64_t>>>;

/// Random documents: `docs` documents of 1..max_seqs sequences of 0..max_len tokens below `vocab`.
Documents random_documents(std::mt19937_64& rng, std::size_t docs, std::size_t max_seqs,
                           std::size_t max_len, std::int64_t vocab);
/// Writes documents with IndexedDatasetBuilder to `prefix` in dtype `dt`.
void write_documents(const std::string& prefix, dataloader::DType dt, const Documents& docs,
                     bool with_modes = false);

}  // namespace packpipe::test
