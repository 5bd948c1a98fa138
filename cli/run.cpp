// `packpipe run PLANFILE --replay`: executes a plan file's instruction streams with no model. Every
// compute op takes its planned duration (scaled), every activation and gradient carries a checked
// payload, and the report puts the measured makespan beside the simulated one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "costmodel/measurements.h"
#include "plan/format.h"
#include "plan/validator.h"
#include "planner/measure.h"
#include "runtime/cuda.h"
#include "runtime/local.h"
#include "runtime/nccl.h"
#include "runtime/replay.h"
#include "runtime/report.h"

namespace packpipe::cli {

namespace pl = packpipe::plan;
namespace rt = packpipe::runtime;

namespace {

struct RunCliOptions {
  std::string file;
  bool replay = false;
  std::string transport = "threads";
  double time_scale = 1.0;
  double timeout = 60;
  std::uint64_t first = 0, iterations = 0;
  std::uint64_t payload_bytes = 65536;
  bool no_verify = false, json = false;
  bool allow_incomplete = false;  ///< run the iterations an incomplete plan file holds
  std::string trace;
  std::string measurements;  ///< packpipe-measurements of the executed iterations
  std::int64_t tp = 1;       ///< the plans' tensor-parallel size (their measurements' shapes)
  std::string model, device_name;  ///< recorded in the measurements' header
  int device = 0;
  std::int64_t rank = -1;
  std::uint32_t replica = 0;
  std::string nccl_id_file;
};

// The plan file's plans grouped by iteration (replicas in order), from `first`, at most `count`.
std::vector<std::vector<pl::Plan>> read_iterations(const pl::PlanFileReader& r, std::uint64_t first, std::uint64_t count) {
  std::vector<std::vector<pl::Plan>> out;
  for (std::size_t i = 0; i < r.size(); ++i) {
    const std::uint64_t it = r.iteration(i);
    if (it < first) continue;
    if (out.empty() || out.back().front().iteration != it) {
      if (count > 0 && out.size() == count) break;
      out.emplace_back();
    }
    out.back().push_back(r.read(i));
  }
  return out;
}

rt::ExecutorOptions executor_options(const RunCliOptions& o) {
  rt::ExecutorOptions eo;
  eo.timeout_s = o.timeout;
  eo.validate = false;  // run_replay validates every plan once, before any rank starts
  return eo;
}

rt::ReplayOptions replay_options(const RunCliOptions& o) {
  rt::ReplayOptions ro;
  ro.time_scale = o.time_scale;
  ro.payload_bytes = o.payload_bytes;
  ro.verify = !o.no_verify;
  return ro;
}

// One process per GPU: this rank's stream of one replica, over NCCL, replayed on its device.
rt::RankRecord run_nccl_rank(const RunCliOptions& o, const pl::Plan& p, rt::Transport& transport) {
  rt::CudaGroup device(1, o.device);  // the device, its stream and spin calibration
  auto handler = rt::cuda_replay_handler(device, 0, replay_options(o));
  rt::Executor ex(*handler, transport, executor_options(o));
  return ex.run(p);
}

// The measurements of every executed plan (ranks not recorded, e.g. the other ranks of an nccl run,
// are left out).
costmodel::MeasurementSet measurements_of(const std::vector<rt::ExecutedPlan>& executed, const RunCliOptions& o) {
  costmodel::MeasurementSet set;
  set.header.model = o.model;
  set.header.device = o.device_name;
  set.header.source = fmt::format("packpipe run --replay --transport {} --time-scale {} {}", o.transport, o.time_scale,
                                  o.file);
  planner::MeasureOptions mo;
  mo.tp = o.tp;
  for (const auto& e : executed) {
    planner::InstructionTimes times(e.records.size());
    for (std::size_t r = 0; r < e.records.size(); ++r) {
      for (const auto& t : e.records[r].times) times[r].emplace_back(t.start_ns, t.end_ns);
    }
    planner::PlanMeasurements m = planner::measurements_from(*e.plan, times, mo);
    set.ops.insert(set.ops.end(), m.ops.begin(), m.ops.end());
    if (m.has_iteration) set.iterations.push_back(m.iteration);
  }
  return set;
}

Json run_replay(const RunCliOptions& o) {
  PACKPIPE_CHECK_ARG(o.replay, "packpipe run executes plans with no model and needs --replay (a model runs through "
                               "packpipe.torch or a C++ stage handler)");
  PACKPIPE_CHECK_ARG(!o.measurements.empty() || (o.model.empty() && o.device_name.empty()),
                     "--model and --device-name describe the measurements: they go with --measurements");
  check_option_range("--tp", o.tp, 1, costmodel::kMaxMeasuredSize);
  std::vector<std::string> inputs{o.file};
  for (const std::string* p : {&o.model, &o.device_name}) {
    if (file_exists(*p)) inputs.push_back(*p);  // a preset name is no file
  }
  std::vector<OutputFile> outputs{{o.trace, "--trace"}, {o.measurements, "--measurements"}};
  if (o.transport == "nccl" && !o.nccl_id_file.empty()) {
    outputs.push_back({o.nccl_id_file, "--nccl-id-file"});
    outputs.push_back({rt::nccl_abort_file(o.nccl_id_file), "the abort file of --nccl-id-file"});
  }
  check_command_files(inputs, outputs);
  const pl::PlanFileReader reader(o.file);
  if (!o.allow_incomplete) reader.require_complete("pass --allow-incomplete");
  const auto iterations = read_iterations(reader, o.first, o.iterations);
  PACKPIPE_CHECK_ARG(!iterations.empty(), "{}: no plan at or after iteration {}", o.file, o.first);
  // Every plan checked once, before any rank starts (each rank's executor refuses an invalid plan
  // too, and the error listed its violations once per rank).
  for (const auto& replicas : iterations) {
    for (const pl::Plan& p : replicas) {
      try {
        pl::validate_or_throw(p);
      } catch (const std::exception& e) {
        PACKPIPE_THROW(Error, "{}: iteration {}, replica {}: refusing to run an invalid plan: {}", o.file, p.iteration,
                       p.replica, e.what());
      }
    }
  }
  const pl::Plan& head = iterations.front().front();

  std::unique_ptr<rt::Transport> nccl;
  if (o.transport == "nccl") {
    PACKPIPE_CHECK_ARG(o.rank >= 0 && o.rank < head.ranks, "--transport nccl runs one rank per process: pass --rank in "
                       "[0, {}) (the plan's pipeline ranks)", head.ranks);
    PACKPIPE_CHECK_ARG(!o.nccl_id_file.empty(), "--transport nccl needs --nccl-id-file (a path every rank can read)");
    rt::NcclOptions no;
    no.device = o.device;
    no.timeout_s = o.timeout;
    no.id_file = o.nccl_id_file;
    nccl = rt::nccl_transport(static_cast<std::uint32_t>(o.rank), head.ranks, no);
  }

  std::vector<rt::ExecutedPlan> executed;
  Progress progress("replaying", iterations.size());
  std::size_t done = 0;
  for (const auto& plans : iterations) {
    if (o.transport == "threads") {
      const auto runs = rt::run_local_replicas(
          plans, [&](std::uint32_t) { return std::make_unique<rt::ReplayHandler>(replay_options(o)); },
          executor_options(o));
      for (std::size_t k = 0; k < plans.size(); ++k) executed.push_back({&plans[k], runs[k].records});
    } else if (o.transport == "cuda") {
      for (const auto& p : plans) {
        executed.push_back({&p, rt::run_cuda_replay(p, o.device, replay_options(o), executor_options(o)).records});
      }
    } else {
      PACKPIPE_CHECK_ARG(o.replica < plans.size(), "--replica {}: iteration {} has {} replicas", o.replica,
                         plans.front().iteration, plans.size());
      const pl::Plan& p = plans[o.replica];
      std::vector<rt::RankRecord> records(p.ranks);
      records[static_cast<std::size_t>(o.rank)] = run_nccl_rank(o, p, *nccl);
      executed.push_back({&p, std::move(records)});
    }
    progress.update(++done);
  }
  progress.finish();

  const bool one_rank = o.transport == "nccl";
  const rt::RunSummary s = one_rank ? rt::RunSummary{} : rt::summarize(executed, o.time_scale);
  if (!o.trace.empty() && !one_rank) write_file_atomic(o.trace, rt::trace_json(executed, o.time_scale));
  std::size_t measured = 0;
  if (!o.measurements.empty()) {
    const costmodel::MeasurementSet set = measurements_of(executed, o);
    write_measurements(o.measurements, set);
    measured = set.ops.size();
  }
  Json j{{"file", o.file},
         {"transport", o.transport},
         {"time_scale", o.time_scale},
         {"iterations", iterations.size()},
         {"ranks", head.ranks},
         {"dp", head.dp},
         {"payload_bytes", o.payload_bytes}};
  if (one_rank) {
    std::uint64_t n = 0;
    for (const auto& e : executed) n += e.records[static_cast<std::size_t>(o.rank)].instructions;
    j["rank"] = o.rank;
    j["instructions"] = n;
    return j;
  }
  j["measured_ms"] = s.measured_ms;
  j["simulated_ms"] = s.simulated_ms;
  j["measured_over_simulated"] = s.simulated_ms > 0 ? Json(s.measured_ms / s.simulated_ms) : Json(nullptr);
  // (no plan with a simulated time to compare with, e.g. --time-scale 0: no ratio, as above)
  j["median_ratio_per_plan"] = s.simulated_ms > 0 ? Json(s.median_ratio) : Json(nullptr);
  Json ops = Json::object();
  for (const auto& [k, r, n] : s.op_ratios) ops[k] = Json{{"median_measured_over_planned", r}, {"count", n}};
  j["compute_ops"] = ops;
  j["instructions"] = s.instructions;
  j["overhead_ns_per_instruction"] = s.overhead_ns_per_instruction;
  j["wait_fraction"] = s.wait_fraction;
  Json per = Json::array();
  for (const auto& f : s.plans) {
    per.push_back(Json{{"iteration", f.iteration}, {"replica", f.replica}, {"measured_ms", f.measured_ms},
                       {"simulated_ms", f.simulated_ms}});
  }
  j["plans"] = per;
  if (!o.trace.empty()) j["trace"] = o.trace;
  if (!o.measurements.empty()) j["measurements"] = Json{{"file", o.measurements}, {"ops", measured}};
  return j;
}

void print_report(const Json& j) {
  std::printf("packpipe run: %s (%llu iterations, %llu ranks, dp %llu), replay on %s, time scale %g\n",
              j["file"].get<std::string>().c_str(), j["iterations"].get<unsigned long long>(),
              j["ranks"].get<unsigned long long>(), j["dp"].get<unsigned long long>(),
              j["transport"].get<std::string>().c_str(), j["time_scale"].get<double>());
  auto print_measurements = [&] {
    if (!j.contains("measurements")) return;
    std::printf("  measurements: %llu ops written to %s\n", j["measurements"]["ops"].get<unsigned long long>(),
                j["measurements"]["file"].get<std::string>().c_str());
  };
  if (j.contains("rank")) {
    std::printf("  rank %lld ran %llu instructions\n", j["rank"].get<long long>(), j["instructions"].get<unsigned long long>());
    print_measurements();
    return;
  }
  const double m = j["measured_ms"].get<double>(), s = j["simulated_ms"].get<double>();
  std::printf("  makespan: measured %.3f s, simulated %.3f s", m / 1e3, s / 1e3);
  if (s > 0) std::printf(" (measured / simulated %.4f; median per plan %.4f)", m / s, j["median_ratio_per_plan"].get<double>());
  std::printf("\n");
  std::string ops;
  for (const auto& [k, v] : j["compute_ops"].items()) {
    ops += fmt::format("{}{} {:.4f} (n={})", ops.empty() ? "" : ", ", k, v["median_measured_over_planned"].get<double>(),
                       v["count"].get<unsigned long long>());
  }
  if (!ops.empty()) std::printf("  compute ops, measured / planned duration (median): %s\n", ops.c_str());
  std::printf("  executor overhead: %.2f us per instruction (%llu instructions); waits %.0f%% of rank time\n",
              j["overhead_ns_per_instruction"].get<double>() / 1e3, j["instructions"].get<unsigned long long>(),
              100 * j["wait_fraction"].get<double>());
  if (j.contains("trace")) {
    std::printf("  trace (measured beside planned): %s (open in ui.perfetto.dev or chrome://tracing)\n",
                j["trace"].get<std::string>().c_str());
  }
  print_measurements();
}

}  // namespace

void register_run_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Execute a plan file's instruction streams (--replay: with no model)");
  auto o = std::make_shared<RunCliOptions>();
  cmd->add_option("PLANFILE", o->file, "Plan file written by `packpipe plan --out`")->required();
  cmd->add_flag("--replay", o->replay, "Replay: each op takes its planned duration, payloads are checked");
  cmd->add_option("--transport", o->transport, "threads (every rank a thread), cuda (every rank a stream of one GPU), "
                                               "nccl (this process is --rank, one GPU each)")
      ->check(CLI::IsMember({"threads", "cuda", "nccl"}))
      ->capture_default_str();
  cmd->add_option("--time-scale", o->time_scale, "Replayed duration = planned x this (0: no waiting)")
      ->check(float_range(0, 1e6))
      ->capture_default_str();
  cmd->add_option("--timeout", o->timeout, "Seconds any wait may take before every rank stops with an error (0: forever)")
      ->check(float_range(0, rt::kMaxTimeoutS, "0: forever"))
      ->capture_default_str();
  cmd->add_option("--first-iteration", o->first, "Start at this iteration");
  cmd->add_option("--iterations", o->iterations, "Run at most this many iterations (0, the default: all)");
  cmd->add_option("--payload-bytes", o->payload_bytes, "Bytes of each tensor moved and checked (0: all of it)")
      ->capture_default_str();
  cmd->add_flag("--no-verify", o->no_verify, "Do not check payloads");
  cmd->add_flag("--allow-incomplete", o->allow_incomplete,
                "Run the iterations of an incomplete plan file (a planning run that stopped early); refused without");
  cmd->add_option("--trace", o->trace, "Write a Chrome/Perfetto trace: measured timeline beside the planned one");
  cmd->add_option("--measurements", o->measurements,
                  "Write the executed ops' measured times (JSON Lines) for `packpipe costmodel calibrate` and "
                  "`costmodel validate --measured`");
  cmd->add_option("--tp", o->tp, "Tensor-parallel size the plans were made for (the measurements' shapes)")
      ->capture_default_str();
  cmd->add_option("--model", o->model, "Model the plans were made for (preset or .json file), recorded in the "
                                       "measurements' header")
      ->check(model_check());
  cmd->add_option("--device-name", o->device_name,
                  "Device the cost model describes (preset or .json file), recorded in the measurements' header")
      ->check(device_check());
  cmd->add_option("--device", o->device, "CUDA device (cuda, nccl)")->capture_default_str();
  auto* rank = cmd->add_option("--rank", o->rank, "nccl: this process's pipeline rank");
  auto* replica = cmd->add_option("--replica", o->replica, "nccl: the data-parallel replica whose plans this pipeline runs");
  auto* id_file = cmd->add_option("--nccl-id-file", o->nccl_id_file,
                                  "nccl: file through which rank 0 shares the NCCL unique id");
  cmd->add_flag("--json", o->json, "Print the report as one JSON object");
  cmd->callback([o, rank, replica, id_file] {
    // (the other transports run every rank and replica of the plans: these would be ignored)
    for (const CLI::Option* opt : {rank, replica, id_file}) {
      PACKPIPE_CHECK_ARG(o->transport == "nccl" || opt->count() == 0, "{} is for --transport nccl (one process per "
                         "rank); --transport {} runs every rank and replica of the plans", opt->get_name(), o->transport);
    }
    const Json j = run_replay(*o);
    if (o->json) {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      print_report(j);
    }
  });
}

}  // namespace packpipe::cli
