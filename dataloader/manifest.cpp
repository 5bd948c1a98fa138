#include "dataloader/manifest.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/json.h"

namespace packpipe::dataloader {

namespace {

using nlohmann::json;

const char* kTopKeys[] = {"version", "split", "samples_per_epoch", "tasks"};
const char* kTaskKeys[] = {"name", "dataset", "datasets", "inputs", "targets", "layout", "weight"};

/// Context for messages: "manifest 'file'" or "manifest 'file': task 2 ('name')".
struct Where {
  const std::string& file;
  long task = -1;
  std::string task_name;

  std::string str() const {
    std::string s = fmt::format("manifest '{}'", file);
    if (task >= 0) {
      s += fmt::format(": task {}", task);
      if (!task_name.empty()) s += fmt::format(" ('{}')", task_name);
    }
    return s;
  }
};

/// Short description of a JSON value for "found ..." parts of messages.
std::string describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return fmt::format("{} {}", v.type_name(), text);
}

[[noreturn]] void bad_field(const Where& w, const std::string& field, const std::string& expected,
                            const json& found) {
  PACKPIPE_THROW(InvalidArgument, "{}: field '{}': expected {}, found {}", w.str(), field, expected,
                 describe(found));
}

/// The quoted names of `layouts` for messages: "\"a\", \"b\" or \"c\"".
std::string quoted(std::initializer_list<TaskLayout> layouts) {
  std::string s;
  std::size_t k = 0;
  for (const TaskLayout l : layouts) {
    s += fmt::format("{}\"{}\"", k == 0 ? "" : k + 1 == layouts.size() ? " or " : ", ", layout_name(l));
    ++k;
  }
  return s;
}

void check_keys(const json& obj, const char* const* allowed, std::size_t n, const Where& w) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (std::size_t i = 0; i < n; ++i) ok = ok || it.key() == allowed[i];
    if (!ok) {
      std::string list;
      for (std::size_t i = 0; i < n; ++i) list += (i ? ", " : "") + std::string(allowed[i]);
      PACKPIPE_THROW(InvalidArgument, "{}: unknown key '{}' (expected one of: {})", w.str(), it.key(),
                     list);
    }
  }
}

std::string resolve(const std::string& base_dir, const std::string& prefix) {
  std::filesystem::path p(prefix);
  if (base_dir.empty() || p.is_absolute()) return prefix;
  return (std::filesystem::path(base_dir) / p).string();
}

/// A prefix or a non-empty list of prefixes; `allow_string` false requires a list.
std::vector<std::string> prefix_list(const json& v, const std::string& field, bool allow_string,
                                     const Where& w, const std::string& base_dir) {
  const char* expected = allow_string ? "a prefix string or a non-empty array of prefix strings"
                                      : "a non-empty array of prefix strings";
  std::vector<std::string> out;
  if (v.is_string() && allow_string) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array() && !v.empty()) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string()) bad_field(w, fmt::format("{}[{}]", field, i), "a prefix string", v[i]);
      out.push_back(v[i].get<std::string>());
    }
  } else {
    bad_field(w, field, expected, v);
  }
  for (auto& p : out) {
    if (p.empty()) bad_field(w, field, "non-empty prefix strings", v);
    p = resolve(base_dir, p);
  }
  return out;
}

