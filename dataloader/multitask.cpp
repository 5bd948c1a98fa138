#include "dataloader/multitask.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <xxhash.h>

#include "common/errors.h"
#include "common/rng.h"

namespace packpipe::dataloader {

struct MultiTaskDataset::Task {
  std::string name;
  TaskLayout layout = TaskLayout::Sequence;
  std::vector<IndexedDataset> shards;   ///< sequences, or inputs for PairedPrefixes
  std::vector<IndexedDataset> targets;  ///< PairedPrefixes: one per shard
  std::vector<std::uint64_t> offsets;   ///< first sample of each shard, plus the total
  bool compressed = false;

  std::uint64_t size() const { return offsets.back(); }

  /// Shard holding sample i (i < size()) and the sample's index within it.
  std::pair<std::size_t, std::uint64_t> locate(std::uint64_t i) const {
    const auto it = std::upper_bound(offsets.begin(), offsets.end(), i);
    const auto s = static_cast<std::size_t>(it - offsets.begin() - 1);
    return {s, i - offsets[s]};
  }

  /// First sequence of document d of `ds` after checking it holds exactly `expected` sequences.
  std::uint64_t document_sequence(const IndexedDataset& ds, std::uint64_t d, std::int64_t expected) const {
    std::int64_t range[2];
    ds.doc_idx().copy(d, 2, range);  // guarded, as every read of the mapped index
    const std::int64_t first = range[0], last = range[1];
    const auto S = static_cast<std::int64_t>(ds.size());
    PACKPIPE_CHECK(first >= 0 && last >= first && last <= S,
                   "{}.idx: document {} spans sequences [{}, {}) (expected a range within [0, {}]); task '{}'",
                   ds.prefix(), d, first, last, S, name);
    PACKPIPE_CHECK(last - first == expected,
                   "{}.idx: document {} holds {} sequences (expected exactly {} for layout {}); task '{}'",
                   ds.prefix(), d, last - first, expected, layout_name(layout), name);
    return static_cast<std::uint64_t>(first);
  }

