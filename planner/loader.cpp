#include "planner/loader.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <iterator>
#include <memory>

#include <fmt/format.h>

#include "common/background_queue.h"
#include "common/errors.h"
#include "dataloader/dtype.h"
#include "packing/rows.h"
#include "plan/format.h"
#include "planner/context.h"
#include "planner/detail/rethrow.h"

namespace packpipe::planner {

namespace {

// An encoder-decoder plan: some virtual stage holds decoder layers.
bool has_decoder(const pl::Plan& plan) {
  return std::any_of(plan.stages.begin(), plan.stages.end(), [](const pl::StageSpec& s) { return s.decoder_layers > 0; });
}

// Checks micro-batch `m` of `plan` for assembly (a format-2 plan, one length per sample, row offsets
// over its samples) and returns its rows as CSR offsets (one row per sample when the plan's are empty).
std::vector<std::uint64_t> checked_rows(const pl::Plan& plan, std::size_t m, bool encdec) {
  PACKPIPE_CHECK_RANGE(m < plan.microbatches.size(), "iteration {}: micro-batch {} is out of range (the plan has {})",
                       plan.iteration, m, plan.microbatches.size());
  PACKPIPE_CHECK_ARG(plan.has_stage_specs(),
                     "iteration {}: the plan has no stage specs (a format-1 plan), so it does not say what a LOAD_MB "
                     "brings or how long each sample is; plan it again with this version",
                     plan.iteration);
  const pl::PlanMicroBatch& mb = plan.microbatches[m];
  const std::size_t n = mb.samples.size();
  PACKPIPE_CHECK_ARG(mb.lengths.size() == n, "iteration {}, micro-batch {}: {} sample lengths for {} samples",
                     plan.iteration, m, mb.lengths.size(), n);
  if (encdec) {
    PACKPIPE_CHECK_ARG(mb.target_lengths.size() == n,
                       "iteration {}, micro-batch {}: {} target lengths for {} samples (an encoder-decoder plan gives "
                       "one per sample)",
                       plan.iteration, m, mb.target_lengths.size(), n);
  } else {
    PACKPIPE_CHECK_ARG(mb.target_lengths.empty(),
                       "iteration {}, micro-batch {}: {} target lengths in a decoder-only plan (expected none)",
                       plan.iteration, m, mb.target_lengths.size());
  }
  std::vector<std::uint64_t> offsets;
  if (mb.row_offsets.empty()) {
    for (std::uint64_t i = 0; i <= n; ++i) offsets.push_back(i);
  } else {
    offsets.assign(mb.row_offsets.begin(), mb.row_offsets.end());
    PACKPIPE_CHECK_ARG(offsets.size() >= 2 && offsets.front() == 0 && offsets.back() == n &&
                           std::is_sorted(offsets.begin(), offsets.end()),
                       "iteration {}, micro-batch {}: its row offsets do not cover its {} samples in order",
                       plan.iteration, m, n);
  }
  PACKPIPE_CHECK_ARG(offsets.size() - 1 == mb.rows, "iteration {}, micro-batch {}: {} rows, but its row offsets give {}",
                     plan.iteration, m, mb.rows, offsets.size() - 1);
  return offsets;
}

// Checks that every row of one side of micro-batch `m` fits the side's padded length.
void check_rows_fit(const pl::Plan& plan, std::size_t m, const std::vector<std::uint64_t>& offsets,
                    const std::vector<std::uint32_t>& lengths, std::uint32_t width, const char* side) {
  PACKPIPE_CHECK_ARG(width > 0, "iteration {}, micro-batch {}: the {} padded length is 0", plan.iteration, m, side);
  for (std::size_t r = 0; r + 1 < offsets.size(); ++r) {
    std::uint64_t used = 0;
    for (auto k = offsets[r]; k < offsets[r + 1]; ++k) used += lengths[k];
    PACKPIPE_CHECK_ARG(used <= width, "iteration {}, micro-batch {}: row {} holds {} {} tokens, more than its padded "
                       "length {}", plan.iteration, m, r, used, side, width);
  }
}

// Decodes input tokens [input_begin, +n_input) and target tokens [target_begin, +n_target) of a
// sample into `input` and `target`, from a copy made through the guarded reads
// (MultiTaskDataset::read_range): a `.bin` truncated under a live loader is an Error naming the
// file, never SIGBUS. Never from a view.
void read_tokens(const dl::MultiTaskDataset& data, SampleRef ref, std::uint32_t input_begin, std::uint32_t n_input,
                 std::uint32_t target_begin, std::uint32_t n_target, std::vector<std::int64_t>& input,
                 std::vector<std::int64_t>& target) {
  input.resize(n_input);
  target.resize(n_target);
  if (n_input == 0 && n_target == 0) return;
  const dl::DType dt = data.dtype(ref.task);
  thread_local std::vector<std::uint8_t> in, tg;  // reused: one copy per sample, no allocation
  data.read_range(ref, input_begin, n_input, target_begin, n_target, in, tg);
  dl::decode_tokens(in.data(), n_input, dt, input.data());
  dl::decode_tokens(tg.data(), n_target, dt, target.data());
}

// "sample k (task 'name', dataset sample i)" for messages.
std::string sample_name(const dl::MultiTaskDataset& data, std::size_t k, SampleRef ref) {
  const auto& tasks = data.manifest().tasks;
  const std::string task = ref.task < tasks.size() ? fmt::format("task '{}'", tasks[ref.task].name)
                                                   : fmt::format("task {}", ref.task);
  return fmt::format("sample {} ({}, dataset sample {}{})", k, task, ref.index,
                     ref.offset > 0 ? fmt::format(", its chunk from token {}", ref.offset) : std::string());
}

}  // namespace

RowLayout microbatch_layout(const pl::Plan& plan, std::size_t m, bool decoder) {
  const bool encdec = has_decoder(plan);
  const std::vector<std::uint64_t> offsets = checked_rows(plan, m, encdec);
  PACKPIPE_CHECK_ARG(!decoder || encdec, "iteration {}, micro-batch {}: a decoder-only plan has no decoder side",
                     plan.iteration, m);
  const pl::PlanMicroBatch& mb = plan.microbatches[m];
  const std::vector<std::uint32_t>& lengths = decoder ? mb.target_lengths : mb.lengths;
  const std::uint32_t width = decoder ? mb.padded_dec_len : mb.padded_len;
  check_rows_fit(plan, m, offsets, lengths, width, decoder ? "decoder" : "encoder");
  packing::Packing rows;
  rows.samples.resize(lengths.size());
  for (std::uint32_t i = 0; i < rows.samples.size(); ++i) rows.samples[i] = i;
  rows.row_offsets = offsets;
  rows.capacity = width;
  packing::RowTensors t = packing::row_tensors(rows, lengths.data(), width);
  RowLayout out;
  out.rows = mb.rows;
  out.seq = width;
  out.cu_seqlens = std::move(t.cu_seqlens);
  out.position_ids = std::move(t.position_ids);
  out.segment_ids = std::move(t.segment_ids);
  out.max_seqlen = t.max_seqlen;
  out.cu_seqlens_k = out.cu_seqlens;
  out.max_seqlen_k = out.max_seqlen;
  out.prefix.assign(lengths.size(), 0);
  out.continues.assign(lengths.size(), 0);
  if (decoder || !plan.has_slices()) return out;
  const pl::SliceLinks links = pl::slice_links(plan);
  for (std::size_t i = 0; i < lengths.size(); ++i) out.continues[i] = links.continues(m, i) ? 1 : 0;
  if (!mb.has_slices()) return out;
  PACKPIPE_CHECK_ARG(mb.layout == Layout::Packed && offsets.size() == 2,
                     "iteration {}, micro-batch {}: slices in layout {} ({} rows); slices are entries of one packed row",
                     plan.iteration, m, layout_name(mb.layout), offsets.size() - 1);
  // One packed row: entry i holds tokens cu_seqlens[i] .. cu_seqlens[i + 1] (a padding segment after
  // the last entry, if any, keeps its own keys).
  std::int32_t k = 0;
  for (std::size_t i = 0; i + 1 < out.cu_seqlens.size(); ++i) {
    const std::int32_t len = out.cu_seqlens[i + 1] - out.cu_seqlens[i];
    const std::uint32_t pre = i < lengths.size() ? mb.prefix_of(i) : 0;
    if (i < lengths.size()) out.prefix[i] = pre;
    for (std::int32_t p = out.cu_seqlens[i]; p < out.cu_seqlens[i + 1]; ++p) {
      out.position_ids[static_cast<std::size_t>(p)] += static_cast<std::int32_t>(pre);
    }
    k += len + static_cast<std::int32_t>(pre);
    out.cu_seqlens_k[i + 1] = k;
    out.max_seqlen_k = std::max(out.max_seqlen_k, len + static_cast<std::int32_t>(pre));
  }
  return out;
}

// ---- the dataset a plan indexes ---------------------------------------------------------------

pl::DatasetIdentity dataset_identity(const dl::MultiTaskDataset& data) {
  auto tasks = std::make_shared<std::vector<pl::DatasetTask>>();
  tasks->reserve(data.num_tasks());
  for (std::size_t t = 0; t < data.num_tasks(); ++t) {
    tasks->push_back(pl::DatasetTask{data.manifest().tasks[t].name, data.task_size(t)});
  }
  pl::DatasetIdentity id;
  id.fingerprint = data.fingerprint();
  id.tasks = std::move(tasks);
  return id;
}

namespace {

// "3 tasks [a, b, c]", the names cut after 12 (a manifest may hold thousands).
std::string task_names(const std::vector<pl::DatasetTask>& tasks) {
  std::string names;
  for (std::size_t t = 0; t < tasks.size() && t < 12; ++t) names += fmt::format("{}'{}'", t ? ", " : "", tasks[t].name);
  if (tasks.size() > 12) names += fmt::format(", ... ({} more)", tasks.size() - 12);
  return fmt::format("{} task{} [{}]", tasks.size(), tasks.size() == 1 ? "" : "s", names);
}

// What differs between the tasks a plan records and a dataset's, planned versus found.
std::string dataset_difference(const std::vector<pl::DatasetTask>& planned, const std::vector<pl::DatasetTask>& found) {
  if (planned.empty()) return fmt::format("the plan records its dataset's fingerprint only; found {}", task_names(found));
  auto names = [](const std::vector<pl::DatasetTask>& tasks) {
    std::vector<std::string> n;
    for (const auto& t : tasks) n.push_back(t.name);
    return n;
  };
  const std::vector<std::string> a = names(planned), b = names(found);
  if (a != b) {
    std::vector<std::string> sa = a, sb = b;
    std::sort(sa.begin(), sa.end());
    std::sort(sb.begin(), sb.end());
    std::string what = sa == sb ? "the tasks are in another order" : "other tasks";
    std::vector<std::string> missing, extra;
    std::set_difference(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(missing));
    std::set_difference(sb.begin(), sb.end(), sa.begin(), sa.end(), std::back_inserter(extra));
    if (!missing.empty()) what += fmt::format(" (planned task '{}' is missing", missing.front());
    if (!extra.empty()) what += fmt::format("{}'{}' was not planned", missing.empty() ? " (task " : "; task ", extra.front());
    if (!missing.empty() || !extra.empty()) what += ")";
    return fmt::format("{}: planned {}, found {}", what, task_names(planned), task_names(found));
  }
  for (std::size_t t = 0; t < planned.size(); ++t) {
    if (planned[t].samples != found[t].samples) {
      return fmt::format("task {} ('{}') held {} samples when planned, found {}", t, planned[t].name,
                         planned[t].samples, found[t].samples);
    }
  }
  return fmt::format("the same {} with the same sample counts, but other data behind them (a dataset file, its token "
                     "counts or lengths, a task's layout or weight, the split or the samples per epoch differ)",
                     task_names(planned));
}

}  // namespace

void check_dataset(const pl::DatasetIdentity& planned, const dl::MultiTaskDataset& data, const std::string& what) {
  if (!planned.known() || planned.fingerprint == data.fingerprint()) return;
  PACKPIPE_THROW(InvalidArgument,
                 "{} was planned from another dataset than '{}': {} (dataset fingerprint: planned {:016x}, found "
                 "{:016x}). Give the manifest it was planned from, or plan again over this one",
                 what, data.manifest().path, dataset_difference(planned.task_list(), dataset_identity(data).task_list()),
                 planned.fingerprint, data.fingerprint());
}

LoadedTensors assemble_microbatch(const dl::MultiTaskDataset& data, const pl::Plan& plan, std::size_t m,
                                  std::uint32_t stage, const TokenOptions& tokens) {
  check_dataset(plan.dataset, data, fmt::format("iteration {}: the plan", plan.iteration));
  const bool encdec = has_decoder(plan);
  const std::vector<std::uint64_t> offsets = checked_rows(plan, m, encdec);
  PACKPIPE_CHECK_RANGE(stage < plan.stages.size(), "iteration {}: virtual stage {} is out of range (the plan has {})",
                       plan.iteration, stage, plan.stages.size());
  const pl::PlanMicroBatch& mb = plan.microbatches[m];
  const std::size_t n = mb.samples.size();
  PACKPIPE_CHECK_ARG(!mb.refs.empty() || n == 0,
                     "iteration {}, micro-batch {}: the plan has no sample refs; plan it with plan_epoch or "
                     "plan_batch(refs=...)",
                     plan.iteration, m);
  PACKPIPE_CHECK_ARG(mb.refs.size() == n, "iteration {}, micro-batch {}: {} sample refs for {} samples", plan.iteration,
                     m, mb.refs.size(), n);
  const std::uint8_t loads = plan.stages[stage].loads;
  constexpr std::uint8_t kDecoderLoads = pl::kLoadDecoderInputIds | pl::kLoadDecoderLabels;
  PACKPIPE_CHECK_ARG(encdec || (loads & kDecoderLoads) == 0,
                     "iteration {}: stage {} loads decoder tensors, which a decoder-only plan does not have",
                     plan.iteration, stage);
  PACKPIPE_CHECK_ARG(!encdec || (loads & pl::kLoadLabels) == 0,
                     "iteration {}: stage {} loads labels, which an encoder-decoder plan has as decoder_labels",
                     plan.iteration, stage);
  check_rows_fit(plan, m, offsets, mb.lengths, mb.padded_len, "encoder");
  if (encdec) check_rows_fit(plan, m, offsets, mb.target_lengths, mb.padded_dec_len, "decoder");

  LoadedTensors out;
  out.mb = static_cast<std::uint32_t>(m);
  out.stage = stage;
  out.rows = mb.rows;
  out.seq = mb.padded_len;
  out.dec_seq = encdec ? mb.padded_dec_len : 0;
  out.loads = loads;
  const std::size_t W = out.seq, D = out.dec_seq, R = out.rows;
  if (loads & pl::kLoadInputIds) out.input_ids.assign(R * W, tokens.pad_id);
  if (loads & pl::kLoadLabels) out.labels.assign(R * W, tokens.ignore_index);
  if (loads & pl::kLoadDecoderInputIds) out.decoder_input_ids.assign(R * D, tokens.pad_id);
  if (loads & pl::kLoadDecoderLabels) out.decoder_labels.assign(R * D, tokens.ignore_index);
  if (loads & pl::kLoadPositionIds) {
    const RowLayout layout = microbatch_layout(plan, m, false);
    out.position_ids.assign(layout.position_ids.begin(), layout.position_ids.end());
  }
  const bool need_encoder = (loads & (pl::kLoadInputIds | pl::kLoadLabels)) != 0;
  const bool need_decoder = (loads & kDecoderLoads) != 0;

  std::vector<std::int64_t> input, target;
  std::unique_ptr<pl::SliceLinks> links;
  if (plan.has_slices()) links = std::make_unique<pl::SliceLinks>(pl::slice_links(plan));
  for (std::size_t r = 0; r < R; ++r) {
    std::size_t at = r * W, dec_at = r * D;  // where the row's next sample starts
    for (auto k = offsets[r]; k < offsets[r + 1]; ++k) {
      const SampleRef ref = mb.refs[k];
      PACKPIPE_CHECK_ARG(ref.task < data.num_tasks() && ref.index < data.task_size(ref.task),
                         "iteration {}, micro-batch {}, {}: the dataset does not hold it ({} tasks{}); is this the "
                         "plan's dataset?",
                         plan.iteration, m, sample_name(data, k, ref), data.num_tasks(),
                         ref.task < data.num_tasks() ? fmt::format(", task {} has {} samples", ref.task,
                                                                   data.task_size(ref.task))
                                                     : std::string());
      const std::uint32_t in = data.input_length(ref), tg = data.target_length(ref);
      const std::uint32_t len = mb.lengths[k];
      if (!encdec) {
        // Tokens [o, o + len) of the sample's input then target tokens (o > 0: a chunk, or a slice).
        // A slice that continues in a later micro-batch also reads the next token: its last
        // position's label (docs/design/015-long-context.md).
        const std::uint64_t o = ref.offset;
        const bool cont = links != nullptr && links->continues(m, k);
        const std::uint32_t read = len + (cont ? 1u : 0u);
        PACKPIPE_CHECK_ARG(o + read <= std::uint64_t{in} + tg,
                           "iteration {}, micro-batch {}, {}: planned tokens [{}, {}){} run past the sample's {} tokens "
                           "(input {} + target {})",
                           plan.iteration, m, sample_name(data, k, ref), o, o + len,
                           cont ? " and the next slice's first" : "", std::uint64_t{in} + tg, in, tg);
        out.loss_tokens += decoder_only_loss(read, in, ref.offset, plan.loss_mode);
        if (!need_encoder) continue;
        const std::uint32_t in_begin = std::min(ref.offset, in);
        const auto in_end = static_cast<std::uint32_t>(std::min<std::uint64_t>(o + read, in));
        const std::uint32_t tg_begin = static_cast<std::uint32_t>(std::max<std::uint64_t>(o, in) - in);
        read_tokens(data, ref, in_begin, in_end - in_begin, tg_begin, read - (in_end - in_begin), input, target);
        input.insert(input.end(), target.begin(), target.end());  // the chunk as one sequence
        if (!out.input_ids.empty()) std::copy(input.begin(), input.begin() + len, out.input_ids.begin() + at);
        if (!out.labels.empty()) {
          for (std::uint32_t p = 0; p + 1 < read; ++p) {
            // Targets: where the next token is a target token (its index in the sample at least `in`).
            if (plan.loss_mode == pl::LossMode::AllTokens || o + p + 1 >= in) out.labels[at + p] = input[p + 1];
          }
        }
        at += len;
        continue;
      }
      PACKPIPE_CHECK_ARG(ref.offset == 0,
                         "iteration {}, micro-batch {}, {}: a chunk (offset {}) in an encoder-decoder plan; only "
                         "decoder-only samples are split at the context length",
                         plan.iteration, m, sample_name(data, k, ref), ref.offset);
      const std::uint32_t t = mb.target_lengths[k];
      PACKPIPE_CHECK_ARG(len <= std::max<std::uint32_t>(in, 1),
                         "iteration {}, micro-batch {}, {}: planned encoder length {} is longer than the sample's {} "
                         "input tokens (an empty input is planned as 1)",
                         plan.iteration, m, sample_name(data, k, ref), len, in);
      PACKPIPE_CHECK_ARG(t <= std::max<std::uint32_t>(tg, 1),
                         "iteration {}, micro-batch {}, {}: planned decoder length {} is longer than the sample's {} "
                         "target tokens (an empty target is planned as 1)",
                         plan.iteration, m, sample_name(data, k, ref), t, tg);
      out.loss_tokens += std::min(t, tg);
      if (need_encoder || need_decoder) {
        read_tokens(data, ref, 0, need_encoder ? std::min(len, in) : 0, 0, need_decoder ? std::min(t, tg) : 0, input,
                    target);
      }
      if (!out.input_ids.empty() && in > 0) std::copy(input.begin(), input.end(), out.input_ids.begin() + at);
      // an empty input is one pad_id token, which the padding fill already wrote
      if (!out.decoder_input_ids.empty() && t > 0) {
        out.decoder_input_ids[dec_at] = tokens.decoder_start_id;
        for (std::uint32_t j = 1; j < t; ++j) out.decoder_input_ids[dec_at + j] = target[j - 1];
      }
      if (!out.decoder_labels.empty()) {
        // an empty target's one planned token keeps ignore_index
        for (std::uint32_t j = 0; j < std::min(t, tg); ++j) out.decoder_labels[dec_at + j] = target[j];
      }
      at += len;
      dec_at += t;
    }
  }
  PACKPIPE_CHECK(out.loss_tokens == mb.loss_tokens,
                 "iteration {}, micro-batch {}: the plan counts {} loss tokens, the assembled labels {} (loss mode "
                 "'{}'); was the plan made from this dataset?",
                 plan.iteration, m, mb.loss_tokens, out.loss_tokens, pl::loss_mode_name(plan.loss_mode));
  return out;
}

// ---- RankLoader ------------------------------------------------------------------------------

struct RankLoader::Impl {
  Impl(const dl::MultiTaskDataset& d, const RankLoaderOptions& o) : data(d), options(o) {}
  const dl::MultiTaskDataset& data;
  RankLoaderOptions options;
  std::unique_ptr<EpochPlanner> planner;       // planner mode
  std::unique_ptr<pl::PlanFileReader> reader;  // plan-file mode
  std::vector<std::uint64_t> file_iterations;  // plan-file mode: the iterations to read, in order
  std::uint64_t first = 0;                     // the first iteration delivered
  std::uint64_t count = 0;                     // iterations delivered in all
  std::atomic<std::uint64_t> delivered{0};
  std::unique_ptr<BackgroundQueue<RankIteration>> queue;  // the assembly, ahead of the consumer

