// Small helpers shared by the CLI subcommands: length statistics, progress, output.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/enum_names.h"
#include "costmodel/cost_model.h"
#include "partition/pipeline.h"
#include "planner/context.h"

namespace packpipe::cli {

namespace part = ::packpipe::partition;

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

/// Largest --global-batch-tokens accepted (2^40: far above any real batch).
constexpr std::uint64_t kMaxGlobalBatchTokens = std::uint64_t{1} << 40;
/// Largest --global-batch-samples accepted (a batch's samples have 31-bit ids in the partition).
constexpr std::uint64_t kMaxGlobalBatchSamples = (std::uint64_t{1} << 31) - 1;
/// Largest --threads accepted.
constexpr std::int64_t kMaxThreads = 1024;

/// `--model`, `--device`, `--profile`, `--profile-interpolation`, `--calibration`: the cost model a
/// subcommand uses.
struct CostModelArgs {
  std::string model = "gpt-6.7b";
  std::string device = "A100-40GB";
  std::vector<std::string> profiles;
  std::string calibration;  ///< a calibration file (costmodel/calibration.h); empty: none
  std::string interpolation = "fit";  ///< --profile-interpolation: fit, or linear (DynaPipe's rule)
  std::string attention;  ///< --attention: eager or flash; empty: the model's, else the device's
  /// Registers the options on `cmd` (this object must outlive the parse); without
  /// `with_calibration`, all but --calibration (a command that fits a calibration over the base model).
  void add_to(CLI::App* cmd, bool with_calibration = true);
  /// The analytic model, or the profiled one when profiles are given, calibrated by the calibration
  /// file when given; throws as the loaders do (and when the calibration was fitted over another model).
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
  std::string layer_split = "even";
  /// Registers the options on `cmd` with `stages` as the default stage count.
  void add_to(CLI::App* cmd);
  /// The pipeline shape; throws InvalidArgument naming the option and its limit for a size out of
  /// range (partition::kMaxPipelineSize; the layers are checked against the model by
  /// partition::virtual_stages). --layer-split balanced is resolved against `cost` (when given).
  part::PipelineShape shape(const costmodel::CostModel* cost = nullptr) const;
};

/// `--max-seq-len`, `--max-target-len`, `--seq-policy`: the context length (planner/context.h).
struct ContextArgs {
  std::uint64_t max_seq_len = 0, max_target_len = 0;
  std::string policy = "truncate";
  /// Registers the options on `cmd` (this object must outlive the parse).
  void add_to(CLI::App* cmd);
  /// The context length, named by the CLI's options in messages; throws InvalidArgument naming the
  /// option for a length over 2^32 - 1.
  planner::ContextLength context() const;
};
/// The context length's settings and what it did, for a --json report (empty when not limited).
Json context_json(const planner::ContextLength& c, const planner::ContextReport& r);
/// "context length 1024 (split): 2 samples truncated, 0 dropped, 3 split into 7 chunks": the
/// max_seq_len and seq_policy of `settings` and the counts of `counts` (context_json's fields).
std::string context_text(const Json& settings, const Json& counts);

/// Human-readable byte count ("1.5 MiB").
std::string human_bytes(std::uint64_t bytes);

/// `text` with every line after the first indented by `spaces`: a value's dump(2) placed at that depth
/// of a JSON object written piece by piece, as the whole object's dump(2) would lay it out.
std::string indent_json_lines(const std::string& text, int spaces);

/// Whole text of `path` ('-': standard input), read without blocking on a FIFO and refusing a
/// directory or a device (common/file_io.h read_regular_file); `what` names the role in errors.
std::string read_text_input(const std::string& path, std::string_view what);

/// Calls `fn(line_number, fields)` for every line of `text` that has fields: '#' starts a comment,
/// a trailing CR is ignored, fields are separated by spaces or tabs; line numbers start at 1.
void for_each_data_line(const std::string& text,
                        const std::function<void(std::uint64_t, const std::vector<std::string_view>&)>& fn);

/// One field of `where` (e.g. "lengths.txt:3") as an unsigned integer at most `max`: only decimal
/// digits, no sign, no trailing characters. Throws Error naming where, `what`, the limit and the text.
std::uint64_t parse_unsigned_field(std::string_view field, std::uint64_t max, const std::string& where,
                                   std::string_view what);

/// Sample lengths read from a text file: `input_len [target_len]` per line.
struct LengthsFile {
  std::vector<std::uint32_t> input;
  std::vector<std::uint32_t> target;  ///< empty for a one-column file
  std::vector<std::uint64_t> lines;   ///< file line of each sample (1-based)
  bool two_columns = false;
  std::string name;                   ///< the path as given, or "<stdin>"
  /// "NAME:LINE" of sample `i` (for messages: the user knows the line, not the sample index).
  std::string where(std::size_t i) const;
};

/// The ONE reader of lengths files (pack, partition): `input_len [target_len]` per line of `path`
/// ('-': stdin), '#' comments and blank lines skipped, every data line with the same number of
/// columns, each length an integer in [0, 2^32 - 1]. Throws Error naming file:line and the text for
/// a non-numeric, negative or overflowing length, trailing characters, a third column, a column
/// count unlike the first data line's, an unreadable path (directory, FIFO, device) or a file with
/// no lengths at all.
LengthsFile read_lengths_file(const std::string& path);

/// The range check of a floating option, run when the option is parsed (before any work): the text
/// must be a finite number in [lo, hi] (NaN and infinities refused), else CLI11 reports
/// "OPTION: must be in [lo, hi] (why), found TEXT". Every floating option of every subcommand has
/// it: main() refuses to start with one that does not (its name is kFloatRangeName).
CLI::Validator float_range(double lo, double hi, std::string why = {});
/// CLI11 checks of a --model and a --device option, run when the option is parsed (before any
/// work): the text must be a preset or a JSON file that loads (costmodel::load_model / load_device);
/// the loader's message (the presets, or the file and field) is the error.
CLI::Validator model_check();
CLI::Validator device_check();

/// The name float_range gives its validator.
inline constexpr const char* kFloatRangeName = "float_range";

/// Size limits of the CLI options (and the Python entry points' arguments) with their messages.
/// Throws InvalidArgument "OPTION must be in [lo, hi], found V" naming the option.
void check_option_range(std::string_view option, std::int64_t value, std::int64_t lo, std::int64_t hi,
                        std::string_view why = {});
void check_option_range(std::string_view option, std::uint64_t value, std::uint64_t lo, std::uint64_t hi,
                        std::string_view why = {});

/// A CLI11 check accepting exactly the names of `table` (an enum's one name table), so that a
/// new value of the enum is accepted without another edit.
template <class E, std::size_t N>
CLI::IsMember one_of(const EnumName<E> (&table)[N]) {
  return CLI::IsMember(enum_names(table));
}

/// The files a cost model reads (for check_output_is_not_input): the profiles (a folder and every
/// file under it), the calibration, and --model / --device when they name files.
std::vector<std::string> cost_model_inputs(const CostModelArgs& args);

}  // namespace packpipe::cli