  /// Sequence numbers (input, target) of sample i; target is meaningful for paired layouts only.
  struct Where {
    const IndexedDataset* input;
    std::uint64_t input_seq;
    const IndexedDataset* target;
    std::uint64_t target_seq;
  };
  Where where(std::uint64_t i) const {
    const auto [s, j] = locate(i);
    const IndexedDataset& ds = shards[s];
    switch (layout) {
      case TaskLayout::Sequence:
        return {&ds, j, nullptr, 0};
      case TaskLayout::PairedPrefixes: {
        const IndexedDataset& tg = targets[s];
        return {&ds, document_sequence(ds, j, 1), &tg, document_sequence(tg, j, 1)};
      }
      case TaskLayout::PairedSequences: {
        const std::uint64_t a = document_sequence(ds, j, 2);
        if (ds.has_modes()) {
          std::int8_t m[2];
          ds.modes().copy(a, 2, m);  // guarded, as every read of the mapped index
          PACKPIPE_CHECK(m[0] == 0 && m[1] == 1,
                         "{}.idx: document {} has sequence modes ({}, {}) (expected 0 then 1 for input and "
                         "target); task '{}'",
                         ds.prefix(), j, int(m[0]), int(m[1]), name);
        }
        return {&ds, a, &ds, a + 1};
      }
    }
    PACKPIPE_ASSERT(false);
    return {};
  }
};

std::uint64_t free_memory_maps() {
  std::uint64_t limit = 65530;  // the kernel's default
  {
    std::ifstream f("/proc/sys/vm/max_map_count");
    std::uint64_t v = 0;
    if (f >> v && v > 0) limit = v;
  }
  std::uint64_t used = 0;
  {
    std::ifstream f("/proc/self/maps");
    std::string line;
    while (std::getline(f, line)) ++used;
  }
  return limit > used ? limit - used : 0;
}

void check_memory_maps(const std::string& manifest, std::uint64_t prefixes, std::uint64_t free_maps,
                       std::uint64_t headroom) {
  const std::uint64_t need = 2 * prefixes;
  PACKPIPE_CHECK(need + headroom <= free_maps,
                 "manifest '{}': its {} dataset prefixes need {} memory maps (a .idx and a .bin each) and this "
                 "process may open {} more under the kernel's limit (vm.max_map_count), keeping {} to spare; merge "
                 "small datasets into fewer prefixes (packpipe dataset merge) or raise vm.max_map_count by at least {}",
                 manifest, prefixes, need, free_maps, headroom, need + headroom - std::min(free_maps, need + headroom));
}

MultiTaskDataset::MultiTaskDataset(const Manifest& manifest) : manifest_(manifest) {
  PACKPIPE_CHECK_ARG(!manifest_.tasks.empty(), "manifest '{}': no tasks (expected at least one)", manifest_.path);
  PACKPIPE_CHECK_ARG(manifest_.tasks.size() <= 0xffffffffULL, "manifest '{}': {} tasks (expected < 2^32)",
                     manifest_.path, manifest_.tasks.size());
  {
    std::uint64_t prefixes = 0;
    for (const TaskSpec& spec : manifest_.tasks) prefixes += spec.prefixes.size() + spec.target_prefixes.size();
    check_memory_maps(manifest_.path, prefixes, free_memory_maps());  // before any file is opened
  }
  for (std::size_t t = 0; t < manifest_.tasks.size(); ++t) {
    const TaskSpec& spec = manifest_.tasks[t];
    auto task = std::make_unique<Task>();
    task->name = spec.name;
    task->layout = spec.layout;
    const std::string where = fmt::format("manifest '{}': task {} ('{}')", manifest_.path, t, spec.name);
    PACKPIPE_CHECK_ARG(!spec.prefixes.empty(), "{}: no prefixes (expected at least one)", where);
    if (spec.layout == TaskLayout::PairedPrefixes) {
      PACKPIPE_CHECK_ARG(spec.target_prefixes.size() == spec.prefixes.size(),
                         "{}: {} target prefixes for {} input prefixes (expected one per input)", where,
                         spec.target_prefixes.size(), spec.prefixes.size());
    }
    task->offsets.push_back(0);
    for (std::size_t s = 0; s < spec.prefixes.size(); ++s) {
      task->shards.emplace_back(spec.prefixes[s]);
      const IndexedDataset& ds = task->shards.back();
      PACKPIPE_CHECK(ds.dtype() == task->shards.front().dtype(),
                     "{}: '{}' has dtype {} but '{}' has {} (expected one dtype per task)", where, ds.prefix(),
                     dtype_name(ds.dtype()), task->shards.front().prefix(), dtype_name(task->shards.front().dtype()));
      std::uint64_t samples = 0;
      switch (spec.layout) {
        case TaskLayout::Sequence:
          samples = ds.size();
          break;
        case TaskLayout::PairedSequences:
          samples = ds.num_documents();
          break;
        case TaskLayout::PairedPrefixes: {
          task->targets.emplace_back(spec.target_prefixes[s]);
          const IndexedDataset& tg = task->targets.back();
          PACKPIPE_CHECK(ds.num_documents() == tg.num_documents(),
                         "{}: inputs '{}.idx' has {} documents but targets '{}.idx' has {} (expected equal counts, "
                         "document i of both being sample i)",
                         where, ds.prefix(), ds.num_documents(), tg.prefix(), tg.num_documents());
          PACKPIPE_CHECK(tg.dtype() == ds.dtype(),
                         "{}: targets '{}' has dtype {} but inputs '{}' has {} (expected one dtype per task)", where,
                         tg.prefix(), dtype_name(tg.dtype()), ds.prefix(), dtype_name(ds.dtype()));
          task->compressed = task->compressed || tg.compressed();
          samples = ds.num_documents();
          break;
        }
      }
      task->compressed = task->compressed || ds.compressed();
      task->offsets.push_back(add_checked(task->offsets.back(), samples, "task sample count"));
    }
    Lengths fast;
    if (task->layout == TaskLayout::Sequence && task->shards.size() == 1 && !task->shards[0].sizes().guarded()) {
      fast = Lengths{task->shards[0].sizes().bytes(), task->shards[0].size()};
    }
    lengths_.push_back(fast);
    tasks_.push_back(std::move(task));
  }
  fingerprint_ = identity();
}

namespace {

std::uint64_t text_hash(const std::string& s) { return XXH64(s.data(), s.size(), 0); }

std::uint64_t double_hash(double d) {
  std::uint64_t u = 0;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

}  // namespace

std::uint64_t MultiTaskDataset::identity() const {
  std::uint64_t h = mix_combine(0x4d414e4946455354ULL, tasks_.size());  // "MANIFEST"
  h = mix_combine(h, manifest_.weighted);
  for (double f : manifest_.split) h = mix_combine(h, double_hash(f));
  h = mix_combine(h, manifest_.samples_per_epoch);
  auto add_file = [&](const IndexedDataset& ds) {
    h = mix_combine(h, text_hash(std::filesystem::path(ds.prefix()).filename().string()));
    h = mix_combine(h, static_cast<std::uint64_t>(ds.dtype()));
    h = mix_combine(mix_combine(mix_combine(h, ds.size()), ds.num_documents()), ds.num_tokens());
    // The lengths of up to 256 evenly spaced sequences, from the index (O(1) per file; no document is
    // read, so a malformed one is still refused at its access, not here).
    const std::uint64_t n = ds.size(), k = std::min<std::uint64_t>(n, 256);
    for (std::uint64_t j = 0; j < k; ++j) h = mix_combine(h, ds.length(evenly_spaced(n, k, j)));
  };
  for (std::size_t t = 0; t < tasks_.size(); ++t) {
    const Task& task = *tasks_[t];
    h = mix_combine(h, text_hash(task.name));
    h = mix_combine(h, static_cast<std::uint64_t>(task.layout));
    h = mix_combine(h, manifest_.weighted ? double_hash(manifest_.tasks[t].weight) : 0);
    h = mix_combine(h, task.shards.size());
    for (const auto& ds : task.shards) add_file(ds);
    for (const auto& ds : task.targets) add_file(ds);
  }
  return h;
}

MultiTaskDataset MultiTaskDataset::from_prefix(const std::string& prefix) {
  Manifest m;
  m.path = prefix;
  TaskSpec spec;
  spec.name = std::filesystem::path(prefix).filename().string();
  if (spec.name.empty()) spec.name = prefix;
  spec.prefixes = {prefix};
  m.tasks.push_back(std::move(spec));
  return MultiTaskDataset(m);
}

MultiTaskDataset::~MultiTaskDataset() = default;
MultiTaskDataset::MultiTaskDataset(MultiTaskDataset&&) noexcept = default;

std::size_t MultiTaskDataset::num_tasks() const { return tasks_.size(); }

std::uint64_t MultiTaskDataset::task_size(std::size_t task) const {
  PACKPIPE_CHECK_RANGE(task < tasks_.size(), "task {} out of range (expected < {})", task, tasks_.size());
  return tasks_[task]->size();
}

std::uint64_t MultiTaskDataset::sample_tokens(std::size_t task, std::uint64_t index) const {
  if (task < lengths_.size()) {
    const Lengths& l = lengths_[task];
    if (l.sizes != nullptr && index < l.count) {
      std::int32_t v;
      std::memcpy(&v, l.sizes + index * sizeof v, sizeof v);
      if (v >= 0) return static_cast<std::uint64_t>(v);  // else the checked path below names the error
    }
  }
  return std::uint64_t{input_length(SampleRef{static_cast<std::uint32_t>(task), index})} +
         target_length(SampleRef{static_cast<std::uint32_t>(task), index});
}

bool MultiTaskDataset::encoder_decoder(std::size_t task) const {
  PACKPIPE_CHECK_RANGE(task < tasks_.size(), "task {} out of range (expected < {})", task, tasks_.size());
  return tasks_[task]->layout != TaskLayout::Sequence;
}

DType MultiTaskDataset::dtype(std::size_t task) const {
  PACKPIPE_CHECK_RANGE(task < tasks_.size(), "task {} out of range (expected < {})", task, tasks_.size());
  return tasks_[task]->shards.front().dtype();
}

bool MultiTaskDataset::task_compressed(std::size_t task) const {
  PACKPIPE_CHECK_RANGE(task < tasks_.size(), "task {} out of range (expected < {})", task, tasks_.size());
  return tasks_[task]->compressed;
}

void MultiTaskDataset::check_sample(std::size_t task, std::uint64_t index) const {
  PACKPIPE_CHECK_RANGE(task < tasks_.size(), "sample (task {}, index {}): task out of range (the dataset has {} "
                       "tasks)", task, index, tasks_.size());
  const Task& t = *tasks_[task];
  PACKPIPE_CHECK_RANGE(index < t.size(), "sample (task {}, index {}): index out of range (task '{}' has {} samples)",
                       task, index, t.name, t.size());
}

const MultiTaskDataset::Task& MultiTaskDataset::checked(SampleRef ref) const {
  check_sample(ref.task, ref.index);
  return *tasks_[ref.task];
}

std::uint32_t MultiTaskDataset::input_length(SampleRef ref) const {
  const Task& t = checked(ref);
  const auto w = t.where(ref.index);
  return w.input->length(w.input_seq);
}

std::uint32_t MultiTaskDataset::target_length(SampleRef ref) const {
  const Task& t = checked(ref);
  if (t.layout == TaskLayout::Sequence) return 0;
  const auto w = t.where(ref.index);
  return w.target->length(w.target_seq);
}

SampleView MultiTaskDataset::view(SampleRef ref) const {
  const Task& t = checked(ref);
  const auto w = t.where(ref.index);
  SampleView v;
  v.ref = ref;
  v.input = w.input->view(w.input_seq);
  if (w.target != nullptr) {
    v.target = w.target->view(w.target_seq);
  } else {
    v.target = TokenSpan{nullptr, 0, w.input->dtype()};
  }
  return v;
}

void MultiTaskDataset::read_sample(SampleRef ref, std::vector<std::uint8_t>& input,
                                   std::vector<std::uint8_t>& target) const {
  const Task& t = checked(ref);
  const auto w = t.where(ref.index);
  input = w.input->read(w.input_seq);
  if (w.target != nullptr) {
    target = w.target->read(w.target_seq);
  } else {
    target.clear();
  }
}

void MultiTaskDataset::read_range(SampleRef ref, std::uint64_t input_begin, std::uint64_t n_input,
                                  std::uint64_t target_begin, std::uint64_t n_target, std::vector<std::uint8_t>& input,
                                  std::vector<std::uint8_t>& target) const {
  const Task& t = checked(ref);
  const auto w = t.where(ref.index);
  const std::uint64_t have_input = w.input->length(w.input_seq);
  const std::uint64_t have_target = w.target != nullptr ? w.target->length(w.target_seq) : 0;
  // Ends compared without overflow: a begin past the side is refused before its sum is formed.
  PACKPIPE_CHECK_RANGE(input_begin <= have_input && n_input <= have_input - input_begin &&
                           target_begin <= have_target && n_target <= have_target - target_begin,
                       "task '{}' sample {}: input tokens [{}, +{}) and target tokens [{}, +{}) asked for, it has {} "
                       "and {}",
                       manifest_.tasks[ref.task].name, ref.index, input_begin, n_input, target_begin, n_target,
                       have_input, have_target);
  input.resize(n_input * w.input->itemsize());
  // guarded: MappedFile::read or a zstd frame copy
  if (n_input > 0) w.input->read(w.input_seq, input_begin, n_input, input.data());
  target.resize(w.target != nullptr ? n_target * w.target->itemsize() : 0);
  if (n_target > 0) w.target->read(w.target_seq, target_begin, n_target, target.data());
}

bool MultiTaskDataset::compressed() const {
  return std::any_of(tasks_.begin(), tasks_.end(), [](const auto& t) { return t->compressed; });
}

SamplerConfig sampler_config(const Manifest& manifest) {
  SamplerConfig c;
  c.split_fractions = manifest.split;
  c.samples_per_epoch = manifest.samples_per_epoch;
  if (manifest.weighted) {
    for (const auto& t : manifest.tasks) c.weights.push_back(t.weight);
  }
  return c;
}

}  // namespace packpipe::dataloader
