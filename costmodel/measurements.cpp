#include "costmodel/measurements.h"

#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/file_io.h"
#include "common/json.h"

namespace packpipe::costmodel {

namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

constexpr const char* kFormat = "packpipe-measurements";
constexpr int kVersion = 1;

const char* json_type(const Json& v) { return v.is_null() ? "null" : v.type_name(); }

std::string found(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return fmt::format("{} {}", json_type(v), s);
}

// Field readers of one line: every error names the line and the field.
struct Line {
  const Json& j;
  const std::string& where;

  const Json& at(const char* key) const {
    const auto it = j.find(key);
    PACKPIPE_CHECK(it != j.end(), "{}: missing field '{}'", where, key);
    return *it;
  }
  std::int64_t integer(const char* key, std::int64_t lo, std::int64_t hi) const {
    const Json& v = at(key);
    PACKPIPE_CHECK(v.is_number_integer(), "{}: field '{}': expected an integer, found {}", where, key, found(v));
    std::int64_t x = 0;
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      PACKPIPE_CHECK(u <= static_cast<std::uint64_t>(hi), "{}: field '{}': expected an integer in [{}, {}], found {}",
                     where, key, lo, hi, u);
      x = static_cast<std::int64_t>(u);
    } else {
      x = v.get<std::int64_t>();
    }
    PACKPIPE_CHECK(x >= lo && x <= hi, "{}: field '{}': expected an integer in [{}, {}], found {}", where, key, lo, hi,
                   x);
    return x;
  }
  double number(const char* key) const {
    const Json& v = at(key);
    PACKPIPE_CHECK(v.is_number(), "{}: field '{}': expected a finite number, found {}", where, key, found(v));
    const double x = v.get<double>();
    PACKPIPE_CHECK(std::isfinite(x), "{}: field '{}': expected a finite number, found {}", where, key, x);
    return x;
  }
  bool boolean(const char* key) const {
    const Json& v = at(key);
    PACKPIPE_CHECK(v.is_boolean(), "{}: field '{}': expected true or false, found {}", where, key, found(v));
    return v.get<bool>();
  }
  bool has(const char* key) const { return j.find(key) != j.end(); }
  std::string text(const char* key) const {
    const Json& v = at(key);
    PACKPIPE_CHECK(v.is_string(), "{}: field '{}': expected a string, found {}", where, key, found(v));
    return v.get<std::string>();
  }
  /// Varlen attention sums: [self, dec_self, cross] or, for rows with slices, [self, dec_self, cross,
  /// prefix, prefix_tokens], integers in [0, 2^62], not all zero.
  AttentionWork attention(const char* key) const {
    const Json& v = at(key);
    PACKPIPE_CHECK(v.is_array() && (v.size() == 3 || v.size() == 5),
                   "{}: field '{}': expected [self, dec_self, cross] or [self, dec_self, cross, prefix, prefix_tokens] "
                   "(three or five integers), found {}",
                   where, key, found(v));
    std::int64_t x[5] = {0, 0, 0, 0, 0};
    for (std::size_t i = 0; i < v.size(); ++i) {
      const Json& e = v[i];
      PACKPIPE_CHECK(e.is_number_integer() && (e.is_number_unsigned() ? e.get<std::uint64_t>() <= (std::uint64_t{1} << 62)
                                                                        : e.get<std::int64_t>() >= 0 &&
                                                                              e.get<std::int64_t>() <= (std::int64_t{1} << 62)),
                     "{}: field '{}': entry {} must be an integer in [0, 2^62], found {}", where, key, i, found(e));
      x[i] = e.get<std::int64_t>();
    }
    AttentionWork w{x[0], x[1], x[2], x[3], x[4]};
    PACKPIPE_CHECK(w.varlen(), "{}: field '{}': all the sums are 0 (leave the field out for dense rows)", where, key);
    return w;
  }
  void only(std::initializer_list<const char*> keys) const {
    const std::set<std::string> allowed(keys.begin(), keys.end());
    for (auto it = j.begin(); it != j.end(); ++it) {
      PACKPIPE_CHECK(allowed.count(it.key()) != 0, "{}: unknown field '{}' (expected {})", where, it.key(),
                     fmt::join(keys, ", "));
    }
  }
};

constexpr std::int64_t kMaxU32 = std::numeric_limits<std::uint32_t>::max();
constexpr std::int64_t kMaxI64 = std::numeric_limits<std::int64_t>::max();

}  // namespace

void MeasurementSet::append(const MeasurementSet& other) {
  ops.insert(ops.end(), other.ops.begin(), other.ops.end());
  iterations.insert(iterations.end(), other.iterations.begin(), other.iterations.end());
}

std::string describe_measurement(const Measurement& m, std::size_t i) {
  return fmt::format("measurement {} ({}, iteration {}, replica {}, rank {}, instruction {})", i,
                     measured_op_name(m.op), m.iteration, m.replica, m.rank, m.index);
}

