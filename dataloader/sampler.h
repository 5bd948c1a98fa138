// Deterministic, resumable multi-task sampling into global batches.
//
// An epoch is a permutation of "slots": task t contributes n_t slots (n_t = its split size
// without weights; with weights, its share of samples_per_epoch, up- or down-sampled). The
// permutation is counter-based (keyed Feistel network with cycle walking), so the sampler's
// memory is O(tasks) whatever the epoch size, and state = (seed, epoch, position).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "common/sample_ref.h"

namespace packpipe::dataloader {

/// What the sampler needs to know about the data: task sizes and per-sample token counts.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual std::size_t num_tasks() const = 0;
  /// Samples in task t (all splits).
  virtual std::uint64_t task_size(std::size_t task) const = 0;
  /// Tokens of sample i of task t (input plus target).
  virtual std::uint64_t sample_tokens(std::size_t task, std::uint64_t index) const = 0;
  /// Identity of what the source delivers (MultiTaskDataset::fingerprint), mixed into the sampler's
  /// fingerprint; 0 (the default): none beyond the task sizes and lengths the sampler reads itself.
  virtual std::uint64_t fingerprint() const { return 0; }
};

/// Position j of k evenly spaced positions over [0, n) (k <= n, j < k): floor(j n / k), without a
/// 128-bit product.
inline std::uint64_t evenly_spaced(std::uint64_t n, std::uint64_t k, std::uint64_t j) {
  // with n = q k + r, floor(j n / k) = j q + floor(j r / k), and j r < k^2 fits when k <= 2^32
  return j * (n / k) + j * (n % k) / k;
}

/// A sample: task number and index within the task (over all splits); common/sample_ref.h.
using ::packpipe::SampleRef;

struct GlobalBatch {
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;           ///< batch number within the epoch
  std::uint64_t first_position = 0;  ///< epoch position of samples[0]
  std::uint64_t tokens = 0;          ///< sum of sample_tokens over samples
  std::vector<SampleRef> samples;
};

enum class Split : std::uint8_t { Train = 0, Valid = 1, Test = 2 };
/// The one name table: "train", "valid", "test".
inline constexpr EnumName<Split> kSplitNames[] = {
    {Split::Train, "train"}, {Split::Valid, "valid"}, {Split::Test, "test"}};
/// "train", "valid" or "test".
constexpr const char* split_name(Split s) { return enum_name(kSplitNames, s); }
/// Split from its name ("validation" also names Split::Valid); throws InvalidArgument listing the names.
inline Split split_from_name(const std::string& name) {
  return name == "validation" ? Split::Valid : enum_from_name(kSplitNames, name, "split");
}

struct SamplerConfig {
  std::uint64_t seed = 1234;
  Split split = Split::Train;
  std::array<double, 3> split_fractions{1.0, 0.0, 0.0};  ///< contiguous ranges per task, Megatron-style
  /// Empty: each sample of the split once per epoch. Else one finite weight >= 0 per task: task t
  /// gets n_t = its largest-remainder share of samples_per_epoch (tasks with an empty split range
  /// get 0 and the others share their weight), and each of its samples appears floor or ceil of
  /// n_t / split size times per epoch.
  std::vector<double> weights;
  std::uint64_t samples_per_epoch = 0;    ///< with weights only; 0 means the sum of the split sizes
  std::uint64_t global_batch_tokens = 0;  ///< batch by token budget ...
  std::uint64_t global_batch_samples = 0; ///< ... or by sample count: exactly one is non-zero
  /// A token budget counts the tokens trained (GlobalBatch::tokens stays the sampled tokens): with
  /// context_tokens > 0, a sample over it counts context_tokens (truncated), or 0 with context_drops
  /// (dropped); 0: every token counts (also a sample split into chunks, all trained). Decoder-only
  /// samples (input + target, one sequence).
  std::uint64_t context_tokens = 0;
  bool context_drops = false;
};

/// Keyed bijection on [0, n): a 4-round Feistel network (splitmix64 round function) on the
/// smallest even power of two >= n, with cycle walking back into [0, n). O(1) memory, about
/// 4 x 4 mixes per call in the worst case; identical on every platform for the same (n, key).
class Permutation {
 public:
  static constexpr int kRounds = 4;
  /// n may be 0 (then every call throws); key selects the permutation.
  Permutation(std::uint64_t n = 0, std::uint64_t key = 0);
  std::uint64_t size() const { return n_; }
  /// The image of i in [0, n); throws OutOfRange otherwise.
  std::uint64_t operator()(std::uint64_t i) const;

