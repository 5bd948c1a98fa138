// `packpipe partition`: micro-batches of one global batch by any method, with the figures.
#include <cstdio>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "common/errors.h"
#include "costmodel/factory.h"
#include "dataloader/manifest.h"
#include "planner/epoch.h"
#include "dataloader/multitask.h"
#include "dataloader/sampler.h"
#include "partition/partition.h"

namespace packpipe::cli {

namespace cm = packpipe::costmodel;
namespace part = packpipe::partition;
namespace dl = packpipe::dataloader;
namespace pl = packpipe::plan;

namespace {

struct PartitionCliOptions {
  std::string lengths_file, dataset, manifest;
  std::uint64_t batch_tokens = 0, batch_samples = 0, seed = 1234, batch_index = 0;
  CostModelArgs costs;
  ShapeArgs shape_args = {1};
  ContextArgs context;
  std::string method = "dp", recompute = "auto", oversize = "error", basis = "auto", order = "auto";
  int threads = 0;
  std::int64_t mbs = 0;
  std::uint64_t tokens = 0;
  std::int64_t round_multiple = 8;
  std::string layouts = "padded,packed", layout;  ///< layout empty: the method's default
  std::string slicing = "auto";
  std::uint32_t min_slice_tokens = 64;
  std::uint64_t capacity = 0;
  bool pack_windows = false, compare = false, json = false;
};

/// The sampled global batch under the context length (`report`: what it did) and, per sample, how
/// the user knows it (task and dataset index, and a chunk's first token).
part::BatchLengths sample_lengths(const PartitionCliOptions& o, bool encdec, const planner::ContextLength& context,
                                  std::vector<std::string>& names, planner::ContextReport& report) {
  const dl::MultiTaskDataset mt = !o.manifest.empty() ? dl::MultiTaskDataset(dl::load_manifest(o.manifest))
                                                      : dl::MultiTaskDataset::from_prefix(o.dataset);
  PACKPIPE_CHECK_ARG((o.batch_tokens > 0) != (o.batch_samples > 0),
                     "give exactly one of --global-batch-tokens and --global-batch-samples");
  planner::EpochSpec spec;
  spec.sampler = dl::sampler_config(mt.manifest());
  spec.sampler.seed = o.seed;
  spec.sampler.global_batch_tokens = o.batch_tokens;
  spec.sampler.global_batch_samples = o.batch_samples;
  // The epoch planner's rule from a global batch to lengths, the one `packpipe plan` plans with.
  planner::SampledBatch g = planner::sample_batch(mt, spec, o.batch_index, encdec, pl::LossMode::AllTokens, context);
  for (const auto& r : g.refs) {
    names.push_back(fmt::format("global batch {}, task '{}', dataset sample {}{}", o.batch_index,
                                r.task < mt.manifest().tasks.size() ? mt.manifest().tasks[r.task].name : "?",
                                r.index, r.offset > 0 ? fmt::format(" (its chunk from token {})", r.offset) : ""));
  }
  report = std::move(g.context);
  return std::move(g.lengths);
}

// Per micro-batch and entry, the micro-batch holding the previous slice of the entry's sample (-1:
// a whole sample or a first slice), as plan files' `prev`.
std::vector<std::vector<std::int64_t>> previous_slices(const std::vector<part::MicroBatch>& mbs) {
  std::unordered_map<std::uint64_t, std::int64_t> ending;  // (sample, end token) -> micro-batch
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    for (std::size_t i = 0; i < mbs[m].spans.size() && i < mbs[m].samples.size(); ++i) {
      const part::Span& sp = mbs[m].spans[i];
      ending[std::uint64_t{mbs[m].samples[i]} << 32 | (std::uint64_t{sp.begin} + sp.length)] = static_cast<std::int64_t>(m);
    }
  }
  std::vector<std::vector<std::int64_t>> out(mbs.size());
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    for (std::size_t i = 0; i < mbs[m].spans.size() && i < mbs[m].samples.size(); ++i) {
      const part::Span& sp = mbs[m].spans[i];
      const auto it = sp.begin == 0 ? ending.end() : ending.find(std::uint64_t{mbs[m].samples[i]} << 32 | sp.begin);
      out[m].push_back(it == ending.end() ? -1 : it->second);
    }
  }
  return out;
}