void check_measurement(const Measurement& m, std::string_view where) {
  const char* op = measured_op_name(m.op);
  PACKPIPE_CHECK_ARG(std::string_view(op) != "?", "{}: unknown op value {}", where, static_cast<int>(m.op));
  PACKPIPE_CHECK_ARG(std::isfinite(m.ms), "{} ({}): ms must be a finite duration, found {}", where, op, m.ms);
  if (is_compute(m.op)) {
    PACKPIPE_CHECK_ARG(m.ms > 0, "{} ({}): ms must be positive for a compute op, found {}", where, op, m.ms);
  } else {
    PACKPIPE_CHECK_ARG(m.ms >= 0, "{} ({}): ms must not be negative, found {}", where, op, m.ms);
  }
  PACKPIPE_CHECK_ARG(m.ms <= kMaxMeasuredMs && (m.ms == 0 || m.ms >= kMinMeasuredMs),
                     "{} ({}): ms must be in [{:g}, {:g}] (the clock's resolution to 11.6 days{}), found {}", where, op,
                     kMinMeasuredMs, kMaxMeasuredMs, is_compute(m.op) ? "" : ", or 0", m.ms);
  PACKPIPE_CHECK_ARG(m.rows >= 1 && m.rows <= kMaxMeasuredSize, "{} ({}): rows must be in [1, {}], found {}", where, op,
                     kMaxMeasuredSize, m.rows);
  PACKPIPE_CHECK_ARG(m.seq >= 1 && m.seq <= kMaxMeasuredSize, "{} ({}): seq must be in [1, {}], found {}", where, op,
                     kMaxMeasuredSize, m.seq);
  PACKPIPE_CHECK_ARG(m.dec_seq >= 0 && m.dec_seq <= kMaxMeasuredSize, "{} ({}): dec_seq must be in [0, {}], found {}",
                     where, op, kMaxMeasuredSize, m.dec_seq);
  PACKPIPE_CHECK_ARG(m.tp >= 1 && m.tp <= kMaxMeasuredSize, "{} ({}): tp must be in [1, {}], found {}", where, op,
                     kMaxMeasuredSize, m.tp);
  PACKPIPE_CHECK_ARG(m.layout.encoder_layers >= 0 && m.layout.encoder_layers <= kMaxMeasuredSize &&
                         m.layout.decoder_layers >= 0 && m.layout.decoder_layers <= kMaxMeasuredSize,
                     "{} ({}): layer counts must be in [0, {}], found {} encoder and {} decoder", where, op,
                     kMaxMeasuredSize, m.layout.encoder_layers, m.layout.decoder_layers);
  PACKPIPE_CHECK_ARG(m.layout.encoder_layers + m.layout.decoder_layers > 0 || m.layout.has_embedding ||
                         m.layout.has_postprocess,
                     "{} ({}): the stage holds no layers, no embedding and no LM head", where, op);
  if (m.attention.varlen()) {
    Query q;
    q.mbs = m.rows;
    q.seq = m.seq;
    q.dec_seq = m.dec_seq;
    q.attention = m.attention;
    PACKPIPE_CHECK_ARG(attention_work_ok(q, m.rows),
                       "{} ({}): attention sums [{}, {}, {}, {}, {}] are impossible for {} row(s) of {} + {} tokens (each "
                       "sum between the tokens it covers and the dense rows'; slices' prefix sums 0, or 1 <= "
                       "prefix_tokens <= prefix)",
                       where, op, m.attention.self, m.attention.dec_self, m.attention.cross, m.attention.prefix,
                       m.attention.prefix_tokens, m.rows, m.seq, m.dec_seq);
  }
  const char* rc = recompute_name(m.recompute);
  PACKPIPE_CHECK_ARG(std::string_view(rc) != "?", "{} ({}): unknown recompute value {}", where, op,
                     static_cast<int>(m.recompute));
  PACKPIPE_CHECK_ARG(m.iteration <= static_cast<std::uint64_t>(kMaxI64) && m.index <= static_cast<std::uint64_t>(kMaxI64),
                     "{} ({}): iteration and index must be at most 2^63 - 1, found {} and {}", where, op, m.iteration,
                     m.index);
  PACKPIPE_CHECK_ARG(std::isfinite(m.start_ms), "{} ({}): start_ms must be finite, found {}", where, op, m.start_ms);
  if (is_compute(m.op)) {
    PACKPIPE_CHECK_ARG(m.bytes == 0, "{} ({}): bytes is for transfers, found {} on a compute op", where, op, m.bytes);
    PACKPIPE_CHECK_ARG(m.peer == -1, "{} ({}): peer is for transfers, found {} on a compute op", where, op, m.peer);
  } else {
    PACKPIPE_CHECK_ARG(m.bytes >= 1 && m.bytes <= (std::uint64_t{1} << 50),
                       "{} ({}): bytes must be in [1, 2^50] for a transfer, found {}", where, op, m.bytes);
    PACKPIPE_CHECK_ARG(m.peer >= 0 && m.peer <= kMaxU32 && m.peer != static_cast<std::int64_t>(m.rank),
                       "{} ({}): peer must be another rank, found {} on rank {}", where, op, m.peer, m.rank);
  }
}

