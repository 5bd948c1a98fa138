// `packpipe dataset ...`: inspect, verify, build, compress, decompress, merge and sample datasets.
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/mapped_file.h"
#include "dataloader/indexed_dataset.h"
#include "dataloader/manifest.h"
#include "dataloader/multitask.h"
#include "dataloader/sampler.h"
#include "dataloader/zstd_seekable.h"
#include "planner/epoch.h"

namespace packpipe::cli {

namespace dl = packpipe::dataloader;
namespace pl = packpipe::plan;
namespace fs = std::filesystem;

namespace {

int g_exit_status = 0;

bool is_manifest_path(const std::string& arg) {
  return arg.size() > 5 && arg.compare(arg.size() - 5, 5, ".json") == 0;
}

/// Accepts "P", "P.idx", "P.bin" or "P.bin.zst" and returns P.
std::string normalize_prefix(std::string p) {
  for (const char* ext : {".bin.zst", ".idx", ".bin"}) {
    const std::string e(ext);
    if (p.size() > e.size() && p.compare(p.size() - e.size(), e.size(), e) == 0) {
      return p.substr(0, p.size() - e.size());
    }
  }
  return p;
}

void print_json(const Json& j) { std::printf("%s\n", j.dump(2).c_str()); }

// ---- info -------------------------------------------------------------------------------------

Json dataset_info_json(const dl::IndexedDataset& ds) {
  std::vector<std::uint64_t> seq(ds.size());
  for (std::uint64_t i = 0; i < ds.size(); ++i) seq[i] = static_cast<std::uint64_t>(ds.sizes()[i]);
  std::vector<std::uint64_t> docs(ds.num_documents());
  const auto S = static_cast<std::int64_t>(ds.size());
  for (std::uint64_t d = 0; d < ds.num_documents(); ++d) {
    // (opening checks the first and the last entry only; a document's range is checked where it is
    // read, as `dataset verify` checks them all)
    const std::int64_t first = ds.doc_idx()[d], last = ds.doc_idx()[d + 1];
    PACKPIPE_CHECK(first >= 0 && first <= last && last <= S,
                   "{}.idx: doc_idx[{}] and doc_idx[{}]: expected a non-decreasing range within [0, {}], found [{}, "
                   "{}] (`packpipe dataset verify` lists every problem)", ds.prefix(), d, d + 1, S, first, last);
    std::uint64_t t = 0;
    for (auto i = first; i < last; ++i) t += seq[static_cast<std::size_t>(i)];
    docs[d] = t;
  }
  Json j;
  j["prefix"] = ds.prefix();
  j["format"] = dl::format_name(ds.format());
  j["version"] = ds.version();
  j["dtype"] = dl::dtype_name(ds.dtype());
  j["dtype_code"] = static_cast<int>(ds.dtype());
  j["sequences"] = ds.size();
  j["documents"] = ds.num_documents();
  j["tokens"] = ds.num_tokens();
  j["has_modes"] = ds.has_modes();
  j["storage"] = ds.compressed() ? "bin.zst" : "bin";
  j["idx_bytes"] = file_size(ds.prefix() + ".idx");
  j["bin_bytes"] = ds.bin().size();
  if (ds.compressed()) {
    const auto zi = dl::zstd_seekable_info(ds.bin().path());
    j["zst_bytes"] = zi.compressed_bytes;
    j["zst_frames"] = zi.frames;
    j["zst_frame_size"] = zi.frame_size;
    j["compression_ratio"] = zi.compressed_bytes ? static_cast<double>(zi.decompressed_bytes) /
                                                       static_cast<double>(zi.compressed_bytes)
                                                 : 0.0;
  }
  j["sequence_lengths"] = to_json(length_stats(seq));
  j["document_lengths"] = to_json(length_stats(docs));
  return j;
}

void print_dataset_info(const Json& j) {
  std::printf("%s\n", j["prefix"].get<std::string>().c_str());
  std::printf("  format      %s version %llu\n", j["format"].get<std::string>().c_str(),
              j["version"].get<unsigned long long>());
  std::printf("  dtype       %s (code %d)\n", j["dtype"].get<std::string>().c_str(), j["dtype_code"].get<int>());
  std::printf("  sequences   %llu\n", j["sequences"].get<unsigned long long>());
  std::printf("  documents   %llu\n", j["documents"].get<unsigned long long>());
  std::printf("  tokens      %llu\n", j["tokens"].get<unsigned long long>());
  std::printf("  modes       %s\n", j["has_modes"].get<bool>() ? "yes" : "no");
  if (j["storage"] == "bin.zst") {
    std::printf("  storage     .bin.zst %s (%.2fx, %llu frames of %s)\n",
                human_bytes(j["zst_bytes"].get<std::uint64_t>()).c_str(), j["compression_ratio"].get<double>(),
                j["zst_frames"].get<unsigned long long>(),
                human_bytes(j["zst_frame_size"].get<std::uint64_t>()).c_str());
  } else {
    std::printf("  storage     .bin %s\n", human_bytes(j["bin_bytes"].get<std::uint64_t>()).c_str());
  }
  auto stats = [](const Json& s) {
    return fmt::format("min {}, p50 {}, p90 {}, p99 {}, max {}, mean {:.1f}", s["min"].get<std::uint64_t>(),
                       s["p50"].get<std::uint64_t>(), s["p90"].get<std::uint64_t>(),
                       s["p99"].get<std::uint64_t>(), s["max"].get<std::uint64_t>(), s["mean"].get<double>());
  };
  std::printf("  seq length  %s\n", stats(j["sequence_lengths"]).c_str());
  std::printf("  doc length  %s\n", stats(j["document_lengths"]).c_str());
}

Json manifest_info_json(const dl::MultiTaskDataset& mt) {
  Json j;
  j["manifest"] = mt.manifest().path;
  j["weighted"] = mt.manifest().weighted;
  j["split"] = mt.manifest().split;
  Json tasks = Json::array();
  std::uint64_t samples = 0, tokens = 0;
  for (std::size_t t = 0; t < mt.num_tasks(); ++t) {
    const auto& spec = mt.manifest().tasks[t];
    const std::uint64_t n = mt.task_size(t);
    std::vector<std::uint64_t> in(n), tg(n);
    std::uint64_t task_tokens = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      const dl::SampleRef ref{static_cast<std::uint32_t>(t), i};
      in[i] = mt.input_length(ref);
      tg[i] = mt.target_length(ref);
      task_tokens += in[i] + tg[i];
    }
    Json tj;
    tj["name"] = spec.name;
    tj["layout"] = dl::layout_name(spec.layout);
    tj["prefixes"] = spec.prefixes;
    if (!spec.target_prefixes.empty()) tj["target_prefixes"] = spec.target_prefixes;
    if (mt.manifest().weighted) tj["weight"] = spec.weight;
    tj["samples"] = n;
    tj["tokens"] = task_tokens;
    tj["input_lengths"] = to_json(length_stats(in));
    if (mt.encoder_decoder(t)) tj["target_lengths"] = to_json(length_stats(tg));
    tasks.push_back(std::move(tj));
    samples += n;
    tokens += task_tokens;
  }
  j["tasks"] = std::move(tasks);
  j["samples"] = samples;
  j["tokens"] = tokens;
  return j;
}

void print_manifest_info(const Json& j) {
  std::printf("%s: %zu tasks, %llu samples, %llu tokens\n", j["manifest"].get<std::string>().c_str(),
              j["tasks"].size(), j["samples"].get<unsigned long long>(), j["tokens"].get<unsigned long long>());
  std::printf("  %-18s %-17s %8s %10s  %-24s %-24s\n", "task", "layout", "samples", "tokens",
              "input p50/p90/max", "target p50/p90/max");
  for (const auto& t : j["tasks"]) {
    auto triple = [](const Json& s) {
      return fmt::format("{}/{}/{}", s["p50"].get<std::uint64_t>(), s["p90"].get<std::uint64_t>(),
                         s["max"].get<std::uint64_t>());
    };
    std::printf("  %-18s %-17s %8llu %10llu  %-24s %-24s\n", t["name"].get<std::string>().c_str(),
                t["layout"].get<std::string>().c_str(), t["samples"].get<unsigned long long>(),
                t["tokens"].get<unsigned long long>(), triple(t["input_lengths"]).c_str(),
                t.contains("target_lengths") ? triple(t["target_lengths"]).c_str() : "-");
  }
}

// ---- verify -----------------------------------------------------------------------------------

/// Verifies one dataset; prints problems; returns the number found.
std::size_t verify_prefix(const std::string& prefix, std::size_t max_problems, Json* out) {
  Json j;
  j["prefix"] = prefix;
  std::vector<dl::VerifyProblem> problems;
  std::uint64_t sequences = 0, tokens = 0;
  try {
    dl::IndexedDataset::Options o;
    o.check_sizes = false;  // verify() lists every problem, the sizes' too
    dl::IndexedDataset ds(prefix, o);
    problems = ds.verify(max_problems);
    sequences = ds.size();
    tokens = ds.num_tokens();
  } catch (const std::exception& e) {
    problems.push_back({prefix, e.what()});
  }
  j["ok"] = problems.empty();
  j["sequences"] = sequences;
  j["tokens"] = tokens;
  Json pj = Json::array();
  for (const auto& p : problems) pj.push_back(Json{{"file", p.file}, {"message", p.message}});
  j["problems"] = std::move(pj);
  if (out != nullptr) {
    out->push_back(std::move(j));
  } else {
    if (problems.empty()) {
      std::printf("OK   %s: %llu sequences, %llu tokens\n", prefix.c_str(),
                  static_cast<unsigned long long>(sequences), static_cast<unsigned long long>(tokens));
    } else {
      std::printf("FAIL %s: %zu problem(s)\n", prefix.c_str(), problems.size());
      for (const auto& p : problems) std::printf("  %s: %s\n", p.file.c_str(), p.message.c_str());
    }
  }
  return problems.size();
}

// ---- build ------------------------------------------------------------------------------------

struct BuildOptions {
  std::string input;
  std::string output_prefix;
  std::string dtype = "auto";
  std::int64_t append_eod = -1;
  bool split_by_task = false;
  std::string paired_layout = "prefixes";
  std::string manifest;
  bool json = false;
};

/// One output dataset group: a sequence dataset, or the two sides of a paired task.
struct TaskWriter {
  std::string name;
  bool paired = false;
  std::vector<std::string> prefixes;  // 1 (sequence / paired-sequences) or 2 (inputs, targets)
  std::vector<std::unique_ptr<dl::IndexedDatasetBuilder>> builders;
  std::uint64_t records = 0;
};

std::vector<std::int64_t> ids_of(const Json& rec, const char* key, const std::string& file, std::uint64_t line) {
  const auto& a = rec.at(key);
  PACKPIPE_CHECK_ARG(a.is_array(), "{}:{}: '{}' must be an array of token ids, found {}", file, line, key,
                     a.type_name());
  std::vector<std::int64_t> ids;
  ids.reserve(a.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    PACKPIPE_CHECK_ARG(a[k].is_number_integer(), "{}:{}: {}[{}] must be an integer token id, found {}", file,
                       line, key, k, a[k].dump());
    PACKPIPE_CHECK_ARG(!a[k].is_number_unsigned() ||
                           a[k].get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX),
                       "{}:{}: {}[{}]: token id {} is too large (token ids are below 2^63, and must fit "
                       "the dataset's dtype)",
                       file, line, key, k, a[k].dump());
    ids.push_back(a[k].get<std::int64_t>());
  }
  return ids;
}

