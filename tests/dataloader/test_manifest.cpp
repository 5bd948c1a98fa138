#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "common/errors.h"
#include "dataloader/manifest.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::dataloader;
using packpipe::test::TempDir;
using packpipe::test::write_file;
using Catch::Matchers::Contains;

namespace {

Manifest parse(const std::string& text) { return parse_manifest(text, "m.json", "", false); }

/// Empty `<prefix>.idx` and `<prefix>.bin`: enough for the existence checks of load_manifest.
void touch_prefix(const std::string& prefix, const char* bin_ext = ".bin") {
  write_file(prefix + ".idx", "");
  write_file(prefix + bin_ext, "");
}

}  // namespace

TEST_CASE("manifest accepts every task form and resolves relative prefixes", "[interface]") {
  const std::string text = R"({
    "version": 1,
    "split": [98, 1, 1],
    "samples_per_epoch": 1000,
    "tasks": [
      {"name": "lm", "dataset": "data/lm_text_document", "weight": 3},
      {"name": "lm_sharded", "datasets": ["a", "/abs/b"], "weight": 1.5},
      {"name": "qa", "inputs": "qa_inputs", "targets": "qa_targets", "weight": 0},
      {"name": "qa2", "inputs": ["i1", "i2"], "targets": ["t1", "t2"], "layout": "paired_prefixes", "weight": 1},
      {"name": "mm", "dataset": "modes", "layout": "paired_sequences", "weight": 0.5}
    ]})";
  const Manifest m = parse_manifest(text, "dir/m.json", "dir", false);
  REQUIRE(m.path == "dir/m.json");
  REQUIRE(m.tasks.size() == 5);
  CHECK(m.weighted);
  CHECK(m.samples_per_epoch == 1000);
  CHECK(m.split[0] == Approx(0.98));
  CHECK(m.split[1] == Approx(0.01));
  CHECK(m.split[2] == Approx(0.01));

  CHECK(m.tasks[0].layout == TaskLayout::Sequence);
  CHECK(m.tasks[0].prefixes == std::vector<std::string>{"dir/data/lm_text_document"});
  CHECK(m.tasks[0].weight == 3.0);
  CHECK(m.tasks[1].prefixes == std::vector<std::string>{"dir/a", "/abs/b"});
  CHECK(m.tasks[2].layout == TaskLayout::PairedPrefixes);
  CHECK(m.tasks[2].prefixes == std::vector<std::string>{"dir/qa_inputs"});
  CHECK(m.tasks[2].target_prefixes == std::vector<std::string>{"dir/qa_targets"});
  CHECK(m.tasks[2].weight == 0.0);
  CHECK(m.tasks[3].target_prefixes.size() == 2);
  CHECK(m.tasks[4].layout == TaskLayout::PairedSequences);
  CHECK(std::string(layout_name(TaskLayout::PairedSequences)) == "paired_sequences");
}

TEST_CASE("manifest defaults: split 1,0,0, unweighted, Megatron split strings", "[interface]") {
  const Manifest m = parse(R"({"tasks": [{"name": "a", "dataset": "p"}, {"name": "b", "dataset": "q"}]})");
  CHECK_FALSE(m.weighted);
  CHECK(m.split == std::array<double, 3>{1.0, 0.0, 0.0});
  CHECK(m.samples_per_epoch == 0);
  CHECK(m.tasks[0].prefixes == std::vector<std::string>{"p"});

  const Manifest s = parse(R"({"split": "99,1", "tasks": [{"name": "a", "dataset": "p"}]})");
  CHECK(s.split[0] == Approx(0.99));
  CHECK(s.split[1] == Approx(0.01));
  CHECK(s.split[2] == 0.0);
}

