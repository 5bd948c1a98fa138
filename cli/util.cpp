#include "cli/util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <unistd.h>

#include <fmt/format.h>

#include "common/errors.h"
#include "costmodel/factory.h"

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

void CostModelArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--model", model, "Model preset or .json file")->capture_default_str();
  cmd->add_option("--device", device, "Device preset or .json file")->capture_default_str();
  cmd->add_option("--profile", profiles, "Profile file or folder (repeatable); none: the analytic model");
}

std::unique_ptr<costmodel::CostModel> CostModelArgs::make() const {
  costmodel::CostModelConfig c;
  c.model = model;
  c.device = device;
  c.profiles = profiles;
  return costmodel::make_cost_model(c);
}

void ShapeArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--stages", stages, "Pipeline stages (ranks)")->capture_default_str();
  cmd->add_option("--chunks", chunks, "Virtual stages per rank (interleaving)")->capture_default_str();
  cmd->add_option("--layers-per-stage", layers_per_stage, "Layers per virtual stage (0: model layers / (stages x chunks))");
  cmd->add_option("--dp", dp, "Data-parallel replicas")->capture_default_str();
  cmd->add_option("--tp", tp, "Tensor-parallel ranks")->capture_default_str();
  cmd->add_option("--zero", zero, "ZeRO stage of the optimizer state (0-3)")->capture_default_str();
  cmd->add_option("--memory-mb", memory_mb, "Memory limit per device, MB = 1e6 bytes (0: the device's memory)");
}

scheduler::PipelineShape ShapeArgs::shape() const {
  PACKPIPE_CHECK_ARG(stages >= 1, "--stages must be at least 1, found {}", stages);
  PACKPIPE_CHECK_ARG(chunks >= 1, "--chunks must be at least 1, found {}", chunks);
  PACKPIPE_CHECK_ARG(layers_per_stage >= 0, "--layers-per-stage must not be negative, found {}", layers_per_stage);
  PACKPIPE_CHECK_ARG(dp >= 1, "--dp must be at least 1, found {}", dp);
  PACKPIPE_CHECK_ARG(tp >= 1, "--tp must be at least 1, found {}", tp);
  PACKPIPE_CHECK_ARG(zero >= 0 && zero <= 3, "--zero must be 0-3, found {}", zero);
  PACKPIPE_CHECK_ARG(memory_mb >= 0, "--memory-mb must not be negative, found {}", memory_mb);
  scheduler::PipelineShape s;
  s.stages = stages;
  s.chunks = chunks;
  s.layers_per_stage = layers_per_stage;
  s.dp = dp;
  s.tp = tp;
  s.zero_stage = zero;
  s.memory_limit_mb = memory_mb;
  return s;
}

}  // namespace packpipe::cli
