// `packpipe plan inspect|validate|export`: read plan files (a multi-iteration plan file, one binary
// plan, or a JSON plan), show an iteration's header and streams, validate every plan, export.
#include <charconv>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "costmodel/cost_model.h"
#include "plan/export_pytorch.h"
#include "plan/format.h"
#include "plan/trace.h"
#include "plan/validator.h"

namespace packpipe::cli {

namespace pl = packpipe::plan;

namespace {

void print_json(const Json& j) { std::printf("%s\n", j.dump(2).c_str()); }

// The plan of `iteration` for data-parallel `replica`, or the file's first plan when iteration < 0.
pl::Plan load(const pl::PlanFileReader& r, std::int64_t iteration, std::uint32_t replica) {
  if (iteration < 0) {
    PACKPIPE_CHECK(r.size() > 0, "{}: the file holds no plans", r.path());
    return r.read_iteration(r.iteration(0), replica);  // replica of the first iteration, never another iteration's plan
  }
  return r.read_iteration(static_cast<std::uint64_t>(iteration), replica);
}

// Atomic, and never onto the plan file being read.
void write_text(const std::string& path, const std::string& text, const std::string& input, const char* what) {
  check_command_files({input}, {{path, what}});
  write_file_atomic(path, text);
}

}  // namespace

// An iteration or rank as typed: negative (read as "not given"), or past int64 (which CLI11 would
// clamp), refused by name with what was typed.
const CLI::Validator kIndexRange(
    [](std::string& text) -> std::string {
      std::int64_t v = 0;
      const char* end = text.data() + text.size();
      const auto [at, ec] = std::from_chars(text.data(), end, v);
      if (ec != std::errc() || at != end || v < 0) return fmt::format("expected an integer in [0, 2^63), found '{}'", text);
      return {};
    },
    "INDEX");

void add_plan_file_commands(CLI::App& plan) {
  {
    auto* cmd = plan.add_subcommand("inspect", "Header, micro-batches and instruction streams of one iteration's plan");
    auto file = std::make_shared<std::string>();
    auto iteration = std::make_shared<std::int64_t>(-1);
    auto rank = std::make_shared<std::int64_t>(-1);
    auto json = std::make_shared<bool>(false);
    cmd->add_option("FILE", *file, "Plan file (.plans), one binary plan, or a JSON plan")->required();
    cmd->add_option("--iteration", *iteration, "Iteration to show (default: the file's first plan)")
        ->check(kIndexRange);
    auto replica = std::make_shared<std::uint32_t>(0);
    cmd->add_option("--replica", *replica, "Data-parallel replica (default 0)");
    cmd->add_option("--rank", *rank, "Show only this rank's stream")
        ->check(kIndexRange);
    cmd->add_flag("--json", *json, "Print the plan's JSON form (one rank's stream with --rank)");
    cmd->callback([=] {
      const pl::PlanFileReader r(*file);
      const pl::Plan p = load(r, *iteration, *replica);
      PACKPIPE_CHECK_RANGE(*rank < 0 || *rank < static_cast<std::int64_t>(p.ranks), "--rank {}: the plan has {} ranks",
                           *rank, p.ranks);
      if (*json) {
        std::printf("%s\n", pl::plan_to_json(p, 1, *rank).c_str());
        return;
      }
      const pl::ValidationReport rep = pl::validate(p);
      std::printf("iteration %llu of %zu in %s: schedule %s, %u ranks, %u virtual stages, dp %u\n",
                  static_cast<unsigned long long>(p.iteration), r.size(), r.path().c_str(), p.schedule.c_str(), p.ranks,
                  p.vstages, p.dp);
      std::string map;
      for (std::size_t v = 0; v < p.stage_rank.size(); ++v) map += fmt::format("{}{}->{}", v ? " " : "", v, p.stage_rank[v]);
      std::printf("stage -> rank: %s\n", map.c_str());
      if (p.dataset.known()) {  // the dataset its sample refs index (loaders refuse another)
        std::string tasks;
        for (const auto& t : p.dataset.task_list()) {
          tasks += fmt::format("{}{} ({} samples)", tasks.empty() ? "" : ", ", t.name, t.samples);
        }
        std::printf("dataset: fingerprint %016llx%s%s\n", static_cast<unsigned long long>(p.dataset.fingerprint),
                    tasks.empty() ? "" : ", tasks ", tasks.c_str());
      }
      if (p.max_seq_len > 0 || p.max_target_len > 0) {
        std::printf("context length: %u tokens%s\n", p.max_seq_len,
                    p.max_target_len > 0 ? fmt::format(", decoder {}", p.max_target_len).c_str() : "");
      }
      std::printf("%zu micro-batches, %llu tokens, simulated %.3f ms, %zu instructions, %s\n", p.microbatches.size(),
                  static_cast<unsigned long long>(p.global_tokens), p.makespan_ms, p.instruction_count(),
                  rep.ok() ? "valid" : fmt::format("{} violations", rep.violations.size()).c_str());
      // A plan that decodes may still be inconsistent: every index below is checked before use,
      // and the violations are listed.
      for (const auto& x : rep.violations) std::printf("  violation: %s\n", pl::to_string(x, &p).c_str());
      for (std::size_t m = 0; m < p.microbatches.size(); ++m) {
        const auto& mb = p.microbatches[m];
        std::string rc = "?";
        if (p.vstages > 0 && m < p.microbatches.size() && p.at(m, 0) < p.recompute.size()) {
          rc = costmodel::recompute_name(static_cast<costmodel::Recompute>(p.recompute[p.at(m, 0)]));
        }
        // Slices: each entry's kept prefix and the micro-batch of its previous slice (`prev`).
        std::string slices;
        for (std::size_t i = 0; i < mb.prev.size() && i < mb.samples.size(); ++i) {
          if (mb.prev[i] == pl::kNoSlice) continue;
          slices += fmt::format("{}sample {} from token {} (after micro-batch {})", slices.empty() ? "; slices: " : ", ",
                                mb.samples[i], mb.prefix_of(i), mb.prev[i]);
        }
        std::printf("  mb %zu: %u rows x %u%s tokens, %llu real, loss weight %.6f, recompute %s, %zu samples%s\n", m,
                    mb.rows, mb.padded_len,
                    mb.padded_dec_len ? fmt::format(" (+ {} decoder)", mb.padded_dec_len).c_str() : "",
                    static_cast<unsigned long long>(mb.tokens), mb.loss_weight, rc.c_str(), mb.samples.size(),
                    slices.c_str());
      }
      for (std::uint32_t k = 0; k < p.ranks && k < p.streams.size(); ++k) {
        if (*rank >= 0 && *rank != k) continue;
        std::printf("rank %u: %zu instructions, %s buffer slots, peak %s\n", k, p.streams[k].size(),
                    k < p.buffer_slots.size() ? std::to_string(p.buffer_slots[k]).c_str() : "?",
                    k < rep.peak_bytes.size() ? human_bytes(rep.peak_bytes[k]).c_str() : "unknown (invalid plan)");
        for (std::size_t i = 0; i < p.streams[k].size(); ++i) {
          const auto& ins = p.streams[k][i];
          std::string extra;
          if ((pl::opcode_fields(ins.op) & pl::kFieldShape) && ins.shape < p.shapes.size()) {
            extra = "  [" + pl::to_string(p.shapes[ins.shape]) + "]";
          }
          std::printf("  %4zu  %s%s\n", i, pl::to_string(ins).c_str(), extra.c_str());
        }
      }
    });
  }
  {
    auto* cmd = plan.add_subcommand("validate", "Check every plan of a file; exit status 1 on any violation");
    auto file = std::make_shared<std::string>();
    auto iteration = std::make_shared<std::int64_t>(-1);
    auto json = std::make_shared<bool>(false);
    auto buffers = std::make_shared<bool>(false);
    cmd->add_option("FILE", *file, "Plan file (.plans), one binary plan, or a JSON plan")->required();
    cmd->add_option("--iteration", *iteration, "Check only this iteration")
        ->check(kIndexRange);
    cmd->add_flag("--count-buffers", *buffers, "Count communication buffers towards the memory limit");
    cmd->add_flag("--json", *json, "Print one JSON object");
    cmd->callback([=] {
      const pl::PlanFileReader r(*file);
      pl::ValidateOptions o;
      o.count_buffers = *buffers;
      std::vector<std::size_t> which;
      if (*iteration >= 0) {
        const std::int64_t i = r.find(static_cast<std::uint64_t>(*iteration));
        PACKPIPE_CHECK_RANGE(i >= 0, "{}: no plan for iteration {}", r.path(), *iteration);
        // Every data-parallel replica of the iteration.
        for (auto k = static_cast<std::size_t>(i); k < r.size() && r.iteration(k) == static_cast<std::uint64_t>(*iteration); ++k) {
          which.push_back(k);
        }
      } else {
        for (std::size_t i = 0; i < r.size(); ++i) which.push_back(i);
      }
      Json plans = Json::array();
      Json replica_problems = Json::array();
      std::size_t bad = 0, total = 0, cross = 0;
      // The replicas of one iteration (consecutive in a plan file), checked against each other.
      std::vector<pl::Plan> group;
      auto check_group = [&] {
        if (group.empty() || !r.is_plan_file()) return;
        for (const auto& x : pl::validate_replicas(group)) {
          ++total;
          if (*json) {
            replica_problems.push_back(Json{{"iteration", group.front().iteration}, {"replica", x.rank},
                                            {"message", x.message}, {"text", pl::to_string(x)}});
          } else {
            std::printf("iteration %llu: [replicas] %s\n", static_cast<unsigned long long>(group.front().iteration),
                        x.message.c_str());
          }
          ++cross;
        }
        group.clear();
      };
      Progress progress("validate", which.size());
      for (std::size_t n = 0; n < which.size(); ++n) {
        pl::Plan p = r.read(which[n]);
        if (!group.empty() && group.front().iteration != p.iteration) check_group();
        const pl::ValidationReport rep = pl::validate(p, o);
        total += rep.violations.size();
        bad += rep.ok() ? 0 : 1;
        progress.update(n + 1);
        if (*json) {
          Json v = Json::array();
          for (const auto& x : rep.violations) {
            v.push_back(Json{{"kind", x.kind}, {"rank", x.rank}, {"index", x.index}, {"message", x.message},
                             {"text", pl::to_string(x, &p)}});
          }
          plans.push_back(Json{{"iteration", p.iteration}, {"valid", rep.ok()}, {"peak_bytes", rep.peak_bytes},
                               {"violations", std::move(v)}});
        } else if (!rep.ok()) {
          std::printf("iteration %llu: %zu violations\n", static_cast<unsigned long long>(p.iteration), rep.violations.size());
          for (const auto& x : rep.violations) std::printf("  %s\n", pl::to_string(x, &p).c_str());
        }
        group.push_back(std::move(p));
      }
      check_group();
      progress.finish();
      const std::string held =
          r.iterations() == 0 ? std::string("no iterations")
                              : fmt::format("iterations {}..{}", r.first_iteration(), r.first_iteration() + r.iterations() - 1);
      const std::string incomplete =
          r.complete() ? std::string()
                       : fmt::format("incomplete epoch: the file holds {} of the {} iterations its writer declared "
                                     "(the planning run stopped early); plan the epoch again",
                                     r.iterations(), r.expected_iterations());
      if (*json) {
        Json out{{"file", r.path()}, {"plans", which.size()}, {"iterations", held}, {"complete", r.complete()},
                 {"invalid_plans", bad}, {"violations", total}, {"valid", bad == 0 && cross == 0 && r.complete()},
                 {"results", std::move(plans)}, {"replica_violations", std::move(replica_problems)}};
        if (!incomplete.empty()) out["error"] = incomplete;
        print_json(out);
      } else {
        if (!incomplete.empty()) std::printf("%s: %s\n", r.path().c_str(), incomplete.c_str());
        std::printf("%s: %zu plans checked, %zu invalid, %zu violations (%s, %s)\n", r.path().c_str(), which.size(),
                    bad, total, held.c_str(), r.complete() ? "complete" : "INCOMPLETE");
      }
      set_exit_status(bad == 0 && cross == 0 && r.complete() ? 0 : 1);
    });
  }
  {
    auto* cmd = plan.add_subcommand("export", "Export one iteration: Chrome trace or PyTorch compute_only CSV");
    auto file = std::make_shared<std::string>();
    auto iteration = std::make_shared<std::int64_t>(-1);
    auto trace = std::make_shared<std::string>();
    auto csv = std::make_shared<std::string>();
    cmd->add_option("FILE", *file, "Plan file (.plans), one binary plan, or a JSON plan")->required();
    cmd->add_option("--iteration", *iteration, "Iteration to export (default: the file's first plan)")
        ->check(kIndexRange);
    auto replica = std::make_shared<std::uint32_t>(0);
    cmd->add_option("--replica", *replica, "Data-parallel replica (default 0)");
    auto* t = cmd->add_option("--chrome-trace", *trace, "Write the simulated timeline as Chrome trace / Perfetto JSON");
    auto* c = cmd->add_option("--pytorch-csv", *csv,
                              "Write torch.distributed.pipelining compute_only CSV (micro-batches of one shape only)");
    t->excludes(c);
    auto json = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "Print one JSON object (the plan exported and the file written)");
    cmd->callback([=] {
      PACKPIPE_CHECK_ARG(!trace->empty() || !csv->empty(), "plan export: pass --chrome-trace OUT or --pytorch-csv OUT");
      const pl::PlanFileReader r(*file);
      const pl::Plan p = load(r, *iteration, *replica);
      // The exporters index the plan's tables: a plan that decodes but is inconsistent is refused
      // with its violations instead of being exported (or crashing the exporter).
      pl::validate_or_throw(p);
      const Json report{{"plan_file", *file},        {"iteration", p.iteration},     {"replica", p.replica},
                        {"ranks", p.ranks},           {"microbatches", p.microbatches.size()},
                        {"makespan_ms", p.makespan_ms}};
      if (!csv->empty()) {
        write_text(*csv, pl::pytorch_compute_csv(p), *file, "--pytorch-csv");
        if (*json) {
          Json j = report;
          j["pytorch_csv"] = *csv;
          return print_json(j);
        }
        std::printf("wrote %s (iteration %llu, %u ranks, %zu micro-batches)\n", csv->c_str(),
                    static_cast<unsigned long long>(p.iteration), p.ranks, p.microbatches.size());
      }
      if (!trace->empty()) {
        PACKPIPE_CHECK(!p.timeline.empty(),
                       "{}: iteration {} carries no simulated timeline (planned without keep_timeline); nothing to trace",
                       r.path(), p.iteration);
        pl::Schedule s;
        s.name = p.schedule;
        s.ranks = p.ranks;
        s.vstages = p.vstages;
        s.microbatches = static_cast<std::int64_t>(p.microbatches.size());
        s.ops = p.timeline;
        s.makespan_ms = p.makespan_ms;
        pl::TraceOptions o;
        o.process_name = fmt::format("packpipe plan iteration {} ({})", p.iteration, p.schedule);
        write_text(*trace, pl::chrome_trace_json(s, o), *file, "--chrome-trace");
        if (*json) {
          Json j = report;
          j["chrome_trace"] = *trace;
          return print_json(j);
        }
        std::printf("wrote %s (iteration %llu, %u ranks, %.3f ms simulated)\n", trace->c_str(),
                    static_cast<unsigned long long>(p.iteration), p.ranks, p.makespan_ms);
      }
    });
  }
}

}  // namespace packpipe::cli
