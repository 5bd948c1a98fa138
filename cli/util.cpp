#include "cli/util.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <limits>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/errors.h"
#include "common/file_io.h"
#include "costmodel/factory.h"
#include "planner/planner.h"

namespace packpipe::cli {

namespace {
double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}
std::uint64_t nearest_rank(const std::vector<std::uint64_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  auto k = static_cast<std::size_t>(q * static_cast<double>(sorted.size()));
  return sorted[std::min(k, sorted.size() - 1)];
}
}  // namespace

LengthStats length_stats(std::vector<std::uint64_t>& lengths) {
  LengthStats s;
  s.count = lengths.size();
  if (lengths.empty()) return s;
  std::sort(lengths.begin(), lengths.end());
  for (auto l : lengths) s.total += l;
  s.min = lengths.front();
  s.max = lengths.back();
  s.mean = static_cast<double>(s.total) / static_cast<double>(s.count);
  s.p50 = nearest_rank(lengths, 0.5);
  s.p90 = nearest_rank(lengths, 0.9);
  s.p99 = nearest_rank(lengths, 0.99);
  return s;
}

Json to_json(const LengthStats& s) {
  return Json{{"count", s.count}, {"total", s.total}, {"min", s.min}, {"p50", s.p50},
              {"p90", s.p90},     {"p99", s.p99},     {"max", s.max}, {"mean", s.mean}};
}

std::string to_text(const LengthStats& s) {
  return fmt::format("min {}, p50 {}, p90 {}, p99 {}, max {}, mean {:.1f}", s.min, s.p50, s.p90,
                     s.p99, s.max, s.mean);
}

Progress::Progress(std::string label, std::uint64_t total)
    : label_(std::move(label)), total_(total), enabled_(::isatty(STDERR_FILENO) != 0),
      start_(now_seconds()) {}

Progress::~Progress() { finish(); }

void Progress::update(std::uint64_t done) {
  if (!enabled_ || finished_) return;
  const double t = now_seconds();
  if (t - last_draw_ < 0.1) return;
  last_draw_ = t;
  if (total_ > 0) {
    std::fprintf(stderr, "\r%s: %llu / %llu (%.0f%%) %.1fs", label_.c_str(),
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_),
                 100.0 * static_cast<double>(done) / static_cast<double>(total_), t - start_);
  } else {
    std::fprintf(stderr, "\r%s: %llu %.1fs", label_.c_str(), static_cast<unsigned long long>(done),
                 t - start_);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (last_draw_ > 0) std::fprintf(stderr, "\r\033[K");
}

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string read_text_input(const std::string& path, std::string_view what) {
  if (path != "-") return read_regular_file(path, what);
  std::string text(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>{});
  PACKPIPE_CHECK(!std::cin.bad(), "cannot read {} from standard input", what);
  return text;
}

void for_each_data_line(const std::string& text,
                        const std::function<void(std::uint64_t, const std::vector<std::string_view>&)>& fn) {
  std::vector<std::string_view> fields;
  std::uint64_t lineno = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++lineno;
    if (const auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    fields.clear();
    std::size_t k = 0;
    while (k < line.size()) {
      while (k < line.size() && (line[k] == ' ' || line[k] == '\t')) ++k;
      const std::size_t start = k;
      while (k < line.size() && line[k] != ' ' && line[k] != '\t') ++k;
      if (k > start) fields.push_back(line.substr(start, k - start));
    }
    if (!fields.empty()) fn(lineno, fields);
  }
}

std::uint64_t parse_unsigned_field(std::string_view field, std::uint64_t max, const std::string& where,
                                   std::string_view what) {
  PACKPIPE_CHECK(!field.empty(), "{}: {} is empty (a comma too many?)", where, what);
  PACKPIPE_CHECK(field.front() != '-', "{}: {} must not be negative, found '{}'", where, what, field);
  std::uint64_t v = 0;
  bool overflow = false;
  for (const char c : field) {
    PACKPIPE_CHECK(c >= '0' && c <= '9', "{}: {} must be a non-negative integer (decimal digits only), found '{}'",
                   where, what, field);
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (max - d) / 10) overflow = true;  // v * 10 + d > max
    if (!overflow) v = v * 10 + d;
  }
  PACKPIPE_CHECK(!overflow, "{}: {} {} is too large; the largest accepted is {}", where, what, field, max);
  return v;
}

