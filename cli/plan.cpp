// `packpipe plan`: plans every iteration of an epoch of a multi-task dataset (micro-batches by DP on
// the cost model, schedule search, instruction streams) in parallel, streams the plans to one file
// and reports packpipe's simulated throughput against the baselines a user would run.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "costmodel/factory.h"
#include "costmodel/report.h"
#include "dataloader/indexed_dataset.h"
#include "dataloader/manifest.h"
#include "dataloader/multitask.h"
#include "dataloader/sampler.h"
#include "partition/partition.h"
#include "plan/format.h"
#include "planner/epoch.h"
#include "planner/loader.h"
#include "plan/trace.h"
#include "schedule/schedules.h"

namespace packpipe::cli {

namespace dl = packpipe::dataloader;
namespace cm = packpipe::costmodel;
namespace part = packpipe::partition;
namespace sched = packpipe::schedule;
namespace pl = packpipe::plan;

namespace {

struct PlanCliOptions {
  std::string manifest, dataset;
  CostModelArgs costs;
  ShapeArgs shape_args = {4};
  ContextArgs context;
  std::uint64_t batch_tokens = 0, batch_samples = 0, seed = 1234, epoch = 0, iterations = 0;
  std::string split = "train";
  std::string schedule = "search";
  std::string method = "dp";
  std::string recompute = "auto";
  std::string oversize = "error";
  std::string slicing = "auto";
  std::uint32_t min_slice_tokens = 64;
  std::int64_t round_multiple = 8;
  std::vector<std::int64_t> baseline_mbs = {1, 2, 4, 8, 16, 32, 64};
  std::vector<std::int64_t> baseline_rows = {1, 2, 4, 8, 16};
  std::string layouts = "padded,packed";
  bool no_baselines = false, validate = false, compress = false, json = false;
  double min_gain = planner::PlannerOptions{}.min_gain;
  std::string baseline_schedule = "as-run";
  std::string out, report, trace;
  int threads = 0;
  std::string dtype, loss = "all", family = "any";  ///< dtype empty: the model file's, else bf16
  bool tied_embedding = false, no_split_backward = false, fallback = false;
};

/// Range checks of the options that are not the pipeline shape (ShapeArgs checks that), before
/// anything is read or allocated from them.
void check_plan_options(const PlanCliOptions& o) {
  check_option_range("--global-batch-tokens", o.batch_tokens, 0, kMaxGlobalBatchTokens);
  check_option_range("--global-batch-samples", o.batch_samples, 0, kMaxGlobalBatchSamples,
                     "a global batch names its samples with 32-bit ids");
  check_option_range("--threads", static_cast<std::int64_t>(o.threads), 0, kMaxThreads, "0: all cores");
  check_option_range("--round-multiple", o.round_multiple, 1, part::kMaxRoundMultiple);
  (void)o.context.context();  // --max-seq-len, --max-target-len
  PACKPIPE_CHECK_ARG(!o.baseline_mbs.empty() || o.no_baselines, "--baseline-mbs needs at least one size");
  for (const auto m : o.baseline_mbs) check_option_range("--baseline-mbs", m, 1, planner::kMaxBaselineMbs);
  for (const auto m : o.baseline_rows) check_option_range("--baseline-rows", m, 1, planner::kMaxBaselineMbs);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

Json figures_json(const planner::MethodFigures& f, std::uint64_t tokens) {
  Json j{{"feasible", f.feasible}, {"microbatches", f.microbatches}, {"efficiency", f.efficiency}};
  j["iteration_ms"] = std::isfinite(f.iteration_ms) ? Json(f.iteration_ms) : Json(nullptr);
  j["tokens_per_s"] = f.feasible && f.iteration_ms > 0 ? Json(static_cast<double>(tokens) / (f.iteration_ms / 1e3))
                                                        : Json(nullptr);
  j["peak_mb"] = f.peak_mb;
  if (!f.schedule.empty()) j["schedule"] = f.schedule;
  if (!f.why.empty()) j["why"] = f.why;
  return j;
}

// ---- run_plan's steps ----

/// The option checks that need no file: one source, the ranges, one batch size.
void check_plan_inputs(const PlanCliOptions& o) {
  PACKPIPE_CHECK_ARG(o.manifest.empty() != o.dataset.empty(), "give exactly one of --manifest and --dataset");
  check_plan_options(o);
  PACKPIPE_CHECK_ARG((o.batch_tokens > 0) != (o.batch_samples > 0),
                     "give exactly one of --global-batch-tokens and --global-batch-samples");
}

/// Refuses every output before anything is written if it is one of the inputs (the manifest, any
/// dataset file of any task, a profile): writing it would destroy what is being read. Called before
/// the cost model is loaded, so that a model or profile file named as an output is refused as such.
/// Also refuses two outputs naming the same file.
void check_plan_outputs(const PlanCliOptions& o, const dl::MultiTaskDataset& data) {
  std::vector<std::string> inputs;
  if (!o.manifest.empty()) inputs.push_back(o.manifest);
  auto add_dataset = [&](const std::string& prefix) {
    for (auto& f : dl::dataset_input_files(prefix)) inputs.push_back(std::move(f));
  };
  for (const auto& t : data.manifest().tasks) {
    for (const auto& pre : t.prefixes) add_dataset(pre);
    for (const auto& pre : t.target_prefixes) add_dataset(pre);
  }
  if (!o.dataset.empty()) add_dataset(o.dataset);
  for (const auto& f : cost_model_inputs(o.costs)) inputs.push_back(f);
  check_command_files(inputs, {{o.out, "--out"}, {o.trace, "--chrome-trace"}, {o.report, "--report"}});
}

/// The planner's options from the command line.
planner::PlannerOptions planner_options(const PlanCliOptions& o, const cm::CostModel& cost) {
  planner::PlannerOptions po;
  po.shape = o.shape_args.shape(&cost);
  po.partition.method = part::partition_method_from_name(o.method);
  po.partition.recompute = part::recompute_policy_from_name(o.recompute);
  po.partition.round_multiple = o.round_multiple;
  po.partition.oversize = part::oversize_policy_from_name(o.oversize);
  po.partition.oversize_option = "--oversize";
  po.partition.slicing = part::slice_policy_from_name(o.slicing);
  po.partition.min_slice_tokens = o.min_slice_tokens;
  po.context = o.context.context();
  po.schedule = o.schedule;
  po.search.seed = o.seed;
  po.validate = o.validate;
  po.baselines = !o.no_baselines;
  po.baseline_schedule = planner::baseline_schedule_from_name(o.baseline_schedule);
  po.min_gain = o.min_gain;
  po.baseline_mbs = o.baseline_mbs;
  po.baseline_rows = o.baseline_rows;
  po.partition.layouts = layout_set_from_names(o.layouts);
  po.keep_timeline = true;
  const std::string& model_dtype = cost.model().activation_dtype;
  po.dtype = pl::dtype_from_name(!o.dtype.empty() ? o.dtype : !model_dtype.empty() ? model_dtype : "bf16");
  po.loss_mode = pl::loss_mode_from_name(o.loss);
  po.family = planner::schedule_family_from_name(o.family);
  po.tied_embedding = o.tied_embedding;
  po.allow_split_backward = !o.no_split_backward;
  po.fallback = o.fallback;
  return po;
}

/// The iterations to plan: the sampler of `data` under the command line's seed, split and batch size.
planner::EpochSpec epoch_spec(const PlanCliOptions& o, const dl::MultiTaskDataset& data) {
  planner::EpochSpec spec;
  spec.sampler = dl::sampler_config(data.manifest());
  spec.sampler.seed = o.seed;
  spec.sampler.split = dl::split_from_name(o.split);
  spec.sampler.global_batch_tokens = o.batch_tokens;
  spec.sampler.global_batch_samples = o.batch_samples;
  spec.epoch = o.epoch;
  spec.iterations = o.iterations;
  return spec;
}

/// The --out plan file (null without --out), marked to hold `expected` iterations, so that a file
/// that holds fewer reads as incomplete, and to index `data` (loaders refuse it over another dataset).
std::unique_ptr<pl::PlanFileWriter> open_plan_file(const PlanCliOptions& o, const dl::MultiTaskDataset& data,
                                                   std::uint64_t expected) {
  if (o.out.empty()) return nullptr;
  pl::EncodeOptions wo;
  wo.compress = o.compress;
  auto writer = std::make_unique<pl::PlanFileWriter>(o.out, wo);
  if (expected > 0) writer->expect_iterations(0, expected);
  writer->set_dataset(planner::dataset_identity(data));
  return writer;
}

/// Sums over the iterations for the report's "total".
struct Sums {
  double packpipe_ms = 0, flops = 0;
  std::uint64_t samples = 0, tokens = 0, microbatches = 0, truncated = 0, dropped = 0;
  planner::ContextReport context;  ///< counts only
  bool packpipe_feasible = true;
  std::uint64_t infeasible = 0;      ///< iterations whose plan is over the memory limit
  std::uint64_t first_infeasible = 0;
  std::string first_why;             ///< the first such iteration's reason
  std::vector<double> planning_ms;
  std::vector<double> peak_mb;  ///< per stage, the max over the iterations
};

/// What planning the epoch leaves for the report, accumulated iteration by iteration: totals,
/// the baseline grid's column totals and 8 bytes of planning time per iteration. Each iteration's
/// own figures go to a spill file as one JSON line, read back once when the report is written, so
/// the report's memory does not grow with the epoch.
struct Planned {
  std::uint64_t rows = 0, from_baselines = 0;
  Sums sums;
  std::vector<part::Baseline> grid;  ///< the baseline settings (every iteration lists the same grid)
  std::vector<double> column_ms;     ///< per grid entry, its total over the run (infinite where one does not fit)
  std::vector<char> candidate;       ///< per grid entry, BaselineFigures::candidate
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> spill{nullptr, &std::fclose};
  double wall_s = 0;
  int threads = 0;
};

/// One iteration's figures as the spill keeps them: the report's iteration object, with every grid
/// entry's figures under "columns" (the report keeps each family's chosen one).
Json spill_row(const planner::IterationResult& r, const planner::PlannerOptions& po) {
  Json it{{"iteration", r.iteration}, {"samples", r.samples}, {"tokens", r.tokens}};
  it["packpipe"] = figures_json(r.packpipe, r.tokens);
  it["packpipe"]["source"] = r.source;
  if (!r.baselines.empty()) {
    Json cols = Json::array();
    for (const auto& e : r.baselines) cols.push_back(figures_json(e.figures, r.tokens));
    it["columns"] = std::move(cols);
  }
  if (po.partition.oversize != part::OversizePolicy::Error) {
    it["truncated"] = r.truncated;
    it["dropped"] = r.dropped;
  }
  it.update(context_json(po.context, r.context));
  it["planning_ms"] = r.planning_ms;
  if (!r.schedule_note.empty()) it["schedule_note"] = r.schedule_note;
  it["partition_ms"] = r.partition_ms;
  it["schedule_ms"] = r.schedule_ms;
  it["candidates_ms"] = r.candidates_ms;
  it["build_ms"] = r.build_ms;
  return it;
}

/// Adds one iteration to the running figures and its line to the spill.
void tally(Planned& p, const planner::IterationResult& r, const planner::PlannerOptions& po) {
  Sums& s = p.sums;
  if (p.rows == 0) {
    s.peak_mb.assign(static_cast<std::size_t>(po.shape.stages), 0.0);
    for (const auto& b : r.baselines) {
      p.grid.push_back(b.baseline);
      p.candidate.push_back(b.candidate ? 1 : 0);
    }
    p.column_ms.assign(p.grid.size(), 0.0);
  }
  ++p.rows;
  p.from_baselines += r.from_baseline ? 1 : 0;
  s.packpipe_ms += r.packpipe.iteration_ms;
  s.packpipe_feasible = s.packpipe_feasible && r.packpipe.feasible;
  if (!r.packpipe.feasible && s.infeasible++ == 0) {
    s.first_infeasible = r.iteration;
    s.first_why = r.packpipe.why;
  }
  s.flops += r.model_flops;
  s.samples += r.samples;
  s.tokens += r.tokens;
  s.microbatches += static_cast<std::uint64_t>(r.packpipe.microbatches);
  s.truncated += r.truncated;
  s.dropped += r.dropped;
  s.context.truncated += r.context.truncated;
  s.context.dropped += r.context.dropped;
  s.context.split += r.context.split;
  s.context.chunks += r.context.chunks;
  s.planning_ms.push_back(r.planning_ms);
  for (std::size_t k = 0; k < s.peak_mb.size() && k < r.packpipe.peak_mb.size(); ++k) {
    s.peak_mb[k] = std::max(s.peak_mb[k], r.packpipe.peak_mb[k]);
  }
  for (std::size_t c = 0; c < p.column_ms.size(); ++c) {
    const planner::MethodFigures* f = c < r.baselines.size() ? &r.baselines[c].figures : nullptr;
    p.column_ms[c] += f != nullptr && f->feasible ? f->iteration_ms : std::numeric_limits<double>::infinity();
  }
  const std::string line = spill_row(r, po).dump() + "\n";
  PACKPIPE_CHECK(std::fwrite(line.data(), 1, line.size(), p.spill.get()) == line.size(),
                 "plan: writing the report's temporary file failed: {}", std::strerror(errno));
}

/// Plans every iteration through planner::EpochPlanner, streaming the plans to --out (which
/// appears only when all are written), iteration 0's timeline to --chrome-trace and each
/// iteration's figures to the report's spill.
Planned plan_epoch(const PlanCliOptions& o, const dl::MultiTaskDataset& data, const cm::CostModel& cost,
                   const planner::PlannerOptions& po) {
  planner::EpochOptions eo;
  eo.threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  eo.encode = !o.out.empty();
  eo.encoding.compress = o.compress;
  planner::EpochPlanner epoch(data, cost, po, epoch_spec(o, data), eo);
  const std::unique_ptr<pl::PlanFileWriter> writer = open_plan_file(o, data, epoch.iterations());
  Progress progress("planning", epoch.iterations());
  Planned out;
  out.threads = eo.threads;
  out.spill.reset(std::tmpfile());  // anonymous: gone when closed, whatever happens
  PACKPIPE_CHECK(out.spill != nullptr, "plan: cannot create the report's temporary file: {}", std::strerror(errno));
  std::string trace_json;
  const auto t_start = std::chrono::steady_clock::now();
  epoch.run([&](planner::PlannedIteration& w) {
    auto& r = w.result;
    if (writer) {
      for (std::size_t k = 0; k < w.blobs.size(); ++k) {
        writer->append_encoded(r.iteration, static_cast<std::uint32_t>(k), w.blobs[k]);  // blobs in replica order
      }
    }
    if (r.iteration == 0 && !o.trace.empty()) trace_json = pl::chrome_trace_json(r.schedules.front());
    tally(out, r, po);
    progress.update(out.rows);
  });
  progress.finish();
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  PACKPIPE_CHECK_ARG(out.rows > 0, "no global batch to plan: the {} split of epoch {} is empty", o.split, o.epoch);
  if (writer) writer->close();  // only now does the plan file appear
  if (!o.trace.empty() && !trace_json.empty()) write_file_atomic(o.trace, trace_json);
  return out;
}

/// The report's "config": what was planned, on what, how.
Json config_json(const PlanCliOptions& o, const cm::CostModel& cost, const planner::PlannerOptions& po, int threads) {
  const double memory_mb = po.shape.memory_limit_mb > 0 ? po.shape.memory_limit_mb : cost.device().memory_gb * 1e3;
  return Json{{"source", o.manifest.empty() ? o.dataset : o.manifest},
              {"model", cost.model().name},
              {"device", cost.device().name},
              {"cost_model", cost.describe()},
              {"stages", po.shape.stages},
              {"chunks", po.shape.chunks},
              {"dp", po.shape.dp},
              {"tp", po.shape.tp},
              {"memory_limit_mb", memory_mb},
              {"global_batch_tokens", o.batch_tokens},
              {"global_batch_samples", o.batch_samples},
              {"seed", o.seed},
              {"epoch", o.epoch},
              {"method", o.method},
              {"min_gain", po.min_gain},
              {"layouts", layout_set_names(po.partition.layouts)},
              {"schedule", o.schedule},
              {"baseline_schedule", po.baselines ? Json(o.baseline_schedule) : Json(nullptr)},
              {"threads", threads}};
}

/// The context length in the report's "config" (nothing when there is none: reports of runs
/// without one are unchanged).
void add_context_config(Json& config, const planner::ContextLength& c, bool encdec) {
  if (!c.limited()) return;
  config["max_seq_len"] = c.max_seq_len;
  if (encdec) config["max_target_len"] = c.target_limit();
  config["seq_policy"] = planner::seq_policy_name(c.policy);
}

/// The baseline families the report compares with, each at its best setting over the run.
struct Baselines {
  struct Family {
    std::string name;
    std::int64_t col = -1;  ///< grid entry (-1: no setting fits every iteration)
    double total_ms = 0;
    /// Its plans are candidates for packpipe's (the dp method, and a layout --layouts lists);
    /// otherwise reported only, and packpipe may be slower.
    bool candidate = false;
    std::string layout;
  };
  std::vector<Family> families;  ///< in grid order of first appearance
  std::int64_t best = -1;        ///< index into families of the fastest (-1: none fits)
};

Baselines choose_baselines(const Planned& p, const planner::PlannerOptions& po) {
  Baselines b;
  if (!po.baselines) return b;
  for (std::size_t gi = 0; gi < p.grid.size(); ++gi) {
    const part::Baseline& g = p.grid[gi];
    const std::string name = g.family();
    if (std::any_of(b.families.begin(), b.families.end(), [&](const auto& f) { return f.name == name; })) continue;
    Baselines::Family f;
    f.name = name;
    f.total_ms = std::numeric_limits<double>::infinity();
    f.layout = std::string(layout_name(g.layout));
    f.candidate = p.candidate[gi] != 0;
    // The setting with the least total over the run (-1: none fits every iteration), as a user
    // tuning one setting for the run would pick.
    for (std::size_t c = 0; c < p.grid.size(); ++c) {
      if (p.grid[c].family() == name && p.column_ms[c] < f.total_ms) {
        f.total_ms = p.column_ms[c];
        f.col = static_cast<std::int64_t>(c);
      }
    }
    b.families.push_back(f);
  }
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < b.families.size(); ++k) {
    if (b.families[k].col >= 0 && b.families[k].total_ms < best) {
      best = b.families[k].total_ms;
      b.best = static_cast<std::int64_t>(k);
    }
  }
  return b;
}

/// The report's entry of one iteration from its spilled line: packpipe's figures and each family's
/// chosen setting's, in the order the report has always had.
Json report_iteration(Json spilled, const std::vector<part::Baseline>& grid, const Baselines& b) {
  Json it = Json::object();
  for (auto e = spilled.begin(); e != spilled.end(); ++e) {
    if (e.key() == "columns") continue;
    it[e.key()] = std::move(e.value());
    if (e.key() != "packpipe" || !spilled.contains("columns")) continue;
    const Json& cols = spilled["columns"];
    for (const auto& f : b.families) {
      if (f.col < 0 || static_cast<std::size_t>(f.col) >= cols.size()) continue;
      Json fig = cols[static_cast<std::size_t>(f.col)];
      fig["setting"] = grid[static_cast<std::size_t>(f.col)].label();
      it["baselines"][f.name] = std::move(fig);
    }
  }
  return it;
}

/// Time, throughput and MFU of the whole run taking `total_ms` on `gpus` devices.
Json throughput_json(const Sums& s, double total_ms, std::int64_t gpus, const cm::DeviceSpec& device) {
  const auto tr = cm::throughput_report(s.flops, static_cast<double>(s.samples), static_cast<double>(s.tokens),
                                        total_ms / 1e3, gpus, device);
  return Json{{"time_s", total_ms / 1e3},
              {"tokens_per_s", tr.tokens_per_s},
              {"samples_per_s", tr.samples_per_s},
              {"tflops_per_gpu", tr.tflops_per_gpu},
              {"mfu", tr.mfu}};
}

/// A baseline family's totals at its chosen setting, its speedup figure and its whole grid.
Json baseline_total_json(const Planned& p, const Baselines::Family& f, std::int64_t gpus, const cm::DeviceSpec& device) {
  const Sums& s = p.sums;
  const std::vector<part::Baseline>& grid = p.grid;
  Json grid_json = Json::array();
  for (std::size_t c = 0; c < grid.size(); ++c) {
    if (grid[c].family() != f.name) continue;
    const double t = p.column_ms[c];
    grid_json.push_back(Json{{"setting", grid[c].label()}, {"time_s", std::isfinite(t) ? Json(t / 1e3) : Json(nullptr)}});
  }
  if (f.col < 0 || !std::isfinite(f.total_ms)) {
    return Json{{"feasible", false},
                {"why", "no setting of the grid fits every iteration"},
                {"candidate", f.candidate},
                {"grid", grid_json}};
  }
  Json j = throughput_json(s, f.total_ms, gpus, device);
  j["feasible"] = true;
  j["candidate"] = f.candidate;
  j["layout"] = f.layout;
  j["setting"] = grid[static_cast<std::size_t>(f.col)].label();
  j["speedup_of_packpipe"] = f.total_ms / s.packpipe_ms;
  j["grid"] = std::move(grid_json);
  return j;
}

/// The report's "total": packpipe's and the baselines' time and throughput over the run, and the
/// planning time.
Json total_json(const Planned& planned, const cm::CostModel& cost, const planner::PlannerOptions& po,
                const Baselines& b) {
  const Sums& s = planned.sums;
  const std::int64_t gpus = po.shape.stages * po.shape.dp * po.shape.tp;
  Json total{{"iterations", planned.rows}, {"samples", s.samples}, {"tokens", s.tokens}};
  total["packpipe"] = throughput_json(s, s.packpipe_ms, gpus, cost.device());
  total["packpipe"]["feasible"] = s.packpipe_feasible;
  total["packpipe"]["microbatches"] = s.microbatches;
  total["packpipe"]["peak_mb"] = s.peak_mb;
  if (po.partition.oversize != part::OversizePolicy::Error) {
    total["truncated"] = s.truncated;
    total["dropped"] = s.dropped;
  }
  total.update(context_json(po.context, s.context));
  if (po.baselines) {
    Json families = Json::object();
    for (const auto& f : b.families) families[f.name] = baseline_total_json(planned, f, gpus, cost.device());
    total["baselines"] = std::move(families);
    if (b.best >= 0) {
      const auto& f = b.families[static_cast<std::size_t>(b.best)];
      // The headline: packpipe against the fastest baseline a user could have run, named.
      total["best_baseline"] = Json{{"family", f.name},
                                    {"setting", total["baselines"][f.name]["setting"]},
                                    {"speedup_of_packpipe", f.total_ms / s.packpipe_ms},
                                    {"candidate", f.candidate},
                                    {"layout", f.layout}};
    }
  }
  total["packpipe"]["iterations_from_baselines"] = planned.from_baselines;
  const auto& ms = s.planning_ms;
  total["planning_ms"] = Json{{"median", percentile(ms, 0.5)},
                              {"p90", percentile(ms, 0.9)},
                              {"max", percentile(ms, 1.0)},
                              {"mean", std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size())}};
  total["wall_s"] = planned.wall_s;
  return total;
}

/// The report's iterations in order, from the spill (one line in memory at a time).
void for_each_iteration(const Planned& planned, const Baselines& b, const std::function<void(Json)>& each) {
  std::FILE* f = planned.spill.get();
  PACKPIPE_CHECK(std::fflush(f) == 0 && std::fseek(f, 0, SEEK_SET) == 0,
                 "plan: reading the report's temporary file back failed: {}", std::strerror(errno));
  std::string line;
  for (int c = std::fgetc(f);; c = std::fgetc(f)) {
    if (c == EOF) break;
    if (c != '\n') {
      line += static_cast<char>(c);
      continue;
    }
    each(report_iteration(Json::parse(line), planned.grid, b));
    line.clear();
  }
  PACKPIPE_CHECK(!std::ferror(f) && line.empty(), "plan: reading the report's temporary file back failed");
}

/// The report (config, iterations, totals, the files written), written as one JSON object through
/// `out` as print_json would lay it out, an iteration at a time; `each`, if given, also sees every
/// iteration.
void write_report(const PlanCliOptions& o, const cm::CostModel& cost, const planner::PlannerOptions& po,
                  const Planned& planned, const std::function<void(std::string_view)>& out,
                  const std::function<void(const Json&)>& each, Json* head_and_total) {
  const Baselines b = choose_baselines(planned, po);
  Json config = config_json(o, cost, po, planned.threads);
  add_context_config(config, po.context, cost.model().arch == cm::Architecture::EncoderDecoder);
  Json tail;
  tail["total"] = total_json(planned, cost, po, b);
  if (!o.out.empty()) tail["plan_file"] = o.out;
  if (!o.trace.empty()) tail["chrome_trace"] = o.trace;
  out("{\n  \"config\": " + indent_json_lines(config.dump(2), 2) + ",\n  \"iterations\": [");
  bool first = true;
  for_each_iteration(planned, b, [&](Json it) {
    out((first ? "\n    " : ",\n    ") + indent_json_lines(it.dump(2), 4));
    first = false;
    if (each) each(it);
  });
  out("\n  ]");
  for (auto e = tail.begin(); e != tail.end(); ++e) {
    out(",\n  " + Json(e.key()).dump() + ": " + indent_json_lines(e.value().dump(2), 2));
  }
  out("\n}\n");
  if (head_and_total != nullptr) {
    (*head_and_total)["config"] = std::move(config);
    for (auto e = tail.begin(); e != tail.end(); ++e) (*head_and_total)[e.key()] = e.value();
  }
}

void print_report(const Json& j, std::size_t n);

/// `packpipe plan`: plans the epoch, then writes the report to --report and prints it (--json) or
/// its text form; neither holds more than one iteration's entry in memory.
void run_plan(const PlanCliOptions& o) {
  check_plan_inputs(o);
  const dl::MultiTaskDataset data = o.manifest.empty() ? dl::MultiTaskDataset::from_prefix(o.dataset)
                                                       : dl::MultiTaskDataset(dl::load_manifest(o.manifest));
  check_plan_outputs(o, data);
  const auto cost = o.costs.make();
  const planner::PlannerOptions po = planner_options(o, *cost);
  const Planned planned = plan_epoch(o, data, *cost, po);
  if (planned.sums.infeasible > 0) {
    // Written, as asked, but they will not run: say so where a script sees it, whatever the format.
    std::fprintf(stderr,
                 "packpipe: warning: %llu of %llu iterations have no plan within the memory limit (first: iteration "
                 "%llu%s%s); their plans%s are over it and will not run as planned (more stages, tp, more "
                 "recompute, --recompute full, or a larger limit may fit)\n",
                 static_cast<unsigned long long>(planned.sums.infeasible),
                 static_cast<unsigned long long>(planned.rows),
                 static_cast<unsigned long long>(planned.sums.first_infeasible),
                 planned.sums.first_why.empty() ? "" : ": ", planned.sums.first_why.c_str(),
                 o.out.empty() ? "" : (" in " + o.out).c_str());
  }
  if (!o.report.empty()) {
    AtomicFile f(o.report);
    write_report(o, *cost, po, planned, [&](std::string_view text) { f.write(text); }, nullptr, nullptr);
    f.commit();
  }
  if (o.json) {
    write_report(o, *cost, po, planned, [](std::string_view text) { std::fwrite(text.data(), 1, text.size(), stdout); },
                 nullptr, nullptr);
    return;
  }
  // The text form shows the first and last 6 iterations.
  Json j;
  Json shown = Json::array();
  std::uint64_t n = 0;
  write_report(o, *cost, po, planned, [](std::string_view) {}, [&](const Json& it) {
        if (n < 6 || n + 6 >= planned.rows) shown.push_back(it);
        ++n;
      }, &j);
  j["iterations"] = std::move(shown);
  print_report(j, planned.rows);
}

/// The text form of the report `j`, whose "iterations" hold the first and last 6 of the run's `n`
/// (all of them when n <= 12).
void print_report(const Json& j, std::size_t n) {
  const auto& c = j["config"];
  const auto& t = j["total"];
  std::printf("packpipe plan: %s\n", c["source"].get<std::string>().c_str());
  std::printf("  %s on %s, %lld stages x %lld chunks, dp %lld, tp %lld, memory %.0f MB, cost model: %s\n",
              c["model"].get<std::string>().c_str(), c["device"].get<std::string>().c_str(),
              c["stages"].get<long long>(), c["chunks"].get<long long>(), c["dp"].get<long long>(),
              c["tp"].get<long long>(), c["memory_limit_mb"].get<double>(), c["cost_model"].get<std::string>().c_str());
  // One column per baseline family, at its best setting over the run.
  std::vector<std::string> fams;
  if (t.contains("baselines")) {
    for (auto it = t["baselines"].begin(); it != t["baselines"].end(); ++it) {
      if (it.value()["feasible"].get<bool>()) fams.push_back(it.key());
    }
  }
  std::printf("\n  %5s %7s %7s %4s %5s %11s", "iter", "samples", "tokens", "mbs", "eff", "packpipe ms");
  for (const auto& f : fams) std::printf(" %12s", f.c_str());
  std::printf(" %9s\n", "plan ms");
  const auto& iters = j["iterations"];
  auto ms = [](const Json& v) { return v.is_null() ? std::string("-") : fmt::format("{:.1f}", v.get<double>()); };
  for (std::size_t i = 0; i < iters.size(); ++i) {
    if (n > 12 && i == 6) std::printf("  %5s\n", "...");
    const auto& it = iters[i];
    std::printf("  %5llu %7llu %7llu %4lld %5.2f %11s", it["iteration"].get<unsigned long long>(),
                it["samples"].get<unsigned long long>(), it["tokens"].get<unsigned long long>(),
                it["packpipe"]["microbatches"].get<long long>(), it["packpipe"]["efficiency"].get<double>(),
                ms(it["packpipe"]["iteration_ms"]).c_str());
    for (const auto& f : fams) {
      const bool has = it.contains("baselines") && it["baselines"].contains(f);
      std::printf(" %12s", has ? ms(it["baselines"][f]["iteration_ms"]).c_str() : "-");
    }
    std::printf(" %9.2f\n", it["planning_ms"].get<double>());
  }
  auto line = [](const char* name, const Json& m) {
    std::printf("  %-13s %9.2f s  %10.0f tokens/s  %6.1f TFLOPs/GPU  MFU %4.1f%%", name, m["time_s"].get<double>(),
                m["tokens_per_s"].get<double>(), m["tflops_per_gpu"].get<double>(), 100 * m["mfu"].get<double>());
  };
  const bool searched = c.contains("baseline_schedule") && c["baseline_schedule"] == "search";
  std::printf("\n  simulated time of %zu iterations (%llu samples, %llu tokens), each baseline at its best "
              "setting for the run, %s:\n",
              n, t["samples"].get<unsigned long long>(), t["tokens"].get<unsigned long long>(),
              searched ? "under packpipe's schedule search"
                       : "under the schedule its system runs (1F1B over its order, or the --schedule named)");
  line("packpipe", t["packpipe"]);
  std::printf("  %s\n", t["packpipe"]["feasible"].get<bool>() ? "" : "(over the memory limit somewhere)");
  if (t.contains("truncated")) {
    std::printf("  oversize samples: %llu truncated, %llu dropped\n", t["truncated"].get<unsigned long long>(),
                t["dropped"].get<unsigned long long>());
  }
  if (c.contains("max_seq_len")) std::printf("  %s\n", context_text(c, t).c_str());
  if (t.contains("baselines")) {
    for (auto it = t["baselines"].begin(); it != t["baselines"].end(); ++it) {
      const Json& b = it.value();
      if (!b["feasible"].get<bool>()) {
        std::printf("  %-13s no setting of the grid fits every iteration\n", it.key().c_str());
        continue;
      }
      line(it.key().c_str(), b);
      std::printf("  (%s; packpipe %.2fx%s)\n", b["setting"].get<std::string>().c_str(),
                  b["speedup_of_packpipe"].get<double>(), b["candidate"].get<bool>() ? "" : "; reported only");
    }
  }
  if (t.contains("best_baseline")) {
    const Json& b = t["best_baseline"];
    std::printf("\n  packpipe is %.2fx the best baseline, %s (simulated)\n", b["speedup_of_packpipe"].get<double>(),
                b["setting"].get<std::string>().c_str());
    if (!b["candidate"].get<bool>()) {
      const std::string layout = b["layout"].get<std::string>();
      std::printf("  (reported only: %s\n", j["config"]["method"] != "dp"
                                                 ? "the plan is the named method's, never a baseline's)"
                                                 : fmt::format("its layout {} is not among --layouts, so packpipe cannot "
                                                               "take its plan; list {} if the executor runs it)",
                                                               layout, layout)
                                                       .c_str());
    }
  }
  if (t["packpipe"]["iterations_from_baselines"].get<std::uint64_t>() > 0) {
    std::printf("  %llu of %zu iterations run a baseline's micro-batches (packpipe's partition was not %.0f%% faster)%s\n",
                t["packpipe"]["iterations_from_baselines"].get<unsigned long long>(), n,
                100 * j["config"]["min_gain"].get<double>(),
                searched || !t.contains("baselines") ? ""
                                                     : ";\n  there the gain is the schedule's (--baseline-schedule search "
                                                       "compares under packpipe's schedule search)");
  }
  const auto& p = t["planning_ms"];
  std::printf("\n  planning time per iteration: median %.2f ms, p90 %.2f ms, max %.2f ms (%.2f s wall for all)\n",
              p["median"].get<double>(), p["p90"].get<double>(), p["max"].get<double>(), t["wall_s"].get<double>());
  std::string peaks;
  for (const auto& v : t["packpipe"]["peak_mb"]) peaks += fmt::format("{}{:.0f}", peaks.empty() ? "" : " / ", v.get<double>());
  std::printf("  peak memory per stage (MB): %s\n", peaks.c_str());
  if (j.contains("plan_file")) std::printf("  plans: %s\n", j["plan_file"].get<std::string>().c_str());
  if (j.contains("chrome_trace")) {
    std::printf("  trace of iteration 0: %s (open in chrome://tracing or ui.perfetto.dev)\n",
                j["chrome_trace"].get<std::string>().c_str());
  }
}

}  // namespace