// `prev`: previous_slices' row of this micro-batch; `lengths`: the samples' lengths (a span over a
// whole sample is not a slice).
Json mb_json(const part::MicroBatch& mb, bool encdec, const std::vector<std::int64_t>& prev,
             const std::vector<std::uint32_t>& lengths) {
  Json j;
  j["samples"] = mb.samples;
  if (mb.has_slices()) {
    // Entry i holds tokens [begin, begin + length) of samples[i]; prev[i]: the micro-batch holding
    // the slice before it (null: a whole sample, or a sample's first slice).
    Json spans = Json::array(), links = Json::array(), sliced = Json::array();
    for (std::size_t i = 0; i < mb.spans.size(); ++i) {
      spans.push_back(Json::array({mb.spans[i].begin, mb.spans[i].length}));
      links.push_back(i < prev.size() && prev[i] >= 0 ? Json(prev[i]) : Json(nullptr));
      const bool whole = i < mb.samples.size() && mb.samples[i] < lengths.size() && mb.spans[i].begin == 0 &&
                         mb.spans[i].length == lengths[mb.samples[i]];
      sliced.push_back(!whole);
    }
    j["spans"] = std::move(spans);
    j["prev"] = std::move(links);
    j["sliced"] = std::move(sliced);
  }
  j["layout"] = layout_name(mb.layout);
  if (!mb.row_offsets.empty()) j["row_offsets"] = mb.row_offsets;
  j["rows"] = mb.rows();
  if (mb.attention.varlen()) {
    j["attention"] = Json{{"self", mb.attention.self}, {"dec_self", mb.attention.dec_self}, {"cross", mb.attention.cross}};
    if (mb.attention.prefix_tokens != 0) {  // slices' queries over their kept keys (design 015)
      j["attention"]["prefix"] = mb.attention.prefix;
      j["attention"]["prefix_tokens"] = mb.attention.prefix_tokens;
    }
  }
  j["padded_len"] = mb.padded_len;
  if (encdec) j["padded_dec_len"] = mb.padded_dec_len;
  j["tokens"] = mb.tokens;
  j["time_ms"] = mb.time_ms;
  j["recompute"] = cm::recompute_name(mb.recompute);
  j["stored_mb"] = mb.stored_mb;
  j["peak_mb"] = mb.peak_mb;
  return j;
}

Json figures_json(const part::Partition& p, bool encdec) {
  Json j;
  j["microbatch_count"] = p.microbatches.size();
  j["objective_ms"] = p.objective_ms;
  j["predicted_iteration_ms"] = p.predicted_iteration_ms;
  j["max_time_ms"] = p.max_time_ms;
  j["sum_time_ms"] = p.sum_time_ms;
  j["efficiency"] = p.efficiency;
  j["input_efficiency"] = p.input_efficiency;
  if (encdec) j["target_efficiency"] = p.target_efficiency;
  j["cost_basis"] = part::cost_basis_name(p.basis);
  j["truncated"] = p.truncated;
  j["dropped"] = p.dropped;
  return j;
}