std::string LengthsFile::where(std::size_t i) const {
  return i < lines.size() ? fmt::format("{}:{}", name, lines[i]) : name;
}

LengthsFile read_lengths_file(const std::string& path) {
  LengthsFile f;
  f.name = path == "-" ? "<stdin>" : path;
  const std::string text = read_text_input(path, "lengths file");
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint32_t>::max();
  std::uint64_t first_line = 0;
  for_each_data_line(text, [&](std::uint64_t lineno, const std::vector<std::string_view>& fields) {
    const std::string where = fmt::format("{}:{}", f.name, lineno);
    PACKPIPE_CHECK(fields.size() <= 2, "{}: expected 'input_len [target_len]', found {} fields: '{}'", where,
                   fields.size(), fmt::join(fields, " "));
    if (first_line == 0) {
      first_line = lineno;
      f.two_columns = fields.size() == 2;
    }
    PACKPIPE_CHECK(f.two_columns == (fields.size() == 2), "{}: expected {} column(s) like line {}, found {}", where,
                   f.two_columns ? 2 : 1, first_line, fields.size());
    f.input.push_back(static_cast<std::uint32_t>(parse_unsigned_field(fields[0], kMax, where, "input length")));
    if (f.two_columns) {
      f.target.push_back(static_cast<std::uint32_t>(parse_unsigned_field(fields[1], kMax, where, "target length")));
    }
    f.lines.push_back(lineno);
  });
  PACKPIPE_CHECK(!f.input.empty(),
                 "{}: no lengths found ({}); expected one 'input_len [target_len]' per line ('#' starts a comment)",
                 f.name, text.empty() ? "the file is empty" : "only blank lines and comments");
  return f;
}

CLI::Validator float_range(double lo, double hi, std::string why) {
  const std::string range = fmt::format("[{}, {}]{}{}{}", lo, hi, why.empty() ? "" : " (", why,
                                        why.empty() ? "" : ")");
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        const char* begin = text.c_str();
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(begin, &end);
        while (end != nullptr && (*end == ' ' || *end == '\t')) ++end;
        const bool number = end != begin && end != nullptr && *end == '\0';
        // the double itself is checked: never a cast of a huge value into an integer
        if (!number || !std::isfinite(v) || v < lo || v > hi) return fmt::format("must be in {}, found {}", range, text);
        return std::string();
      },
      "FLOAT in " + range, kFloatRangeName);
}

namespace {

// A validator whose error is what `load` throws for the option's text.
template <class Load>
CLI::Validator loads(Load load, std::string desc) {
  return CLI::Validator(
      [load](std::string& text) -> std::string {
        try {
          load(text);
        } catch (const std::exception& e) {
          return e.what();
        }
        return std::string();
      },
      std::move(desc));
}

}  // namespace

CLI::Validator model_check() {
  return loads([](const std::string& t) { costmodel::load_model(t); }, "");
}

CLI::Validator device_check() {
  return loads([](const std::string& t) { costmodel::load_device(t); }, "");
}

void check_option_range(std::string_view option, std::int64_t value, std::int64_t lo, std::int64_t hi,
                        std::string_view why) {
  PACKPIPE_CHECK_ARG(value >= lo && value <= hi, "{} must be in [{}, {}]{}{}{}, found {}", option, lo, hi,
                     why.empty() ? "" : " (", why, why.empty() ? "" : ")", value);
}

void check_option_range(std::string_view option, std::uint64_t value, std::uint64_t lo, std::uint64_t hi,
                        std::string_view why) {
  PACKPIPE_CHECK_ARG(value >= lo && value <= hi, "{} must be in [{}, {}]{}{}{}, found {}", option, lo, hi,
                     why.empty() ? "" : " (", why, why.empty() ? "" : ")", value);
}

