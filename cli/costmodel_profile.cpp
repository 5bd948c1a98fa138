// `packpipe costmodel validate|import`: accuracy of the profiled model by leave-one-out, and
// conversion of DynaPipe / Aceso / Metis / AIOB / AICB profiles into one packpipe profile file.
#include <cctype>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/calibrate.h"
#include "cli/commands.h"
#include "cli/util.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "costmodel/profiled.h"

namespace packpipe::cli {

namespace cm = packpipe::costmodel;

namespace {

/// "gpt_6.7b" -> "gpt-6.7b", "gpt_1_3B" -> "gpt-1.3b", "t5_770M" -> "t5-770m" (preset spelling).
std::string preset_from_profile_name(const std::string& name) {
  std::vector<std::string> toks;
  std::string cur;
  for (char ch : name) {
    if (ch == '_' || ch == '-') {
      if (!cur.empty()) toks.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
  }
  if (!cur.empty()) toks.push_back(cur);
  if (toks.size() < 2) return name;
  std::string out = toks[0] + "-" + toks[1];
  for (std::size_t i = 2; i < toks.size(); ++i) out += "." + toks[i];
  return out;
}

cm::ModelSpec resolve_model(const std::string& option, const cm::Profile& p) {
  if (!option.empty()) return cm::load_model(option);
  PACKPIPE_CHECK_ARG(!p.model.empty(), "the profile does not name its model: pass --model (one of {})",
                     fmt::join(cm::model_preset_names(), ", "));
  const std::string guess = preset_from_profile_name(p.model);
  try {
    return cm::load_model(guess);
  } catch (const InvalidArgument&) {
    PACKPIPE_THROW(InvalidArgument, "the profile's model '{}' is not a preset ('{}' unknown): pass --model", p.model,
                   guess);
  }
}

Json errors_json(const cm::LooErrors& e) { return Json::parse(cm::loo_errors_json(e)); }

void print_json(const Json& j) { std::printf("%s\n", j.dump(2).c_str()); }

struct ReadOpts {
  std::int64_t seq = 0, dec_seq = 0, tp = 0, mbs = 0;
  cm::ProfileReadOptions get() const {
    cm::ProfileReadOptions o;
    o.seq = seq;
    o.dec_seq = dec_seq;
    o.tp = tp;
    o.mbs = mbs;
    return o;
  }
};

void add_read_options(CLI::App* sub, ReadOpts& o) {
  sub->add_option("--seq", o.seq, "sequence length for formats that do not record it (Aceso: 2048, Metis, AIOB)");
  sub->add_option("--dec-seq", o.dec_seq, "decoder length for Aceso T5 tables (default 512)");
  sub->add_option("--tp", o.tp, "AIOB: tensor-parallel degree when the file name does not say");
  sub->add_option("--mbs", o.mbs, "AIOB: micro-batch size when the file name does not say");
}

// ---- validate -----------------------------------------------------------------------------------

struct ValidateArgs {
  std::vector<std::string> profiles;
  std::string model;
  bool leave_one_out = false;
  bool json = false;
  bool groups = false;
  ReadOpts read;
  // --measured: the cost model against executed iterations (cli/costmodel_calibrate.cpp)
  std::vector<std::string> measured;
  std::string device, calibration, plot_data, plot;
};

void run_validate_measured(const ValidateArgs& a) {
  PACKPIPE_CHECK_ARG(!a.leave_one_out && !a.groups, "--leave-one-out and --groups check profiles' own points; they do "
                     "not combine with --measured");
  MeasuredValidateArgs m;
  m.measured = a.measured;
  m.costs.model = a.model;
  m.costs.device = a.device;
  m.costs.profiles = a.profiles;
  m.costs.calibration = a.calibration;
  m.plot_data = a.plot_data;
  m.plot = a.plot;
  m.json = a.json;
  run_measured_validate(m);
}

void run_validate(const ValidateArgs& a) {
  const cm::Profile p = cm::load_profiles(a.profiles, a.read.get());
  const cm::ModelSpec model = resolve_model(a.model, p);
  if (!a.leave_one_out) {
    // Loading and building the tables is the check; say what was found.
    const cm::ProfiledCostModel m(p, model, cm::DeviceSpec{});
    Json j;
    j["profile"] = a.profiles;
    j["model"] = model.name;
    j["device"] = p.device;
    j["files"] = p.sources.size();
    j["points"] = p.points.size();
    j["params"] = p.params.size();
    j["comm_samples"] = p.comm.size();
    j["notes"] = p.notes;
    j["description"] = m.describe();
    if (a.json) {
      print_json(j);
    } else {
      std::printf("%s\n  model   %s\n  files   %zu\n  points  %zu\n  comm    %zu samples\n", m.describe().c_str(),
                  model.name.c_str(), p.sources.size(), p.points.size(), p.comm.size());
      for (const auto& n : p.notes) std::printf("  note    %s\n", n.c_str());
    }
    return;
  }
  const cm::LooReport r = cm::leave_one_out(p, model);
  if (a.json) {
    Json j;
    j["profile"] = a.profiles;
    j["model"] = r.model;
    j["device"] = r.device.empty() ? Json(nullptr) : Json(r.device);
    j["protocol"] = "leave-one-out: each point with profiled neighbours at the adjacent axis values removed "
                    "(whole slice for seq and dec_seq) and predicted; MAPE in percent";
    const Json all = errors_json(r.all);
    for (auto it = all.begin(); it != all.end(); ++it) j[it.key()] = it.value();
    Json by = Json::array();
    for (const auto& b : r.by_stage_rc) {
      Json e = errors_json(b.errors);
      Json row;
      row["stage"] = cm::layer_kind_name(b.kind);
      row["rc"] = cm::recompute_name(b.rc);
      for (auto it = e.begin(); it != e.end(); ++it) row[it.key()] = it.value();
      by.push_back(row);
    }
    j["by_stage_rc"] = by;
    if (a.groups) {
      Json gs = Json::array();
      for (const auto& g : r.groups) {
        Json row;
        row["stage"] = cm::layer_kind_name(g.kind);
        row["tp"] = g.tp;
        row["rc"] = cm::recompute_name(g.rc);
        row["variant"] = g.variant;
        row["axis"] = g.axis;
        const Json e = errors_json(g.errors);
        for (auto it = e.begin(); it != e.end(); ++it) row[it.key()] = it.value();
        gs.push_back(row);
      }
      j["groups"] = gs;
    }
    print_json(j);
    return;
  }
  std::printf("leave-one-out on %zu file%s, model %s%s\n", p.sources.size(), p.sources.size() == 1 ? "" : "s",
              r.model.c_str(), r.device.empty() ? "" : (", device " + r.device).c_str());
  std::printf("  %-24s %7s %10s %10s %10s %10s\n", "stage / rc", "points", "time", "linear", "memory", "linear");
  auto line = [](const std::string& label, const cm::LooErrors& e) {
    const std::string mem = e.memory_predictions ? fmt::format("{:9.2f}% {:9.2f}%", e.memory_mape, e.linear_memory_mape)
                                                 : fmt::format("{:>10} {:>10}", "-", "-");
    std::printf("  %-24s %7zu %9.2f%% %9.2f%% %s\n", label.c_str(), e.points, e.time_mape, e.linear_time_mape,
                mem.c_str());
  };
  for (const auto& b : r.by_stage_rc) line(fmt::format("{} / {}", cm::layer_kind_name(b.kind), cm::recompute_name(b.rc)), b.errors);
  line("all", r.all);
  std::printf("  (MAPE: ours = fitted curve and interpolated residual in log coordinates, nested; linear = DynaPipe's "
              "rule on the raw grid)\n");
}

// ---- import -------------------------------------------------------------------------------------

struct ImportArgs {
  std::vector<std::string> inputs;
  std::string out;
  std::string model;
  std::string device;
  bool json = false;
  ReadOpts read;
};

void run_import(const ImportArgs& a) {
  cm::Profile p = cm::load_profiles(a.inputs, a.read.get());
  if (!a.model.empty()) p.model = a.model;
  if (!a.device.empty()) p.device = a.device;
  const std::string text = cm::write_packpipe_profile(p);
  // Never onto a profile it read (a folder's files included), and atomically.
  std::vector<std::string> inputs = a.inputs;
  inputs.insert(inputs.end(), p.sources.begin(), p.sources.end());
  check_command_files(inputs, {{a.out, "--out"}});
  write_file_atomic(a.out, text);
  if (a.json) {
    Json j;
    j["out"] = a.out;
    j["sources"] = p.sources;
    j["model"] = p.model;
    j["device"] = p.device;
    j["points"] = p.points.size();
    j["params"] = p.params.size();
    j["comm_samples"] = p.comm.size();
    j["notes"] = p.notes;
    j["bytes"] = text.size();
    print_json(j);
  } else {
    std::printf("wrote %s: %zu points, %zu parameter rows, %zu communication samples from %zu file%s\n", a.out.c_str(),
                p.points.size(), p.params.size(), p.comm.size(), p.sources.size(), p.sources.size() == 1 ? "" : "s");
    for (const auto& n : p.notes) std::printf("  note: %s\n", n.c_str());
  }
}

}  // namespace

void add_costmodel_profile_commands(CLI::App& costmodel) {
  auto va = std::make_shared<ValidateArgs>();
  CLI::App* v = costmodel.add_subcommand(
      "validate", "Load profiles and measure interpolation accuracy (leave-one-out), or, with --measured, compare a "
                  "cost model with executed iterations");
  v->add_option("--profile", va->profiles, "profile files or folders (any supported format); with --measured: the "
                                           "profiled model (none: the analytic model)");
  v->add_option("--model", va->model, "model preset or JSON for the FLOPs (default: from the profile's name; with "
                                      "--measured: the measurements' model)")
      ->check(model_check());
  v->add_option("--measured", va->measured, "measurement files (packpipe run --measurements, a trainer): per-op "
                                            "and per-iteration errors of the cost model")
      ->expected(1, -1);
  v->add_option("--device", va->device, "with --measured: device preset or JSON (default: the measurements' device)")
      ->check(device_check());
  v->add_option("--calibration", va->calibration, "with --measured: calibration file applied over the cost model");
  v->add_option("--plot-data", va->plot_data, "with --measured: write predicted and measured pairs (JSON) for a plot");
  v->add_option("--plot", va->plot, "with --measured: draw predicted against measured op and iteration times into "
                                    "this PNG (python3 -m packpipe.plots; needs matplotlib)");
  v->add_flag("--leave-one-out", va->leave_one_out, "remove each interior grid point and predict it from the rest");
  v->add_flag("--groups", va->groups, "with --json: errors per grid (stage, tp, rc, variant, axis)");
  v->add_flag("--json", va->json, "one JSON object on stdout");
  add_read_options(v, va->read);
  v->callback([va] {
    if (!va->measured.empty()) return run_validate_measured(*va);
    PACKPIPE_CHECK_ARG(!va->profiles.empty(), "costmodel validate needs --profile (profiles to check) or --measured "
                       "(executed iterations to compare a cost model with)");
    PACKPIPE_CHECK_ARG(va->device.empty() && va->calibration.empty() && va->plot_data.empty() && va->plot.empty(),
                       "--device, --calibration, --plot-data and --plot go with --measured");
    run_validate(*va);
  });

  auto ia = std::make_shared<ImportArgs>();
  CLI::App* im = costmodel.add_subcommand("import", "Convert profiles into one packpipe profile file (ms, bytes)");
  im->add_option("inputs", ia->inputs, "profile files or folders")->required();
  im->add_option("--out", ia->out, "packpipe profile file to write (JSON)")->required();
  im->add_option("--model", ia->model, "model name to record in the file");
  im->add_option("--device", ia->device, "device name to record in the file");
  im->add_flag("--json", ia->json, "summary as JSON");
  add_read_options(im, ia->read);
  im->callback([ia] { run_import(*ia); });
}

}  // namespace packpipe::cli