std::array<double, 3> parse_split(const json& v, const Where& w) {
  std::array<double, 3> f{0.0, 0.0, 0.0};
  const char* expected = "an array of 3 numbers >= 0 with a positive sum, or a string like \"98,1,1\"";
  if (v.is_array()) {
    if (v.size() != 3) bad_field(w, "split", expected, v);
    for (std::size_t i = 0; i < 3; ++i) {
      if (!v[i].is_number()) bad_field(w, "split", expected, v);
      f[i] = v[i].get<double>();
    }
  } else if (v.is_string()) {
    // Megatron's --split syntax: up to three comma-separated numbers, missing ones are 0.
    std::string s = v.get<std::string>();
    std::size_t start = 0, i = 0;
    while (true) {
      std::size_t comma = s.find(',', start);
      std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (i >= 3 || part.empty()) bad_field(w, "split", expected, v);
      std::size_t used = 0;
      try {
        f[i++] = std::stod(part, &used);
      } catch (const std::exception&) {
        bad_field(w, "split", expected, v);
      }
      if (used != part.size()) bad_field(w, "split", expected, v);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else {
    bad_field(w, "split", expected, v);
  }
  double sum = 0.0;
  for (double x : f) {
    if (!std::isfinite(x) || x < 0.0) bad_field(w, "split", expected, v);
    sum += x;
  }
  if (!(sum > 0.0) || !std::isfinite(sum)) bad_field(w, "split", expected, v);
  for (double& x : f) x /= sum;
  return f;
}

void check_prefix_files(const std::string& prefix, const Where& w, const std::string& field) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string idx = prefix + ".idx";
  if (!fs::is_regular_file(idx, ec)) {
    PACKPIPE_THROW(Error, "{}: field '{}': missing file '{}' (expected an existing .idx for prefix '{}')",
                   w.str(), field, idx, prefix);
  }
  const std::string bin = prefix + ".bin";
  const std::string zst = prefix + ".bin.zst";
  if (!fs::is_regular_file(bin, ec) && !fs::is_regular_file(zst, ec)) {
    PACKPIPE_THROW(Error, "{}: field '{}': missing file '{}' (nor '{}') for prefix '{}'", w.str(),
                   field, bin, zst, prefix);
  }
}

Manifest parse_impl(const std::string& json_text, const std::string& name, const std::string& base_dir,
                    bool check_files) {
  Where top{name, -1, {}};
  json doc;
  try {
    doc = parse_json(json_text, top.str());  // duplicate keys (e.g. two "tasks") refused, depth bounded
  } catch (const Error& e) {
    PACKPIPE_THROW(InvalidArgument, "{}", e.what());
  }
  if (!doc.is_object()) {
    PACKPIPE_THROW(InvalidArgument, "{}: expected a JSON object at the top level, found {}", top.str(),
                   describe(doc));
  }
  check_keys(doc, kTopKeys, std::size(kTopKeys), top);

  Manifest m;
  m.path = name;
  if (doc.contains("version")) {
    const json& v = doc["version"];
    if (!v.is_number_integer() || v.get<std::int64_t>() != 1) bad_field(top, "version", "1", v);
  }
  if (doc.contains("split")) m.split = parse_split(doc["split"], top);
  if (doc.contains("samples_per_epoch")) {
    const json& v = doc["samples_per_epoch"];
    if (!v.is_number_unsigned()) bad_field(top, "samples_per_epoch", "an integer >= 0", v);
    m.samples_per_epoch = v.get<std::uint64_t>();
  }
  if (!doc.contains("tasks")) {
    PACKPIPE_THROW(InvalidArgument, "{}: missing field 'tasks' (expected a non-empty array of task objects)",
                   top.str());
  }
  const json& tasks = doc["tasks"];
  if (!tasks.is_array() || tasks.empty()) {
    bad_field(top, "tasks", "a non-empty array of task objects", tasks);
  }

  std::set<std::string> names;
  std::size_t with_weight = 0;
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    const json& jt = tasks[t];
    Where w{name, static_cast<long>(t), {}};
    if (!jt.is_object()) bad_field(w, "tasks", "a task object", jt);
    if (jt.contains("name") && jt["name"].is_string()) w.task_name = jt["name"].get<std::string>();
    check_keys(jt, kTaskKeys, std::size(kTaskKeys), w);

    TaskSpec spec;
    if (!jt.contains("name")) {
      PACKPIPE_THROW(InvalidArgument, "{}: missing field 'name' (expected a non-empty string)", w.str());
    }
    if (!jt["name"].is_string() || jt["name"].get<std::string>().empty()) {
      bad_field(w, "name", "a non-empty string", jt["name"]);
    }
    spec.name = jt["name"].get<std::string>();
    if (!names.insert(spec.name).second) {
      PACKPIPE_THROW(InvalidArgument, "{}: field 'name': duplicate task name '{}' (task names must be unique)",
                     w.str(), spec.name);
    }

    const bool has_dataset = jt.contains("dataset");
    const bool has_datasets = jt.contains("datasets");
    const bool has_inputs = jt.contains("inputs");
    const bool has_targets = jt.contains("targets");
    const int sources = int(has_dataset) + int(has_datasets) + int(has_inputs || has_targets);
    if (sources != 1) {
      PACKPIPE_THROW(InvalidArgument,
                     "{}: expected exactly one of 'dataset', 'datasets' or 'inputs' + 'targets', found {}",
                     w.str(), sources == 0 ? std::string("none") : std::string("several"));
    }

    std::string layout;
    if (jt.contains("layout")) {
      const json& v = jt["layout"];
      if (!v.is_string()) bad_field(w, "layout", quoted({TaskLayout::Sequence, TaskLayout::PairedSequences, TaskLayout::PairedPrefixes}), v);
      layout = v.get<std::string>();
    }

    if (has_inputs || has_targets) {
      if (!has_inputs || !has_targets) {
        PACKPIPE_THROW(InvalidArgument, "{}: missing field '{}' (paired prefixes need both 'inputs' and 'targets')",
                       w.str(), has_inputs ? "targets" : "inputs");
      }
      if (!layout.empty() && layout != layout_name(TaskLayout::PairedPrefixes)) {
        bad_field(w, "layout", quoted({TaskLayout::PairedPrefixes}) + " (or no layout) with 'inputs' + 'targets'",
                  jt["layout"]);
      }
      spec.layout = TaskLayout::PairedPrefixes;
      spec.prefixes = prefix_list(jt["inputs"], "inputs", true, w, base_dir);
      spec.target_prefixes = prefix_list(jt["targets"], "targets", true, w, base_dir);
      if (spec.prefixes.size() != spec.target_prefixes.size()) {
        PACKPIPE_THROW(InvalidArgument,
                       "{}: field 'targets': expected as many target prefixes as inputs ({}), found {}",
                       w.str(), spec.prefixes.size(), spec.target_prefixes.size());
      }
    } else {
      if (layout.empty() || layout == layout_name(TaskLayout::Sequence)) {
        spec.layout = TaskLayout::Sequence;
      } else if (layout == layout_name(TaskLayout::PairedSequences)) {
        spec.layout = TaskLayout::PairedSequences;
      } else {
        bad_field(w, "layout", quoted({TaskLayout::Sequence, TaskLayout::PairedSequences}) + " with 'dataset'/'datasets'",
                  jt["layout"]);
      }
      spec.prefixes = has_dataset ? prefix_list(jt["dataset"], "dataset", true, w, base_dir)
                                  : prefix_list(jt["datasets"], "datasets", false, w, base_dir);
    }

    if (jt.contains("weight")) {
      const json& v = jt["weight"];
      if (!v.is_number()) bad_field(w, "weight", "a finite number >= 0", v);
      spec.weight = v.get<double>();
      if (!std::isfinite(spec.weight) || spec.weight < 0.0) bad_field(w, "weight", "a finite number >= 0", v);
      ++with_weight;
    }
    m.tasks.push_back(std::move(spec));
  }

  if (with_weight != 0 && with_weight != m.tasks.size()) {
    PACKPIPE_THROW(InvalidArgument,
                   "{}: field 'weight': expected either every task or no task to give a weight, found {} of {}",
                   top.str(), with_weight, m.tasks.size());
  }
  m.weighted = with_weight != 0;
  if (m.weighted) {
    double sum = 0.0;
    for (const auto& t : m.tasks) sum += t.weight;
    if (!(sum > 0.0) || !std::isfinite(sum)) {
      PACKPIPE_THROW(InvalidArgument, "{}: field 'weight': expected a positive, finite sum of weights, found {}",
                     top.str(), sum);
    }
  }
  if (m.samples_per_epoch != 0 && !m.weighted) {
    PACKPIPE_THROW(InvalidArgument,
                   "{}: field 'samples_per_epoch': only meaningful with task weights (without weights every "
                   "sample is drawn once per epoch), found {} and no weights",
                   top.str(), m.samples_per_epoch);
  }

  if (check_files) {
    for (std::size_t t = 0; t < m.tasks.size(); ++t) {
      const TaskSpec& spec = m.tasks[t];
      Where w{name, static_cast<long>(t), spec.name};
      const char* field = spec.layout == TaskLayout::PairedPrefixes ? "inputs" : "dataset";
      for (const auto& p : spec.prefixes) check_prefix_files(p, w, field);
      for (const auto& p : spec.target_prefixes) check_prefix_files(p, w, "targets");
    }
  }
  return m;
}

}  // namespace