/// Reads the JSON lines once, calling f(line_number, record) for each non-empty line.
template <typename F>
void for_each_record(const std::string& path, F&& f) {
  ::close(open_regular_file(path, "JSON lines file"));  // a FIFO or directory is refused, not waited on
  std::ifstream in(path);
  PACKPIPE_CHECK(in.good(), "cannot open '{}'", path);
  const std::uint64_t total = file_size(path);
  Progress progress("reading " + path, total);
  std::string line;
  std::uint64_t lineno = 0, done = 0;
  while (std::getline(in, line)) {
    ++lineno;
    done += line.size() + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json rec;
    try {
      rec = parse_ordered_json(line, fmt::format("{}:{}", path, lineno));
    } catch (const Error& e) {
      PACKPIPE_THROW(InvalidArgument, "{}", e.what());
    }
    PACKPIPE_CHECK_ARG(rec.is_object(), "{}:{}: expected a JSON object, found {}", path, lineno, rec.type_name());
    PACKPIPE_CHECK_ARG(rec.contains("input_ids"), "{}:{}: missing 'input_ids'", path, lineno);
    f(lineno, rec);
    if ((lineno & 1023) == 0) progress.update(done);
  }
}

/// The record's task name ("default" without one); refuses a non-string or empty name at its line.
std::string task_of(const Json& rec, const std::string& file, std::uint64_t line) {
  if (!rec.contains("task")) return "default";
  const Json& t = rec.at("task");
  PACKPIPE_CHECK_ARG(t.is_string(), "{}:{}: 'task' must be a string (a task name), found {} {}", file, line,
                     t.type_name(), t.dump());
  const std::string& task = t.get_ref<const std::string&>();
  PACKPIPE_CHECK_ARG(!task.empty(), "{}:{}: empty task name; give every record a non-empty 'task' or none",
                     file, line);
  return task;
}

