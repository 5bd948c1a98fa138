// Profile readers: one parser per format, all from memory, into costmodel::Profile (ms, bytes).
#include "costmodel/profile_readers.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/file_io.h"
#include "common/json.h"

namespace packpipe::costmodel {

namespace fs = std::filesystem;

namespace {

constexpr double kMB = 1e6;             // DynaPipe, AICB-style decimal megabytes
constexpr double kMiB = 1048576.0;      // Aceso, 2^20
constexpr double kGiB = 1073741824.0;   // 2^30
constexpr double kAcesoOom = 1e7;       // Aceso's failure marker (µs) in op tables
constexpr double kAcesoPrimMissing = 1e7;  // prim tables store 1e9 ms for sizes that failed

std::string base_name(const std::string& path) {
  const auto pos = path.find_last_of('/');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

std::string trim(const std::string& s) {
  std::size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r')) --b;
  return s.substr(a, b - a);
}

/// Lines with their 1-based numbers; '\r' stripped; empty lines dropped.
std::vector<std::pair<std::size_t, std::string>> lines_of(const std::string& text) {
  std::vector<std::pair<std::size_t, std::string>> out;
  std::size_t start = 0, no = 1;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!trim(line).empty()) out.emplace_back(no, std::move(line));
    if (end == text.size()) break;
    start = end + 1;
    ++no;
  }
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t pos = s.find(sep, start);
    out.push_back(trim(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start)));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

/// Where a value came from, for messages: "file.csv line 12 column 'mbs'".
struct Where {
  const std::string& file;
  std::size_t line;
  const std::string& column;
};

double to_double(const std::string& s, const Where& w) {
  const char* b = s.c_str();
  char* e = nullptr;
  errno = 0;
  const double v = std::strtod(b, &e);
  PACKPIPE_CHECK(!s.empty() && e == b + s.size() && errno == 0 && std::isfinite(v),
                 "{} line {} column '{}': expected a number, found '{}'", w.file, w.line, w.column, s);
  return v;
}

std::int64_t to_int(const std::string& s, const Where& w) {
  const char* b = s.c_str();
  char* e = nullptr;
  errno = 0;
  const long long v = std::strtoll(b, &e, 10);
  PACKPIPE_CHECK(!s.empty() && e == b + s.size() && errno == 0,
                 "{} line {} column '{}': expected an integer, found '{}'", w.file, w.line, w.column, s);
  return static_cast<std::int64_t>(v);
}

std::int64_t to_positive(const std::string& s, const Where& w) {
  const std::int64_t v = to_int(s, w);
  PACKPIPE_CHECK(v > 0, "{} line {} column '{}': must be positive, found {}", w.file, w.line, w.column, v);
  return v;
}

std::int64_t to_nonnegative(const std::string& s, const Where& w) {
  const std::int64_t v = to_int(s, w);
  PACKPIPE_CHECK(v >= 0, "{} line {} column '{}': must not be negative, found {}", w.file, w.line, w.column, v);
  return v;
}

double to_nonnegative_double(const std::string& s, const Where& w) {
  const double v = to_double(s, w);
  PACKPIPE_CHECK(v >= 0, "{} line {} column '{}': must not be negative, found {}", w.file, w.line, w.column, v);
  return v;
}

/// A comma-separated table whose header must contain exactly `columns` (any order).
struct Table {
  std::string file;
  std::vector<std::string> header;
  std::vector<std::size_t> index;  // index[i] = position of columns[i] in the header
  std::vector<std::pair<std::size_t, std::vector<std::string>>> rows;
};

/// Describes a header column whose name matches an expected one except for its unit suffix.
std::string unit_hint(const std::vector<std::string>& header, const std::string& want) {
  // "time_ms_per_layer" vs "time_us_per_layer"; "stored_activation_MB_per_layer" vs "..._MiB_...".
  for (const auto& h : header) {
    if (h.size() < 3) continue;
    std::size_t common_prefix = 0;
    while (common_prefix < h.size() && common_prefix < want.size() && h[common_prefix] == want[common_prefix]) {
      ++common_prefix;
    }
    std::size_t common_suffix = 0;
    while (common_suffix < h.size() - common_prefix && common_suffix < want.size() - common_prefix &&
           h[h.size() - 1 - common_suffix] == want[want.size() - 1 - common_suffix]) {
      ++common_suffix;
    }
    const std::size_t diff_h = h.size() - common_prefix - common_suffix;
    const std::size_t diff_w = want.size() - common_prefix - common_suffix;
    if (common_prefix >= 2 && diff_h <= 4 && diff_w <= 4 && diff_h + diff_w > 0) {
      return fmt::format(" (found '{}': wrong unit?)", h);
    }
  }
  return "";
}

Table read_table(const std::string& text, const std::string& file, const std::vector<std::string>& columns) {
  Table t;
  t.file = file;
  const auto lines = lines_of(text);
  PACKPIPE_CHECK(!lines.empty(), "{}: empty file, expected a header line with columns {}", file,
                 fmt::join(columns, ","));
  t.header = split(lines[0].second, ',');
  for (const auto& c : columns) {
    const auto it = std::find(t.header.begin(), t.header.end(), c);
    PACKPIPE_CHECK(it != t.header.end(), "{} line {}: missing column '{}'{}; header is '{}'", file, lines[0].first, c,
                   unit_hint(t.header, c), lines[0].second);
    t.index.push_back(static_cast<std::size_t>(it - t.header.begin()));
  }
  for (const auto& h : t.header) {
    PACKPIPE_CHECK(std::find(columns.begin(), columns.end(), h) != columns.end(),
                   "{} line {}: unexpected column '{}' (expected {})", file, lines[0].first, h, fmt::join(columns, ","));
  }
  for (std::size_t i = 1; i < lines.size(); ++i) {
    auto cells = split(lines[i].second, ',');
    PACKPIPE_CHECK(cells.size() == t.header.size(), "{} line {}: expected {} columns, found {}", file,
                   lines[i].first, t.header.size(), cells.size());
    t.rows.emplace_back(lines[i].first, std::move(cells));
  }
  PACKPIPE_CHECK(!t.rows.empty(), "{}: empty grid (a header and no rows)", file);
  return t;
}

Recompute rc_from(const std::string& s, const Where& w) {
  for (const auto& x : kRecomputeNames) {
    if (s == x.name) return x.value;
  }
  PACKPIPE_THROW(Error, "{} line {} column '{}': expected one of {}, found '{}'", w.file, w.line, w.column,
                 enum_name_list(kRecomputeNames), s);
}

LayerKind kind_from(const std::string& s, const Where& w, bool allow_embedding) {
  auto allowed = [&](LayerKind k) { return allow_embedding || k != LayerKind::Embedding; };
  for (const auto& x : kLayerKindNames) {
    if (allowed(x.value) && s == x.name) return x.value;
  }
  std::string expected;
  for (const auto& x : kLayerKindNames) {
    if (allowed(x.value)) expected += (expected.empty() ? "" : ", ") + std::string(x.name);
  }
  PACKPIPE_THROW(Error, "{} line {} column '{}': expected one of {}, found '{}'", w.file, w.line, w.column, expected,
                 s);
}

/// "gpt_6.7b" from "path/gpt_6.7b_timing.csv".
std::string dynapipe_model_name(const std::string& file) {
  std::string b = base_name(file);
  for (const char* suffix : {"_timing.csv", "_activation.csv", "_model_state.csv"}) {
    if (ends_with(b, suffix)) return b.substr(0, b.size() - std::string(suffix).size());
  }
  return "";
}

/// Sets (seq, dec_seq) of a DynaPipe row: decoder rows (enc, dec); T5 post-process (0, dec);
/// decoder-only rows (enc, 0).
void dynapipe_shape(ProfilePoint& p, std::int64_t enc, std::int64_t dec, const Where& w) {
  p.seq = enc;
  p.dec_seq = dec;
  if (p.kind == LayerKind::Decoder) {
    PACKPIPE_CHECK(enc > 0 && dec > 0, "{} line {}: decoder rows need positive enc_seqlen and dec_seqlen, found {} and {}",
                   w.file, w.line, enc, dec);
  } else {
    PACKPIPE_CHECK(enc > 0 || dec > 0, "{} line {}: enc_seqlen and dec_seqlen are both 0", w.file, w.line);
  }
}

// The data rows of a DynaPipe CSV whose first columns are tp, rc and lm_stage: each row's three
// parsed in column order, then handed with the row's cells to f(p, tp, rc, kind, cell, where, line).
template <class F>
Profile read_dynapipe_rows(const std::string& text, const std::string& file, const std::vector<std::string>& cols,
                           bool params, F&& f) {
  const Table t = read_table(text, file, cols);
  Profile p;
  p.model = dynapipe_model_name(file);
  p.sources.push_back(file);
  for (const auto& row_entry : t.rows) {
    const std::size_t line = row_entry.first;
    const auto& c = row_entry.second;
    auto cell = [&](std::size_t i) -> const std::string& { return c[t.index[i]]; };
    auto w = [&](std::size_t i) { return Where{file, line, cols[i]}; };
    const std::int64_t tp = to_positive(cell(0), w(0));
    const Recompute rc = rc_from(cell(1), w(1));
    const LayerKind kind = kind_from(cell(2), w(2), params);
    f(p, tp, rc, kind, cell, w, line);
  }
  return p;
}

Profile parse_dynapipe_timing(const std::string& text, const std::string& file) {
  static const std::vector<std::string> cols = {"tp",         "rc",         "lm_stage", "train_stage",
                                                "enc_seqlen", "dec_seqlen", "mbs",      "time_ms_per_layer"};
  return read_dynapipe_rows(text, file, cols, false,
                            [&](Profile& p, std::int64_t tp, Recompute rc, LayerKind kind, auto&& cell, auto&& w,
                                std::size_t line) {
                              ProfilePoint pt;
                              pt.tp = tp;
                              pt.rc = rc;
                              pt.kind = kind;
                              const std::string& stage = cell(3);
                              PACKPIPE_CHECK(stage == "forward" || stage == "backward",
                                             "{} line {} column 'train_stage': expected forward or backward, found '{}'",
                                             file, line, stage);
                              dynapipe_shape(pt, to_nonnegative(cell(4), w(4)), to_nonnegative(cell(5), w(5)), w(4));
                              pt.mbs = to_positive(cell(6), w(6));
                              const double ms = to_nonnegative_double(cell(7), w(7));
                              (stage == "forward" ? pt.fwd_ms : pt.bwd_ms) = ms;
                              p.points.push_back(pt);
                            });
}

/// DynaPipe's peak activation is one layer's absolute forward peak (its planner adds the other
/// layers' stored activations to it); packpipe's peak is the transient on top of the stored bytes.
double dynapipe_transient(double stored_bytes, double peak_bytes) { return std::max(0.0, peak_bytes - stored_bytes); }

Profile parse_dynapipe_activation(const std::string& text, const std::string& file) {
  static const std::vector<std::string> cols = {"tp",  "rc", "lm_stage", "enc_seqlen", "dec_seqlen",
                                                "mbs", "stored_activation_MB_per_layer", "peak_activation_MB"};
  return read_dynapipe_rows(text, file, cols, false,
                            [&](Profile& p, std::int64_t tp, Recompute rc, LayerKind kind, auto&& cell, auto&& w,
                                std::size_t) {
                              ProfilePoint pt;
                              pt.tp = tp;
                              pt.rc = rc;
                              pt.kind = kind;
                              dynapipe_shape(pt, to_nonnegative(cell(3), w(3)), to_nonnegative(cell(4), w(4)), w(3));
                              pt.mbs = to_positive(cell(5), w(5));
                              pt.stored_bytes = to_nonnegative_double(cell(6), w(6)) * kMB;
                              pt.peak_bytes = dynapipe_transient(pt.stored_bytes, to_nonnegative_double(cell(7), w(7)) * kMB);
                              p.points.push_back(pt);
                            });
}

Profile parse_dynapipe_model_state(const std::string& text, const std::string& file) {
  static const std::vector<std::string> cols = {"tp", "rc", "lm_stage", "param_MB_per_layer"};
  return read_dynapipe_rows(text, file, cols, true,
                            [&](Profile& p, std::int64_t tp, Recompute rc, LayerKind kind, auto&& cell, auto&& w,
                                std::size_t) {
                              ProfileParams pp;
                              pp.tp = tp;
                              pp.rc = rc;
                              pp.kind = kind;
                              pp.bytes = to_nonnegative_double(cell(3), w(3)) * kMB;
                              p.params.push_back(pp);
                            });
}

// ---- name parsing -------------------------------------------------------------------------------

/// Splits "a_b-c" into tokens on '_' and '-'.
std::vector<std::string> name_tokens(const std::string& stem) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : stem) {
    if (ch == '_' || ch == '-') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() < 16 && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

/// The integer after `prefix` in a token equal to prefix + digits, or -1.
std::int64_t token_value(const std::string& tok, const std::string& prefix) {
  if (!starts_with(tok, prefix)) return -1;
  const std::string rest = tok.substr(prefix.size());
  if (!all_digits(rest)) return -1;
  return std::strtoll(rest.c_str(), nullptr, 10);
}

/// Finds `prefix<digits>` among the tokens; -1 if absent.
std::int64_t find_token(const std::vector<std::string>& toks, const std::string& prefix) {
  for (const auto& t : toks) {
    const auto v = token_value(t, prefix);
    if (v >= 0) return v;
  }
  return -1;
}

std::string stem_of(const std::string& file, const std::string& ext) {
  std::string b = base_name(file);
  if (ends_with(b, ext)) b.resize(b.size() - ext.size());
  return b;
}

// ---- DynaPipe per-point microbenchmark files ----------------------------------------------------

struct MicrobenchName {
  std::int64_t tp = 0, hs = 0, ah = 0, kv = 0, ffhs = 0, sl = 0, dsl = 0, mbs = 0;
  Recompute rc = Recompute::None;
};

MicrobenchName parse_microbench_name(const std::string& file) {
  const std::string b = base_name(file);
  const std::string expected =
      "microbench_tp{T}_hs{H}_ah{A}_kv{K}_ffhs{F}_sl{L}[_{Ldec}]_mbs{m}[_rc_selective|_rc_full_uniform].txt";
  PACKPIPE_CHECK(starts_with(b, "microbench_") && ends_with(b, ".txt"), "{}: file name does not match {}", file,
                 expected);
  std::string stem = b.substr(11, b.size() - 11 - 4);
  MicrobenchName n;
  if (ends_with(stem, "_rc_selective")) {
    n.rc = Recompute::Selective;
    stem.resize(stem.size() - 13);
  } else if (ends_with(stem, "_rc_full_uniform")) {
    n.rc = Recompute::Full;
    stem.resize(stem.size() - 16);
  }
  const auto toks = split(stem, '_');
  // tp, hs, ah, kv, ffhs, sl, [dec], mbs
  const std::vector<std::string> keys = {"tp", "hs", "ah", "kv", "ffhs", "sl"};
  PACKPIPE_CHECK(toks.size() == 7 || toks.size() == 8, "{}: file name does not match {}", file, expected);
  std::int64_t* fields[] = {&n.tp, &n.hs, &n.ah, &n.kv, &n.ffhs, &n.sl};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    *fields[i] = token_value(toks[i], keys[i]);
    PACKPIPE_CHECK(*fields[i] > 0, "{}: expected '{}<positive integer>' in the name, found '{}' (pattern {})", file,
                   keys[i], toks[i], expected);
  }
  if (toks.size() == 8) {
    PACKPIPE_CHECK(all_digits(toks[6]) && std::strtoll(toks[6].c_str(), nullptr, 10) > 0,
                   "{}: expected the decoder length after sl{}, found '{}' (pattern {})", file, n.sl, toks[6], expected);
    n.dsl = std::strtoll(toks[6].c_str(), nullptr, 10);
  }
  n.mbs = token_value(toks.back(), "mbs");
  PACKPIPE_CHECK(n.mbs > 0, "{}: expected 'mbs<positive integer>' in the name, found '{}' (pattern {})", file,
                 toks.back(), expected);
  return n;
}