std::vector<std::string> cost_model_inputs(const CostModelArgs& args) {
  std::vector<std::string> out = args.profiles;
  // A profile folder is read recursively: every file in it is an input.
  for (const auto& prof : args.profiles) {
    std::error_code ec;
    if (!std::filesystem::is_directory(prof, ec)) continue;
    for (auto it = std::filesystem::recursive_directory_iterator(prof, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_regular_file(ec)) out.push_back(it->path().string());
    }
  }
  if (!args.calibration.empty()) out.push_back(args.calibration);
  for (const std::string* p : {&args.model, &args.device}) {
    struct stat st {};
    if (::stat(p->c_str(), &st) == 0) out.push_back(*p);  // a preset name is no file
  }
  return out;
}

void CostModelArgs::add_to(CLI::App* cmd, bool with_calibration) {
  cmd->add_option("--model", model, "Model preset or .json file")->check(model_check())->capture_default_str();
  cmd->add_option("--device", device, "Device preset or .json file")->check(device_check())->capture_default_str();
  cmd->add_option("--profile", profiles, "Profile file or folder (repeatable); none: the analytic model");
  if (with_calibration) {
    cmd->add_option("--calibration", calibration,
                    "Calibration file (`packpipe costmodel calibrate`) applied over the cost model");
  }
  cmd->add_option("--profile-interpolation", interpolation,
                  "With --profile, how shapes between grid points are costed: " +
                      enum_name_list(costmodel::kProfileInterpolationNames) +
                      " (fit: packpipe's feature fits; linear: DynaPipe's multilinear rule, its exact cost basis)")
      ->check(one_of(costmodel::kProfileInterpolationNames))
      ->capture_default_str();
  cmd->add_option("--attention", attention,
                  "The attention kernel the trainer runs: " + enum_name_list(costmodel::kAttentionKernelNames) +
                      " (flash: FlashAttention, cuDNN, fused SDPA, no stored scores; eager: the scores materialised); "
                      "default: the model file's, else the device's (flash on the GPU presets)")
      ->check(one_of(costmodel::kAttentionKernelNames));
}

std::unique_ptr<costmodel::CostModel> CostModelArgs::make() const {
  costmodel::CostModelConfig c;
  c.model = model;
  c.device = device;
  c.profiles = profiles;
  c.calibration = calibration;
  c.interpolation = costmodel::profile_interpolation_from_name(interpolation);
  c.attention = attention;
  return costmodel::make_cost_model(c);
}

void ShapeArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--stages", stages, "Pipeline stages (ranks)")->capture_default_str();
  cmd->add_option("--chunks", chunks, "Virtual stages per rank (interleaving)")->capture_default_str();
  cmd->add_option("--layers-per-stage", layers_per_stage, "Layers per virtual stage (0: model layers / (stages x chunks))");
  cmd->add_option("--dp", dp, "Data-parallel replicas")->capture_default_str();
  cmd->add_option("--tp", tp, "Tensor-parallel ranks")->capture_default_str();
  cmd->add_option("--zero", zero, "ZeRO stage of the optimizer state (0-3)")->capture_default_str();
  cmd->add_option("--memory-mb", memory_mb,
                  "Memory limit per device, MB = 1e6 bytes, at most the device's memory (0: all of it)")
      ->check(float_range(0, part::kMaxMemoryLimitMb, "0: the device's memory"));
  cmd->add_option("--layer-split", layer_split,
                  "Layers per virtual stage: even, balanced (stage times balanced on the cost model, embedding and "
                  "head included), or a comma-separated list")
      ->capture_default_str();
}

void ContextArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--max-seq-len", max_seq_len,
                  "Context length: the most tokens a sample trains with (decoder-only: input + target; "
                  "encoder-decoder: the input), e.g. the model's positions (0, the default: none)");
  cmd->add_option("--max-target-len", max_target_len,
                  "Encoder-decoder models: the most decoder (target) tokens (0: --max-seq-len)");
  cmd->add_option("--seq-policy", policy,
                  "A sample over the context length: " + enum_name_list(planner::kSeqPolicyNames) +
                      " (truncate: its first tokens; drop: left out; split: decoder-only, consecutive chunks of at "
                      "most --max-seq-len tokens, each a sample, as Megatron's --seq-length)")
      ->check(one_of(planner::kSeqPolicyNames))
      ->capture_default_str();
}