Json run_partition(const PartitionCliOptions& o) {
  const auto cost = o.costs.make();
  const bool encdec = cost->model().arch == cm::Architecture::EncoderDecoder;
  const int sources = (!o.lengths_file.empty()) + (!o.dataset.empty()) + (!o.manifest.empty());
  PACKPIPE_CHECK_ARG(sources == 1, "give exactly one of LENGTHS_FILE, --dataset and --manifest");
  check_option_range("--global-batch-tokens", o.batch_tokens, 0, kMaxGlobalBatchTokens);
  check_option_range("--global-batch-samples", o.batch_samples, 0, kMaxGlobalBatchSamples,
                     "a global batch names its samples with 31-bit ids");
  check_option_range("--threads", static_cast<std::int64_t>(o.threads), 0, kMaxThreads, "0: automatic");
  check_option_range("--mbs", o.mbs, 0, std::int64_t{1} << 31, "samples (rows) per micro-batch");
  check_option_range("--tokens", o.tokens, 0, kMaxGlobalBatchTokens, "padded tokens per micro-batch");
  check_option_range("--round-multiple", o.round_multiple, 1, part::kMaxRoundMultiple);
  const planner::ContextLength context = o.context.context();
  planner::check_context_length(context, encdec);
  PACKPIPE_CHECK_ARG(!context.limited() || o.lengths_file.empty(),
                     "--max-seq-len / --max-target-len apply to a batch sampled from a dataset (--manifest, "
                     "--dataset); a lengths file is the batch as given: cut its lengths first");
  // Each sample as the user knows it: its line in the lengths file, or its task and index.
  std::vector<std::string> names;
  planner::ContextReport context_report;
  part::BatchLengths b;
  if (!o.lengths_file.empty()) {
    LengthsFile f = read_lengths_file(o.lengths_file);
    for (std::size_t i = 0; i < f.input.size(); ++i) names.push_back(fmt::format("sample {} at {}", i, f.where(i)));
    b.input = std::move(f.input);
    b.target = std::move(f.target);
  } else {
    b = sample_lengths(o, encdec, context, names, context_report);
    PACKPIPE_CHECK_ARG(b.size() > 0, "every sample of global batch {} is over --max-seq-len {} (--seq-policy drop)",
                       o.batch_index, context.max_seq_len);
  }
  if (encdec && b.target.empty() && !b.input.empty()) {
    PACKPIPE_THROW(InvalidArgument, "model '{}' is encoder-decoder: the lengths need a target column", o.costs.model);
  }
  if (!encdec && !b.target.empty()) {  // decoder-only: input and target form one sequence
    for (std::size_t k = 0; k < b.input.size(); ++k) {
      const std::uint64_t sum = std::uint64_t{b.input[k]} + b.target[k];
      PACKPIPE_CHECK_ARG(sum <= std::numeric_limits<std::uint32_t>::max(),
                         "{}: input {} + target {} = {} tokens, more than 2^32 - 1 for decoder-only model '{}'",
                         names[k], b.input[k], b.target[k], sum, o.costs.model);
      b.input[k] = static_cast<std::uint32_t>(sum);
    }
    b.target.clear();
  }
  const part::PipelineShape sh = o.shape_args.shape(cost.get());
  const auto vs = part::virtual_stages(cost->model(), sh);
  part::PartitionOptions po;
  po.method = part::partition_method_from_name(o.method);
  po.microbatch_size = o.mbs;
  po.token_budget = o.tokens;
  po.round_multiple = o.round_multiple;
  po.recompute = part::recompute_policy_from_name(o.recompute);
  po.oversize = part::oversize_policy_from_name(o.oversize);
  po.basis = part::cost_basis_from_name(o.basis);
  po.pack_windows = o.pack_windows;
  po.layouts = layout_set_from_names(o.layouts);
  if (!o.layout.empty()) po.layout = layout_from_name(o.layout);
  po.slicing = part::slice_policy_from_name(o.slicing);
  po.min_slice_tokens = o.min_slice_tokens;
  po.capacity = o.capacity;
  po.order = part::enc_dec_order_from_name(o.order);
  po.threads = o.threads;
  po.oversize_option = "--oversize";
  po.describe_sample = [&names](std::uint32_t s) {
    return s < names.size() ? names[s] : fmt::format("sample {}", s);
  };
  const part::Partition p = part::partition(b, *cost, sh, vs, po);
  Json j;
  j["model"] = cost->model().name;
  j["cost_model"] = cost->describe();
  j["samples"] = b.size();
  if (context.limited()) {
    j["max_seq_len"] = context.max_seq_len;
    if (encdec) j["max_target_len"] = context.target_limit();
    j["seq_policy"] = planner::seq_policy_name(context.policy);
    j.update(context_json(context, context_report));
  }
  j["method"] = o.method;
  j["microbatches"] = Json::array();
  const auto prev = previous_slices(p.microbatches);
  const std::vector<std::uint32_t>& lengths = p.lengths.input.empty() ? b.input : p.lengths.input;
  std::set<std::uint32_t> sliced_samples;
  std::uint64_t slices = 0;
  for (std::size_t m = 0; m < p.microbatches.size(); ++m) {
    Json mj = mb_json(p.microbatches[m], encdec, prev[m], lengths);
    if (mj.contains("sliced")) {
      for (std::size_t i = 0; i < mj["sliced"].size(); ++i) {
        if (!mj["sliced"][i].get<bool>()) continue;
        ++slices;
        sliced_samples.insert(p.microbatches[m].samples[i]);
      }
    }
    j["microbatches"].push_back(std::move(mj));
  }
  // Samples cut into slices that pipeline (each counted once) and their slices: a sample listed in
  // several micro-batches is one of these, never a duplicate.
  j["sliced_samples"] = sliced_samples.size();
  j["slices"] = slices;
  j["ranks"] = p.ranks;
  j["rank_time_ms"] = p.rank_time_ms;
  const Json fig = figures_json(p, encdec);
  for (auto it = fig.begin(); it != fig.end(); ++it) j[it.key()] = it.value();
  if (o.compare) {
    // packpipe's dp and DynaPipe's, then every baseline of the grid, each on the same stage basis;
    // the headline is against the fastest baseline, named.
    Json table = Json::array();
    double dp_ms = std::numeric_limits<double>::infinity(), best_ms = dp_ms;
    std::string best_label;
    auto row_of = [&](const std::string& method, const std::string& setting, const part::PartitionOptions& q) {
      Json row{{"method", method}, {"setting", setting}};
      try {
        const part::Partition r = part::partition(b, *cost, sh, vs, q);
        const Json rf = figures_json(r, encdec);
        for (auto it = rf.begin(); it != rf.end(); ++it) row[it.key()] = it.value();
        const part::Partition e = part::evaluate_partition(b, *cost, sh, vs, r.microbatches, q, part::CostBasis::Stages);
        row["predicted_iteration_ms"] = e.predicted_iteration_ms;
        row["feasible"] = true;
      } catch (const std::exception& e) {
        row["feasible"] = false;
        row["error"] = e.what();
      }
      return row;
    };
    for (const char* name : {"dp", "dynapipe"}) {
      part::PartitionOptions q = po;
      q.method = part::partition_method_from_name(name);
      q.basis = part::CostBasis::Auto;
      Json row = row_of(name, name, q);
      if (row["feasible"].get<bool>() && std::string(name) == "dp") dp_ms = row["predicted_iteration_ms"].get<double>();
      table.push_back(std::move(row));
    }
    part::BaselineGridOptions go;
    go.layouts = po.layouts;
    go.round_multiple = po.round_multiple;
    if (o.mbs > 0) go.microbatch_sizes = go.rows = {o.mbs};
    for (const part::Baseline& bl : part::baseline_grid(b, go)) {
      part::PartitionOptions q = bl.options(po);
      q.basis = part::CostBasis::Auto;
      Json row = row_of(bl.family(), bl.label(), q);
      if (row["feasible"].get<bool>() && row["predicted_iteration_ms"].get<double>() < best_ms) {
        best_ms = row["predicted_iteration_ms"].get<double>();
        best_label = bl.label();
      }
      table.push_back(std::move(row));
    }
    j["compare"] = std::move(table);
    if (!best_label.empty() && std::isfinite(dp_ms)) {
      j["best_baseline"] = Json{{"setting", best_label}, {"predicted_iteration_ms", best_ms},
                                {"speedup_of_dp", best_ms / dp_ms}};
    }
  }
  return j;
}