enum class Dim { Time, Memory };

/// Value of `value unit` in ms or bytes; strict about the unit's dimension.
double convert_unit(double v, const std::string& unit, Dim dim, const std::string& file, std::size_t line,
                    const std::string& name) {
  if (dim == Dim::Time) {
    if (unit == "ms") return v;
    if (unit == "us" || unit == "\xC2\xB5s") return v / 1e3;
    if (unit == "ns") return v / 1e6;
    if (unit == "s") return v * 1e3;
    PACKPIPE_THROW(Error, "{} line {}: '{}' is a time; expected unit ms (or us, ns, s), found '{}'", file, line, name,
                   unit);
  }
  if (unit == "MB") return v * kMB;
  if (unit == "MiB") return v * kMiB;
  if (unit == "GB") return v * 1e9;
  if (unit == "GiB") return v * kGiB;
  if (unit == "B" || unit == "bytes") return v;
  PACKPIPE_THROW(Error, "{} line {}: '{}' is a memory size; expected unit MB (or MiB, GB, GiB, bytes), found '{}'",
                 file, line, name, unit);
}

Profile parse_dynapipe_microbench(const std::string& text, const std::string& file) {
  const MicrobenchName n = parse_microbench_name(file);
  const bool enc_dec = n.dsl > 0;
  Profile p;
  p.sources.push_back(file);
  p.model = fmt::format("hs{}_ah{}_kv{}_ffhs{}", n.hs, n.ah, n.kv, n.ffhs);
  std::map<LayerKind, ProfilePoint> pts;
  auto point = [&](LayerKind k) -> ProfilePoint& {
    auto it = pts.find(k);
    if (it != pts.end()) return it->second;
    ProfilePoint pt;
    pt.kind = k;
    pt.tp = n.tp;
    pt.rc = n.rc;
    pt.mbs = n.mbs;
    if (k == LayerKind::Decoder) {
      pt.seq = n.sl;
      pt.dec_seq = n.dsl;
    } else if (k == LayerKind::PostProcess && enc_dec) {
      pt.seq = 0;
      pt.dec_seq = n.dsl;
    } else {
      pt.seq = n.sl;
    }
    return pts.emplace(k, pt).first->second;
  };
  std::map<std::string, std::size_t> seen;
  std::map<LayerKind, std::pair<double, int>> params;
  for (const auto& [line, raw] : lines_of(text)) {
    const auto colon = raw.find(':');
    PACKPIPE_CHECK(colon != std::string::npos, "{} line {}: expected 'name: value unit', found '{}'", file, line, raw);
    const std::string name = trim(raw.substr(0, colon));
    const std::string rest = trim(raw.substr(colon + 1));
    const auto space = rest.find_first_of(" \t");
    PACKPIPE_CHECK(space != std::string::npos, "{} line {}: '{}' has no unit (expected 'name: value unit')", file,
                   line, name);
    const std::string value_text = trim(rest.substr(0, space));
    const std::string unit = trim(rest.substr(space + 1));
    const double v = to_double(value_text, Where{file, line, name});
    PACKPIPE_CHECK(v >= 0, "{} line {}: '{}' must not be negative, found {}", file, line, name, v);
    PACKPIPE_CHECK(seen.emplace(name, line).second, "{} line {}: '{}' repeats line {}", file, line, name, seen[name]);
    struct Field {
      const char* name;
      LayerKind kind;
      int what;  // 0 fwd, 1 bwd, 2 stored, 3 peak
    };
    static const Field fields[] = {
        {"forward_encoder", LayerKind::Encoder, 0},       {"backward_encoder", LayerKind::Encoder, 1},
        {"forward_decoder", LayerKind::Decoder, 0},       {"backward_decoder", LayerKind::Decoder, 1},
        {"forward_postprocess", LayerKind::PostProcess, 0}, {"backward_postprocess", LayerKind::PostProcess, 1},
        {"encoder_activation", LayerKind::Encoder, 2},    {"decoder_activation", LayerKind::Decoder, 2},
        {"peak_encoder_activation", LayerKind::Encoder, 3}, {"peak_decoder_activation", LayerKind::Decoder, 3},
    };
    bool known = false;
    for (const auto& f : fields) {
      if (name != f.name) continue;
      known = true;
      PACKPIPE_CHECK(f.kind != LayerKind::Decoder || enc_dec,
                     "{} line {}: '{}' in a decoder-only profile (the name has no decoder length)", file, line, name);
      ProfilePoint& pt = point(f.kind);
      switch (f.what) {
        case 0: pt.fwd_ms = convert_unit(v, unit, Dim::Time, file, line, name); break;
        case 1: pt.bwd_ms = convert_unit(v, unit, Dim::Time, file, line, name); break;
        case 2: pt.stored_bytes = convert_unit(v, unit, Dim::Memory, file, line, name); break;
        default: pt.peak_bytes = convert_unit(v, unit, Dim::Memory, file, line, name); break;
      }
    }
    if (!known) {
      const std::pair<const char*, LayerKind> model_fields[] = {{"model_embedding", LayerKind::Embedding},
                                                                 {"model_encoder", LayerKind::Encoder},
                                                                 {"model_decoder", LayerKind::Decoder}};
      for (const auto& [prefix, kind] : model_fields) {
        if (!starts_with(name, prefix)) continue;
        known = true;
        auto& acc = params[kind];
        acc.first += convert_unit(v, unit, Dim::Memory, file, line, name);
        acc.second += 1;
      }
    }
    PACKPIPE_CHECK(known,
                   "{} line {}: unknown field '{}' (expected forward_/backward_{{encoder,decoder,postprocess}}, "
                   "encoder_activation, decoder_activation, peak_{{encoder,decoder}}_activation, model_*)",
                   file, line, name);
  }
  PACKPIPE_CHECK(!pts.empty(), "{}: no timing or activation fields", file);
  for (auto& [k, pt] : pts) {
    if (!std::isnan(pt.stored_bytes) && !std::isnan(pt.peak_bytes)) pt.peak_bytes = dynapipe_transient(pt.stored_bytes, pt.peak_bytes);
    p.points.push_back(pt);
  }
  for (const auto& [k, acc] : params) {
    // Several model_encoder* lines (e.g. per-rank figures) are averaged, as DynaPipe does.
    p.params.push_back(ProfileParams{k, n.tp, n.rc, acc.first / acc.second});
  }
  return p;
}