std::string sanitize_task_name(const std::string& task) {
  std::string out;
  for (char c : task) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  return out;
}

Json run_build(const BuildOptions& o) {
  PACKPIPE_CHECK_ARG(o.paired_layout == "prefixes" || o.paired_layout == "sequences",
                     "--paired-layout must be 'prefixes' or 'sequences', found '{}'", o.paired_layout);
  // Pass 1: validate, find the largest id (for --dtype auto) and each task's kind.
  std::int64_t max_id = 0;
  std::string max_where;  // "file:line: " of the largest id
  std::uint64_t records = 0;
  std::map<std::string, bool> task_paired;
  std::map<std::string, std::uint64_t> task_line;  // first record of each task
  std::vector<std::string> task_order;
  for_each_record(o.input, [&](std::uint64_t line, const Json& rec) {
    const std::string task = task_of(rec, o.input, line);
    const bool paired = rec.contains("target_ids");
    auto it = task_paired.find(task);
    if (it == task_paired.end()) {
      task_paired.emplace(task, paired);
      task_order.push_back(task);
      task_line[task] = line;
    } else {
      PACKPIPE_CHECK_ARG(it->second == paired,
                         "{}:{}: task '{}' mixes records with and without 'target_ids' (first record {})", o.input,
                         line, task, it->second ? "had targets" : "had none");
    }
    for (const char* key : {"input_ids", "target_ids"}) {
      if (!rec.contains(key)) continue;
      for (auto id : ids_of(rec, key, o.input, line)) {
        PACKPIPE_CHECK_ARG(id >= 0, "{}:{}: negative token id {} in '{}'", o.input, line, id, key);
        if (id > max_id) {
          max_id = id;
          max_where = fmt::format("{}:{}: ", o.input, line);
        }
      }
    }
    ++records;
  });
  PACKPIPE_CHECK_ARG(records > 0, "{}: no records", o.input);
  if (o.append_eod > max_id) {
    max_id = o.append_eod;
    max_where = "--append-eod: ";
  }
  const dl::DType dt = o.dtype == "auto" ? dl::optimal_dtype(static_cast<std::uint64_t>(max_id) + 1)
                                         : dl::dtype_from_name(o.dtype);
  PACKPIPE_CHECK_ARG(dl::fits_dtype(max_id, dt), "{}token id {} does not fit {}", max_where, max_id,
                     o.dtype == "auto" ? fmt::format("{} (--dtype auto chooses uint16 or int32, as Megatron's "
                                                     "preprocessing does; give --dtype int64)", dl::dtype_name(dt))
                                       : fmt::format("--dtype {}", dl::dtype_name(dt)));
  PACKPIPE_CHECK_ARG(o.split_by_task || task_order.size() == 1,
                     "{} holds {} tasks; pass --split-by-task to write one dataset per task", o.input,
                     task_order.size());

  // Output layout: every output name is checked before anything is written, so two tasks whose
  // names sanitise alike (a/b, a_b) or an output that is the input fail with nothing left behind.
  std::map<std::string, std::string> task_of_base;
  for (const auto& task : task_order) {
    if (!o.split_by_task) break;
    const std::string s = sanitize_task_name(task);
    auto [it, fresh] = task_of_base.emplace(s, task);
    PACKPIPE_CHECK_ARG(fresh,
                       "{}: tasks '{}' (line {}) and '{}' (line {}) both become the output prefix '{}_{}' "
                       "(characters other than letters, digits, '-' and '_' become '_'); rename one of them",
                       o.input, it->second, task_line[it->second], task, task_line[task], o.output_prefix, s);
  }
  std::map<std::string, TaskWriter> writers;
  std::vector<OutputFile> outputs;  // every file the command writes, the manifest last
  for (const auto& task : task_order) {
    TaskWriter w;
    w.name = task;
    w.paired = task_paired[task];
    const std::string base = o.split_by_task ? o.output_prefix + "_" + sanitize_task_name(task) : o.output_prefix;
    if (w.paired && o.paired_layout == "prefixes") {
      w.prefixes = {base + "_inputs_document", base + "_targets_document"};
    } else {
      w.prefixes = {base};
    }
    for (const auto& p : w.prefixes) {
      for (auto& f : dl::dataset_output_files(p, fmt::format("output dataset file of task '{}'", task))) {
        outputs.push_back(std::move(f));
      }
    }
    writers.emplace(task, std::move(w));
  }
  outputs.push_back({o.manifest, "--manifest"});
  // Before anything is created: no output is the input, and no two outputs (a task's dataset and
  // another's, or the manifest) are one file.
  check_command_files({o.input}, outputs);
  for (const auto& task : task_order) {
    TaskWriter& w = writers.at(task);
    const bool modes = w.paired && o.paired_layout == "sequences";
    for (const auto& p : w.prefixes) {
      fs::path parent = fs::path(p).parent_path();
      if (!parent.empty()) fs::create_directories(parent);
      w.builders.push_back(std::make_unique<dl::IndexedDatasetBuilder>(p, dt, modes));
    }
  }

  // Pass 2: write.
  std::vector<std::uint8_t> buf;
  auto append = [&](dl::IndexedDatasetBuilder& b, std::vector<std::int64_t> ids, std::int8_t mode) {
    if (o.append_eod >= 0) ids.push_back(o.append_eod);
    buf.resize(ids.size() * dl::dtype_size(dt));
    dl::encode_tokens(ids.data(), ids.size(), dt, buf.data());
    b.add_item(buf.data(), ids.size(), mode);
  };
  for_each_record(o.input, [&](std::uint64_t line, const Json& rec) {
    const std::string task = task_of(rec, o.input, line);
    TaskWriter& w = writers.at(task);
    auto in = ids_of(rec, "input_ids", o.input, line);
    if (!w.paired) {
      append(*w.builders[0], std::move(in), 0);
      w.builders[0]->end_document();
    } else if (w.builders.size() == 2) {
      append(*w.builders[0], std::move(in), 0);
      append(*w.builders[1], ids_of(rec, "target_ids", o.input, line), 0);
      w.builders[0]->end_document();
      w.builders[1]->end_document();
    } else {
      append(*w.builders[0], std::move(in), 0);
      append(*w.builders[0], ids_of(rec, "target_ids", o.input, line), 1);
      w.builders[0]->end_document();
    }
    ++w.records;
  });

  Json result;
  result["input"] = o.input;
  result["records"] = records;
  result["dtype"] = dl::dtype_name(dt);
  Json datasets = Json::array();
  Json manifest_tasks = Json::array();
  const fs::path manifest_dir = o.manifest.empty() ? fs::path() : fs::absolute(o.manifest).parent_path();
  auto rel = [&](const std::string& p) {
    return o.manifest.empty() ? p : fs::relative(fs::absolute(p), manifest_dir).string();
  };
  for (const auto& task : task_order) {
    TaskWriter& w = writers.at(task);
    for (std::size_t k = 0; k < w.builders.size(); ++k) {
      w.builders[k]->finalize();
      datasets.push_back(Json{{"task", task},
                              {"prefix", w.prefixes[k]},
                              {"sequences", w.builders[k]->num_sequences()},
                              {"documents", w.builders[k]->num_documents()},
                              {"tokens", w.builders[k]->num_tokens()}});
    }
    Json t{{"name", task}};
    if (!w.paired) {
      t["dataset"] = rel(w.prefixes[0]);
    } else if (w.prefixes.size() == 2) {
      t["inputs"] = rel(w.prefixes[0]);
      t["targets"] = rel(w.prefixes[1]);
    } else {
      t["dataset"] = rel(w.prefixes[0]);
      t["layout"] = dl::layout_name(dl::TaskLayout::PairedSequences);
    }
    manifest_tasks.push_back(std::move(t));
  }
  result["datasets"] = std::move(datasets);
  if (!o.manifest.empty()) {
    Json m{{"version", 1}, {"tasks", std::move(manifest_tasks)}};
    write_file_atomic(o.manifest, m.dump(2) + "\n");
    result["manifest"] = o.manifest;
  }
  return result;
}

