// Small helpers shared by the CLI subcommands: length statistics, progress, output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "costmodel/cost_model.h"
#include "scheduler/pipeline.h"

namespace packpipe::cli {

using Json = nlohmann::ordered_json;

/// Summary of a list of lengths (tokens).
struct LengthStats {
  std::uint64_t count = 0;
  std::uint64_t total = 0;
  std::uint64_t min = 0;
  std::uint64_t max = 0;
  double mean = 0;
  std::uint64_t p50 = 0;
  std::uint64_t p90 = 0;
  std::uint64_t p99 = 0;
};

/// Statistics of `lengths` (reorders it). Percentiles are nearest-rank.
LengthStats length_stats(std::vector<std::uint64_t>& lengths);
/// The statistics as a JSON object.
Json to_json(const LengthStats& s);
/// "min 3, p50 10, p90 40, p99 90, max 120, mean 15.2"
std::string to_text(const LengthStats& s);

/// Progress line on stderr, drawn only when stderr is a terminal; rate-limited.
class Progress {
 public:
  Progress(std::string label, std::uint64_t total);
  ~Progress();
  /// Sets the amount done so far; redraws at most every 100 ms.
  void update(std::uint64_t done);
  /// Clears the line.
  void finish();

 private:
  std::string label_;
  std::uint64_t total_;
  bool enabled_;
  bool finished_ = false;
  double last_draw_ = 0;
  double start_ = 0;
};

/// `--model`, `--device`, `--profile`: the cost model a subcommand uses.
struct CostModelArgs {
  std::string model = "gpt-6.7b";
  std::string device = "A100-40GB";
  std::vector<std::string> profiles;
  /// Registers the three options on `cmd` (this object must outlive the parse).
  void add_to(CLI::App* cmd);
  /// The analytic model, or the profiled one when profiles are given; throws as the loaders do.
  std::unique_ptr<costmodel::CostModel> make() const;
};

/// `--stages`, `--chunks`, `--layers-per-stage`, `--dp`, `--tp`, `--zero`, `--memory-mb`.
struct ShapeArgs {
  std::int64_t stages = 4;
  std::int64_t chunks = 1;
  std::int64_t layers_per_stage = 0;
  std::int64_t dp = 1;
  std::int64_t tp = 1;
  int zero = 1;
  double memory_mb = 0;
  /// Registers the options on `cmd` with `stages` as the default stage count.
  void add_to(CLI::App* cmd);
  /// The pipeline shape; throws InvalidArgument naming the option for a non-positive size.
  scheduler::PipelineShape shape() const;
};

/// Human-readable byte count ("1.5 MiB").
std::string human_bytes(std::uint64_t bytes);

}  // namespace packpipe::cli