void check_iteration_measurement(const IterationMeasurement& it, std::string_view where) {
  PACKPIPE_CHECK_ARG(it.iteration <= static_cast<std::uint64_t>(kMaxI64), "{}: iteration must be at most 2^63 - 1, "
                     "found {}", where, it.iteration);
  const std::pair<const char*, double> times[] = {{"measured_ms", it.measured_ms}, {"predicted_ms", it.predicted_ms}};
  for (const auto& [name, ms] : times) {
    PACKPIPE_CHECK_ARG(std::isfinite(ms) && (ms == 0 || (ms >= kMinMeasuredMs && ms <= kMaxMeasuredMs)),
                       "{}: {} must be 0 (unknown) or in [{:g}, {:g}], found {}", where, name, kMinMeasuredMs,
                       kMaxMeasuredMs, ms);
  }
  PACKPIPE_CHECK_ARG(it.schedule.empty() || enum_find(kScheduleKindNames, it.schedule) != nullptr,
                     "{}: schedule must be empty (unknown) or one of {}, found '{}'", where,
                     enum_name_list(kScheduleKindNames), it.schedule);
}

std::string measurement_line(const Measurement& m) {
  OJson j;
  j["op"] = measured_op_name(m.op);
  j["encoder_layers"] = m.layout.encoder_layers;
  j["decoder_layers"] = m.layout.decoder_layers;
  j["embedding"] = m.layout.has_embedding;
  j["postprocess"] = m.layout.has_postprocess;
  j["tp"] = m.tp;
  j["rows"] = m.rows;
  j["seq"] = m.seq;
  j["dec_seq"] = m.dec_seq;
  if (m.attention.varlen()) {
    j["attention"] = {m.attention.self, m.attention.dec_self, m.attention.cross};
    if (m.attention.prefix_tokens != 0) {
      j["attention"].push_back(m.attention.prefix);
      j["attention"].push_back(m.attention.prefix_tokens);
    }
  }
  j["recompute"] = recompute_name(m.recompute);
  j["bytes"] = m.bytes;
  j["ms"] = m.ms;
  j["iteration"] = m.iteration;
  j["replica"] = m.replica;
  j["rank"] = m.rank;
  j["stage"] = m.stage;
  j["mb"] = m.mb;
  j["index"] = m.index;
  j["start_ms"] = m.start_ms;
  j["peer"] = m.peer;
  return j.dump();
}

std::string iteration_line(const IterationMeasurement& it) {
  OJson j;
  j["op"] = "iteration";
  j["iteration"] = it.iteration;
  j["replica"] = it.replica;
  j["measured_ms"] = it.measured_ms;
  j["predicted_ms"] = it.predicted_ms;
  if (!it.schedule.empty()) j["schedule"] = it.schedule;
  return j.dump();
}

std::string measurements_to_jsonl(const MeasurementSet& set) {
  OJson h;
  h["format"] = kFormat;
  h["version"] = kVersion;
  h["model"] = set.header.model;
  h["device"] = set.header.device;
  h["source"] = set.header.source;
  std::string out = h.dump();
  out += '\n';
  for (std::size_t i = 0; i < set.ops.size(); ++i) {
    check_measurement(set.ops[i], fmt::format("measurement {}", i));
    out += measurement_line(set.ops[i]);
    out += '\n';
  }
  for (const auto& it : set.iterations) {
    check_iteration_measurement(it, fmt::format("iteration {} replica {}", it.iteration, it.replica));
    out += iteration_line(it);
    out += '\n';
  }
  return out;
}

void write_measurements(const std::string& path, const MeasurementSet& set) {
  write_file_atomic(path, measurements_to_jsonl(set));
}