// ---- sample -----------------------------------------------------------------------------------

struct SampleOptions {
  std::string source;
  std::uint64_t seed = 1234;
  std::uint64_t epoch = 0;
  std::uint64_t batch_tokens = 0;
  std::uint64_t batch_samples = 0;
  std::string split = "train";
  std::uint64_t batches = 5;
  std::uint32_t dp = 1;
  ContextArgs context;
  bool encoder_decoder = false;  ///< count samples as an encoder-decoder model does (the context length per side)
  bool json = false;
};

/// Forms the batches `o` asks for and hands each to the caller as it is formed (memory independent of
/// their number): `header` once (source, epoch, sizes, context length), `batch` per global batch in
/// order, `state` once at the end (the sampler's state after the last batch shown).
void run_sample(const SampleOptions& o, const std::function<void(const Json&)>& header,
                const std::function<void(const Json&)>& batch, const std::function<void(const Json&)>& state) {
  const planner::ContextLength context = o.context.context();
  planner::check_context_length(context, o.encoder_decoder);
  const dl::MultiTaskDataset mt = is_manifest_path(o.source)
                                      ? dl::MultiTaskDataset(dl::load_manifest(o.source))
                                      : dl::MultiTaskDataset::from_prefix(normalize_prefix(o.source));
  PACKPIPE_CHECK_ARG((o.batch_tokens > 0) != (o.batch_samples > 0),
                     "give exactly one of --global-batch-tokens and --global-batch-samples");
  PACKPIPE_CHECK_ARG(o.dp >= 1, "--dp must be at least 1, found {}", o.dp);
  dl::SamplerConfig cfg = dl::sampler_config(mt.manifest());
  cfg.seed = o.seed;
  cfg.split = dl::split_from_name(o.split);
  cfg.global_batch_tokens = o.batch_tokens;
  cfg.global_batch_samples = o.batch_samples;
  cfg = planner::budget_of_trained_tokens(cfg, context, o.encoder_decoder);  // the budget counts what is trained
  dl::Sampler sampler(mt, cfg);
  sampler.set_epoch(o.epoch);

  Json j;
  j["source"] = o.source;
  j["epoch"] = o.epoch;
  j["epoch_samples"] = sampler.epoch_size();
  if (context.limited()) {
    j["max_seq_len"] = context.max_seq_len;
    if (o.encoder_decoder) j["max_target_len"] = context.target_limit();
    j["seq_policy"] = planner::seq_policy_name(context.policy);
  }
  header(j);
  dl::GlobalBatch b;
  std::uint64_t n = 0;
  while ((o.batches == 0 || n < o.batches) && sampler.next_batch(b)) {
    std::map<std::string, std::uint64_t> per_task;
    std::uint64_t max_len = 0;
    for (const auto& r : b.samples) {
      ++per_task[mt.manifest().tasks[r.task].name];
      max_len = std::max(max_len, mt.sample_tokens(r.task, r.index));
    }
    Json bj{{"index", b.index}, {"samples", b.samples.size()}, {"tokens", b.tokens}, {"max_sample_tokens", max_len}};
    bj["tasks"] = per_task;
    if (context.limited()) {
      // The batch as planning sees it (planner::batch_lengths): after the context length.
      planner::ContextReport report;
      const part::BatchLengths l = planner::batch_lengths(mt, b, o.encoder_decoder, b.index, nullptr,
                                                          pl::LossMode::AllTokens, context, &report);
      std::uint64_t tokens = 0, longest = 0;
      for (std::size_t k = 0; k < l.size(); ++k) {
        const std::uint64_t n = std::uint64_t{l.input[k]} + (l.encoder_decoder() ? l.target[k] : 0);
        tokens += n;
        longest = std::max(longest, n);
      }
      bj["seq_samples"] = l.size();
      bj["seq_tokens"] = tokens;
      bj["seq_max_sample_tokens"] = longest;
      bj.update(context_json(context, report));
    }
    if (o.dp > 1) {
      Json ranks = Json::array();
      for (std::uint32_t r = 0; r < o.dp; ++r) {
        std::uint64_t tok = 0;
        const auto shard = dl::shard_batch(b, mt, r, o.dp);
        for (const auto& s : shard) tok += mt.sample_tokens(s.task, s.index);
        ranks.push_back(Json{{"samples", shard.size()}, {"tokens", tok}});
      }
      bj["ranks"] = std::move(ranks);
    }
    batch(bj);
    ++n;
  }
  state(parse_ordered_json(sampler.state().to_json(), "sampler state"));
}

}  // namespace

