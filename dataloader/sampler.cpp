#include "dataloader/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <numeric>
#include <queue>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/json.h"
#include "common/rng.h"

namespace packpipe::dataloader {

namespace {

inline std::uint64_t combine(std::uint64_t a, std::uint64_t b) { return mix_combine(a, b); }

std::uint64_t double_bits(double d) {
  std::uint64_t u = 0;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

// Domain-separation constants for the keys derived from the seed.
constexpr std::uint64_t kEpochTag = 0x45504f4348ULL;  // "EPOCH"
constexpr std::uint64_t kTaskTag = 0x5441534bULL;     // "TASK"

std::uint64_t epoch_key(std::uint64_t seed, std::uint64_t epoch) {
  return combine(combine(seed, kEpochTag), epoch);
}

// The check of a state: a digest of its fields, so a state whose position, batch index, epoch or
// fingerprint was edited (or corrupted) without recomputing it is refused. Not a secret: it guards
// against mistakes, as the fingerprint does, not against forgery.
constexpr std::uint64_t kStateTag = 0x5354415445ULL;  // "STATE"

std::uint64_t state_check(const SamplerState& s) {
  std::uint64_t h = combine(combine(s.fingerprint, kStateTag), s.seed);
  h = combine(combine(combine(h, s.epoch), s.position), s.batch_index);
  return h == 0 ? 1 : h;  // 0 means "no check"
}

std::uint64_t task_key(std::uint64_t epoch_key, std::size_t task, std::uint64_t pass) {
  return combine(combine(combine(epoch_key, kTaskTag), task), pass);
}

}  // namespace

// ---- Permutation -----------------------------------------------------------

Permutation::Permutation(std::uint64_t n, std::uint64_t key) : n_(n), half_bits_(0) {
  // Smallest h with 4^h >= n, so the Feistel domain 2^(2h) is below 4n and cycle walking takes
  // fewer than 4 steps on average.
  while (half_bits_ < 32 && (std::uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
  std::uint64_t k = mix64(key ^ 0x5045524dULL);  // "PERM"
  for (int r = 0; r < kRounds; ++r) {
    k = mix64(k + kSplitMixGamma);
    round_keys_[r] = k;
  }
}

std::uint64_t Permutation::encrypt(std::uint64_t x) const {
  const unsigned h = half_bits_;
  const std::uint64_t mask = (h == 32) ? 0xffffffffULL : ((std::uint64_t{1} << h) - 1);
  std::uint64_t left = (x >> h) & mask;
  std::uint64_t right = x & mask;
  for (int r = 0; r < kRounds; ++r) {
    const std::uint64_t f = mix64(right ^ round_keys_[r]) & mask;
    const std::uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << h) | right;
}

std::uint64_t Permutation::operator()(std::uint64_t i) const {
  PACKPIPE_CHECK_RANGE(i < n_, "permutation index {} out of range (expected < {})", i, n_);
  if (n_ <= 1) return i;
  std::uint64_t x = i;
  // x stays on i's cycle of the domain permutation, which holds i itself: this terminates.
  do {
    x = encrypt(x);
  } while (x >= n_);
  return x;
}

// ---- SamplerState --------------------------------------------------------------

std::string SamplerState::to_json() const {
  nlohmann::json j;
  j["seed"] = seed;
  j["epoch"] = epoch;
  j["position"] = position;
  j["batch_index"] = batch_index;
  // As a hex string: JSON readers that hold numbers in doubles would round a 64-bit hash.
  j["fingerprint"] = fmt::format("{:016x}", fingerprint);
  if (check != 0) j["check"] = fmt::format("{:016x}", check);
  return j.dump();
}

SamplerState SamplerState::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = parse_json(text, "sampler state");  // a repeated "position" would replay batches: refused
  } catch (const Error& e) {
    PACKPIPE_THROW(InvalidArgument, "{}", e.what());
  }
  PACKPIPE_CHECK_ARG(j.is_object(), "sampler state: expected a JSON object, found {}", j.type_name());
  auto field = [&](const char* key) -> std::uint64_t {
    PACKPIPE_CHECK_ARG(j.contains(key), "sampler state: missing field '{}'", key);
    const auto& v = j[key];
    PACKPIPE_CHECK_ARG(v.is_number_unsigned(), "sampler state: field '{}': expected an integer >= 0, found {}",
                       key, v.dump());
    return v.get<std::uint64_t>();
  };
  SamplerState s;
  s.seed = field("seed");
  s.epoch = field("epoch");
  s.position = field("position");
  s.batch_index = field("batch_index");
  // 64-bit hashes as hex strings (an integer is accepted too).
  auto hex_field = [&](const char* key) -> std::uint64_t {
    const auto& f = j[key];
    if (f.is_number_unsigned()) return f.get<std::uint64_t>();
    const std::string hex = f.is_string() ? f.get<std::string>() : std::string();
    bool ok = !hex.empty() && hex.size() <= 16;
    std::uint64_t v = 0;
    for (char c : hex) {
      int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                                 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) ok = false;
      v = (v << 4) | static_cast<std::uint64_t>(d < 0 ? 0 : d);
    }
    PACKPIPE_CHECK_ARG(ok, "sampler state: field '{}': expected up to 16 hex digits, found {}", key, f.dump());
    return v;
  };
  PACKPIPE_CHECK_ARG(j.contains("fingerprint"), "sampler state: missing field 'fingerprint'");
  s.fingerprint = hex_field("fingerprint");
  if (j.contains("check")) {
    s.check = hex_field("check");
    PACKPIPE_CHECK_ARG(s.check != 0, "sampler state: field 'check' is 0 (expected the digest state() writes)");
  }
  return s;
}

// ---- Sampler -------------------------------------------------------------------

Sampler::Sampler(const SampleSource& source, SamplerConfig config)
    : source_(&source), config_(std::move(config)) {
  const std::size_t T = source.num_tasks();
  PACKPIPE_CHECK_ARG(T > 0, "sampler: the source has no tasks (expected at least 1)");
  PACKPIPE_CHECK_ARG(T <= 0xffffffffULL, "sampler: {} tasks (expected at most 2^32 - 1)", T);
  PACKPIPE_CHECK_ARG((config_.global_batch_tokens == 0) != (config_.global_batch_samples == 0),
                     "sampler: expected exactly one of global_batch_tokens and global_batch_samples to be "
                     "non-zero, found {} and {}",
                     config_.global_batch_tokens, config_.global_batch_samples);
  const auto s = static_cast<std::size_t>(config_.split);
  PACKPIPE_CHECK_ARG(s < std::size(kSplitNames), "sampler: split {} (expected 0..{}: {})", s,
                     std::size(kSplitNames) - 1, enum_name_list(kSplitNames));

  // Megatron-style bookends: normalise, accumulate, round(b * n).
  double total = 0.0;
  for (double f : config_.split_fractions) {
    PACKPIPE_CHECK_ARG(std::isfinite(f) && f >= 0.0, "sampler: split fraction {} (expected a finite number >= 0)", f);
    total += f;
  }
  PACKPIPE_CHECK_ARG(total > 0.0 && std::isfinite(total), "sampler: split fractions sum to {} (expected > 0)", total);
  std::array<double, 4> bookend{0.0, 0.0, 0.0, 1.0};
  for (int i = 0; i < 3; ++i) bookend[i + 1] = bookend[i] + config_.split_fractions[i] / total;

  begin_.resize(T);
  end_.resize(T);
  slots_.assign(T, 0);
  slot_offset_.assign(T + 1, 0);
  std::uint64_t split_total = 0;
  for (std::size_t t = 0; t < T; ++t) {
    const std::uint64_t n = source.task_size(t);
    auto at = [&](int b) -> std::uint64_t {
      if (b == 0) return 0;
      if (b == 3) return n;
      const double x = std::nearbyint(bookend[b] * static_cast<double>(n));
      return x <= 0.0 ? 0 : std::min<std::uint64_t>(n, static_cast<std::uint64_t>(x));
    };
    begin_[t] = at(static_cast<int>(s));
    end_[t] = std::max(begin_[t], at(static_cast<int>(s) + 1));
    split_total = add_checked(split_total, end_[t] - begin_[t], "sampler split size");
  }

  // Quotas are computed in double: beyond 2^48 samples an epoch would neither be exact nor ever end.
  constexpr std::uint64_t kMaxSamplesPerEpoch = std::uint64_t{1} << 48;
  PACKPIPE_CHECK_ARG(config_.samples_per_epoch <= kMaxSamplesPerEpoch,
                     "sampler: samples_per_epoch = {} (expected at most 2^48 = {})", config_.samples_per_epoch,
                     kMaxSamplesPerEpoch);
  if (config_.weights.empty()) {
    PACKPIPE_CHECK_ARG(config_.samples_per_epoch == 0,
                       "sampler: samples_per_epoch = {} needs weights (without weights every sample of the split "
                       "is drawn once per epoch)",
                       config_.samples_per_epoch);
    for (std::size_t t = 0; t < T; ++t) slots_[t] = end_[t] - begin_[t];
  } else {
    PACKPIPE_CHECK_ARG(config_.weights.size() == T, "sampler: {} weights for {} tasks (expected one per task)",
                       config_.weights.size(), T);
    double wsum = 0.0;
    for (std::size_t t = 0; t < T; ++t) {
      const double w = config_.weights[t];
      PACKPIPE_CHECK_ARG(std::isfinite(w) && w >= 0.0, "sampler: weight of task {} is {} (expected a finite number >= 0)",
                         t, w);
      if (end_[t] > begin_[t]) wsum += w;
    }
    const std::uint64_t E = config_.samples_per_epoch != 0 ? config_.samples_per_epoch : split_total;
    if (E > 0) {
      PACKPIPE_CHECK_ARG(wsum > 0.0 && std::isfinite(wsum),
                         "sampler: the tasks with samples in split '{}' have total weight {} (expected > 0 to fill "
                         "{} samples per epoch)",
                         split_name(config_.split), wsum, E);
      // Largest remainder: floors of the quotas, then +1 by descending remainder (ties: lower task).
      std::vector<double> rem(T, -1.0);
      std::uint64_t assigned = 0;
      std::vector<std::size_t> eligible;
      for (std::size_t t = 0; t < T; ++t) {
        if (end_[t] == begin_[t] || config_.weights[t] == 0.0) continue;
        const double q = static_cast<double>(E) * (config_.weights[t] / wsum);
        const double fl = std::floor(q);
        slots_[t] = std::min<std::uint64_t>(E, static_cast<std::uint64_t>(fl));
        rem[t] = q - fl;
        assigned += slots_[t];
        eligible.push_back(t);
      }
      std::stable_sort(eligible.begin(), eligible.end(),
                       [&](std::size_t a, std::size_t b) { return rem[a] > rem[b]; });
      // Rounding can leave more than #tasks to place, or overshoot by a few: loop until exact.
      for (std::size_t i = 0; assigned < E; i = (i + 1) % eligible.size()) {
        ++slots_[eligible[i]];
        ++assigned;
      }
      for (std::size_t i = eligible.size(); assigned > E;) {
        i = (i == 0 ? eligible.size() : i) - 1;
        if (slots_[eligible[i]] > 0) {
          --slots_[eligible[i]];
          --assigned;
        }
      }
    }
  }
  for (std::size_t t = 0; t < T; ++t) {
    slot_offset_[t + 1] = add_checked(slot_offset_[t], slots_[t], "sampler epoch size");
  }
  epoch_size_ = slot_offset_[T];

  // Fingerprint: everything that changes the sequence of batches, except per-sample lengths (O(N)).
  std::uint64_t h = combine(0x5041434b50495045ULL, config_.seed);  // "PACKPIPE"
  h = combine(h, static_cast<std::uint64_t>(config_.split));
  for (double f : config_.split_fractions) h = combine(h, double_bits(f));
  h = combine(h, config_.weights.size());
  for (double w : config_.weights) h = combine(h, double_bits(w));
  h = combine(h, config_.samples_per_epoch);
  h = combine(h, config_.global_batch_tokens);
  h = combine(h, config_.global_batch_samples);
  if (config_.context_tokens > 0) {  // (absent without a context length: earlier states stay valid)
    h = combine(combine(h, config_.context_tokens), static_cast<std::uint64_t>(config_.context_drops));
  }
  h = combine(h, T);
  h = combine(h, source.fingerprint());  // the tasks' names, order, files and weights (a manifest's identity)
  for (std::size_t t = 0; t < T; ++t) h = combine(combine(h, source.task_size(t)), slots_[t]);
  // And the data: the token counts of up to 256 evenly spaced samples per task (O(tasks), not
  // O(samples)), so a state saved on another dataset of the same sizes is refused too.
  for (std::size_t t = 0; t < T; ++t) {
    const std::uint64_t n = source.task_size(t);
    const std::uint64_t k = std::min<std::uint64_t>(n, 256);
    for (std::uint64_t j = 0; j < k; ++j) h = combine(h, source.sample_tokens(t, evenly_spaced(n, k, j)));
  }
  fingerprint_ = h;

  start_epoch(0);
}

void Sampler::start_epoch(std::uint64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  batch_index_ = 0;
  epoch_key_ = epoch_key(config_.seed, epoch);
  epoch_perm_ = Permutation(epoch_size_, epoch_key_);
  draw_.resize(slots_.size());
  for (std::size_t t = 0; t < slots_.size(); ++t) {
    draw_[t] = TaskDraw{begin_[t], end_[t] - begin_[t], Permutation(end_[t] - begin_[t], task_key(epoch_key_, t, 0))};
  }
}

void Sampler::set_epoch(std::uint64_t epoch) { start_epoch(epoch); }

SampleRef Sampler::at(std::uint64_t position) const {
  PACKPIPE_CHECK_RANGE(position < epoch_size_, "sampler: position {} out of range (epoch size {})", position,
                       epoch_size_);
  const std::uint64_t slot = epoch_perm_(position);
  const auto it = std::upper_bound(slot_offset_.begin(), slot_offset_.end(), slot);
  const auto t = static_cast<std::size_t>(it - slot_offset_.begin() - 1);
  const TaskDraw& d = draw_[t];
  const std::uint64_t k = slot - slot_offset_[t];
  const std::uint64_t pass = k / d.size;
  const std::uint64_t j = k % d.size;
  const std::uint64_t element = pass == 0 ? d.first_pass(j) : Permutation(d.size, task_key(epoch_key_, t, pass))(j);
  return SampleRef{static_cast<std::uint32_t>(t), d.begin + element};
}

bool Sampler::next_batch(GlobalBatch& out) {
  if (position_ >= epoch_size_) return false;
  GlobalBatch b;
  b.epoch = epoch_;
  b.index = batch_index_;
  b.first_position = position_;
  std::uint64_t pos = position_;
  if (config_.global_batch_samples != 0) {
    const std::uint64_t n = std::min(config_.global_batch_samples, epoch_size_ - pos);
    b.samples.reserve(n);
    for (std::uint64_t i = 0; i < n; ++i, ++pos) {
      const SampleRef r = at(pos);
      b.tokens += source_->sample_tokens(r.task, r.index);
      b.samples.push_back(r);
    }
  } else {
    const std::uint64_t budget = config_.global_batch_tokens;
    const std::uint64_t L = config_.context_tokens;
    std::uint64_t counted = 0;  // the budget's count: what is trained of each sample
    while (pos < epoch_size_) {
      const SampleRef r = at(pos);
      const std::uint64_t tok = source_->sample_tokens(r.task, r.index);
      const std::uint64_t trained = L > 0 && tok > L ? (config_.context_drops ? 0 : L) : tok;
      if (!b.samples.empty() && (trained > budget - counted)) break;  // counted <= budget here
      b.samples.push_back(r);
      b.tokens += tok;
      counted += trained;
      ++pos;
      if (counted > budget) break;  // a single oversize sample is a batch of its own
    }
  }
  position_ = pos;
  ++batch_index_;
  out = std::move(b);
  return true;
}

SamplerState Sampler::state() const {
  SamplerState s;
  s.seed = config_.seed;
  s.epoch = epoch_;
  s.position = position_;
  s.batch_index = batch_index_;
  s.fingerprint = fingerprint_;
  s.check = state_check(s);
  return s;
}

void Sampler::restore(const SamplerState& state) {
  PACKPIPE_CHECK_ARG(state.fingerprint == fingerprint_ && state.seed == config_.seed,
                     "sampler restore: state fingerprint {:016x} (seed {}) does not match this sampler's {:016x} "
                     "(seed {}): the config or the task sizes differ",
                     state.fingerprint, state.seed, fingerprint_, config_.seed);
  PACKPIPE_CHECK_ARG(state.position <= epoch_size_, "sampler restore: position {} is past the epoch size {}",
                     state.position, epoch_size_);
  constexpr std::uint64_t kMaxEpoch = std::uint64_t{1} << 32;
  PACKPIPE_CHECK_ARG(state.epoch < kMaxEpoch, "sampler restore: epoch {} (expected below 2^32; the state is corrupt)",
                     state.epoch);
  PACKPIPE_CHECK_ARG(state.batch_index <= state.position,
                     "sampler restore: batch_index {} with position {} (every batch holds at least one sample; the "
                     "state is corrupt)",
                     state.batch_index, state.position);
  // The position must be where batch `batch_index` starts: a position moved by one would skip or
  // repeat a sample. A state with its check proves it in O(1) (state() wrote it at a boundary);
  // sample-count batches are checked in O(1) anyway; a token-budget state without a check by
  // replaying the epoch's batch boundaries up to the position (O(position), once per restore).
  if (state.check != 0) {
    PACKPIPE_CHECK_ARG(state.check == state_check(state),
                       "sampler restore: the state's check {:016x} does not match its fields (epoch {}, position {}, "
                       "batch_index {}): the state was edited or corrupted, and resuming would skip or repeat "
                       "samples",
                       state.check, state.epoch, state.position, state.batch_index);
  }
  std::uint64_t expected = 0;
  if (state.check != 0) {
    expected = state.position;
  } else if (config_.global_batch_samples != 0) {
    const std::uint64_t g = config_.global_batch_samples;
    const std::uint64_t batches = epoch_size_ / g + (epoch_size_ % g != 0);
    PACKPIPE_CHECK_ARG(state.batch_index <= batches,
                       "sampler restore: batch_index {} is past the epoch's {} batches (the state is corrupt)",
                       state.batch_index, batches);
    expected = std::min(state.batch_index * g, epoch_size_);
  } else {
    Sampler probe(*this);
    probe.start_epoch(state.epoch);
    GlobalBatch b;
    for (std::uint64_t k = 0; k < state.batch_index; ++k) {
      PACKPIPE_CHECK_ARG(probe.next_batch(b),
                         "sampler restore: batch_index {} is past the epoch's {} batches (the state is corrupt)",
                         state.batch_index, k);
      if (probe.position_ > state.position) break;
    }
    expected = probe.position_;
  }
  PACKPIPE_CHECK_ARG(expected == state.position,
                     "sampler restore: position {} is not where batch {} of epoch {} starts (expected {}); the state "
                     "was edited or belongs to another configuration, and resuming would skip or repeat samples",
                     state.position, state.batch_index, state.epoch, expected);
  start_epoch(state.epoch);
  position_ = state.position;
  batch_index_ = state.batch_index;
}

// ---- sharding -------------------------------------------------------------------

std::vector<SampleRef> shard_batch(const GlobalBatch& batch, const SampleSource& source, std::uint32_t rank,
                                   std::uint32_t world) {
  PACKPIPE_CHECK_ARG(world > 0, "shard_batch: world size 0 (expected >= 1)");
  PACKPIPE_CHECK_ARG(rank < world, "shard_batch: rank {} (expected < world size {})", rank, world);
  using Load = std::pair<std::uint64_t, std::uint32_t>;  // (tokens so far, rank): ties to the lowest rank
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  // Only the first min(world, samples) ranks can receive a sample: rank r is the least loaded, ties
  // to the lowest, only once ranks 0..r-1 hold tokens, which takes r samples before it. So the
  // greedy over those ranks is the greedy over all of them, in O(samples) memory (a world of 2^31
  // built a heap of 2^31 ranks).
  const auto used = static_cast<std::uint32_t>(std::min<std::uint64_t>(world, batch.samples.size()));
  std::vector<SampleRef> out;
  if (rank >= used) return out;
  for (std::uint32_t r = 0; r < used; ++r) heap.emplace(0, r);
  for (const SampleRef& s : batch.samples) {
    Load l = heap.top();
    heap.pop();
    if (l.second == rank) out.push_back(s);
    l.first += source.sample_tokens(s.task, s.index);
    heap.push(l);
  }
  return out;
}

}  // namespace packpipe::dataloader