void print_partition(const Json& j, bool encdec) {
  std::printf("%s (%s): %zu samples, method %s, %zu micro-batches", j["model"].get<std::string>().c_str(),
              j["cost_model"].get<std::string>().c_str(), j["samples"].get<std::size_t>(),
              j["method"].get<std::string>().c_str(), j["microbatches"].size());
  if (j["sliced_samples"].get<std::size_t>() > 0) {
    std::printf("; %zu samples cut into %llu slices (shown as sample[begin:end) tokens)",
                j["sliced_samples"].get<std::size_t>(), static_cast<unsigned long long>(j["slices"].get<std::uint64_t>()));
  }
  std::printf("\n");
  std::size_t k = 0;
  for (const auto& mb : j["microbatches"]) {
    std::printf("  mb %3zu: %3lld rows x %5lld", k++, static_cast<long long>(mb["rows"].get<std::int64_t>()),
                static_cast<long long>(mb["padded_len"].get<std::int64_t>()));
    if (encdec) std::printf(" + %4lld", static_cast<long long>(mb["padded_dec_len"].get<std::int64_t>()));
    std::printf(" tokens, %8.2f ms, recompute %-9s samples", mb["time_ms"].get<double>(),
                mb["recompute"].get<std::string>().c_str());
    const auto& samples = mb["samples"];
    for (std::size_t i = 0; i < samples.size(); ++i) {
      if (i == 8) {
        std::printf(" ...");
        break;
      }
      std::printf(" %u", samples[i].get<unsigned>());
      if (mb.contains("sliced") && mb["sliced"][i].get<bool>()) {
        const auto begin = mb["spans"][i][0].get<std::uint64_t>(), length = mb["spans"][i][1].get<std::uint64_t>();
        std::printf("[%llu:%llu)", static_cast<unsigned long long>(begin),
                    static_cast<unsigned long long>(begin + length));
      }
    }
    std::printf("\n");
  }
  std::printf("objective %.2f ms, predicted iteration %.2f ms (max %.2f, sum %.2f), efficiency %.2f%%",
              j["objective_ms"].get<double>(), j["predicted_iteration_ms"].get<double>(), j["max_time_ms"].get<double>(),
              j["sum_time_ms"].get<double>(), 100 * j["efficiency"].get<double>());
  if (encdec) {
    std::printf(" (input %.2f%%, target %.2f%%)", 100 * j["input_efficiency"].get<double>(),
                100 * j["target_efficiency"].get<double>());
  }
  std::printf("\n");
  if (!j["truncated"].empty() || !j["dropped"].empty()) {
    std::printf("truncated %zu, dropped %zu samples\n", j["truncated"].size(), j["dropped"].size());
  }
  if (j.contains("seq_policy")) std::printf("%s\n", context_text(j, j).c_str());
  if (j.contains("compare")) {
    std::printf("\n%-36s %5s %12s %12s %11s\n", "method (setting)", "mbs", "objective", "iteration", "efficiency");
    for (const auto& r : j["compare"]) {
      const std::string name = r["setting"].get<std::string>();
      if (!r["feasible"].get<bool>()) {
        std::printf("%-36s infeasible: %s\n", name.c_str(), r["error"].get<std::string>().c_str());
        continue;
      }
      std::printf("%-36s %5zu %9.2f ms %9.2f ms %10.2f%%\n", name.c_str(), r["microbatch_count"].get<std::size_t>(),
                  r["objective_ms"].get<double>(), r["predicted_iteration_ms"].get<double>(),
                  100 * r["efficiency"].get<double>());
    }
    if (j.contains("best_baseline")) {
      std::printf("dp is %.2fx the best baseline, %s (predicted iteration, 1F1B bound)\n",
                  j["best_baseline"]["speedup_of_dp"].get<double>(),
                  j["best_baseline"]["setting"].get<std::string>().c_str());
    }
  }
}

}  // namespace

