// `packpipe costmodel calibrate`: fits a calibration of a cost model to measured op times and
// writes it; `packpipe costmodel validate --measured`: a cost model against executed iterations.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli/calibrate.h"
#include "cli/commands.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "costmodel/calibration.h"
#include "planner/measure.h"

namespace packpipe::cli {

namespace cm = packpipe::costmodel;

namespace {

void print_json(const Json& j) { std::printf("%s\n", j.dump(2).c_str()); }

// A replay's op times are the plan's own times scaled by its --time-scale (its header's source
// says so): a fit to a replay at another scale than 1 scales the model by it (the README's recipe
// at 0.01 gave a model 100x too fast, planned at an MFU of 4284%, with no word). Warned on stderr.
void warn_scaled_replay(const cm::MeasurementHeader& h, const std::vector<std::string>& files) {
  const std::string& src = h.source;
  const auto at = src.find("--time-scale ");
  if (src.find("--replay") == std::string::npos || at == std::string::npos) return;
  const double scale = std::strtod(src.c_str() + at + 13, nullptr);
  if (scale == 1.0) return;
  std::fprintf(stderr,
               "packpipe: warning: %s records a replay at --time-scale %g: its op times are the plan's own x %g, so "
               "the fit scales the model by about %g; replay at --time-scale 1 to check the fit, or measure a "
               "trainer (packpipe.torch) to calibrate\n",
               files.front().c_str(), scale, scale, scale);
}

// Every file's measurements, in the order given (the first file's header). A file given twice (by
// inode: through links and relative paths) is refused: its measurements would count twice.
cm::MeasurementSet read_all(const std::vector<std::string>& files) {
  for (std::size_t i = 0; i < files.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      PACKPIPE_CHECK_ARG(!same_file(files[i], files[j]), "--measured: '{}' and '{}' are the same file; each file's "
                         "measurements are read once (given twice, every op would count twice)", files[j], files[i]);
    }
  }
  cm::MeasurementSet set = cm::read_measurements(files.front());
  for (std::size_t i = 1; i < files.size(); ++i) set.append(cm::read_measurements(files[i]));
  return set;
}

// The cost model options with --model and --device defaulting to what the measurements name.
CostModelArgs resolve(CostModelArgs a, const cm::MeasurementHeader& h) {
  const CostModelArgs defaults;
  if (a.model.empty()) a.model = h.model.empty() ? defaults.model : h.model;
  if (a.device.empty()) a.device = h.device.empty() ? defaults.device : h.device;
  return a;
}

// --model and --device with no default of their own: the measurements' header names them.
void add_cost_options(CLI::App* cmd, CostModelArgs& costs, bool with_calibration) {
  costs.model.clear();
  costs.device.clear();
  costs.add_to(cmd, with_calibration);
  cmd->get_option("--model")->description("Model preset or .json file (default: the measurements' model, else gpt-6.7b)");
  cmd->get_option("--device")->description(
      "Device preset or .json file (default: the measurements' device, else A100-40GB)");
}

Json op_errors_json(const planner::OpErrors& e) {
  return Json{{"op", cm::measured_op_name(e.op)},
              {"count", e.count},
              {"median_abs", e.median_abs},
              {"p90_abs", e.p90_abs},
              {"bias", e.bias}};
}

// ---- calibrate ----------------------------------------------------------------------------------

struct CalibrateArgs {
  std::vector<std::string> measured;
  std::string out;
  CostModelArgs costs;
  cm::FitOptions fit;
  bool no_regions = false;
  bool json = false;
};

Json run_calibrate(const CalibrateArgs& a) {
  std::vector<std::string> inputs = a.measured;
  for (const auto& f : cost_model_inputs(a.costs)) inputs.push_back(f);
  check_command_files(inputs, {{a.out, "--out"}});
  cm::FitOptions fit = a.fit;
  fit.regions = !a.no_regions;
  const cm::MeasurementSet set = read_all(a.measured);
  PACKPIPE_CHECK_ARG(!set.ops.empty(), "{}: no op measurements to fit", fmt::join(a.measured, ", "));
  const CostModelArgs costs = resolve(a.costs, set.header);
  const std::shared_ptr<const cm::CostModel> base = costs.make();
  warn_scaled_replay(set.header, a.measured);
  cm::Calibration cal = cm::fit_calibration(*base, set.ops, fit);
  // Iteration lines that name their schedule give the schedule factors (013). They are an addition
  // to the op fits: iterations that cannot be re-simulated leave them out, said in the report.
  std::string schedules_skipped;
  if (!set.iterations.empty()) {
    try {
      cal = planner::fit_schedule_factors(base, cal, set);
    } catch (const InvalidArgument& e) {
      schedules_skipped = e.what();
    }
  }
  const auto before = planner::op_errors(*base, set.ops);
  const cm::CalibratedCostModel calibrated(base, cal);
  const auto after = planner::op_errors(calibrated, set.ops);
  cal.save(a.out);  // atomically, and only once everything above succeeded

  Json j;
  j["out"] = a.out;
  j["measured"] = a.measured;
  j["measurements"] = set.ops.size();
  const Json file = Json::parse(cal.to_json());  // the file's own form of the base and the transfer fits
  j["base"] = file["base"];
  Json ops = Json::array();
  for (std::size_t k = 0; k < before.size(); ++k) {
    const cm::MeasuredOp op = before[k].op;
    Json o{{"op", cm::measured_op_name(op)},
           {"count", before[k].count},
           {"error_before", before[k].median_abs},
           {"error_after", after[k].median_abs},
           {"bias_before", before[k].bias},
           {"bias_after", after[k].bias}};
    if (cm::is_compute(op)) {
      const cm::OpFit& f = cal.compute[static_cast<std::size_t>(op)];
      o["fitted"] = f.fitted;
      o["from"] = f.from;
      o["a"] = f.global.a;
      o["b_ms"] = f.global.b;
      o["attention_gamma"] = f.attention_gamma;
      o["rejected"] = f.global.rejected;
      o["regions"] = f.regions.size();
    }
    ops.push_back(o);
  }
  j["ops"] = ops;
  j["transfers"] = file["transfers"];
  j["schedules"] = file.contains("schedules") ? file["schedules"] : Json::array();
  if (!schedules_skipped.empty()) j["schedules_not_fitted"] = schedules_skipped;
  return j;
}

void print_calibrate(const Json& j) {
  const Json& b = j["base"];
  std::printf("calibrated %s on %s (%s) from %zu measurements: wrote %s\n", b["model"].get<std::string>().c_str(),
              b["device"].get<std::string>().c_str(), b["description"].get<std::string>().c_str(),
              j["measurements"].get<std::size_t>(), j["out"].get<std::string>().c_str());
  std::printf("  %-5s %7s %9s %8s %10s %8s %9s %14s %14s\n", "op", "count", "rejected", "regions", "a", "b ms",
              "attn x", "error before", "error after");
  for (const Json& o : j["ops"]) {
    const bool compute = o.contains("a");
    std::printf("  %-5s %7lld %9s %8s %10s %8s %9s %13.2f%% %13.2f%%\n", o["op"].get<std::string>().c_str(),
                o["count"].get<long long>(),
                compute ? std::to_string(o["rejected"].get<long long>()).c_str() : "-",
                compute ? std::to_string(o["regions"].get<long long>()).c_str() : "-",
                compute ? fmt::format("{:.4f}", o["a"].get<double>()).c_str() : "-",
                compute ? fmt::format("{:.4f}", o["b_ms"].get<double>()).c_str() : "-",
                compute ? fmt::format("{:.3f}", 1.0 + o["attention_gamma"].get<double>()).c_str() : "-",
                100 * o["error_before"].get<double>(), 100 * o["error_after"].get<double>());
  }
  for (const Json& t : j["transfers"]) {
    if (!t["fitted"].get<bool>()) continue;
    std::printf("  %s-node transfers: %lld points, %lld sizes; latency %.4f ms, %.3f GB/s\n",
                t["link"].get<std::string>().c_str(), t["points"].get<long long>(), t["sizes"].get<long long>(),
                t["latency_ms"].get<double>(), t["bytes_per_ms"].get<double>() / 1e6);
  }
  for (const Json& f : j["schedules"]) {
    std::printf("  schedule %s: measured %.3f x its simulated makespan (%lld iterations, spread %.1f%%)\n",
                f["schedule"].get<std::string>().c_str(), f["factor"].get<double>(), f["iterations"].get<long long>(),
                100 * f["spread"].get<double>());
  }
  if (j.contains("schedules_not_fitted")) {
    std::printf("  schedule factors not fitted: %s\n", j["schedules_not_fitted"].get<std::string>().c_str());
  }
  std::printf("  (errors: median |predicted - measured| / measured per op; attn x: the attention part's cost "
              "relative to the model's, 1 + attention_gamma; transfers are upper bounds: see "
              "docs/design/013-calibration.md)\n");
}

// The temporary file beside the PNG `png` that holds plot data set `k` while packpipe.plots draws.
std::string plot_data_temporary(const std::string& png, std::size_t k) {
  return fmt::format("{}.plot-data-{}.json", png, k);
}

// Draws the PNG `png` (python3 -m packpipe.plots) from plot data sets (label, JSON), each written
// to a temporary file beside the PNG (plot_data_temporary) and removed after.
void draw_plot(const std::string& png, const std::vector<std::pair<std::string, std::string>>& sets) {
  struct Remove {
    std::vector<std::string> paths;
    ~Remove() {
      for (const auto& p : paths) std::remove(p.c_str());
    }
  } temporaries;
  std::vector<std::string> args{"validation"};
  for (std::size_t k = 0; k < sets.size(); ++k) {
    const std::string path = plot_data_temporary(png, k);
    write_file_atomic(path, sets[k].second);
    temporaries.paths.push_back(path);
    args.push_back(path);
  }
  args.insert(args.end(), {"-o", png});
  for (const auto& [label, data] : sets) {
    if (!label.empty()) args.insert(args.end(), {"--label", label});
  }
  run_python_module("packpipe.plots", args, fmt::format("drawing {}", png));
}

}  // namespace