  // The iteration number of the k-th iteration delivered (k <= count; count: one past the last).
  std::uint64_t iteration_at(std::uint64_t k) const {
    if (planner != nullptr || file_iterations.empty()) return first + k;
    return k < file_iterations.size() ? file_iterations[k] : file_iterations.back() + 1;
  }
};

namespace {

void check_loader_depth(std::size_t depth) {
  PACKPIPE_CHECK_ARG(depth >= 1 && depth <= kMaxLoaderDepth,
                     "RankLoader: depth must be at least 1 and at most {} (iterations held ready), found {}",
                     kMaxLoaderDepth, depth);
}

// Checks the loader's options against plans of `dp` replicas and `ranks` pipeline ranks.
void check_loader_options(const RankLoaderOptions& o, std::uint64_t dp, std::uint64_t ranks) {
  check_loader_depth(o.depth);
  PACKPIPE_CHECK_ARG(o.replica < dp, "RankLoader: replica {} is out of range: the plans have {} data-parallel replicas",
                     o.replica, dp);
  PACKPIPE_CHECK_ARG(o.rank >= -1 && (o.rank < 0 || static_cast<std::uint64_t>(o.rank) < ranks),
                     "RankLoader: rank {} is out of range: the plans have {} pipeline ranks (-1: every rank)", o.rank,
                     ranks);
}

// The loads of the loader's rank (every rank for -1) of `plan`, in stream order.
std::vector<LoadedTensors> rank_loads(const dl::MultiTaskDataset& data, const pl::Plan& plan,
                                      const RankLoaderOptions& o) {
  PACKPIPE_CHECK_ARG(o.replica < plan.dp && plan.replica == o.replica,
                     "the plan is replica {} of {}, the loader follows replica {}", plan.replica, plan.dp, o.replica);
  PACKPIPE_CHECK_ARG(o.rank < 0 || static_cast<std::uint64_t>(o.rank) < plan.streams.size(),
                     "rank {} is out of range: the plan has {} pipeline ranks", o.rank, plan.streams.size());
  std::vector<LoadedTensors> out;
  const std::size_t begin = o.rank < 0 ? 0 : static_cast<std::size_t>(o.rank);
  const std::size_t end = o.rank < 0 ? plan.streams.size() : begin + 1;
  for (std::size_t r = begin; r < end; ++r) {
    for (const pl::Instruction& ins : plan.streams[r]) {
      if (ins.op == pl::Opcode::LoadMb) out.push_back(assemble_microbatch(data, plan, ins.mb, ins.stage, o.tokens));
    }
  }
  return out;
}

}  // namespace

RankLoader::RankLoader(const dl::MultiTaskDataset& data, std::unique_ptr<EpochPlanner> planner,
                       RankLoaderOptions options)
    : impl_(std::make_unique<Impl>(data, options)) {
  PACKPIPE_CHECK_ARG(planner != nullptr, "RankLoader: no planner given");
  PACKPIPE_CHECK_ARG(&planner->data() == &data,
                     "RankLoader: the planner plans another dataset than the loader's; give both the same dataset");
  const auto& shape = planner->options().shape;
  check_loader_options(options, static_cast<std::uint64_t>(shape.dp), static_cast<std::uint64_t>(shape.stages));
  impl_->first = planner->position();
  impl_->count = planner->iterations() - (planner->position() - planner->spec().first_iteration);
  impl_->planner = std::move(planner);
  start();
}

RankLoader::RankLoader(const dl::MultiTaskDataset& data, const std::string& plan_file, std::uint64_t first_iteration,
                       std::uint64_t count, RankLoaderOptions options)
    : impl_(std::make_unique<Impl>(data, options)) {
  check_loader_depth(options.depth);
  impl_->reader = std::make_unique<pl::PlanFileReader>(plan_file);
  const pl::PlanFileReader& file = *impl_->reader;
  check_dataset(file.dataset(), data, fmt::format("plan file '{}'", plan_file));
  if (!options.allow_incomplete) {
    file.require_complete("pass allow_incomplete=True (PlanLoader, RankLoader; RankLoaderOptions::allow_incomplete in C++)");
  }
  std::vector<std::uint64_t> held;  // distinct iterations, in file (= iteration) order
  for (std::size_t i = 0; i < file.size(); ++i) {
    if (held.empty() || held.back() != file.iteration(i)) held.push_back(file.iteration(i));
  }
  const auto from = std::lower_bound(held.begin(), held.end(), first_iteration);
  const bool at_end = from == held.end() && (held.empty() ? first_iteration == 0 : first_iteration == held.back() + 1);
  PACKPIPE_CHECK_ARG((from != held.end() && *from == first_iteration) || at_end,
                     "RankLoader: first iteration {} is not in plan file '{}' (it holds {})", first_iteration, plan_file,
                     held.empty() ? std::string("no plan")
                                  : fmt::format("iterations {} to {}", held.front(), held.back()));
  const std::size_t left = static_cast<std::size_t>(held.end() - from);
  const std::size_t take = count == 0 ? left : static_cast<std::size_t>(std::min<std::uint64_t>(count, left));
  impl_->file_iterations.assign(from, from + static_cast<std::ptrdiff_t>(take));
  impl_->first = first_iteration;
  impl_->count = take;
  if (take > 0) {
    const pl::Plan head = file.read_iteration(impl_->file_iterations.front(), 0);
    check_dataset(head.dataset, data, fmt::format("plan file '{}'", plan_file));  // a file that records none
    check_loader_options(options, head.dp, head.ranks);
  }
  start();
}

void RankLoader::start() {
  Impl* im = impl_.get();
  im->queue = std::make_unique<BackgroundQueue<RankIteration>>(
      im->options.depth,
      [im](BackgroundQueue<RankIteration>& q) {
        for (std::uint64_t k = 0; k < im->count && !q.stopped(); ++k) {
          const std::uint64_t expected = im->iteration_at(k);
          RankIteration it;
          try {
            pl::Plan plan;
            if (im->planner != nullptr) {
              PlannedIteration planned;
              PACKPIPE_CHECK(im->planner->next(planned), "the planner ended after {} of {} iterations", k, im->count);
              PACKPIPE_CHECK_ARG(im->options.replica < planned.result.plans.size(),
                                 "replica {} is out of range: the iteration has {} plans", im->options.replica,
                                 planned.result.plans.size());
              it.iteration = planned.iteration;
              plan = std::move(planned.result.plans[im->options.replica]);
            } else {
              it.iteration = expected;
              plan = im->reader->read_iteration(expected, im->options.replica);
            }
            it.loads = rank_loads(im->data, plan, im->options);
            it.plan = std::move(plan);
          } catch (...) {
            detail::rethrow_naming(std::current_exception(), expected);
          }
          if (!q.push(std::move(it))) return;
        }
      },
      "RankLoader");
}

RankLoader::~RankLoader() = default;  // the queue stops the assembly and joins its thread

bool RankLoader::next(RankIteration& out) {
  if (!impl_->queue->next(out)) return false;
  impl_->delivered.fetch_add(1);
  return true;
}

std::uint64_t RankLoader::iterations() const { return impl_->count; }

std::uint64_t RankLoader::position() const { return impl_->iteration_at(impl_->delivered.load()); }

}  // namespace packpipe::planner