TEST_CASE("manifest_to_json round-trips", "[interface]") {
  const Manifest m = parse(R"({"split": [8, 1, 1], "samples_per_epoch": 7, "tasks": [
      {"name": "lm", "datasets": ["a", "b"], "weight": 2},
      {"name": "qa", "inputs": ["i"], "targets": ["t"], "weight": 1},
      {"name": "mm", "dataset": "m", "layout": "paired_sequences", "weight": 0.25}]})");
  const Manifest back = parse(manifest_to_json(m));
  REQUIRE(back.tasks.size() == m.tasks.size());
  CHECK(back.weighted == m.weighted);
  CHECK(back.samples_per_epoch == 7);
  for (int i = 0; i < 3; ++i) CHECK(back.split[i] == Approx(m.split[i]));
  for (std::size_t t = 0; t < m.tasks.size(); ++t) {
    CHECK(back.tasks[t].name == m.tasks[t].name);
    CHECK(back.tasks[t].layout == m.tasks[t].layout);
    CHECK(back.tasks[t].prefixes == m.tasks[t].prefixes);
    CHECK(back.tasks[t].target_prefixes == m.tasks[t].target_prefixes);
    CHECK(back.tasks[t].weight == m.tasks[t].weight);
  }
}

TEST_CASE("load_manifest resolves prefixes against the manifest's folder and checks files", "[interface]") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("sub"));
  touch_prefix(dir.file("sub/lm"));
  touch_prefix(dir.file("sub/zipped"), ".bin.zst");
  touch_prefix(dir.file("in"));
  touch_prefix(dir.file("tg"));
  write_file(dir.file("m.json"), R"({"tasks": [
      {"name": "lm", "datasets": ["sub/lm", "sub/zipped"]},
      {"name": "qa", "inputs": "in", "targets": "tg"}]})");
  const Manifest m = load_manifest(dir.file("m.json"));
  REQUIRE(m.tasks.size() == 2);
  CHECK(m.path == dir.file("m.json"));
  CHECK(m.tasks[0].prefixes[0] == dir.file("sub/lm"));
  CHECK(m.tasks[1].target_prefixes[0] == dir.file("tg"));
}

TEST_CASE("load_manifest names the missing .idx or .bin", "[negative]") {
  TempDir dir;
  write_file(dir.file("only.idx"), "");
  write_file(dir.file("m.json"), R"({"tasks": [{"name": "lm", "dataset": "gone"}]})");
  REQUIRE_THROWS_MATCHES(load_manifest(dir.file("m.json")), packpipe::Error,
                         Catch::Matchers::Predicate<std::exception>([&](const std::exception& e) {
                           const std::string w = e.what();
                           return w.find(dir.file("m.json")) != std::string::npos &&
                                  w.find("task 0 ('lm')") != std::string::npos &&
                                  w.find(dir.file("gone") + ".idx") != std::string::npos;
                         }));
  write_file(dir.file("m2.json"), R"({"tasks": [{"name": "a", "dataset": "x"}, {"name": "qa", "inputs": "only", "targets": "only"}]})");
  touch_prefix(dir.file("x"));
  REQUIRE_THROWS_WITH(load_manifest(dir.file("m2.json")),
                      Contains("task 1 ('qa')") && Contains("'inputs'") && Contains(dir.file("only") + ".bin"));
  REQUIRE_THROWS_WITH(load_manifest(dir.file("nope.json")), Contains("nope.json") && Contains("cannot open"));
}

TEST_CASE("parse_manifest without file checks accepts missing files", "[boundary]") {
  const Manifest m = parse_manifest(R"({"tasks": [{"name": "a", "dataset": "/does/not/exist"}]})", "m.json",
                                    "/also/missing", false);
  CHECK(m.tasks[0].prefixes[0] == "/does/not/exist");
}

