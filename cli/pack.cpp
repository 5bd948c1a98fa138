// `packpipe pack`: packs sample lengths read from a text file (`input_len [target_len]` per line,
// `-` for stdin) into rows of a capacity and prints the row count, efficiency and time.
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/util.h"
#include "common/errors.h"
#include "packing/packer.h"

namespace packpipe::cli {

namespace pk = packpipe::packing;

namespace {

struct PackCliOptions {
  std::string input;
  std::uint64_t capacity = 0;
  std::uint64_t target_capacity = 0;
  std::uint64_t max_samples_per_row = 0;
  std::string algorithm = "bfd";
  bool json = false;
  bool rows = false;
};

void run_pack(const PackCliOptions& o) {
  const pk::Algorithm alg = pk::algorithm_from_name(o.algorithm);
  constexpr std::uint64_t kU32 = std::numeric_limits<std::uint32_t>::max();
  PACKPIPE_CHECK_ARG(o.capacity > 0, "--capacity must be positive (tokens per row), found 0");
  check_option_range("--capacity", o.capacity, 1, kU32, "tokens per row");
  check_option_range("--target-capacity", o.target_capacity, 0, kU32, "target tokens per row (0: one dimension)");
  check_option_range("--max-samples-per-row", o.max_samples_per_row, 0, kU32, "0: no limit");
  const LengthsFile s = read_lengths_file(o.input);
  // A sample longer than a capacity is named by its line (the packer knows only its index).
  for (std::size_t i = 0; i < s.input.size(); ++i) {
    PACKPIPE_CHECK_ARG(s.input[i] <= o.capacity,
                       "{}: sample {} has {} tokens, more than the capacity {}; raise --capacity or remove the sample",
                       s.where(i), i, s.input[i], o.capacity);
    PACKPIPE_CHECK_ARG(!s.two_columns || o.target_capacity == 0 || s.target[i] <= o.target_capacity,
                       "{}: sample {} has {} target tokens, more than the target capacity {}; raise "
                       "--target-capacity or remove the sample",
                       s.where(i), i, s.target[i], o.target_capacity);
  }
  PACKPIPE_CHECK_ARG(!s.two_columns || o.target_capacity > 0,
                     "{} gives target lengths (two columns); pass --target-capacity for two-dimensional packing",
                     o.input);
  PACKPIPE_CHECK_ARG(s.two_columns || o.target_capacity == 0 || s.input.empty(),
                     "--target-capacity {} given but {} has no target lengths (one column)", o.target_capacity,
                     o.input);
  pk::PackOptions po;
  po.algorithm = alg;
  po.capacity = o.capacity;
  po.target_capacity = s.two_columns ? o.target_capacity : 0;
  po.max_samples_per_row = o.max_samples_per_row;
  const auto t0 = std::chrono::steady_clock::now();
  const pk::Packing p = pk::pack(s.input.data(), s.input.size(), po, s.two_columns ? s.target.data() : nullptr);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::uint64_t tokens = 0, target_tokens = 0;
  for (const auto x : p.row_tokens) tokens += x;
  for (const auto x : p.row_target_tokens) target_tokens += x;
  const std::uint64_t lower_bound =
      std::max<std::uint64_t>((tokens + o.capacity - 1) / o.capacity,
                              po.target_capacity ? (target_tokens + po.target_capacity - 1) / po.target_capacity : 0);
  if (o.json) {
    Json j;
    j["algorithm"] = pk::algorithm_name(alg);
    j["capacity"] = p.capacity;
    j["target_capacity"] = p.target_capacity;
    j["samples"] = s.input.size();
    j["tokens"] = tokens;
    if (s.two_columns) j["target_tokens"] = target_tokens;
    j["rows"] = p.rows();
    j["lower_bound_rows"] = lower_bound;
    j["efficiency"] = p.efficiency();
    j["seconds"] = seconds;
    if (o.rows) {
      Json list = Json::array();
      for (std::size_t r = 0; r < p.rows(); ++r) {
        Json row;
        row["samples"] = std::vector<std::uint32_t>(p.samples.begin() + static_cast<std::ptrdiff_t>(p.row_offsets[r]),
                                                    p.samples.begin() + static_cast<std::ptrdiff_t>(p.row_offsets[r + 1]));
        row["tokens"] = p.row_tokens[r];
        if (s.two_columns) row["target_tokens"] = p.row_target_tokens[r];
        list.push_back(std::move(row));
      }
      j["row_list"] = std::move(list);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("packed %zu samples (%llu tokens%s) into %zu rows of %llu%s tokens with %s\n", s.input.size(),
              static_cast<unsigned long long>(tokens),
              s.two_columns ? (" + " + std::to_string(target_tokens) + " target").c_str() : "", p.rows(),
              static_cast<unsigned long long>(p.capacity),
              s.two_columns ? (" + " + std::to_string(p.target_capacity)).c_str() : "", pk::algorithm_name(alg));
  std::printf("  efficiency %.4f%% (lower bound %llu rows), %.6f s\n", 100.0 * p.efficiency(),
              static_cast<unsigned long long>(lower_bound), seconds);
  if (o.rows) {
    for (std::size_t r = 0; r < p.rows(); ++r) {
      std::printf("  row %zu: %llu tokens", r, static_cast<unsigned long long>(p.row_tokens[r]));
      if (s.two_columns) std::printf(" + %llu target", static_cast<unsigned long long>(p.row_target_tokens[r]));
      std::printf(":");
      for (auto k = p.row_offsets[r]; k < p.row_offsets[r + 1]; ++k) std::printf(" %u", p.samples[k]);
      std::printf("\n");
    }
  }
}

}  // namespace

void register_pack_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand("pack", "Pack sample lengths into rows of a token capacity");
  auto o = std::make_shared<PackCliOptions>();
  cmd->add_option("LENGTHS", o->input, "Text file with one 'input_len [target_len]' per line ('-': stdin)")
      ->required();
  cmd->add_option("--capacity", o->capacity, "Tokens per row (input side)")->required();
  cmd->add_option("--target-capacity", o->target_capacity, "Target tokens per row (two-column input)");
  cmd->add_option("--algorithm", o->algorithm, "Packing algorithm: " + enum_name_list(pk::kAlgorithmNames))
      ->check(one_of(pk::kAlgorithmNames));
  cmd->add_option("--max-samples-per-row", o->max_samples_per_row, "At most this many samples per row (0: no limit)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->add_flag("--rows", o->rows, "List the rows (sample ids in placement order)");
  cmd->callback([o] { run_pack(*o); });
}

}  // namespace packpipe::cli