// ---- validate --measured --------------------------------------------------------------------------

void run_measured_validate(const MeasuredValidateArgs& a) {
  std::vector<std::string> inputs = a.measured;
  for (const auto& f : cost_model_inputs(a.costs)) inputs.push_back(f);
  std::vector<OutputFile> outputs{{a.plot_data, "--plot-data"}, {a.plot, "--plot"}};
  if (!a.plot.empty()) {  // the plot's data sets: the model's, and with --calibration the base model's too
    for (std::size_t k = 0; k < (a.costs.calibration.empty() ? 1u : 2u); ++k) {
      outputs.push_back({plot_data_temporary(a.plot, k), "the temporary plot data of --plot"});
    }
  }
  check_command_files(inputs, outputs);
  if (!a.plot.empty()) AtomicFile probe(a.plot);  // refuses a directory, a missing folder or a busy output before any work
  const cm::MeasurementSet set = read_all(a.measured);
  PACKPIPE_CHECK_ARG(!set.ops.empty(), "{}: no op measurements to validate the cost model against (only {}); "
                     "measure with `packpipe run --measurements` or a trainer's Calibrator",
                     fmt::join(a.measured, ", "),
                     set.iterations.empty() ? std::string("the header")
                                            : fmt::format("{} iteration lines", set.iterations.size()));
  const auto cost = resolve(a.costs, set.header).make();
  const planner::ValidationReport r = planner::validate_measurements(*cost, set);
  const std::string plot = planner::validation_plot_json(r, set);
  if (!a.plot_data.empty()) write_file_atomic(a.plot_data, plot);
  if (!a.plot.empty()) {
    if (a.costs.calibration.empty()) {
      draw_plot(a.plot, {{"", plot}});
    } else {  // the base model beside the calibrated one
      CostModelArgs base = resolve(a.costs, set.header);
      base.calibration.clear();
      const auto base_cost = base.make();
      const std::string base_plot =
          planner::validation_plot_json(planner::validate_measurements(*base_cost, set), set);
      draw_plot(a.plot, {{"uncalibrated", base_plot}, {"calibrated", plot}});
    }
  }
  if (a.json) {
    Json j;
    j["measured"] = a.measured;
    j["cost_model"] = r.cost_model;
    j["measurements"] = set.ops.size();
    Json ops = Json::array();
    for (const auto& e : r.ops) ops.push_back(op_errors_json(e));
    j["ops"] = ops;
    j["iterations"] = Json::parse(plot)["iterations"];
    j["iterations_compared"] = r.iterations_compared;
    j["iteration_median_abs"] = r.iteration_median_abs;
    j["iteration_p90_abs"] = r.iteration_p90_abs;
    j["iteration_bias"] = r.iteration_bias;
    if (!a.plot_data.empty()) j["plot_data"] = a.plot_data;
    if (!a.plot.empty()) j["plot"] = a.plot;
    print_json(j);
    return;
  }
  std::printf("%s against %zu measurements (%s)\n", r.cost_model.c_str(), set.ops.size(),
              fmt::format("{}", fmt::join(a.measured, ", ")).c_str());
  std::printf("  %-5s %7s %12s %12s %12s\n", "op", "count", "median |e|", "p90 |e|", "bias");
  for (const auto& e : r.ops) {
    std::printf("  %-5s %7lld %11.2f%% %11.2f%% %+11.2f%%\n", cm::measured_op_name(e.op), static_cast<long long>(e.count),
                100 * e.median_abs, 100 * e.p90_abs, 100 * e.bias);
  }
  std::printf("  iterations: %zu re-simulated, %lld with a measured makespan", r.iterations.size(),
              static_cast<long long>(r.iterations_compared));
  if (r.iterations_compared > 0) {
    std::printf(": median |e| %.2f%%, p90 %.2f%%, bias %+.2f%%", 100 * r.iteration_median_abs,
                100 * r.iteration_p90_abs, 100 * r.iteration_bias);
  }
  std::printf("\n  (e = (predicted - measured) / measured)\n");
  if (!a.plot_data.empty()) std::printf("  plot data: %s\n", a.plot_data.c_str());
  if (!a.plot.empty()) std::printf("  plot: %s\n", a.plot.c_str());
}

