// Small helpers shared by the CLI subcommands: length statistics, progress, output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

/// Human-readable byte count ("1.5 MiB").
std::string human_bytes(std::uint64_t bytes);

}  // namespace packpipe::cli