TEST_CASE("manifest errors name the file, the task and the field with expected versus found", "[negative]") {
  SECTION("malformed JSON") {
    REQUIRE_THROWS_WITH(parse("{\"tasks\": [}"), Contains("m.json") && Contains("malformed JSON") && Contains("line 1"));
  }
  SECTION("not an object") { REQUIRE_THROWS_WITH(parse("[1]"), Contains("top level") && Contains("array")); }
  SECTION("unknown top-level key") {
    REQUIRE_THROWS_WITH(parse(R"({"taks": [], "tasks": [{"name": "a", "dataset": "p"}]})"),
                        Contains("unknown key 'taks'") && Contains("tasks"));
  }
  SECTION("unknown task key (typo)") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": "p", "wieght": 2}]})"),
                        Contains("task 0 ('a')") && Contains("unknown key 'wieght'"));
  }
  SECTION("negative weight") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": "p", "weight": 1},
                                            {"name": "b", "dataset": "q", "weight": -0.5}]})"),
                        Contains("task 1 ('b')") && Contains("'weight'") && Contains(">= 0") && Contains("-0.5"));
  }
  SECTION("weight of the wrong type") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": "p", "weight": "2"}]})"),
                        Contains("'weight'") && Contains("found string"));
  }
  SECTION("non-finite weight (number overflow)") {
    REQUIRE_THROWS_AS(parse(R"({"tasks": [{"name": "a", "dataset": "p", "weight": 1e999}]})"),
                      packpipe::InvalidArgument);
  }
  SECTION("weights on some tasks only") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": "p", "weight": 1}, {"name": "b", "dataset": "q"}]})"),
                        Contains("every task or no task") && Contains("1 of 2"));
  }
  SECTION("all weights zero") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": "p", "weight": 0}]})"),
                        Contains("positive, finite sum"));
  }
  SECTION("dataset of the wrong type") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": 3}]})"),
                        Contains("task 0 ('a')") && Contains("field 'dataset'") && Contains("found number"));
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "datasets": "p"}]})"),
                        Contains("field 'datasets'") && Contains("non-empty array"));
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "datasets": ["p", 1]}]})"), Contains("'datasets[1]'"));
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": ""}]})"), Contains("non-empty prefix"));
  }
  SECTION("duplicate task names") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": "p"}, {"name": "a", "dataset": "q"}]})"),
                        Contains("task 1 ('a')") && Contains("duplicate task name 'a'"));
  }
  SECTION("empty or missing tasks") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": []})"), Contains("'tasks'") && Contains("non-empty array"));
    REQUIRE_THROWS_WITH(parse(R"({"version": 1})"), Contains("missing field 'tasks'"));
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [3]})"), Contains("task 0") && Contains("task object"));
  }
  SECTION("missing or bad name") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"dataset": "p"}]})"), Contains("task 0") && Contains("missing field 'name'"));
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "", "dataset": "p"}]})"), Contains("non-empty string"));
  }
  SECTION("inputs and targets count mismatch") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "qa", "inputs": ["a", "b"], "targets": ["c"]}]})"),
                        Contains("task 0 ('qa')") && Contains("'targets'") && Contains("(2), found 1"));
  }
  SECTION("inputs without targets") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "qa", "inputs": "a"}]})"), Contains("missing field 'targets'"));
  }
  SECTION("no or several data sources") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a"}]})"), Contains("exactly one of") && Contains("none"));
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": "p", "inputs": "i", "targets": "t"}]})"),
                        Contains("several"));
  }
  SECTION("bad layout") {
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": "p", "layout": "paired_prefixes"}]})"),
                        Contains("field 'layout'"));
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "inputs": "p", "targets": "q", "layout": "sequence"}]})"),
                        Contains("field 'layout'"));
    REQUIRE_THROWS_WITH(parse(R"({"tasks": [{"name": "a", "dataset": "p", "layout": 1}]})"), Contains("found number"));
  }
  SECTION("bad version, split and samples_per_epoch") {
    REQUIRE_THROWS_WITH(parse(R"({"version": 2, "tasks": [{"name": "a", "dataset": "p"}]})"),
                        Contains("field 'version'") && Contains("expected 1"));
    REQUIRE_THROWS_WITH(parse(R"({"split": [1, 2], "tasks": [{"name": "a", "dataset": "p"}]})"), Contains("field 'split'"));
    REQUIRE_THROWS_WITH(parse(R"({"split": [0, 0, 0], "tasks": [{"name": "a", "dataset": "p"}]})"), Contains("positive sum"));
    REQUIRE_THROWS_WITH(parse(R"({"split": "1,x", "tasks": [{"name": "a", "dataset": "p"}]})"), Contains("field 'split'"));
    REQUIRE_THROWS_WITH(parse(R"({"split": [1, -1, 1], "tasks": [{"name": "a", "dataset": "p"}]})"), Contains("field 'split'"));
    REQUIRE_THROWS_WITH(parse(R"({"samples_per_epoch": -3, "tasks": [{"name": "a", "dataset": "p", "weight": 1}]})"),
                        Contains("'samples_per_epoch'") && Contains("-3"));
    REQUIRE_THROWS_WITH(parse(R"({"samples_per_epoch": 3, "tasks": [{"name": "a", "dataset": "p"}]})"),
                        Contains("only meaningful with task weights"));
  }
}
