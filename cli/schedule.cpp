// `packpipe schedule`: simulate pipeline schedules for given micro-batch shapes, or search the
// schedule and micro-batch order; prints a summary, a table for `--schedule all`, JSON with
// --json, and writes the winner's Chrome trace with --chrome-trace.
#include <cctype>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "costmodel/factory.h"
#include "partition/pipeline.h"
#include "schedule/schedules.h"
#include "schedule/search.h"
#include "schedule/simulator.h"
#include "plan/trace.h"

namespace packpipe::cli {

namespace cm = packpipe::costmodel;
namespace part = packpipe::partition;
namespace sched = packpipe::schedule;
namespace pl = packpipe::plan;

namespace {

struct ScheduleOptionsCli {
  std::string input = "-";
  CostModelArgs costs;
  ShapeArgs shape_args = {4};
  std::string schedule = "search";
  std::uint64_t seed = 0;
  std::string chrome_trace;
  bool reference = false;
  bool json = false;
};

/// Largest rows of a micro-batch and padded length accepted in a micro-batch file.
constexpr std::uint64_t kMaxRows = std::uint64_t{1} << 20;
constexpr std::uint64_t kMaxPaddedLen = std::uint64_t{1} << 24;

// Micro-batch shapes: one per line, `rows padded_len [padded_dec_len] [recompute]` (a decoder
// length for an encoder-decoder `model` only); '#' starts a comment. Read without blocking on a FIFO; every error names file:line and the text.
std::vector<part::MicroBatch> read_microbatches(const std::string& path, const cm::ModelSpec& model) {
  const std::string name = path == "-" ? "<stdin>" : path;
  const std::string text = read_text_input(path, "micro-batch file");
  std::vector<part::MicroBatch> out;
  for_each_data_line(text, [&](std::uint64_t lineno, const std::vector<std::string_view>& tok) {
    const std::string where = fmt::format("{}:{}", name, lineno);
    PACKPIPE_CHECK(tok.size() <= 4, "{}: expected 'rows padded_len [padded_dec_len] [recompute]', found {} fields",
                   where, tok.size());
    PACKPIPE_CHECK(tok.size() >= 2, "{}: missing padded_len; expected 'rows padded_len [padded_dec_len] [recompute]'",
                   where);
    part::MicroBatch mb;
    const std::uint64_t rows = parse_unsigned_field(tok[0], kMaxRows, where, "rows");
    PACKPIPE_CHECK(rows >= 1, "{}: rows must be at least 1, found {}", where, rows);
    mb.samples.resize(static_cast<std::size_t>(rows));
    for (std::size_t i = 0; i < mb.samples.size(); ++i) mb.samples[i] = static_cast<std::uint32_t>(i);
    mb.padded_len = static_cast<std::int64_t>(parse_unsigned_field(tok[1], kMaxPaddedLen, where, "padded_len"));
    PACKPIPE_CHECK(mb.padded_len >= 1, "{}: padded_len must be at least 1, found 0", where);
    std::size_t next = 2;
    if (tok.size() > next && std::isdigit(static_cast<unsigned char>(tok[next][0]))) {
      mb.padded_dec_len =
          static_cast<std::int64_t>(parse_unsigned_field(tok[next], kMaxPaddedLen, where, "padded_dec_len"));
      // (it would be dropped without a word: the model has no decoder of its own)
      PACKPIPE_CHECK(mb.padded_dec_len == 0 || model.arch == cm::Architecture::EncoderDecoder,
                     "{}: padded_dec_len {} for {}, a decoder-only model; expected 'rows padded_len [recompute]'",
                     where, mb.padded_dec_len, model.name);
      ++next;
    }
    if (tok.size() > next) {
      try {
        mb.recompute = cm::recompute_from_name(std::string(tok[next]));
      } catch (const std::exception&) {
        PACKPIPE_THROW(::packpipe::Error, "{}: recompute must be one of {}, found '{}'", where,
                       enum_name_list(kRecomputeNames), tok[next]);
      }
      ++next;
    }
    PACKPIPE_CHECK(next == tok.size(), "{}: unexpected field '{}'", where, tok[next]);
    mb.tokens = rows * static_cast<std::uint64_t>(mb.padded_len + mb.padded_dec_len);
    out.push_back(std::move(mb));
  });
  PACKPIPE_CHECK(!out.empty(), "no micro-batches in '{}'; expected one 'rows padded_len [padded_dec_len] "
                 "[recompute]' per line", name);
  return out;
}

Json per_rank_mb(const std::vector<double>& bytes) {
  Json a = Json::array();
  for (double b : bytes) a.push_back(b / 1e6);
  return a;
}

Json schedule_json(const pl::Schedule& s, double limit_bytes) {
  Json j;
  j["schedule"] = s.name;
  j["makespan_ms"] = s.makespan_ms;
  j["bubble_fraction"] = s.bubble_fraction;
  j["peak_memory_mb"] = per_rank_mb(s.peak_bytes);
  j["utilization"] = s.utilization;
  double peak = 0;
  for (double b : s.peak_bytes) peak = std::max(peak, b);
  j["fits_memory"] = limit_bytes <= 0 || peak <= limit_bytes;
  j["order"] = s.order;
  return j;
}

void run_schedule(const ScheduleOptionsCli& o) {
  // The trace must not overwrite what is read (the micro-batch file, a profile, a model file).
  if (!o.chrome_trace.empty()) {
    std::vector<std::string> inputs = cost_model_inputs(o.costs);
    if (o.input != "-") inputs.push_back(o.input);
    check_command_files(inputs, {{o.chrome_trace, "--chrome-trace"}});
  }
  const auto cost = o.costs.make();
  const auto mbs = read_microbatches(o.input, cost->model());
  const part::PipelineShape shape = o.shape_args.shape(cost.get());
  const auto vs = part::virtual_stages(cost->model(), shape);
  const sched::SimProblem problem = sched::make_sim_problem(sched::stage_cost_table(*cost, shape, vs, mbs), *cost, shape);
  const double limit = problem.memory_limit_bytes;

  sched::SearchOptions so;
  so.seed = o.seed;
  so.recompute_table = [&](cm::Recompute rc) {
    auto copy = mbs;
    for (auto& m : copy) m.recompute = rc;
    return sched::stage_cost_table(*cost, shape, vs, copy);
  };

  Json j;
  j["model"] = cost->model().name;
  j["device"] = cost->device().name;
  j["cost_model"] = cost->describe();
  j["microbatches"] = problem.microbatches();
  j["stages"] = shape.stages;
  j["chunks"] = shape.chunks;
  j["memory_limit_mb"] = limit / 1e6;
  j["lower_bound_ms"] = sched::makespan_lower_bounds(problem).value();

  pl::Schedule winner;
  std::vector<Json> rows;
  if (o.schedule == "search" || o.schedule == "all") {
    const auto t0 = std::chrono::steady_clock::now();
    const sched::SearchResult r = sched::search_schedule(problem, so);
    const double search_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    winner = r.best;
    Json w = schedule_json(r.best, limit);
    for (auto it = w.begin(); it != w.end(); ++it) j[it.key()] = it.value();
    j["feasible"] = r.feasible;
    j["recompute"] = r.recompute;
    j["search_ms"] = search_ms;
    j["simulations"] = r.simulations;
    j["early_exits"] = r.early_exits;
    if (o.reference) {
      const auto t1 = std::chrono::steady_clock::now();
      const sched::SearchResult ref = sched::reference_search(problem, so);
      const double ref_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
      j["reference"] = Json{{"schedule", ref.best.name},
                            {"makespan_ms", ref.best.makespan_ms},
                            {"bubble_fraction", ref.best.bubble_fraction},
                            {"search_ms", ref_ms},
                            {"simulations", ref.simulations},
                            {"feasible", ref.feasible}};
    }
  }
  if (o.schedule == "all") {
    std::vector<std::uint32_t> order(mbs.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
    Json all = Json::array();
    for (sched::ScheduleKind k : sched::all_schedule_kinds()) {
      std::string why;
      if (!sched::schedule_supports(k, shape.stages, shape.chunks, problem.microbatches(), &why)) {
        all.push_back(Json{{"schedule", sched::schedule_kind_name(k)}, {"supported", false}, {"why", why}});
        continue;
      }
      Json row = schedule_json(sched::make_schedule(k, problem, order), limit);
      row["supported"] = true;
      all.push_back(row);
    }
    j["schedules"] = all;
  } else if (o.schedule != "search") {
    const sched::ScheduleKind k = sched::schedule_kind_from_name(o.schedule);
    const auto t0 = std::chrono::steady_clock::now();
    winner = sched::make_schedule(k, problem);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    Json w = schedule_json(winner, limit);
    for (auto it = w.begin(); it != w.end(); ++it) j[it.key()] = it.value();
    j["feasible"] = w["fits_memory"];
    j["search_ms"] = ms;
  }
  if (!o.chrome_trace.empty()) {
    write_file_atomic(o.chrome_trace, pl::chrome_trace_json(winner));
    j["chrome_trace"] = o.chrome_trace;
  }
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s on %s (%s): %lld micro-batches, %lld stages x %lld chunks, memory limit %.0f MB\n",
              j["model"].get<std::string>().c_str(), j["device"].get<std::string>().c_str(),
              j["cost_model"].get<std::string>().c_str(), static_cast<long long>(problem.microbatches()),
              static_cast<long long>(shape.stages), static_cast<long long>(shape.chunks), limit / 1e6);
  if (o.schedule == "all") {
    std::printf("  %-18s %12s %8s %14s %6s\n", "schedule", "makespan ms", "bubble", "peak MB (max)", "fits");
    for (const auto& row : j["schedules"]) {
      if (!row["supported"].get<bool>()) {
        std::printf("  %-18s %s\n", row["schedule"].get<std::string>().c_str(), row["why"].get<std::string>().c_str());
        continue;
      }
      double peak = 0;
      for (const auto& p : row["peak_memory_mb"]) peak = std::max(peak, p.get<double>());
      std::printf("  %-18s %12.2f %8.3f %14.0f %6s\n", row["schedule"].get<std::string>().c_str(),
                  row["makespan_ms"].get<double>(), row["bubble_fraction"].get<double>(), peak,
                  row["fits_memory"].get<bool>() ? "yes" : "no");
    }
  }
  double peak = 0;
  for (const auto& p : j["peak_memory_mb"]) peak = std::max(peak, p.get<double>());
  std::printf("%s %s: makespan %.2f ms (lower bound %.2f), bubble %.3f, peak %.0f MB%s, %s %.3f ms\n",
              o.schedule == "search" || o.schedule == "all" ? "best" : "schedule",
              j["schedule"].get<std::string>().c_str(), j["makespan_ms"].get<double>(),
              j["lower_bound_ms"].get<double>(), j["bubble_fraction"].get<double>(), peak,
              j["feasible"].get<bool>() ? "" : " (over the memory limit)",
              o.schedule == "search" || o.schedule == "all" ? "searched in" : "simulated in", j["search_ms"].get<double>());
  if (j.contains("reference")) {
    const Json& r = j["reference"];
    std::printf("reference (exhaustive) %s: makespan %.2f ms, searched in %.3f ms\n",
                r["schedule"].get<std::string>().c_str(), r["makespan_ms"].get<double>(), r["search_ms"].get<double>());
  }
  if (j.contains("chrome_trace")) std::printf("Chrome trace: %s\n", o.chrome_trace.c_str());
}

}  // namespace

void register_schedule_commands(CLI::App& app) {
  auto o = std::make_shared<ScheduleOptionsCli>();
  auto* cmd = app.add_subcommand(
      "schedule",
      "Simulate pipeline schedules for micro-batch shapes, or search the schedule and micro-batch order");
  cmd->add_option("input", o->input,
                  "Micro-batch shapes, one per line: rows padded_len [padded_dec_len] [recompute] ('-': stdin)");
  o->costs.add_to(cmd);
  o->shape_args.add_to(cmd);
  cmd->add_option("--schedule", o->schedule,
                  "search (default), " + enum_name_list(sched::kScheduleKindNames) + ", or all");
  cmd->add_option("--seed", o->seed, "Seed of the search (default 0)");
  cmd->add_option("--chrome-trace", o->chrome_trace, "Write the (best) schedule's timeline as Chrome trace JSON");
  cmd->add_flag("--reference", o->reference, "Also run the exhaustive DynaPipe-like reference search");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] { run_schedule(*o); });
}

}  // namespace packpipe::cli