MeasurementSet parse_measurements(std::string_view text, const std::string& what) {
  MeasurementSet out;
  bool have_header = false;
  std::size_t pos = 0;
  std::uint64_t lineno = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view raw = text.substr(pos, end - pos);
    pos = end + 1;
    ++lineno;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    if (raw.find_first_not_of(" \t") == std::string_view::npos) continue;
    const std::string where = fmt::format("{} line {}", what, lineno);
    const Json j = parse_json(raw, where);
    PACKPIPE_CHECK(j.is_object(), "{}: expected a JSON object, found {}", where, found(j));
    const Line l{j, where};
    if (!have_header) {
      const std::string format = l.text("format");
      PACKPIPE_CHECK(format == kFormat, "{}: field 'format': expected \"{}\", found \"{}\"", where, kFormat, format);
      const std::int64_t version = l.integer("version", 0, kMaxI64);
      PACKPIPE_CHECK(version == kVersion, "{}: field 'version': expected {}, found {} (written by a newer packpipe?)",
                     where, kVersion, version);
      l.only({"format", "version", "model", "device", "source"});
      out.header.model = l.text("model");
      out.header.device = l.text("device");
      out.header.source = l.text("source");
      have_header = true;
      continue;
    }
    const std::string op = l.text("op");
    if (op == "iteration") {
      l.only({"op", "iteration", "replica", "measured_ms", "predicted_ms", "schedule"});
      IterationMeasurement it;
      it.iteration = static_cast<std::uint64_t>(l.integer("iteration", 0, kMaxI64));
      it.replica = static_cast<std::uint32_t>(l.integer("replica", 0, kMaxU32));
      it.measured_ms = l.number("measured_ms");
      it.predicted_ms = l.number("predicted_ms");
      if (l.has("schedule")) {
        it.schedule = l.text("schedule");
        PACKPIPE_CHECK(!it.schedule.empty(), "{}: field 'schedule': expected a schedule kind, found \"\" (leave the "
                       "field out when the schedule is unknown)", where);
      }
      try {
        check_iteration_measurement(it, where);
      } catch (const InvalidArgument& e) {
        throw Error(e.what());  // a bad file is an Error naming it, as every other field of a line
      }
      out.iterations.push_back(it);
      continue;
    }
    const auto* name = enum_find(kMeasuredOpNames, op);
    PACKPIPE_CHECK(name != nullptr, "{}: field 'op': unknown op '{}' (expected {}, iteration)", where, op,
                   enum_name_list(kMeasuredOpNames));
    l.only({"op", "encoder_layers", "decoder_layers", "embedding", "postprocess", "tp", "rows", "seq", "dec_seq",
            "attention", "recompute", "bytes", "ms", "iteration", "replica", "rank", "stage", "mb", "index",
            "start_ms", "peer"});
    Measurement m;
    m.op = name->value;
    // Sizes are read as signed integers so that a zero or negative one reaches check_measurement's
    // message (which names it) rather than a conversion error.
    m.layout.encoder_layers = l.integer("encoder_layers", -kMaxI64, kMaxI64);
    m.layout.decoder_layers = l.integer("decoder_layers", -kMaxI64, kMaxI64);
    m.layout.has_embedding = l.boolean("embedding");
    m.layout.has_postprocess = l.boolean("postprocess");
    m.tp = l.integer("tp", -kMaxI64, kMaxI64);
    m.rows = l.integer("rows", -kMaxI64, kMaxI64);
    m.seq = l.integer("seq", -kMaxI64, kMaxI64);
    m.dec_seq = l.integer("dec_seq", -kMaxI64, kMaxI64);
    if (j.contains("attention")) m.attention = l.attention("attention");
    const std::string rc = l.text("recompute");
    const auto* rcn = enum_find(kRecomputeNames, rc);
    PACKPIPE_CHECK(rcn != nullptr, "{}: field 'recompute': unknown mode '{}' (expected {})", where, rc,
                   enum_name_list(kRecomputeNames));
    m.recompute = rcn->value;
    m.bytes = static_cast<std::uint64_t>(l.integer("bytes", 0, kMaxI64));
    m.ms = l.number("ms");
    m.iteration = static_cast<std::uint64_t>(l.integer("iteration", 0, kMaxI64));
    m.replica = static_cast<std::uint32_t>(l.integer("replica", 0, kMaxU32));
    m.rank = static_cast<std::uint32_t>(l.integer("rank", 0, kMaxU32));
    m.stage = static_cast<std::uint32_t>(l.integer("stage", 0, kMaxU32));
    m.mb = static_cast<std::uint32_t>(l.integer("mb", 0, kMaxU32));
    m.index = static_cast<std::uint64_t>(l.integer("index", 0, kMaxI64));
    m.start_ms = l.number("start_ms");
    m.peer = l.integer("peer", -1, kMaxU32);
    try {
      check_measurement(m, where);
    } catch (const InvalidArgument& e) {
      throw Error(e.what());  // a bad file is an Error, as every reader's
    }
    out.ops.push_back(m);
  }
  PACKPIPE_CHECK(have_header, "{}: empty: expected the header line {{\"format\":\"{}\",\"version\":{},...}}", what,
                 kFormat, kVersion);
  return out;
}

MeasurementSet read_measurements(const std::string& path) {
  return parse_measurements(read_regular_file(path, "measurements file"), path);
}

}  // namespace packpipe::costmodel