int exit_status() { return g_exit_status; }
void set_exit_status(int status) { g_exit_status = status; }

namespace {

/// The text form of `dataset build`'s result.
void print_build(const Json& j) {
  std::printf("built %zu dataset(s) from %llu records (dtype %s)\n", j["datasets"].size(),
              j["records"].get<unsigned long long>(), j["dtype"].get<std::string>().c_str());
  for (const auto& d : j["datasets"]) {
    std::printf("  %s: %llu sequences, %llu tokens\n", d["prefix"].get<std::string>().c_str(),
                d["sequences"].get<unsigned long long>(), d["tokens"].get<unsigned long long>());
  }
  if (j.contains("manifest")) std::printf("manifest: %s\n", j["manifest"].get<std::string>().c_str());
}

/// The text form of `dataset sample`'s header for `source`.
void print_sample_header(const Json& j, const std::string& source) {
  std::printf("%s: epoch %llu has %llu samples\n", source.c_str(), j["epoch"].get<unsigned long long>(),
              j["epoch_samples"].get<unsigned long long>());
}

/// The text form of one batch of `dataset sample`.
void print_sample_batch(const Json& b) {
  {
    std::string tasks;
    for (auto it = b["tasks"].begin(); it != b["tasks"].end(); ++it) {
      tasks += fmt::format("{}{}={}", tasks.empty() ? "" : " ", it.key(), it.value().get<std::uint64_t>());
    }
    std::printf("  batch %llu: %llu samples, %llu tokens, longest %llu  [%s]\n",
                b["index"].get<unsigned long long>(), b["samples"].get<unsigned long long>(),
                b["tokens"].get<unsigned long long>(), b["max_sample_tokens"].get<unsigned long long>(),
                tasks.c_str());
    if (b.contains("seq_samples")) {
      std::printf("           within the context length: %llu samples, %llu tokens, longest %llu (%llu truncated, "
                  "%llu dropped, %llu split into %llu chunks)\n",
                  b["seq_samples"].get<unsigned long long>(), b["seq_tokens"].get<unsigned long long>(),
                  b["seq_max_sample_tokens"].get<unsigned long long>(), b["seq_truncated"].get<unsigned long long>(),
                  b["seq_dropped"].get<unsigned long long>(), b["seq_split"].get<unsigned long long>(),
                  b["seq_chunks"].get<unsigned long long>());
    }
    if (b.contains("ranks")) {
      std::string ranks;
      for (const auto& r : b["ranks"]) {
        ranks += fmt::format("{}{}/{}", ranks.empty() ? "" : "  ", r["samples"].get<std::uint64_t>(),
                             r["tokens"].get<std::uint64_t>());
      }
      std::printf("           per rank (samples/tokens): %s\n", ranks.c_str());
    }
  }
}

/// `dataset info`: format, dtype, counts and length statistics.
void add_info_command(CLI::App* ds) {
  auto* cmd = ds->add_subcommand("info", "Format, dtype, counts and length statistics of a dataset or manifest");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto modes = std::make_shared<std::string>("auto");
  cmd->add_option("PATH", *path, "Dataset prefix (P, P.idx or P.bin) or a manifest .json")->required();
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->add_option("--modes", *modes, "Whether .idx carries sequence modes: " + enum_name_list(dl::kModesPolicyNames))
      ->check(one_of(dl::kModesPolicyNames));
  cmd->callback([=] {
    Json j;
    if (is_manifest_path(*path)) {
      j = manifest_info_json(dl::MultiTaskDataset(dl::load_manifest(*path)));
      if (*json) return print_json(j);
      return print_manifest_info(j);
    }
    dl::IndexedDataset::Options opt;
    opt.modes = dl::modes_policy_from_name(*modes);
    j = dataset_info_json(dl::IndexedDataset(normalize_prefix(*path), opt));
    if (*json) return print_json(j);
    print_dataset_info(j);
  });
}

/// `dataset verify`: the full consistency check; exit status 1 on a problem.
void add_verify_command(CLI::App* ds) {
  auto* cmd = ds->add_subcommand("verify", "Full consistency check; exit status 1 on any problem");
  auto paths = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  auto max_problems = std::make_shared<std::size_t>(20);
  cmd->add_option("PATH", *paths, "Dataset prefixes and/or manifest .json files")->required();
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->add_option("--max-problems", *max_problems, "Stop listing after this many problems per dataset");
  cmd->callback([=] {
    std::vector<std::string> prefixes;
    for (const auto& p : *paths) {
      if (!is_manifest_path(p)) {
        prefixes.push_back(normalize_prefix(p));
        continue;
      }
      const auto m = dl::load_manifest(p);
      for (const auto& t : m.tasks) {
        prefixes.insert(prefixes.end(), t.prefixes.begin(), t.prefixes.end());
        prefixes.insert(prefixes.end(), t.target_prefixes.begin(), t.target_prefixes.end());
      }
    }
    Json results = Json::array();
    std::size_t problems = 0;
    for (const auto& p : prefixes) problems += verify_prefix(p, *max_problems, *json ? &results : nullptr);
    if (*json) print_json(Json{{"ok", problems == 0}, {"problems", problems}, {"datasets", results}});
    set_exit_status(problems == 0 ? 0 : 1);
  });
}

/// `dataset build`: Megatron datasets from pre-tokenized JSON lines.
void add_build_command(CLI::App* ds) {
  auto* cmd = ds->add_subcommand("build", "Build Megatron datasets from pre-tokenized JSON lines");
  auto o = std::make_shared<BuildOptions>();
  cmd->add_option("--input", o->input, "JSON lines with 'input_ids', optional 'target_ids' and 'task'")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--output-prefix", o->output_prefix, "Output prefix (P writes P.bin and P.idx)")->required();
  cmd->add_option("--dtype", o->dtype, "Token dtype, or auto (uint16 below 65500, else int32)");
  cmd->add_option("--append-eod", o->append_eod, "Append this token id to every sequence");
  cmd->add_flag("--split-by-task", o->split_by_task, "One dataset per task: P_<task>[_inputs|_targets_document]");
  cmd->add_option("--paired-layout", o->paired_layout,
                  "Records with targets: 'prefixes' (two datasets) or 'sequences' (two sequences per document, modes 0/1)")
      ->check(CLI::IsMember({"prefixes", "sequences"}));
  cmd->add_option("--manifest", o->manifest, "Also write a manifest listing the datasets");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    const Json j = run_build(*o);
    if (o->json) return print_json(j);
    print_build(j);
  });
}