 private:
  std::uint64_t encrypt(std::uint64_t x) const;
  std::uint64_t n_;
  unsigned half_bits_;
  std::uint64_t round_keys_[kRounds];
};

/// Checkpointable sampler position.
struct SamplerState {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  std::uint64_t position = 0;     ///< next epoch position to deliver
  std::uint64_t batch_index = 0;  ///< index of the next batch within the epoch
  std::uint64_t fingerprint = 0;  ///< hash of config and task sizes; restore() checks it
  /// Digest of the fields above (0: none, a state written before it existed):
  /// with it restore() takes O(tasks) whatever the position, without it it replays the batches.
  std::uint64_t check = 0;
  /// JSON object with the fields above ("check" only when non-zero).
  std::string to_json() const;
  /// Parses to_json() output; throws InvalidArgument naming the missing or bad field.
  static SamplerState from_json(const std::string& text);
};

class Prefetcher;

class Sampler {
 public:
  /// Validates the config against `source` (throws InvalidArgument) and starts epoch 0.
  /// `source` must outlive the sampler.
  Sampler(const SampleSource& source, SamplerConfig config);

  const SamplerConfig& config() const { return config_; }
  /// Samples per epoch of this split.
  std::uint64_t epoch_size() const { return epoch_size_; }
  std::uint64_t epoch() const { return epoch_; }
  std::uint64_t position() const { return position_; }
  /// First and one-past-last sample index of task t in this split.
  std::uint64_t split_begin(std::size_t task) const { return begin_[task]; }
  std::uint64_t split_end(std::size_t task) const { return end_[task]; }
  /// Slots task t has in each epoch.
  std::uint64_t task_slots(std::size_t task) const { return slots_[task]; }

  /// Restarts at the beginning of `epoch` (each epoch has its own order).
  void set_epoch(std::uint64_t epoch);
  /// The sample at `position` of the current epoch (throws OutOfRange past the epoch); O(log tasks),
  /// no state change. Slot = epoch permutation(position); slot k of task t is pass k / size, element
  /// perm_(seed, epoch, t, pass)(k mod size) of the task's split range.
  SampleRef at(std::uint64_t position) const;
  /// Fills `out` with the next global batch; false (out untouched) when the epoch is exhausted.
  /// Token budget: samples are added while the total stays <= budget; a sample longer than the
  /// budget forms a batch of its own (never dropped). The last batch of an epoch may be short.
  bool next_batch(GlobalBatch& out);

  /// Current position; restore() on a sampler with the same config and source resumes exactly here.
  SamplerState state() const;
  /// Resumes from a state of a sampler with the same config and source; throws InvalidArgument
  /// if the fingerprint differs, the position is past the epoch or is not where batch batch_index
  /// starts. O(tasks) when the state carries its check (every state() does); a state without one is
  /// checked by replaying the epoch's batch boundaries up to its position.
  void restore(const SamplerState& state);

 private:
  const SampleSource* source_;
  SamplerConfig config_;
  std::vector<std::uint64_t> begin_, end_, slots_, slot_offset_;
  std::uint64_t epoch_size_ = 0;
  std::uint64_t epoch_ = 0;
  std::uint64_t position_ = 0;
  std::uint64_t batch_index_ = 0;
  std::uint64_t fingerprint_ = 0;
  Permutation epoch_perm_;                 ///< slot order of the current epoch
  /// Per task, what at() reads, in one cache line: split start, split size and pass 0's order this
  /// epoch (one line touched per sample whatever the task count).
  struct TaskDraw {
    std::uint64_t begin = 0, size = 0;
    Permutation first_pass;
  };
  std::vector<TaskDraw> draw_;
  std::uint64_t epoch_key_ = 0;
  void start_epoch(std::uint64_t epoch);

  // The Prefetcher attached to this sampler (one at a time); a copy of a sampler has none.
  struct Attached {
    const Prefetcher* by = nullptr;
    Attached() = default;
    Attached(const Attached&) {}
    Attached& operator=(const Attached&) { return *this; }
  };
  Attached attached_;
  friend class Prefetcher;
};

/// Splits a global batch across `world` data-parallel ranks without overlap: samples go, in batch
/// order, to the rank with the fewest tokens so far (ties to the lowest rank). Deterministic.
std::vector<SampleRef> shard_batch(const GlobalBatch& batch, const SampleSource& source,
                                   std::uint32_t rank, std::uint32_t world);


}  // namespace packpipe::dataloader