void register_partition_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand("partition", "Partition one global batch into micro-batches (dp, dynapipe, baselines)");
  auto o = std::make_shared<PartitionCliOptions>();
  cmd->add_option("LENGTHS_FILE", o->lengths_file, "Text file of 'input_len [target_len]' lines");
  cmd->add_option("--dataset", o->dataset, "Dataset prefix to sample a global batch from");
  cmd->add_option("--manifest", o->manifest, "Manifest .json to sample a global batch from");
  cmd->add_option("--global-batch-tokens", o->batch_tokens, "Token budget of a global batch");
  cmd->add_option("--global-batch-samples", o->batch_samples, "Samples per global batch");
  cmd->add_option("--seed", o->seed, "Sampler seed");
  cmd->add_option("--batch-index", o->batch_index, "Which global batch of epoch 0");
  o->costs.add_to(cmd);
  o->shape_args.add_to(cmd);
  cmd->add_option("--method", o->method, "Partition method: " + enum_name_list(part::kPartitionMethodNames))
      ->check(one_of(part::kPartitionMethodNames));
  cmd->add_option("--mbs", o->mbs, "fixed / packing: samples (rows) per micro-batch");
  cmd->add_option("--tokens", o->tokens, "tokens: padded tokens per micro-batch");
  cmd->add_option("--round-multiple", o->round_multiple, "Round padded lengths up to this multiple");
  cmd->add_option("--recompute", o->recompute, "Recompute policy: " + enum_name_list(part::kRecomputePolicyNames))
      ->check(one_of(part::kRecomputePolicyNames));
  cmd->add_option("--oversize", o->oversize,
                  "A sample that cannot fit alone: " + enum_name_list(part::kOversizePolicyNames) +
                      " (slice, decoder-only: cut into slices that pipeline, trained as the whole sample)")
      ->check(one_of(part::kOversizePolicyNames));
  cmd->add_option("--slicing", o->slicing,
                  "dp, decoder-only: " + enum_name_list(part::kSlicePolicyNames) +
                      " (auto: long samples may be cut into slices that pipeline, when that is faster)")
      ->check(one_of(part::kSlicePolicyNames))
      ->capture_default_str();
  cmd->add_option("--min-slice-tokens", o->min_slice_tokens, "The shortest slice, tokens")->capture_default_str();
  o->context.add_to(cmd);
  cmd->add_option("--cost-basis", o->basis, "Cost basis: " + enum_name_list(part::kCostBasisNames))
      ->check(one_of(part::kCostBasisNames));
  cmd->add_flag("--pack-windows", o->pack_windows, "dp / dynapipe: pack each window's samples when cheaper");
  cmd->add_option("--layouts", o->layouts,
                  "dp: layouts its micro-batches may take, padded and/or packed (varlen attention), comma-separated")
      ->capture_default_str();
  cmd->add_option("--layout", o->layout,
                  "packing: packed (rows flattened under varlen attention, the default) or packed-mask (dense rows, "
                  "block mask); fixed: padded (the default) or packed (each micro-batch's samples flattened into one "
                  "varlen row, HF's DataCollatorWithFlattening)");
  cmd->add_option("--capacity", o->capacity,
                  "packing / wlb: tokens per row (0: the longest sample's); slicing: the slice length");
  cmd->add_option("--order", o->order,
                  "dp, encoder-decoder sample order: " + enum_name_list(part::kEncDecOrderNames) +
                      " (auto: the better of sorted and path; sorted: DynaPipe's)")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "dp / dynapipe: threads building the window table (0: automatic, at most 2)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--compare", o->compare, "Run every method on the same batch and print a table");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    const Json j = run_partition(*o);
    if (o->json) {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      print_partition(j, j["microbatches"].size() > 0 && j["microbatches"][0].contains("padded_dec_len"));
    }
  });
}

}  // namespace packpipe::cli