// ---- Aceso --------------------------------------------------------------------------------------

struct AcesoName {
  std::string model;
  std::int64_t mbs = 0, tp = 0, algo = 0;
};

AcesoName parse_aceso_name(const std::string& file) {
  const std::string stem = stem_of(file, ".csv");
  const auto toks = split(stem, '_');
  const char* pattern = "<model>_<size>_mbs<B>_tp<T>_algo<A>.csv";
  PACKPIPE_CHECK(toks.size() >= 4, "{}: file name does not match {}", file, pattern);
  AcesoName n;
  n.mbs = token_value(toks[toks.size() - 3], "mbs");
  n.tp = token_value(toks[toks.size() - 2], "tp");
  n.algo = token_value(toks[toks.size() - 1], "algo");
  PACKPIPE_CHECK(n.mbs > 0 && n.tp > 0 && n.algo >= 0, "{}: file name does not match {}", file, pattern);
  for (std::size_t i = 0; i + 3 < toks.size(); ++i) n.model += (i ? "_" : "") + toks[i];
  return n;
}

Profile parse_aceso_ops(const std::string& text, const std::string& file, const ProfileReadOptions& opt) {
  static const std::vector<std::string> cols = {"op_name",     "forward-compute", "backward-compute",
                                                "input_size",  "output_size",     "weights",
                                                "activations", "fwd_reserved",    "bwd_reserved"};
  const AcesoName n = parse_aceso_name(file);
  const Table t = read_table(text, file, cols);
  struct Acc {
    double fwd_us = 0, bwd_us = 0, act_mib = 0, peak_mib = 0, weights_mib = 0;
    int ops = 0;
    bool oom = false;
  };
  std::map<LayerKind, Acc> acc;
  bool enc_dec = false;
  for (const auto& row_entry : t.rows) {
    if (row_entry.second[t.index[0]] == "decoder-embedding") enc_dec = true;
  }
  for (const auto& row_entry : t.rows) {
    const std::size_t line = row_entry.first;
    const auto& c = row_entry.second;
    auto cell = [&](std::size_t i) -> const std::string& { return c[t.index[i]]; };
    auto num = [&](std::size_t i) { return to_nonnegative_double(cell(i), Where{file, line, cols[i]}); };
    const std::string& op = cell(0);
    LayerKind k;
    if (op == "encoder-embedding" || op == "decoder-embedding") {
      k = LayerKind::Embedding;
    } else if (op == "final-layernorm" || op == "enc-final-layernorm" || op == "dec-final-layernorm" ||
               ends_with(op, "-post-process")) {
      k = LayerKind::PostProcess;
    } else if (starts_with(op, "enc-")) {
      k = LayerKind::Encoder;
    } else if (starts_with(op, "dec-")) {
      k = LayerKind::Decoder;
    } else {
      PACKPIPE_THROW(Error, "{} line {} column 'op_name': unknown op '{}' (expected embedding, enc-*, dec-*, "
                     "final-layernorm or *-post-process)", file, line, op);
    }
    Acc& a = acc[k];
    const double f = num(1), b = num(2);
    if (f >= kAcesoOom || b >= kAcesoOom) a.oom = true;
    a.fwd_us += f;
    a.bwd_us += b;
    // The softmax output is the dropout's input: Aceso counts it 0 in the stored activations.
    if (op.find("softmax") == std::string::npos) a.act_mib += num(6);
    a.peak_mib = std::max({a.peak_mib, num(7), num(8)});
    a.weights_mib += num(5);
    a.ops += 1;
  }
  const int want_enc = 13, want_dec = 21;
  PACKPIPE_CHECK(acc[LayerKind::Encoder].ops == want_enc, "{}: expected {} encoder-layer ops (enc-*), found {}", file,
                 want_enc, acc[LayerKind::Encoder].ops);
  if (enc_dec) {
    PACKPIPE_CHECK(acc[LayerKind::Decoder].ops == want_dec, "{}: expected {} decoder-layer ops (dec-*), found {}",
                   file, want_dec, acc[LayerKind::Decoder].ops);
  } else {
    PACKPIPE_CHECK(acc[LayerKind::Decoder].ops == 0, "{}: decoder ops (dec-*) without a decoder-embedding row", file);
    acc.erase(LayerKind::Decoder);
  }
  const std::int64_t seq = opt.seq > 0 ? opt.seq : 2048;
  const std::int64_t dec = enc_dec ? (opt.dec_seq > 0 ? opt.dec_seq : 512) : 0;
  Profile p;
  p.model = n.model;
  p.sources.push_back(file);
  for (const auto& [k, a] : acc) {
    if (a.ops == 0) continue;
    ProfileParams pp{k, n.tp, Recompute::None, a.weights_mib * kMiB};
    if (n.algo == 0) p.params.push_back(pp);
    if (a.oom) {
      p.notes.push_back(fmt::format("{}: {} marked out of memory (1e7), skipped", file, layer_kind_name(k)));
      continue;
    }
    ProfilePoint pt;
    pt.kind = k;
    pt.tp = n.tp;
    pt.variant = n.algo;
    pt.mbs = n.mbs;
    pt.seq = (k == LayerKind::PostProcess && enc_dec) ? 0 : seq;
    pt.dec_seq = (k == LayerKind::Decoder || (k == LayerKind::PostProcess && enc_dec)) ? dec : 0;
    if (k == LayerKind::Embedding && enc_dec) pt.dec_seq = dec;
    pt.fwd_ms = a.fwd_us / 1e3;
    pt.bwd_ms = a.bwd_us / 1e3;
    pt.stored_bytes = a.act_mib * kMiB;
    pt.peak_bytes = a.peak_mib * kMiB;
    p.points.push_back(pt);
  }
  return p;
}