planner::ContextLength ContextArgs::context() const {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint32_t>::max();
  check_option_range("--max-seq-len", max_seq_len, 0, kMax, "tokens; 0: no context length");
  check_option_range("--max-target-len", max_target_len, 0, kMax, "tokens; 0: --max-seq-len");
  planner::ContextLength c;
  c.max_seq_len = static_cast<std::uint32_t>(max_seq_len);
  c.max_target_len = static_cast<std::uint32_t>(max_target_len);
  c.policy = planner::seq_policy_from_name(policy);
  c.max_seq_len_option = "--max-seq-len";
  c.max_target_len_option = "--max-target-len";
  c.policy_option = "--seq-policy";
  return c;
}

Json context_json(const planner::ContextLength& c, const planner::ContextReport& r) {
  if (!c.limited()) return Json::object();
  return Json{{"seq_truncated", r.truncated}, {"seq_dropped", r.dropped}, {"seq_split", r.split},
              {"seq_chunks", r.chunks}};
}

std::string context_text(const Json& settings, const Json& counts) {
  return fmt::format("context length {} ({}): {} samples truncated, {} dropped, {} split into {} chunks",
                     settings["max_seq_len"].get<std::uint64_t>(), settings["seq_policy"].get<std::string>(),
                     counts["seq_truncated"].get<std::uint64_t>(), counts["seq_dropped"].get<std::uint64_t>(),
                     counts["seq_split"].get<std::uint64_t>(), counts["seq_chunks"].get<std::uint64_t>());
}

part::PipelineShape ShapeArgs::shape(const costmodel::CostModel* cost) const {
  constexpr std::int64_t kMax = part::kMaxPipelineSize;
  check_option_range("--stages", stages, 1, kMax);
  check_option_range("--chunks", chunks, 1, kMax);
  check_option_range("--dp", dp, 1, kMax);
  check_option_range("--tp", tp, 1, kMax);
  PACKPIPE_CHECK_ARG(layers_per_stage >= 0, "--layers-per-stage must not be negative (0: the model's layers split "
                     "evenly), found {}", layers_per_stage);
  PACKPIPE_CHECK_ARG(zero >= 0 && zero <= 3, "--zero must be 0-3, found {}", zero);
  PACKPIPE_CHECK_ARG(std::isfinite(memory_mb) && memory_mb >= 0 && memory_mb <= part::kMaxMemoryLimitMb,
                     "--memory-mb must be in [0, {:g}] (MB per device; 0: the device's memory), found {}",
                     part::kMaxMemoryLimitMb, memory_mb);
  part::PipelineShape s;
  s.stages = stages;
  s.chunks = chunks;
  s.layers_per_stage = layers_per_stage;
  s.dp = dp;
  s.tp = tp;
  s.zero_stage = zero;
  s.memory_limit_mb = memory_mb;
  if (layer_split == "balanced") {
    PACKPIPE_CHECK_ARG(cost != nullptr, "--layer-split balanced needs a cost model");
    // A reference micro-batch of one 2048-token row: embedding, layers and head scale alike with tokens.
    s.stage_layers = planner::balanced_stage_layers(*cost, s, 1, 2048, 512);
  } else if (layer_split != "even") {
    std::size_t pos = 0;
    while (pos <= layer_split.size()) {
      const std::size_t end = std::min(layer_split.find(',', pos), layer_split.size());
      const std::string item = layer_split.substr(pos, end - pos);
      s.stage_layers.push_back(static_cast<std::int64_t>(
          parse_unsigned_field(item, part::kMaxStageLayers, fmt::format("--layer-split '{}'", layer_split),
                               "layers of a stage")));
      pos = end + 1;
    }
  }
  return s;
}

std::string indent_json_lines(const std::string& text, int spaces) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    out += c;
    if (c == '\n') out.append(static_cast<std::size_t>(spaces), ' ');
  }
  return out;
}

}  // namespace packpipe::cli