/// `dataset compress`: P.bin.zst beside P.idx, verified.
void add_compress_command(CLI::App* ds) {
  auto* cmd = ds->add_subcommand("compress", "Write P.bin.zst (seekable zstd) beside P.idx");
  auto prefix = std::make_shared<std::string>();
  auto opt = std::make_shared<dl::ZstdSeekableOptions>();
  auto remove = std::make_shared<bool>(false);
  auto json = std::make_shared<bool>(false);
  cmd->add_option("PREFIX", *prefix, "Dataset prefix")->required();
  cmd->add_option("--level", opt->level, "zstd level (1-19; 3 default, 19 for cold archives)")
      ->check(CLI::Range(1, 22));
  cmd->add_option("--frame-size", opt->frame_size, "Uncompressed bytes per frame (default 262144)")
      ->check(CLI::Range(1u << 10, 1u << 30));
  cmd->add_flag("--remove-bin", *remove, "Delete P.bin after a verified compression");
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->callback([=] {
    const std::string p = normalize_prefix(*prefix);
    const std::string bin = p + ".bin", zst = p + ".bin.zst";
    { const dl::IndexedDataset check(p); }  // refuse to compress a dataset whose index does not open
    const std::uint64_t out = dl::zstd_seekable_compress(bin, zst, *opt);
    const std::uint64_t in = file_size(bin);
    dl::open_zstd_bin(zst)->verify();
    if (*remove) fs::remove(bin);
    Json j{{"prefix", p}, {"bin_bytes", in}, {"zst_bytes", out},
           {"ratio", out ? static_cast<double>(in) / static_cast<double>(out) : 0.0},
           {"frame_size", opt->frame_size}, {"level", opt->level}, {"removed_bin", *remove}};
    if (*json) return print_json(j);
    std::printf("%s: %s -> %s (%.2fx), verified%s\n", zst.c_str(), human_bytes(in).c_str(),
                human_bytes(out).c_str(), j["ratio"].get<double>(), *remove ? ", .bin removed" : "");
  });
}