Manifest load_manifest(const std::string& path) {
  std::error_code ec;
  PACKPIPE_CHECK(!std::filesystem::is_directory(path, ec), "manifest '{}': is a directory (expected a JSON file)",
                 path);
  std::ifstream in(path, std::ios::binary);
  PACKPIPE_CHECK(static_cast<bool>(in), "manifest '{}': cannot open file (expected a readable JSON file)", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  PACKPIPE_CHECK(!in.bad(), "manifest '{}': read error", path);
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  return parse_impl(ss.str(), path, base_dir, true);
}

Manifest parse_manifest(const std::string& json_text, const std::string& name, const std::string& base_dir,
                        bool check_files) {
  try {
    return parse_impl(json_text, name, base_dir, check_files);
  } catch (const json::exception& e) {
    // Every access above is type-checked first; this is a safety net so that callers only ever see
    // packpipe exception types.
    PACKPIPE_THROW(InvalidArgument, "manifest '{}': invalid manifest: {}", name, e.what());
  }
}

std::string manifest_to_json(const Manifest& manifest) {
  json doc;
  doc["version"] = 1;
  doc["split"] = json::array({manifest.split[0], manifest.split[1], manifest.split[2]});
  if (manifest.samples_per_epoch != 0) doc["samples_per_epoch"] = manifest.samples_per_epoch;
  json tasks = json::array();
  for (const auto& t : manifest.tasks) {
    json jt;
    jt["name"] = t.name;
    if (t.layout == TaskLayout::PairedPrefixes) {
      jt["inputs"] = t.prefixes;
      jt["targets"] = t.target_prefixes;
    } else {
      if (t.prefixes.size() == 1) {
        jt["dataset"] = t.prefixes[0];
      } else {
        jt["datasets"] = t.prefixes;
      }
      if (t.layout == TaskLayout::PairedSequences) jt["layout"] = layout_name(t.layout);
    }
    if (manifest.weighted) jt["weight"] = t.weight;
    tasks.push_back(std::move(jt));
  }
  doc["tasks"] = std::move(tasks);
  return doc.dump(2) + "\n";
}

}  // namespace packpipe::dataloader