const char* const kCollectives[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"};

Profile parse_aceso_prim(const std::string& text, const std::string& file) {
  const std::string stem = stem_of(file, ".csv");
  const char* pattern = "prim_<model>_<size>_<collective>_<N>gpus.csv";
  PACKPIPE_CHECK(starts_with(stem, "prim_"), "{}: file name does not match {}", file, pattern);
  const auto last = stem.find_last_of('_');
  PACKPIPE_CHECK(last != std::string::npos && ends_with(stem, "gpus"), "{}: file name does not match {}", file, pattern);
  const std::string ng = stem.substr(last + 1, stem.size() - last - 1 - 4);
  PACKPIPE_CHECK(all_digits(ng) && std::strtoll(ng.c_str(), nullptr, 10) > 1, "{}: expected <N>gpus with N > 1, found '{}'",
                 file, stem.substr(last + 1));
  const std::string head = stem.substr(0, last);
  std::string coll;
  for (const char* c : kCollectives) {
    if (ends_with(head, std::string("_") + c)) {
      coll = c;
      break;
    }
  }
  PACKPIPE_CHECK(!coll.empty(), "{}: unknown collective in the name (expected all_reduce, all_gather, reduce_scatter, "
                 "all_to_all)", file);
  static const std::vector<std::string> cols = {"data_size(MB)", "time(ms)"};
  const Table t = read_table(text, file, cols);
  Profile p;
  p.sources.push_back(file);
  p.model = head.substr(5, head.size() - 5 - coll.size() - 1);
  std::size_t missing = 0;
  for (const auto& row_entry : t.rows) {
    const std::size_t line = row_entry.first;
    const auto& c = row_entry.second;
    const double mib = to_nonnegative_double(c[t.index[0]], Where{file, line, cols[0]});
    const double ms = to_nonnegative_double(c[t.index[1]], Where{file, line, cols[1]});
    if (ms >= kAcesoPrimMissing) {
      ++missing;
      continue;
    }
    // Aceso labels the column MB but the sizes are op output sizes in MiB.
    p.comm.push_back(CommSample{coll, std::strtoll(ng.c_str(), nullptr, 10), false, mib * kMiB, ms});
  }
  if (missing) p.notes.push_back(fmt::format("{}: {} sizes marked failed (>= 1e7 ms), skipped", file, missing));
  return p;
}

Profile parse_aceso_p2p(const std::string& text, const std::string& file) {
  const std::string b = base_name(file);
  const bool inter = b.find("inter") != std::string::npos;
  const auto lines = lines_of(text);
  PACKPIPE_CHECK(lines.size() == 2, "{}: expected 2 lines (sizes in MiB, bandwidth in GiB/s), found {}", file,
                 lines.size());
  const auto sizes = split(lines[0].second, ',');
  const auto bws = split(lines[1].second, ',');
  PACKPIPE_CHECK(sizes.size() == bws.size(), "{} line {}: {} bandwidths for {} sizes", file, lines[1].first,
                 bws.size(), sizes.size());
  Profile p;
  p.sources.push_back(file);
  const std::string size_col = "size_MiB", bw_col = "bandwidth_GiB_per_s";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const double mib = to_nonnegative_double(sizes[i], Where{file, lines[0].first, size_col});
    const double gibs = to_double(bws[i], Where{file, lines[1].first, bw_col});
    PACKPIPE_CHECK(gibs > 0, "{} line {} column {}: bandwidth must be positive, found {}", file, lines[1].first, i + 1,
                   gibs);
    const double bytes = mib * kMiB;
    p.comm.push_back(CommSample{"p2p", 2, inter, bytes, bytes / (gibs * kGiB) * 1e3});
  }
  return p;
}

// ---- Metis --------------------------------------------------------------------------------------

const nlohmann::json& jget(const nlohmann::json& j, const std::string& key, const std::string& path,
                           const std::string& file) {
  PACKPIPE_CHECK(j.is_object() && j.contains(key), "{}: missing field '{}{}'", file, path, key);
  return j.at(key);
}

std::vector<double> jnumbers(const nlohmann::json& j, const std::string& what, const std::string& file) {
  PACKPIPE_CHECK(j.is_array(), "{}: '{}' must be an array, found {}", file, what, j.type_name());
  std::vector<double> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    PACKPIPE_CHECK(j[i].is_number(), "{}: '{}[{}]' must be a number, found {}", file, what, i, j[i].dump());
    const double v = j[i].get<double>();
    PACKPIPE_CHECK(std::isfinite(v) && v >= 0, "{}: '{}[{}]' must be a non-negative number, found {}", file, what, i, v);
    out.push_back(v);
  }
  return out;
}

double jnumber(const nlohmann::json& j, const std::string& what, const std::string& file) {
  PACKPIPE_CHECK(j.is_number(), "{}: '{}' must be a number, found {}", file, what, j.dump());
  return j.get<double>();
}

nlohmann::json parse_json(const std::string& text, const std::string& file) {
  return packpipe::parse_json(text, file);  // duplicate keys refused, depth bounded
}