/// `dataset decompress`: P.bin from P.bin.zst.
void add_decompress_command(CLI::App* ds) {
  auto* cmd = ds->add_subcommand("decompress", "Write P.bin from P.bin.zst, checking every frame");
  auto prefix = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto force = std::make_shared<bool>(false);
  cmd->add_option("PREFIX", *prefix, "Dataset prefix")->required();
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->add_flag("--force", *force, "Replace an existing P.bin (whose content may differ from P.bin.zst's)");
  cmd->callback([=] {
    const std::string p = normalize_prefix(*prefix);
    PACKPIPE_CHECK_ARG(*force || !file_exists(p + ".bin"),
                       "{}.bin exists: decompressing would replace it with {}.bin.zst's content, which may differ "
                       "(a stale .bin.zst); remove it, or pass --force", p, p);
    // The compressed data against the index (the end of the last sequence), before anything is written.
    dl::IndexedDataset::Options check;
    check.compressed = true;
    { const dl::IndexedDataset compressed(p, check); }
    const std::uint64_t n = dl::zstd_seekable_decompress(p + ".bin.zst", p + ".bin");
    if (*json) return print_json(Json{{"prefix", p}, {"bin_bytes", n}});
    std::printf("%s.bin: %s written, all frames checked\n", p.c_str(), human_bytes(n).c_str());
  });
}

