// PyTorch "compute_only" CSV export, checked with an independent parser that follows PyTorch's
// _Action.from_str grammar and PyTorch's _validate_schedule counting rules.
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "plan/export_pytorch.h"
#include "plan/builder.h"
#include "planner/planner.h"
#include "tests/support/synthetic_plans.h"

using namespace packpipe::plan;
using namespace packpipe::planner;
namespace syn = packpipe::test::synthetic;

namespace {

struct Action {
  int stage;
  std::string type;
  int mb;  // -1: none
};

// PyTorch: stripped cell; "" -> None; else re.match(r"(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)")
// over the whole cell; the micro-batch is optional.
std::vector<std::vector<Action>> parse_csv(const std::string& csv) {
  static const std::regex cell_re(R"((\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*))");
  std::vector<std::vector<Action>> rows;
  std::istringstream in(csv);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<Action> row;
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) {
      const auto b = cell.find_first_not_of(" \t\r");
      const auto e = cell.find_last_not_of(" \t\r");
      cell = b == std::string::npos ? "" : cell.substr(b, e - b + 1);
      if (cell.empty()) continue;
      std::smatch m;
      if (!std::regex_match(cell, m, cell_re)) throw std::runtime_error("invalid action '" + cell + "'");
      row.push_back(Action{std::stoi(m[1]), m[2], m[3].length() ? std::stoi(m[3]) : -1});
    }
    rows.push_back(row);
  }
  return rows;
}

// PyTorch's _validate_schedule(actions, pp_size, num_stages, n_mb): returns violations.
std::vector<std::string> validate_like_pytorch(const std::vector<std::vector<Action>>& rows, int pp, int stages, int n_mb) {
  std::vector<std::string> errs;
  if (static_cast<int>(rows.size()) != pp) errs.push_back("every rank must be present");
  std::map<int, std::set<int>> stage_ranks;
  std::map<int, std::map<std::string, std::map<int, int>>> seen;  // stage -> type -> mb -> count
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (const auto& a : rows[r]) {
      stage_ranks[a.stage].insert(static_cast<int>(r));
      if (a.mb < 0) errs.push_back("compute action without micro-batch");
      if ((a.type == "B" || a.type == "I") && seen[a.stage]["F"][a.mb] == 0) errs.push_back("B/I before F");
      if (a.type == "W" && seen[a.stage]["I"][a.mb] == 0) errs.push_back("W before I");
      ++seen[a.stage][a.type][a.mb];
    }
  }
  for (int s = 0; s < stages; ++s) {
    auto count = [&](const char* t) {
      int n = 0;
      for (const auto& kv : seen[s][t]) n += kv.second;
      return n;
    };
    if (count("F") != n_mb) errs.push_back("stage " + std::to_string(s) + ": F count");
    if (count("I") != count("W")) errs.push_back("stage " + std::to_string(s) + ": #I != #W");
    if (count("B") + (count("I") + count("W")) / 2 != n_mb) errs.push_back("stage " + std::to_string(s) + ": backward count");
    if (stage_ranks[s].size() != 1) errs.push_back("stage " + std::to_string(s) + " on several ranks");
  }
  return errs;
}

}  // namespace

TEST_CASE("export: PyTorch compute_only CSV follows the grammar and the validation rules", "[interface]") {
  for (const char* kind : {"gpipe", "1f1b", "zero-bubble"}) {
    for (std::int64_t S : {1, 2, 4, 8}) {
      for (std::int64_t C : {1, 2}) {
        const std::int64_t N = S * 2;
        const Plan p = syn::random_plan(kind, S, C, N, 17, true);
        REQUIRE(pytorch_exportable(p));
        const std::string csv = pytorch_compute_csv(p);
        const auto rows = parse_csv(csv);
        INFO(kind << " S=" << S << " C=" << C << "\n" << csv);
        REQUIRE(rows.size() == static_cast<std::size_t>(S));
        CHECK(validate_like_pytorch(rows, static_cast<int>(S), static_cast<int>(S * C), static_cast<int>(N)).empty());
        // Row r holds exactly rank r's compute ops in order, and stage v sits on rank v mod S.
        for (std::size_t r = 0; r < rows.size(); ++r) {
          REQUIRE(rows[r].size() == p.timeline[r].size());
          for (std::size_t i = 0; i < rows[r].size(); ++i) {
            CHECK(rows[r][i].type == op_kind_token(p.timeline[r][i].kind));
            CHECK(rows[r][i].mb == static_cast<int>(p.timeline[r][i].mb));
            CHECK(rows[r][i].stage == static_cast<int>(p.timeline[r][i].vstage));
            CHECK(rows[r][i].stage % S == static_cast<int>(r));
          }
        }
      }
    }
  }
}

TEST_CASE("export: the independent checker rejects a broken CSV", "[negative]") {
  const Plan p = syn::random_plan("1f1b", 2, 1, 4, 1, true);
  std::string csv = pytorch_compute_csv(p);
  // Drop the last action of rank 0: a backward goes missing.
  auto rows = parse_csv(csv);
  rows[0].pop_back();
  CHECK_FALSE(validate_like_pytorch(rows, 2, 2, 4).empty());
  CHECK_THROWS(parse_csv("0F0,0X1\n"));
}

TEST_CASE("export: plans whose micro-batches differ in shape are refused with the reason", "[negative]") {
  const Plan p = syn::random_plan("1f1b", 4, 1, 8, 5, false);
  std::string why;
  REQUIRE_FALSE(pytorch_exportable(p, &why));
  CHECK(why.find("one shape") != std::string::npos);
  REQUIRE_THROWS_AS(pytorch_compute_csv(p), packpipe::Unsupported);
  REQUIRE_THROWS_WITH(pytorch_compute_csv(p), Catch::Matchers::Contains("micro-batch") &&
                                                  Catch::Matchers::Contains("PyTorch pipelining sizes its buffers once"));
}