Profile parse_metis(const std::string& text, const std::string& file, const ProfileReadOptions& opt) {
  const std::string stem = stem_of(file, ".json");
  const char* pattern = "DeviceType.<DEV>_tp<t>_bs<b>.json";
  PACKPIPE_CHECK(starts_with(stem, "DeviceType."), "{}: file name does not match {}", file, pattern);
  const auto toks = name_tokens(stem.substr(11));
  PACKPIPE_CHECK(toks.size() >= 3, "{}: file name does not match {}", file, pattern);
  const std::int64_t tp = find_token(toks, "tp"), bs = find_token(toks, "bs");
  PACKPIPE_CHECK(tp > 0 && bs > 0, "{}: file name does not match {} (tp and bs must be positive)", file, pattern);
  std::int64_t seq = opt.seq > 0 ? opt.seq : find_token(toks, "seq");
  PACKPIPE_CHECK(seq > 0, "{}: Metis profiles do not record the sequence length: pass it (--seq) or add _seq<S> to the "
                 "name", file);
  const nlohmann::json j = parse_json(text, file);
  const auto& model = jget(j, "model", "", file);
  const auto& et = jget(j, "execution_time", "", file);
  const auto& em = jget(j, "execution_memory", "", file);
  const auto& params = jget(jget(model, "parameters", "model.", file), "parameters_per_layer_bytes",
                            "model.parameters.", file);
  const auto& nl = jget(model, "num_layers", "model.", file);
  PACKPIPE_CHECK(nl.is_number_integer() && nl.get<std::int64_t>() >= 3,
                 "{}: 'model.num_layers' must be an integer >= 3 (embedding, blocks, head), found {}", file, nl.dump());
  const auto L = static_cast<std::size_t>(nl.get<std::int64_t>());
  const auto compute = jnumbers(jget(et, "layer_compute_total_ms", "execution_time.", file),
                                "execution_time.layer_compute_total_ms", file);
  const auto pbytes = jnumbers(params, "model.parameters.parameters_per_layer_bytes", file);
  const auto mem = jnumbers(jget(em, "layer_memory_total_mb", "execution_memory.", file),
                            "execution_memory.layer_memory_total_mb", file);
  for (const auto& [v, what] : {std::pair<std::size_t, const char*>{compute.size(), "execution_time.layer_compute_total_ms"},
                                {pbytes.size(), "model.parameters.parameters_per_layer_bytes"},
                                {mem.size(), "execution_memory.layer_memory_total_mb"}}) {
    PACKPIPE_CHECK(v == L, "{}: '{}' has {} entries, expected model.num_layers = {}", file, what, v, L);
  }
  // Read and checked for type though the per-layer model does not use them.
  for (const char* k : {"forward_backward_time_ms", "batch_generator_time_ms", "optimizer_time_ms"}) {
    jnumber(jget(et, k, "execution_time.", file), std::string("execution_time.") + k, file);
  }
  Profile p;
  p.sources.push_back(file);
  if (model.contains("model_name") && model["model_name"].is_string()) p.model = model["model_name"].get<std::string>();
  p.device = toks[0];
  p.notes.push_back(fmt::format("{}: Metis gives forward+backward per layer; split 1:2 (backward = 2 x forward); "
                                "layer_memory_total_mb includes parameters and optimizer state, so memory is not "
                                "taken from it", file));
  for (std::size_t i = 0; i < L; ++i) {
    ProfilePoint pt;
    pt.kind = i == 0 ? LayerKind::Embedding : (i + 1 == L ? LayerKind::PostProcess : LayerKind::Encoder);
    pt.tp = tp;
    pt.mbs = bs;
    pt.seq = seq;
    pt.fwd_ms = compute[i] / 3.0;
    pt.bwd_ms = compute[i] * 2.0 / 3.0;
    p.points.push_back(pt);
    // Metis stores unsharded parameter bytes (identical across tp); packpipe keeps per-GPU bytes.
    if (i <= 1 || i + 1 == L) p.params.push_back(ProfileParams{pt.kind, tp, Recompute::None, pbytes[i] / static_cast<double>(tp)});
  }
  return p;
}

// ---- AIOB ---------------------------------------------------------------------------------------

Profile parse_aiob(const std::string& text, const std::string& file, const ProfileReadOptions& opt) {
  const auto toks = name_tokens(stem_of(file, ".txt"));
  const std::int64_t tp = opt.tp > 0 ? opt.tp : find_token(toks, "tp");
  const std::int64_t mbs = opt.mbs > 0 ? opt.mbs : find_token(toks, "mbs");
  const std::int64_t seq = opt.seq > 0 ? opt.seq : find_token(toks, "seq");
  PACKPIPE_CHECK(tp > 0 && mbs > 0 && seq > 0,
                 "{}: AIOB files do not record the shape: name must contain tp<T>, mbs<B> and seq<S> (or pass --tp, "
                 "--mbs, --seq); found tp {}, mbs {}, seq {}", file, tp, mbs, seq);
  static const std::vector<std::string> kernels = {"Emb",          "layernorm",    "atten_qkv",    "atten_flash",
                                                   "atten_linear", "layernorm2",   "mlp_linear_1", "mlp_gelu",
                                                   "mlp_linear_2", "layernorm_post", "logit_time", "param_time"};
  static const std::vector<std::string> stats = {"time_gpu_max", "time_gpu_min", "time_gpu_avg"};
  std::map<std::string, std::map<std::string, double>> sections;
  std::map<std::string, std::size_t> section_line;
  std::string current;
  bool have_iter = false;
  for (const auto& [line, raw] : lines_of(text)) {
    const std::string s = trim(raw);
    const auto colon = s.find(':');
    PACKPIPE_CHECK(colon != std::string::npos, "{} line {}: expected 'name:' or 'time_gpu_*: value', found '{}'", file,
                   line, s);
    const std::string key = trim(s.substr(0, colon));
    const std::string value = trim(s.substr(colon + 1));
    if (key == "train_iter") {
      PACKPIPE_CHECK(!have_iter && current.empty(), "{} line {}: 'train_iter' must come once, first", file, line);
      to_positive(value, Where{file, line, key});
      have_iter = true;
      continue;
    }
    if (value.empty()) {
      PACKPIPE_CHECK(std::find(kernels.begin(), kernels.end(), key) != kernels.end(),
                     "{} line {}: unknown section '{}' (expected {})", file, line, key, fmt::join(kernels, ", "));
      PACKPIPE_CHECK(!sections.count(key), "{} line {}: section '{}' repeats line {}", file, line, key, section_line[key]);
      sections[key];
      section_line[key] = line;
      current = key;
      continue;
    }
    PACKPIPE_CHECK(!current.empty(), "{} line {}: '{}' outside a section", file, line, key);
    PACKPIPE_CHECK(std::find(stats.begin(), stats.end(), key) != stats.end(),
                   "{} line {}: unknown field '{}' in section '{}' (expected time_gpu_max, time_gpu_min, time_gpu_avg; "
                   "microseconds)", file, line, key, current);
    PACKPIPE_CHECK(!sections[current].count(key), "{} line {}: '{}' repeats in section '{}'", file, line, key, current);
    sections[current][key] = to_nonnegative_double(value, Where{file, line, key});
  }
  PACKPIPE_CHECK(have_iter, "{}: missing 'train_iter:<n>' line", file);
  for (const auto& k : kernels) {
    PACKPIPE_CHECK(sections.count(k), "{}: missing section '{}'", file, k);
    PACKPIPE_CHECK(sections[k].count("time_gpu_avg"), "{} line {}: section '{}' has no time_gpu_avg", file,
                   section_line[k], k);
  }
  auto us = [&](const char* k) { return sections[k]["time_gpu_avg"]; };
  const double attention = us("layernorm") + us("atten_qkv") + us("atten_flash") + us("atten_linear");
  const double mlp = us("layernorm2") + us("mlp_linear_1") + us("mlp_gelu") + us("mlp_linear_2");
  Profile p;
  p.sources.push_back(file);
  p.notes.push_back(fmt::format("{}: AIOB times are microseconds (time_gpu_avg); backward set equal to forward, as "
                                "AIOB does", file));
  auto add = [&](LayerKind k, double fwd_us) {
    ProfilePoint pt;
    pt.kind = k;
    pt.tp = tp;
    pt.mbs = mbs;
    pt.seq = seq;
    pt.fwd_ms = fwd_us / 1e3;
    pt.bwd_ms = fwd_us / 1e3;
    p.points.push_back(pt);
  };
  add(LayerKind::Embedding, us("Emb"));
  add(LayerKind::Encoder, attention + mlp);
  add(LayerKind::PostProcess, us("layernorm_post") + us("logit_time"));
  return p;
}