/// `dataset merge`: datasets concatenated.
void add_merge_command(CLI::App* ds) {
  auto* cmd = ds->add_subcommand("merge", "Concatenate datasets (byte copy plus pointer shift, constant memory)");
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("INPUT", *inputs, "Input prefixes, in order")->required();
  cmd->add_option("--output-prefix", *out, "Output prefix")->required();
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->callback([=] {
    std::vector<std::string> in;
    for (const auto& p : *inputs) in.push_back(normalize_prefix(p));
    dl::merge_datasets(in, *out);
    dl::IndexedDataset merged(*out);
    Json j{{"prefix", *out}, {"inputs", in}, {"sequences", merged.size()},
           {"documents", merged.num_documents()}, {"tokens", merged.num_tokens()}};
    if (*json) return print_json(j);
    std::printf("%s: merged %zu datasets, %llu sequences, %llu documents, %llu tokens\n", out->c_str(),
                in.size(), static_cast<unsigned long long>(merged.size()),
                static_cast<unsigned long long>(merged.num_documents()),
                static_cast<unsigned long long>(merged.num_tokens()));
  });
}

/// `dataset sample`: the global batches the sampler forms.
void add_sample_command(CLI::App* ds) {
  auto* cmd = ds->add_subcommand("sample", "Show the global batches the sampler forms");
  auto o = std::make_shared<SampleOptions>();
  cmd->add_option("PATH", o->source, "Manifest .json or dataset prefix")->required();
  cmd->add_option("--seed", o->seed, "Sampler seed");
  cmd->add_option("--epoch", o->epoch, "Epoch");
  cmd->add_option("--global-batch-tokens", o->batch_tokens, "Token budget per global batch");
  cmd->add_option("--global-batch-samples", o->batch_samples, "Samples per global batch");
  cmd->add_option("--split", o->split, "Split: " + enum_name_list(dl::kSplitNames))->check(one_of(dl::kSplitNames));
  cmd->add_option("--batches", o->batches, "How many batches to show (0: every batch of the epoch; each is printed as "
                                           "it is formed, so memory does not grow with the count)");
  cmd->add_option("--dp", o->dp, "Data-parallel ranks to shard each batch over");
  o->context.add_to(cmd);
  cmd->add_flag("--encoder-decoder", o->encoder_decoder,
                "Count samples as an encoder-decoder model does: input and target apart, the context length per side "
                "(default: decoder-only, input + target as one sequence)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    if (!o->json) {
      run_sample(
          *o, [&](const Json& h) { print_sample_header(h, o->source); }, print_sample_batch, [](const Json&) {});
      return;
    }
    // One JSON object, as print_json would write it, streamed: the header's fields, "batches" one by
    // one, then "state".
    auto first = std::make_shared<bool>(true);
    run_sample(
        *o,
        [](const Json& h) {
          std::string head = h.dump(2);
          head.resize(head.size() - 2);  // without the closing "\n}"
          std::printf("%s,\n  \"batches\": [", head.c_str());
        },
        [first](const Json& b) {
          std::printf("%s\n    %s", *first ? "" : ",", indent_json_lines(b.dump(2), 4).c_str());
          *first = false;
        },
        [first](const Json& st) {
          std::printf("%s],\n  \"state\": %s\n}\n", *first ? "" : "\n  ", indent_json_lines(st.dump(2), 2).c_str());
        });
  });
}

}  // namespace

void register_dataset_commands(CLI::App& app) {
  auto* ds = app.add_subcommand("dataset", "Inspect, verify, build, compress and merge token datasets");
  ds->require_subcommand(1);
  add_info_command(ds);
  add_verify_command(ds);
  add_build_command(ds);
  add_compress_command(ds);
  add_decompress_command(ds);
  add_merge_command(ds);
  add_sample_command(ds);
}

}  // namespace packpipe::cli