void add_costmodel_calibration_commands(CLI::App& costmodel) {
  auto a = std::make_shared<CalibrateArgs>();
  CLI::App* c = costmodel.add_subcommand(
      "calibrate", "Fit a calibration of a cost model to measured op times (packpipe run --measurements, a trainer) "
                   "and write it for --calibration");
  c->add_option("--measured", a->measured, "Measurement files (packpipe-measurements JSON Lines; repeatable)")
      ->required()
      ->expected(1, -1);
  c->add_option("-o,--out", a->out, "Calibration file to write (JSON, atomically)")->required();
  add_cost_options(c, a->costs, false);
  c->add_option("--min-region-points", a->fit.min_region_points,
                "Fewest points of a log2(tokens) region fitted on its own (fewer: the op's global fit)")
      ->capture_default_str();
  c->add_option("--outlier-mads", a->fit.outlier_mads,
                "Reject points this many robust deviations (1.4826 MAD) from the median residual")
      ->check(float_range(1, 100))
      ->capture_default_str();
  c->add_option("--max-iterations", a->fit.max_iterations, "Fit / reject rounds at most")->capture_default_str();
  c->add_option("--transfer-quantile", a->fit.transfer_quantile,
                "Quantile of one transfer size's measured times taken as its time")
      ->check(float_range(0, 1))
      ->capture_default_str();
  c->add_flag("--no-regions", a->no_regions, "One fit per op kind (no log2(tokens) regions)");
  c->add_flag("--json", a->json, "Print the report as one JSON object");
  c->callback([a] {
    const Json j = run_calibrate(*a);
    if (a->json) return print_json(j);
    print_calibrate(j);
  });
}

}  // namespace packpipe::cli