// ---- AICB run log -------------------------------------------------------------------------------

Profile parse_aicb_log(const std::string& text, const std::string& file) {
  static const std::vector<std::string> cols = {"comm_type", "comm_group", "comm_group_size", "msg_size",
                                                "stage",     "dst",        "src",             "additional",
                                                "_elapsed_time", "algbw",  "busbw",           "count"};
  std::string body = text;
  // Workload files start with a "[rank0 ~ rank127]" banner.
  if (!body.empty() && body[0] == '[') {
    const auto nl = body.find('\n');
    body = nl == std::string::npos ? std::string() : body.substr(nl + 1);
  }
  const Table t = read_table(body, file, cols);
  Profile p;
  p.sources.push_back(file);
  std::size_t skipped = 0;
  for (const auto& row_entry : t.rows) {
    const std::size_t line = row_entry.first;
    const auto& c = row_entry.second;
    auto cell = [&](std::size_t i) -> const std::string& { return c[t.index[i]]; };
    const std::string& type = cell(0);
    PACKPIPE_CHECK(starts_with(type, "CommType."), "{} line {} column 'comm_type': expected CommType.<name>, found '{}'",
                   file, line, type);
    const std::string coll = type.substr(9);
    const bool is_coll = std::find(std::begin(kCollectives), std::end(kCollectives), coll) != std::end(kCollectives);
    if (!is_coll || starts_with(cell(4), "init") || cell(2) == "None" || cell(8) == "None") {
      ++skipped;
      continue;
    }
    const std::int64_t n = to_positive(cell(2), Where{file, line, cols[2]});
    const double bytes = to_nonnegative_double(cell(3), Where{file, line, cols[3]});
    const double ms = to_nonnegative_double(cell(8), Where{file, line, cols[8]});
    p.comm.push_back(CommSample{coll, n, false, bytes, ms});
  }
  p.notes.push_back(fmt::format("{}: {} collectives read (msg_size bytes, _elapsed_time ms); {} rows skipped "
                                "(init, non-collective, unknown group size)", file, p.comm.size(), skipped));
  return p;
}

// ---- packpipe's own file ------------------------------------------------------------------------

const std::vector<std::string> kPointColumns = {"kind",   "tp",      "rc",     "variant",      "mbs",       "seq",
                                                "dec_seq", "fwd_ms", "bwd_ms", "stored_bytes", "peak_bytes"};
const std::vector<std::string> kParamColumns = {"kind", "tp", "rc", "bytes"};
const std::vector<std::string> kCommColumns = {"collective", "group_size", "inter_node", "bytes", "ms"};

nlohmann::json num_or_null(double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); }

void check_columns(const nlohmann::json& j, const char* key, const std::vector<std::string>& want,
                   const std::string& file) {
  const auto& c = jget(j, key, "", file);
  PACKPIPE_CHECK(c.is_array() && c.size() == want.size(), "{}: '{}' must be {}", file, key, nlohmann::json(want).dump());
  for (std::size_t i = 0; i < want.size(); ++i) {
    PACKPIPE_CHECK(c[i].is_string() && c[i].get<std::string>() == want[i], "{}: '{}[{}]' must be '{}', found {}", file,
                   key, i, want[i], c[i].dump());
  }
}

Profile parse_packpipe(const std::string& text, const std::string& file) {
  const nlohmann::json j = parse_json(text, file);
  PACKPIPE_CHECK(j.is_object() && j.value("format", "") == "packpipe-profile",
                 "{}: not a packpipe profile (expected \"format\": \"packpipe-profile\")", file);
  const auto& ver = jget(j, "version", "", file);
  PACKPIPE_CHECK(ver.is_number_integer() && ver.get<int>() == 1, "{}: unsupported version {} (expected 1)", file,
                 ver.dump());
  const auto& units = jget(j, "units", "", file);
  const auto& tu = jget(units, "time", "units.", file);
  const auto& mu = jget(units, "memory", "units.", file);
  PACKPIPE_CHECK(tu.is_string() && tu.get<std::string>() == "ms", "{}: 'units.time' must be \"ms\", found {}", file,
                 tu.dump());
  PACKPIPE_CHECK(mu.is_string() && mu.get<std::string>() == "bytes", "{}: 'units.memory' must be \"bytes\", found {}",
                 file, mu.dump());
  check_columns(j, "point_columns", kPointColumns, file);
  check_columns(j, "param_columns", kParamColumns, file);
  check_columns(j, "comm_columns", kCommColumns, file);
  Profile p;
  p.sources.push_back(file);
  if (j.contains("model") && j["model"].is_string()) p.model = j["model"].get<std::string>();
  if (j.contains("device") && j["device"].is_string()) p.device = j["device"].get<std::string>();
  auto str_list = [&](const char* key, std::vector<std::string>& out) {
    if (!j.contains(key)) return;
    PACKPIPE_CHECK(j[key].is_array(), "{}: '{}' must be an array of strings", file, key);
    for (const auto& s : j[key]) {
      PACKPIPE_CHECK(s.is_string(), "{}: '{}' must be an array of strings", file, key);
      out.push_back(s.get<std::string>());
    }
  };
  str_list("notes", p.notes);
  if (j.contains("attention")) {
    const auto& a = j["attention"];
    PACKPIPE_CHECK(a.is_string(), "{}: 'attention' must be one of {} (the kernel the points were measured with), found {}",
                   file, enum_name_list(kAttentionKernelNames), a.dump());
    bool found = false;
    for (const auto& e : kAttentionKernelNames) {
      if (a.get<std::string>() == e.name) {
        p.attention = e.value;
        found = true;
      }
    }
    PACKPIPE_CHECK(found, "{}: 'attention' must be one of {} (the kernel the points were measured with), found {}", file,
                   enum_name_list(kAttentionKernelNames), a.dump());
  }
  auto rows = [&](const char* key, std::size_t ncols) -> const nlohmann::json& {
    const auto& r = jget(j, key, "", file);
    PACKPIPE_CHECK(r.is_array(), "{}: '{}' must be an array of rows", file, key);
    for (std::size_t i = 0; i < r.size(); ++i) {
      PACKPIPE_CHECK(r[i].is_array() && r[i].size() == ncols, "{}: '{}' row {} must be an array of {} values", file,
                     key, i, ncols);
    }
    return r;
  };
  auto cell_str = [&](const nlohmann::json& v, const char* key, std::size_t row, const std::string& col) {
    PACKPIPE_CHECK(v.is_string(), "{}: '{}' row {} column '{}' must be a string, found {}", file, key, row, col, v.dump());
    return v.get<std::string>();
  };
  auto cell_int = [&](const nlohmann::json& v, const char* key, std::size_t row, const std::string& col, std::int64_t lo) {
    PACKPIPE_CHECK(v.is_number_integer() && v.get<std::int64_t>() >= lo,
                   "{}: '{}' row {} column '{}' must be an integer >= {}, found {}", file, key, row, col, lo, v.dump());
    return v.get<std::int64_t>();
  };
  auto cell_num = [&](const nlohmann::json& v, const char* key, std::size_t row, const std::string& col, bool nullable) {
    if (nullable && v.is_null()) return kNotMeasured;
    PACKPIPE_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0,
                   "{}: '{}' row {} column '{}' must be a non-negative number{}, found {}", file, key, row, col,
                   nullable ? " or null" : "", v.dump());
    return v.get<double>();
  };
  auto kind_of = [&](const std::string& s, const char* key, std::size_t row) {
    for (const auto& x : kLayerKindNames) {
      if (s == x.name) return x.value;
    }
    PACKPIPE_THROW(Error, "{}: '{}' row {} column 'kind': unknown layer kind '{}'", file, key, row, s);
  };
  auto rc_of = [&](const std::string& s, const char* key, std::size_t row) {
    return rc_from(s, Where{file, row, std::string(key) + ".rc"});
  };
  const auto& pts = rows("points", kPointColumns.size());
  for (std::size_t i = 0; i < pts.size(); ++i) {
    const auto& r = pts[i];
    ProfilePoint pt;
    pt.kind = kind_of(cell_str(r[0], "points", i, "kind"), "points", i);
    pt.tp = cell_int(r[1], "points", i, "tp", 1);
    pt.rc = rc_of(cell_str(r[2], "points", i, "rc"), "points", i);
    pt.variant = cell_int(r[3], "points", i, "variant", 0);
    pt.mbs = cell_int(r[4], "points", i, "mbs", 1);
    pt.seq = cell_int(r[5], "points", i, "seq", 0);
    pt.dec_seq = cell_int(r[6], "points", i, "dec_seq", 0);
    PACKPIPE_CHECK(pt.seq > 0 || pt.dec_seq > 0, "{}: 'points' row {}: seq and dec_seq are both 0", file, i);
    pt.fwd_ms = cell_num(r[7], "points", i, "fwd_ms", true);
    pt.bwd_ms = cell_num(r[8], "points", i, "bwd_ms", true);
    pt.stored_bytes = cell_num(r[9], "points", i, "stored_bytes", true);
    pt.peak_bytes = cell_num(r[10], "points", i, "peak_bytes", true);
    p.points.push_back(pt);
  }
  const auto& prs = rows("params", kParamColumns.size());
  for (std::size_t i = 0; i < prs.size(); ++i) {
    const auto& r = prs[i];
    p.params.push_back(ProfileParams{kind_of(cell_str(r[0], "params", i, "kind"), "params", i),
                                     cell_int(r[1], "params", i, "tp", 1),
                                     rc_of(cell_str(r[2], "params", i, "rc"), "params", i),
                                     cell_num(r[3], "params", i, "bytes", false)});
  }
  const auto& cms = rows("comm", kCommColumns.size());
  for (std::size_t i = 0; i < cms.size(); ++i) {
    const auto& r = cms[i];
    PACKPIPE_CHECK(r[2].is_boolean(), "{}: 'comm' row {} column 'inter_node' must be true or false", file, i);
    p.comm.push_back(CommSample{cell_str(r[0], "comm", i, "collective"), cell_int(r[1], "comm", i, "group_size", 1),
                                r[2].get<bool>(), cell_num(r[3], "comm", i, "bytes", false),
                                cell_num(r[4], "comm", i, "ms", false)});
  }
  return p;
}