void register_plan_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Plan every iteration of a dataset: micro-batches, schedule, instruction streams");
  auto o = std::make_shared<PlanCliOptions>();
  auto* src = cmd->add_option_group("source", "What to plan");
  src->add_option("--manifest", o->manifest, "Multi-task manifest (.json)")->check(CLI::ExistingFile);
  src->add_option("--dataset", o->dataset, "One dataset prefix");
  o->costs.add_to(cmd);
  o->shape_args.add_to(cmd);
  cmd->add_option("--global-batch-tokens", o->batch_tokens, "Token budget per global batch");
  cmd->add_option("--global-batch-samples", o->batch_samples, "Samples per global batch");
  cmd->add_option("--seed", o->seed, "Sampler and search seed")->capture_default_str();
  cmd->add_option("--epoch", o->epoch, "Epoch to plan")->capture_default_str();
  cmd->add_option("--split", o->split, "Split: " + enum_name_list(dl::kSplitNames))->check(one_of(dl::kSplitNames));
  cmd->add_option("--iterations", o->iterations, "Plan only the first N iterations (default, or 0: the whole epoch)");
  cmd->add_option("--schedule", o->schedule, "search, or one of " + enum_name_list(sched::kScheduleKindNames))
      ->capture_default_str();
  const char* dp = part::partition_method_name(part::PartitionMethod::DP);
  const char* dynapipe = part::partition_method_name(part::PartitionMethod::DynaPipe);
  cmd->add_option("--method", o->method,
                  fmt::format("Partition: {} (packpipe) or {} (DynaPipe's exact DP)", dp, dynapipe))
      ->check(CLI::IsMember(std::vector<std::string>{dp, dynapipe}))
      ->capture_default_str();
  cmd->add_option("--recompute", o->recompute,
                  "Recompute policy: " + enum_name_list(part::kRecomputePolicyNames) + " (auto: per micro-batch)")
      ->check(one_of(part::kRecomputePolicyNames));
  cmd->add_option("--round-multiple", o->round_multiple, "Pad lengths to a multiple of this")->capture_default_str();
  cmd->add_option("--schedule-family", o->family,
                  "The search (and a fallback) choose within: " + enum_name_list(planner::kScheduleFamilyNames))
      ->check(one_of(planner::kScheduleFamilyNames))
      ->capture_default_str();
  cmd->add_flag("--no-split-backward", o->no_split_backward,
                "Never split a backward into input and weight gradients (no zero-bubble)");
  cmd->add_flag("--schedule-fallback", o->fallback,
                "A named schedule that cannot run an iteration's micro-batch count falls back to the search");
  cmd->add_option("--dtype", o->dtype,
                  "Activations between stages: fp16, bf16, fp32 or fp64 (default: the model file's \"dtype\", else bf16)")
      ->check(CLI::IsMember({"fp16", "bf16", "fp32", "fp64"}))
      ->capture_default_str();
  cmd->add_option("--loss", o->loss, "Tokens that carry loss: " + enum_name_list(pl::kLossModeNames))
      ->check(one_of(pl::kLossModeNames))
      ->capture_default_str();
  cmd->add_flag("--tied-embedding", o->tied_embedding,
                "The embedding and the LM head share a weight: plans sum its gradient (REDUCE_TIED)");
  cmd->add_option("--oversize", o->oversize,
                  "A sample that cannot fit in memory even alone: " + enum_name_list(part::kOversizePolicyNames) +
                      " (error: stop, naming it; slice, decoder-only: cut it into slices that pipeline, trained as the "
                      "whole sample)")
      ->check(one_of(part::kOversizePolicyNames))
      ->capture_default_str();
  cmd->add_option("--slicing", o->slicing,
                  "Decoder-only: " + enum_name_list(part::kSlicePolicyNames) +
                      " (auto: packpipe may cut long samples into slices that pipeline through the stages, with "
                      "exact attention, when that is faster; off: never unless --oversize slice)")
      ->check(one_of(part::kSlicePolicyNames))
      ->capture_default_str();
  cmd->add_option("--min-slice-tokens", o->min_slice_tokens, "The shortest slice, tokens (at least 1)")
      ->capture_default_str();
  o->context.add_to(cmd);
  cmd->add_option("--baseline-mbs", o->baseline_mbs, "Micro-batch sizes the fixed baseline's grid tries");
  cmd->add_option("--baseline-rows", o->baseline_rows, "Rows per micro-batch the packing baselines' grid tries");
  cmd->add_option("--layouts", o->layouts,
                  "Layouts the executor runs, comma-separated: padded and/or packed (varlen attention), which "
                  "packpipe's micro-batches may take, and packed-mask (dense rows under a block mask); a baseline is a "
                  "candidate for the plan only in one of them (the others are reported, not run)")
      ->capture_default_str();
  cmd->add_flag("--no-baselines", o->no_baselines,
                "Do not report the baselines (their plans stay candidates: packpipe is never slower than one)");
  cmd->add_option("--baseline-schedule", o->baseline_schedule,
                  "The schedule the reported baselines run: as-run (the --schedule named, else 1F1B, interleaved "
                  "with chunks, over their order, as their systems run them) or search (packpipe's schedule search: "
                  "the speed-up is the partition's alone; costs a full search per setting). The plans are the same")
      ->check(CLI::IsMember({"as-run", "search"}))
      ->capture_default_str();
  cmd->add_option("--min-gain", o->min_gain,
                  "packpipe's own partition is the plan only when simulated at least this fraction faster than the "
                  "best baseline's plan, which is the plan otherwise; likewise another schedule or order replaces "
                  "1F1B (interleaved with chunks) over the given order, when allowed, only when this much faster")
      ->check(float_range(0, 0.999999, "0: the least simulated makespan, whichever plan gives it"))
      ->capture_default_str();
  cmd->add_flag("--validate", o->validate, "Validate every plan (slower)");
  cmd->add_flag("--compress", o->compress, "zstd-compress the plans in the file");
  cmd->add_option("--out", o->out, "Write the plans of every iteration to this file");
  cmd->add_option("--report", o->report, "Also write the JSON report to this file");
  cmd->add_option("--chrome-trace", o->trace, "Write the simulated timeline of iteration 0 (Chrome trace JSON)");
  cmd->add_option("--threads", o->threads, "Planning threads (0, the default: all cores)");
  cmd->add_flag("--json", o->json, "Print the report as one JSON object");
  cmd->callback([cmd, o] {
    if (!cmd->get_subcommands().empty()) return;  // `plan inspect|validate|export` ran instead
    run_plan(*o);
  });
  add_plan_file_commands(*cmd);
}

}  // namespace packpipe::cli
