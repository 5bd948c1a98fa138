// `packpipe pack`: packs sample lengths read from a text file (`input_len [target_len]` per line,
// `-` for stdin) into rows of a capacity and prints the row count, efficiency and time.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
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

struct SampleLengths {
  std::vector<std::uint32_t> inputs;
  std::vector<std::uint32_t> targets;
  bool two_columns = false;
};

/// Parses one non-negative integer token below 2^32; false if it is not one.
bool parse_u32(const std::string& tok, std::uint32_t& out) {
  if (tok.empty() || tok.size() > 10) return false;
  std::uint64_t v = 0;
  for (const char c : tok) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v > 0xFFFFFFFFull) return false;
  out = static_cast<std::uint32_t>(v);
  return true;
}

/// Reads `input_len [target_len]` lines; blank lines and `#` comments are skipped; every data
/// line must have the same number of columns. Throws Error naming file:line.
SampleLengths read_lengths(std::istream& in, const std::string& name) {
  SampleLengths s;
  std::string line;
  std::uint64_t lineno = 0;
  std::uint64_t first_line = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::vector<std::string> toks;
    for (std::string t; fields >> t;) toks.push_back(t);
    if (toks.empty()) continue;
    PACKPIPE_CHECK(toks.size() <= 2, "{}:{}: expected 'input_len [target_len]', found {} fields: '{}'", name, lineno,
                   toks.size(), line);
    std::uint32_t a = 0, b = 0;
    PACKPIPE_CHECK(parse_u32(toks[0], a), "{}:{}: expected a non-negative integer input length below 2^32, found '{}'",
                   name, lineno, toks[0]);
    if (toks.size() == 2) {
      PACKPIPE_CHECK(parse_u32(toks[1], b),
                     "{}:{}: expected a non-negative integer target length below 2^32, found '{}'", name, lineno,
                     toks[1]);
    }
    if (first_line == 0) {
      first_line = lineno;
      s.two_columns = toks.size() == 2;
    }
    PACKPIPE_CHECK(s.two_columns == (toks.size() == 2), "{}:{}: expected {} column(s) like line {}, found {}", name,
                   lineno, s.two_columns ? 2 : 1, first_line, toks.size());
    s.inputs.push_back(a);
    if (s.two_columns) s.targets.push_back(b);
  }
  return s;
}

void run_pack(const PackCliOptions& o) {
  const pk::Algorithm alg = pk::algorithm_from_name(o.algorithm);
  SampleLengths s;
  if (o.input == "-") {
    s = read_lengths(std::cin, "<stdin>");
  } else {
    std::ifstream f(o.input);
    PACKPIPE_CHECK(f.good(), "{}: cannot open the lengths file", o.input);
    s = read_lengths(f, o.input);
  }
  PACKPIPE_CHECK_ARG(!s.two_columns || o.target_capacity > 0,
                     "{} gives target lengths (two columns); pass --target-capacity for two-dimensional packing",
                     o.input);
  PACKPIPE_CHECK_ARG(s.two_columns || o.target_capacity == 0 || s.inputs.empty(),
                     "--target-capacity {} given but {} has no target lengths (one column)", o.target_capacity,
                     o.input);
  pk::PackOptions po;
  po.algorithm = alg;
  po.capacity = o.capacity;
  po.target_capacity = s.two_columns ? o.target_capacity : 0;
  po.max_samples_per_row = o.max_samples_per_row;
  const auto t0 = std::chrono::steady_clock::now();
  const pk::Packing p = pk::pack(s.inputs.data(), s.inputs.size(), po, s.two_columns ? s.targets.data() : nullptr);
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
    j["samples"] = s.inputs.size();
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
  std::printf("packed %zu samples (%llu tokens%s) into %zu rows of %llu%s tokens with %s\n", s.inputs.size(),
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
  cmd->add_option("--algorithm", o->algorithm, "ffd, bfd or histogram")
      ->check(CLI::IsMember({"ffd", "bfd", "histogram"}));
  cmd->add_option("--max-samples-per-row", o->max_samples_per_row, "At most this many samples per row (0: no limit)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->add_flag("--rows", o->rows, "List the rows (sample ids in placement order)");
  cmd->callback([o] { run_pack(*o); });
}

}  // namespace packpipe::cli