std::string first_line(const std::string& text) {
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string l = trim(text.substr(start, end - start));
    if (!l.empty()) return l;
    start = end + 1;
  }
  return "";
}

// A profile file's text: a regular file (a FIFO or directory is refused, never waited on), not
// empty, with a UTF-8 byte-order mark removed (spreadsheet exports write one).
std::string read_whole(const std::string& path) {
  std::string text = read_regular_file(path, "profile");
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
  PACKPIPE_CHECK(text.find_first_not_of(" \t\r\n") != std::string::npos,
                 "{}: the profile file is empty (expected a profile in one of the supported formats)", path);
  return text;
}

}  // namespace

void Profile::merge(Profile other) {
  if (!other.points.empty() && !points.empty()) {
    PACKPIPE_CHECK_ARG(kernel() == other.kernel(),
                       "profiles measured with different attention kernels cannot be merged: {} ({}) and {} ({})",
                       sources.empty() ? std::string("the first") : sources.front(), attention_kernel_name(kernel()),
                       other.sources.empty() ? std::string("the next") : other.sources.front(),
                       attention_kernel_name(other.kernel()));
  }
  if (!attention.has_value() || points.empty()) attention = other.attention;
  if (model.empty()) model = std::move(other.model);
  if (device.empty()) device = std::move(other.device);
  points.insert(points.end(), other.points.begin(), other.points.end());
  params.insert(params.end(), other.params.begin(), other.params.end());
  comm.insert(comm.end(), other.comm.begin(), other.comm.end());
  sources.insert(sources.end(), other.sources.begin(), other.sources.end());
  notes.insert(notes.end(), other.notes.begin(), other.notes.end());
}

ProfileFormat detect_profile_format(const std::string& name, const std::string& text) {
  const std::string b = base_name(name);
  const std::string head = first_line(text);
  if (starts_with(b, "microbench_") && ends_with(b, ".txt")) return ProfileFormat::DynaPipeMicrobench;
  if (starts_with(head, "train_iter:")) return ProfileFormat::Aiob;
  if (starts_with(b, "DeviceType.") && ends_with(b, ".json")) return ProfileFormat::Metis;
  if (ends_with(b, ".json") && text.find("\"packpipe-profile\"") != std::string::npos) return ProfileFormat::Packpipe;
  if (starts_with(b, "p2p_") && ends_with(b, ".csv")) return ProfileFormat::AcesoP2P;
  if (starts_with(b, "prim_") && ends_with(b, ".csv")) return ProfileFormat::AcesoPrim;
  if (starts_with(head, "op_name,")) return ProfileFormat::AcesoOps;
  if (starts_with(head, "tp,rc,lm_stage,train_stage,")) return ProfileFormat::DynaPipeTiming;
  if (starts_with(head, "tp,rc,lm_stage,enc_seqlen,")) return ProfileFormat::DynaPipeActivation;
  if (starts_with(head, "tp,rc,lm_stage,param_")) return ProfileFormat::DynaPipeModelState;
  if (starts_with(head, "comm_type,") || (starts_with(head, "[rank") && text.find("\ncomm_type,") != std::string::npos)) {
    return ProfileFormat::AicbLog;
  }
  PACKPIPE_THROW(Error,
                 "{}: not a recognised profile (DynaPipe *_timing/_activation/_model_state.csv or microbench_*.txt, "
                 "Aceso op/prim/p2p CSV, Metis DeviceType.*.json, AIOB text, AICB log, packpipe JSON); first line '{}'",
                 name, head.substr(0, 80));
}

namespace {

// Every reader's points: a measured time is finite and positive (0 or NaN would make a partition
// of 0 ms look feasible), measured memory finite and >= 0. The point is named by its key, which
// is its row in the source file.
constexpr double kMaxProfileMs = 1e9;      ///< a layer's time: 11 days
constexpr double kMaxProfileBytes = 1e18;  ///< a layer's memory: an exabyte

void check_points(const Profile& p, const std::string& file) {
  for (std::size_t i = 0; i < p.points.size(); ++i) {
    const ProfilePoint& x = p.points[i];
    auto where = [&] {
      return fmt::format("{}: point {} ({} layers, tp {}, rc {}, mbs {}, seq {}{})", file, i, layer_kind_name(x.kind), x.tp,
                         recompute_name(x.rc), x.mbs, x.seq, x.dec_seq ? fmt::format(", dec_seq {}", x.dec_seq) : std::string());
    };
    // Bounded far above any measurement, so that sums over layers and micro-batches stay finite (a
    // time of 1e308 ms became an infinite stage time, printed as null).
    for (const auto& [v, what] : {std::pair{x.fwd_ms, "forward time (ms)"}, std::pair{x.bwd_ms, "backward time (ms)"}}) {
      PACKPIPE_CHECK(std::isnan(v) || (v > 0 && v <= kMaxProfileMs), "{}: {} is {}; expected a time in (0, {:g}] ms",
                     where(), what, v, kMaxProfileMs);
    }
    for (const auto& [v, what] : {std::pair{x.stored_bytes, "stored activation bytes"}, std::pair{x.peak_bytes, "peak bytes"}}) {
      PACKPIPE_CHECK(std::isnan(v) || (v >= 0 && v <= kMaxProfileBytes), "{}: {} is {}; expected a value in [0, {:g}]",
                     where(), what, v, kMaxProfileBytes);
    }
  }
}

Profile parse_format(ProfileFormat f, const std::string& text, const std::string& name,
                     const ProfileReadOptions& options) {
  switch (f) {
    case ProfileFormat::DynaPipeTiming: return parse_dynapipe_timing(text, name);
    case ProfileFormat::DynaPipeActivation: return parse_dynapipe_activation(text, name);
    case ProfileFormat::DynaPipeModelState: return parse_dynapipe_model_state(text, name);
    case ProfileFormat::DynaPipeMicrobench: return parse_dynapipe_microbench(text, name);
    case ProfileFormat::AcesoOps: return parse_aceso_ops(text, name, options);
    case ProfileFormat::AcesoPrim: return parse_aceso_prim(text, name);
    case ProfileFormat::AcesoP2P: return parse_aceso_p2p(text, name);
    case ProfileFormat::Metis: return parse_metis(text, name, options);
    case ProfileFormat::Aiob: return parse_aiob(text, name, options);
    case ProfileFormat::AicbLog: return parse_aicb_log(text, name);
    case ProfileFormat::Packpipe: return parse_packpipe(text, name);
  }
  PACKPIPE_THROW(InvalidArgument, "unknown profile format {}", static_cast<int>(f));
}

}  // namespace

Profile parse_profile(ProfileFormat f, const std::string& text, const std::string& name,
                      const ProfileReadOptions& options) {
  Profile p = parse_format(f, text, name, options);
  check_points(p, name);
  return p;
}

Profile parse_profile(const std::string& text, const std::string& name, const ProfileReadOptions& options) {
  return parse_profile(detect_profile_format(name, text), text, name, options);
}

Profile load_profiles(const std::vector<std::string>& paths, const ProfileReadOptions& options) {
  PACKPIPE_CHECK_ARG(!paths.empty(), "no profile paths given");
  Profile out;
  std::string first_with_points;  // grids of two models must not be mixed
  auto add = [&](Profile p) {
    if (!p.points.empty() && !p.model.empty()) {
      if (first_with_points.empty()) {
        first_with_points = p.sources.empty() ? p.model : p.sources.front();
        out.model = p.model;
      }
      PACKPIPE_CHECK(p.model == out.model, "{}: profile of model '{}' mixed with '{}' ({}): load one model at a time",
                     p.sources.empty() ? std::string("?") : p.sources.front(), p.model, out.model, first_with_points);
    }
    out.merge(std::move(p));
  };
  for (const auto& path : paths) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      std::vector<std::string> files;
      for (const auto& e : fs::recursive_directory_iterator(path)) {
        if (e.is_regular_file()) files.push_back(e.path().string());
      }
      std::sort(files.begin(), files.end());
      std::size_t used = 0;
      for (const auto& f : files) {
        const std::string text = read_whole(f);
        ProfileFormat fmt;
        try {
          fmt = detect_profile_format(f, text);
        } catch (const Error&) {
          continue;  // README.txt, plan JSON, result tables: not profiles
        }
        Profile one = parse_profile(fmt, text, f, options);  // its points checked
        add(std::move(one));
        ++used;
      }
      PACKPIPE_CHECK(used > 0, "{}: folder holds no recognised profile files", path);
    } else {
      PACKPIPE_CHECK(fs::exists(path, ec), "{}: no such file or folder", path);
      Profile one = parse_profile(read_whole(path), path, options);
      add(std::move(one));
    }
  }
  return out;
}

std::string profile_sources(const Profile& p) {
  return p.sources.empty() ? std::string("(in memory)") : fmt::format("{}", fmt::join(p.sources, ", "));
}

void check_profile_for(const Profile& p, const ModelSpec& model) {
  PACKPIPE_CHECK_ARG(!p.points.empty(), "profile {} has no grid points", profile_sources(p));
  // A profile names the model it measured: another model's times would pass as this one's.
  auto norm = [](const std::string& s) {
    std::string o;
    for (char ch : s) {
      if (std::isalnum(static_cast<unsigned char>(ch))) o += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
    return o;
  };
  PACKPIPE_CHECK_ARG(p.model.empty() || norm(p.model) == norm(model.name),
                     "profile {} measured model '{}', but the cost model is for '{}': profile the model you plan "
                     "for, or plan for model '{}' (model / --model)",
                     profile_sources(p), p.model, model.name, p.model);
  for (const auto& x : p.points) {
    PACKPIPE_CHECK_ARG(x.kind != LayerKind::Decoder || model.arch == Architecture::EncoderDecoder,
                       "profile has decoder layers but model '{}' is decoder-only", model.name);
  }
}

double profile_param_bytes(const Profile& p, LayerKind kind, std::int64_t tp) {
  double sum[2] = {0, 0};
  int n[2] = {0, 0};
  for (const auto& x : p.params) {
    if (x.kind != kind || x.tp != tp) continue;
    const int k = x.rc == Recompute::None ? 0 : 1;
    sum[k] += x.bytes;
    ++n[k];
  }
  if (n[0] > 0) return sum[0] / n[0];
  return n[1] > 0 ? sum[1] / n[1] : std::numeric_limits<double>::quiet_NaN();
}

std::string write_packpipe_profile(const Profile& p) {
  nlohmann::ordered_json j;
  j["format"] = "packpipe-profile";
  j["version"] = 1;
  j["model"] = p.model;
  j["device"] = p.device;
  j["units"] = {{"time", "ms"}, {"memory", "bytes"}};
  j["attention"] = attention_kernel_name(p.kernel());
  j["sources"] = p.sources;
  j["notes"] = p.notes;
  j["point_columns"] = kPointColumns;
  auto pts = nlohmann::ordered_json::array();
  for (const auto& x : p.points) {
    pts.push_back({layer_kind_name(x.kind), x.tp, recompute_name(x.rc), x.variant, x.mbs, x.seq, x.dec_seq,
                   num_or_null(x.fwd_ms), num_or_null(x.bwd_ms), num_or_null(x.stored_bytes), num_or_null(x.peak_bytes)});
  }
  j["points"] = std::move(pts);
  j["param_columns"] = kParamColumns;
  auto prs = nlohmann::ordered_json::array();
  for (const auto& x : p.params) prs.push_back({layer_kind_name(x.kind), x.tp, recompute_name(x.rc), x.bytes});
  j["params"] = std::move(prs);
  j["comm_columns"] = kCommColumns;
  auto cms = nlohmann::ordered_json::array();
  for (const auto& x : p.comm) cms.push_back({x.collective, x.group_size, x.inter_node, x.bytes, x.ms});
  j["comm"] = std::move(cms);
  return j.dump(1) + "\n";
}

std::vector<AlphaBetaFit> fit_alpha_beta(const std::vector<CommSample>& samples) {
  using Key = std::tuple<std::string, std::int64_t, bool>;
  std::map<Key, std::map<double, std::vector<double>>> groups;
  for (const auto& s : samples) {
    if (!(s.ms > 0) || !std::isfinite(s.ms) || !(s.bytes >= 0)) continue;
    groups[{s.collective, s.group_size, s.inter_node}][s.bytes].push_back(s.ms);
  }
  std::vector<AlphaBetaFit> out;
  for (auto& [key, by_size] : groups) {
    AlphaBetaFit f;
    std::tie(f.collective, f.group_size, f.inter_node) = key;
    std::vector<std::pair<double, double>> xy;  // (bytes, median ms)
    for (auto& [bytes, ts] : by_size) {
      f.samples += ts.size();
      std::sort(ts.begin(), ts.end());
      const std::size_t n = ts.size();
      const double med = n % 2 ? ts[n / 2] : 0.5 * (ts[n / 2 - 1] + ts[n / 2]);
      xy.emplace_back(bytes, med);
    }
    f.sizes = xy.size();
    if (xy.size() == 1) {
      f.alpha_ms = xy[0].second;
    } else {
      // Least squares in relative error (weights 1 / y^2) so small messages (latency) count as much as large ones.
      double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
      for (const auto& [x, y] : xy) {
        const double w = 1.0 / (y * y);
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
      }
      const double det = sw * sxx - sx * sx;
      double slope = det > 0 ? (sw * sxy - sx * sy) / det : 0;
      double alpha = det > 0 ? (sy - slope * sx) / sw : sy / sw;
      if (slope <= 0) {  // no bandwidth term visible: latency only
        slope = 0;
        alpha = sy / sw;
      }
      if (alpha < 0) {  // refit through the origin
        alpha = 0;
        slope = sxy / sxx;
      }
      f.alpha_ms = alpha;
      f.bytes_per_ms = slope > 0 ? 1.0 / slope : 0;
    }
    for (const auto& [x, y] : xy) {
      const double pred = f.alpha_ms + (f.bytes_per_ms > 0 ? x / f.bytes_per_ms : 0);
      f.max_rel_error = std::max(f.max_rel_error, std::abs(pred - y) / y);
    }
    out.push_back(f);
  }
  return out;
}

}  // namespace packpipe::costmodel
