#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "tests/support/devices.h"
#include "costmodel/analytic.h"
#include "costmodel/calibration.h"
#include "costmodel/measurements.h"
#include "costmodel/stage_ops.h"
#include "tests/support/temp_dir.h"

namespace cm = packpipe::costmodel;
using Catch::Matchers::Contains;

namespace {

std::shared_ptr<const cm::CostModel> analytic(const std::string& model = "gpt-1.3b") {
  return std::make_shared<cm::AnalyticCostModel>(cm::load_model(model), packpipe::test::eager_device("A100-40GB"));
}

// Synthetic measurements of F and B over many stage shapes: measured = a x model + b, with a
// relative noise of `noise` (normal) and, when `outliers`, every 10th shape's F and B three times
// slower.
// Also send / recv of one size pair per shape at the model's p2p time x 2.
std::vector<cm::Measurement> synthetic(const cm::CostModel& base, double a, double b, double noise, bool outliers,
                                       std::uint64_t seed = 20261122) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> eps(0.0, noise);
  std::vector<cm::Measurement> out;
  std::uint32_t index = 0;
  for (std::int64_t layers : {1, 2, 4}) {
    for (std::int64_t rows : {1, 2, 4, 8}) {
      for (std::int64_t seq : {128, 256, 512, 1024, 2048}) {
        for (int rep = 0; rep < 3; ++rep) {
          for (cm::MeasuredOp op : {cm::MeasuredOp::Forward, cm::MeasuredOp::Backward}) {
            cm::Measurement m;
            m.op = op;
            m.layout.encoder_layers = layers;
            m.layout.has_embedding = rep == 1;
            m.rows = rows;
            m.seq = seq;
            m.index = index++;
            m.rank = static_cast<std::uint32_t>(rep);
            const double p = cm::predict_ms(base, m);
            m.ms = (a * p + b) * (1.0 + eps(rng));
            if (outliers && (m.index / 2) % 10 == 3) m.ms *= 3.0;
            out.push_back(m);
          }
        }
      }
    }
  }
  for (std::uint64_t bytes : {std::uint64_t{1} << 20, std::uint64_t{1} << 24, std::uint64_t{1} << 27}) {
    for (int k = 0; k < 10; ++k) {
      cm::Measurement m;
      m.op = k % 2 == 0 ? cm::MeasuredOp::Send : cm::MeasuredOp::Recv;
      m.layout.encoder_layers = 1;
      m.bytes = bytes;
      m.rank = 0;
      m.peer = 1;
      m.index = index++;
      m.ms = 2.0 * base.comm().p2p_ms(static_cast<double>(bytes)) * (1.0 + 0.5 * k);  // waits: upper bounds
      out.push_back(m);
    }
  }
  return out;
}

// The global fits recover a and b within `tol`; each log2(tokens) region its slope (its intercept is
// a small share of its larger ops' times), and the calibrated times of every measured shape are
// the true line's within 1%.
void check_recovered(const cm::CostModel& base, const std::vector<cm::Measurement>& ms, const cm::Calibration& c,
                     double a, double b, double tol) {
  for (cm::MeasuredOp op : {cm::MeasuredOp::Forward, cm::MeasuredOp::Backward}) {
    const cm::OpFit& f = c.compute[static_cast<std::size_t>(op)];
    INFO(cm::measured_op_name(op));
    REQUIRE(f.fitted);
    CHECK(f.global.a == Approx(a).epsilon(tol));
    CHECK(f.global.b == Approx(b).epsilon(tol));
    REQUIRE(f.regions.size() >= 3);
    for (const auto& r : f.regions) {
      INFO("region at log2 tokens " << r.center_log2_tokens);
      CHECK(r.a == Approx(a).epsilon(tol));
      CHECK(r.error_after < r.error_before);
    }
  }
  for (const auto& m : ms) {
    if (!cm::is_compute(m.op)) continue;
    const double p = cm::predict_ms(base, m);
    CHECK(c.apply(m.op, m.tokens(), p, cm::attention_share(base.model(), m.layout, m.shape(), base.attention())) ==
          Approx(a * p + b).epsilon(0.01));
  }
}

std::string header() { return R"({"format":"packpipe-measurements","version":1,"model":"gpt-1.3b","device":"A100-40GB","source":"test"})"; }

std::string f_line(const std::string& replace_key = "", const std::string& value = "") {
  std::string line = R"({"op":"F","encoder_layers":2,"decoder_layers":0,"embedding":false,"postprocess":false,"tp":1,"rows":2,"seq":512,"dec_seq":0,"recompute":"none","bytes":0,"ms":1.5,"iteration":0,"replica":0,"rank":0,"stage":0,"mb":0,"index":3,"start_ms":0.0,"peer":-1})";
  if (replace_key.empty()) return line;
  const std::string key = "\"" + replace_key + "\":";
  const auto at = line.find(key);
  const auto end = line.find_first_of(",}", at + key.size());
  return line.substr(0, at + key.size()) + value + line.substr(end);
}

// Calibration::from_json of `text` (as "cal.json") is refused with a message holding every part.
void check_calibration_error(const std::string& text, const std::vector<std::string>& parts) {
  try {
    cm::Calibration::from_json(text, "cal.json");
    FAIL("accepted");
  } catch (const packpipe::Error& e) {
    for (const auto& p : parts) CHECK_THAT(e.what(), Contains(p));
  }
}

void check_parse_error(const std::string& text, const std::vector<std::string>& parts) {
  try {
    cm::parse_measurements(text, "m.jsonl");
    FAIL("accepted: " << text);
  } catch (const packpipe::Error& e) {
    for (const auto& p : parts) CHECK_THAT(e.what(), Contains(p));
  }
}

}  // namespace

TEST_CASE("calibration recovers a known multiplicative and additive bias within 2%", "[calibration]") {
  const auto base = analytic();
  // measured = 1.3 x model + 0.2 ms, 0.2% noise from a fixed-seed RNG
  const auto ms = synthetic(*base, 1.3, 0.2, 0.002, false);
  const cm::Calibration c = cm::fit_calibration(*base, ms);
  check_recovered(*base, ms, c, 1.3, 0.2, 0.02);
  // the calibrated model's op times are the line's at every shape
  const cm::CalibratedCostModel model(base, c);
  cm::Measurement m;
  m.layout.encoder_layers = 3;
  m.rows = 3;
  m.seq = 700;
  const double p = cm::predict_ms(*base, m);
  CHECK(cm::predict_ms(model, m) == Approx(1.3 * p + 0.2).epsilon(0.01));
  // B fitted, its halves not: they scale with the calibrated backward
  const cm::StageOpTimes t0 = cm::stage_op_times(*base, m.layout, 1, cm::MicroShape{3, 700, 0, {}}, cm::Recompute::None);
  const cm::StageOpTimes t1 = cm::stage_op_times(model, m.layout, 1, cm::MicroShape{3, 700, 0, {}}, cm::Recompute::None);
  CHECK(t1.backward_weight_ms / t1.backward_ms == Approx(t0.backward_weight_ms / t0.backward_ms));
  CHECK(t1.backward_input_ms + t1.backward_weight_ms == Approx(t1.backward_ms));
  // transfers: the low quantile of each size's waits, a fitted line through them
  CHECK(c.transfers[0].fitted);
  CHECK_FALSE(c.transfers[1].fitted);
  CHECK(c.transfers[0].sizes == 3);
  CHECK(model.comm().p2p_ms(1 << 24) == Approx(2.0 * base->comm().p2p_ms(1 << 24) * 1.45).epsilon(0.1));
  CHECK(model.comm().inter_bytes_per_ms == base->comm().inter_bytes_per_ms);
}

TEST_CASE("calibration rejects injected outliers and still recovers the bias within 2%", "[calibration]") {
  const auto base = analytic();
  const auto ms = synthetic(*base, 1.3, 0.2, 0.002, true);
  const cm::Calibration c = cm::fit_calibration(*base, ms);
  std::vector<cm::Measurement> clean;
  for (const auto& m : ms) {
    if ((m.index / 2) % 10 != 3) clean.push_back(m);
  }
  check_recovered(*base, clean, c, 1.3, 0.2, 0.02);
  for (cm::MeasuredOp op : {cm::MeasuredOp::Forward, cm::MeasuredOp::Backward}) {
    const cm::OpFit& f = c.compute[static_cast<std::size_t>(op)];
    // 18 of each kind's 180 points are three times slower: all rejected, few others
    CHECK(f.global.points == 180);
    CHECK(f.global.rejected >= 18);
    CHECK(f.global.rejected <= 30);
  }
}

TEST_CASE("calibration is deterministic: any order gives the same bytes, JSON round-trips exactly", "[calibration]") {
  const auto base = analytic();
  auto ms = synthetic(*base, 1.1, 0.05, 0.02, true, 7);
  const std::string a = cm::fit_calibration(*base, ms).to_json();
  std::mt19937_64 rng(3);
  for (int k = 0; k < 3; ++k) {
    std::shuffle(ms.begin(), ms.end(), rng);
    CHECK(cm::fit_calibration(*base, ms).to_json() == a);
  }
  const cm::Calibration c = cm::Calibration::from_json(a, "c.json");
  CHECK(c.to_json() == a);
  packpipe::test::TempDir dir;
  c.save(dir.file("c.json"));
  const cm::Calibration d = cm::Calibration::load(dir.file("c.json"));
  CHECK(d.source == dir.file("c.json"));
  CHECK(d.to_json() == a);
  // the model built from the file answers bit for bit as the one built from the fit
  const cm::CalibratedCostModel m1(base, cm::fit_calibration(*base, ms)), m2(analytic(), d);
  for (const auto& m : ms) CHECK(cm::predict_ms(m1, m) == cm::predict_ms(m2, m));
  CHECK_THAT(m2.describe(), Contains(dir.file("c.json")));
}

TEST_CASE("a calibration fitted over another model is refused, naming both", "[calibration][negative]") {
  const auto gpt13 = analytic("gpt-1.3b");
  const auto gpt67 = analytic("gpt-6.7b");
  CHECK(cm::cost_model_fingerprint(*gpt13) != cm::cost_model_fingerprint(*gpt67));
  CHECK(cm::cost_model_fingerprint(*gpt13) == cm::cost_model_fingerprint(*analytic("gpt-1.3b")));
  const cm::Calibration c = cm::fit_calibration(*gpt13, synthetic(*gpt13, 1.2, 0.1, 0.01, false));
  try {
    cm::CalibratedCostModel m(gpt67, c);
    FAIL("accepted");
  } catch (const packpipe::InvalidArgument& e) {
    CHECK_THAT(e.what(), Contains("gpt-1.3b") && Contains("gpt-6.7b") && Contains(c.base.fingerprint) &&
                             Contains(cm::cost_model_fingerprint(*gpt67)));
  }
  // calibrating a calibrated model, or fitting over one, is refused too
  const auto calibrated = std::make_shared<cm::CalibratedCostModel>(gpt13, c);
  REQUIRE_THROWS_WITH(cm::CalibratedCostModel(calibrated, c), Contains("already calibrated"));
  REQUIRE_THROWS_WITH(cm::fit_calibration(*calibrated, synthetic(*gpt13, 1, 0, 0, false)),
                      Contains("already calibrated"));
  REQUIRE_THROWS_WITH(cm::cost_model_fingerprint(*calibrated), Contains("calibrated"));
}

TEST_CASE("bad measurement files are refused naming the file, the line and the field", "[calibration][negative]") {
  const std::string h = header() + "\n";
  // a good file first
  const cm::MeasurementSet ok = cm::parse_measurements(h + f_line() + "\n\n" +
                                                           R"({"op":"iteration","iteration":0,"replica":0,"measured_ms":9.5,"predicted_ms":8})" + "\n",
                                                       "m.jsonl");
  REQUIRE(ok.ops.size() == 1);
  REQUIRE(ok.iterations.size() == 1);
  CHECK(ok.header.model == "gpt-1.3b");
  CHECK(cm::parse_measurements(cm::measurements_to_jsonl(ok), "again").ops.front().ms == 1.5);

  check_parse_error(h + f_line("ms", "-1"), {"m.jsonl line 2", "ms", "found -1"});
  check_parse_error(h + f_line("ms", "0"), {"m.jsonl line 2", "ms must be positive", "found 0"});
  check_parse_error(h + f_line("ms", "NaN"), {"m.jsonl line 2"});
  check_parse_error(h + f_line("ms", "\"fast\""), {"m.jsonl line 2", "'ms'", "expected a finite number", "string"});
  check_parse_error(h + f_line("rows", "0"), {"line 2", "rows must be in [1,", "found 0"});
  check_parse_error(h + f_line("op", "\"X\""), {"line 2", "'op'", "unknown op 'X'", "F, B, I, W, send, recv"});
  check_parse_error(h + f_line("recompute", "\"most\""), {"line 2", "'recompute'", "unknown mode 'most'"});
  check_parse_error(h + f_line("op", "\"send\""), {"line 2", "bytes must be in [1, 2^50] for a transfer, found 0"});
  check_parse_error(h + f_line("op", "\"send\"").replace(f_line("op", "\"send\"").find("\"bytes\":0"), 9, "\"bytes\":8"),
                    {"line 2", "peer must be another rank, found -1"});
  check_parse_error(h + f_line("bytes", "64"), {"line 2", "bytes is for transfers"});
  check_parse_error(h + f_line("seq", "1.5"), {"line 2", "'seq'", "expected an integer", "found number 1.5"});
  check_parse_error(h + f_line() + "x", {"m.jsonl line 2"});
  check_parse_error(h + "\n" + f_line().substr(0, 40), {"m.jsonl line 3"});
  check_parse_error(h + R"({"op":"F"})", {"line 2", "missing field"});
  check_parse_error(h + f_line().substr(0, f_line().size() - 1) + R"(,"colour":"red"})", {"line 2", "unknown field 'colour'"});
  check_parse_error(R"({"format":"packpipe-profile","version":1,"model":"","device":"","source":""})",
                    {"line 1", "'format'", "expected \"packpipe-measurements\"", "found \"packpipe-profile\""});
  check_parse_error(R"({"format":"packpipe-measurements","version":2,"model":"","device":"","source":""})",
                    {"line 1", "'version'", "expected 1, found 2"});
  check_parse_error("\n\n", {"m.jsonl", "empty"});
  REQUIRE_THROWS_WITH(cm::read_measurements("/nonexistent/m.jsonl"), Contains("/nonexistent/m.jsonl"));

  // in memory: the fit names the measurement, the field and what was found
  const auto base = analytic();
  std::vector<cm::Measurement> ms = ok.ops;
  ms.push_back(ms.front());
  ms.back().ms = std::numeric_limits<double>::quiet_NaN();
  ms.back().index = 9;
  REQUIRE_THROWS_WITH(cm::fit_calibration(*base, ms),
                      Contains("measurement 1 (F, iteration 0, replica 0, rank 0, instruction 9)") &&
                          Contains("ms must be a finite duration, found nan"));
  // a shape the model refuses (a decoder layer of a decoder-only model: never planned)
  ms.back() = ms.front();
  ms.back().layout.decoder_layers = 2;
  ms.back().dec_seq = 64;
  REQUIRE_THROWS_WITH(cm::fit_calibration(*base, ms), Contains("measurement 1") && Contains("refuses its shape"));
  ms.back() = ms.front();
  ms.back().tp = 3;  // 32 heads do not split 3 ways
  REQUIRE_THROWS_WITH(cm::fit_calibration(*base, ms), Contains("measurement 1") && Contains("tp 3"));
  // an iteration line with a makespan that is neither unknown (0) nor a duration
  check_parse_error(h + R"({"op":"iteration","iteration":0,"replica":0,"measured_ms":1e-20,"predicted_ms":8})",
                    {"m.jsonl line 2", "measured_ms must be 0 (unknown) or in [1e-06, 1e+09]", "found 1e-20"});
  check_parse_error(h + R"({"op":"iteration","iteration":0,"replica":0,"measured_ms":5,"predicted_ms":1e30})",
                    {"line 2", "predicted_ms must be 0 (unknown)"});
  // the writer refuses what the reader would refuse
  cm::MeasurementSet far = ok;
  far.ops.front().index = std::uint64_t{1} << 63;
  REQUIRE_THROWS_WITH(cm::measurements_to_jsonl(far), Contains("iteration and index must be at most 2^63 - 1"));
  cm::FitOptions bad;
  bad.transfer_quantile = 2;
  REQUIRE_THROWS_WITH(cm::fit_calibration(*base, ok.ops, bad), Contains("transfer_quantile (--transfer-quantile) must be in [0, 1], found 2"));
}

TEST_CASE("bad calibration files are refused naming the file and the field", "[calibration][negative]") {
  const auto base = analytic();
  const std::string good = cm::fit_calibration(*base, synthetic(*base, 1.2, 0.1, 0.01, false)).to_json();
  const auto check = check_calibration_error;
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  check(replace("\"packpipe-calibration\"", "\"packpipe-profile\""), {"cal.json", "/format", "packpipe-calibration"});
  check(replace("\"version\": 1", "\"version\": 7"), {"cal.json", "/version", "expected 1 to 2, found 7"});
  check(replace("\"a\": ", "\"a\": -"), {"cal.json", "/compute/0/global/a", "expected a positive number"});
  check(replace("\"fingerprint\": \"", "\"fingerprint\": \"zz"), {"/base/fingerprint", "16 lower-case hex digits"});
  check(replace("\"outlier_mads\": 3.0", "\"outlier_mads\": 0.5"), {"/options", "outlier_mads"});
  check(replace("\"transfers\"", "\"links\""), {"cal.json", "/transfers", "missing"});
  check(good.substr(0, good.size() / 2), {"cal.json"});
  // values whose times would overflow the schedules, or are not of this model: refused at load
  {
    auto j = nlohmann::json::parse(good);
    j["compute"][0]["global"]["a"] = 1e-9;
    check(j.dump(), {"cal.json", "/compute/0/global/a", "expected in [1e-06, 1e+06]"});
    j = nlohmann::json::parse(good);
    j["transfers"][0]["fitted"] = true;
    j["transfers"][0]["bytes_per_ms"] = 5e-324;
    check(j.dump(), {"cal.json", "/transfers/0/bytes_per_ms", "expected in [1, 1e+15]"});
    j["transfers"][0]["bytes_per_ms"] = 1e300;
    check(j.dump(), {"/transfers/0/bytes_per_ms", "found 1e+300"});
  }
  // the attention term: in (-1, 100], 0 on an op without a fit; absent (an older file) is 0
  {
    auto j = nlohmann::json::parse(good);
    j["compute"][0]["attention_gamma"] = -1.0;
    check(j.dump(), {"cal.json", "/compute/0/attention_gamma", "expected in (-1, 100]", "found -1"});
    j["compute"][0]["attention_gamma"] = 1e3;
    check(j.dump(), {"/compute/0/attention_gamma", "found 1000"});
    j["compute"][0]["attention_gamma"] = "x";
    check(j.dump(), {"/compute/0/attention_gamma", "expected a finite number"});
    j = nlohmann::json::parse(good);
    j["compute"][2]["attention_gamma"] = 0.5;  // I has no fit here
    check(j.dump(), {"/compute/2/attention_gamma", "0 for an op without a fit"});
    j = nlohmann::json::parse(good);
    for (auto& op : j["compute"]) op.erase("attention_gamma");
    CHECK(cm::Calibration::from_json(j.dump(), "old.json").compute[0].attention_gamma == 0);
  }
  REQUIRE_THROWS_WITH(cm::Calibration::load("/nonexistent/cal.json"), Contains("/nonexistent/cal.json"));
}

// Measurements of F and B whose attention part runs (1 + gamma) times slower, relative to the
// token-linear part, than the base model says: padded rows and rows packed with varlen attention
// (segments of a quarter or an eighth of the row), so the stage's attention share spreads.
std::vector<cm::Measurement> attention_biased(const cm::CostModel& base, double a, double gamma, double noise,
                                              std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> eps(0.0, noise);
  std::vector<cm::Measurement> out;
  std::uint32_t index = 0;
  for (std::int64_t rows : {1, 2, 4}) {
    for (std::int64_t seq : {512, 1024, 2048, 4096}) {
      for (int pieces : {1, 4, 8}) {
        for (cm::MeasuredOp op : {cm::MeasuredOp::Forward, cm::MeasuredOp::Backward}) {
          cm::Measurement m;
          m.op = op;
          m.layout.encoder_layers = 2;
          m.rows = rows;
          m.seq = seq;
          if (pieces > 1) {
            for (std::int64_t r = 0; r < rows; ++r) {
              for (int k = 0; k < pieces; ++k) m.attention.add(seq / pieces, 0);
            }
          }
          m.index = index++;
          const double p = cm::predict_ms(base, m);
          const double s = cm::attention_share(base.model(), m.layout, m.shape(), base.attention());
          m.ms = a * p * (1.0 + gamma * s) * (1.0 + eps(rng));
          out.push_back(m);
        }
      }
    }
  }
  return out;
}

TEST_CASE("calibration fits the attention part and the token-linear part as separate terms", "[calibration]") {
  const auto base = analytic();
  // attention 2.5 x slower than the model says relative to the GEMMs (gamma 1.5), 0.5% noise
  const auto ms = attention_biased(*base, 0.8, 1.5, 0.005, 7);
  const cm::Calibration c = cm::fit_calibration(*base, ms);
  for (cm::MeasuredOp op : {cm::MeasuredOp::Forward, cm::MeasuredOp::Backward}) {
    INFO(cm::measured_op_name(op));
    const cm::OpFit& f = c.compute[static_cast<std::size_t>(op)];
    // the regions' lines absorb part of the term, so gamma is found within 20%; the prices below are tight
    CHECK(1.0 + f.attention_gamma == Approx(2.5).epsilon(0.2));
    CHECK(f.global.error_after < 0.02);
  }
  // the file keeps the term; the calibrated model prices shapes it never saw, packed and padded
  const cm::Calibration back = cm::Calibration::from_json(c.to_json(), "back.json");
  CHECK(back.to_json() == c.to_json());
  const cm::CalibratedCostModel model(base, back);
  for (int pieces : {1, 3, 16}) {
    cm::Measurement m;
    m.layout.encoder_layers = 3;
    m.rows = 3;
    m.seq = 3000;
    if (pieces > 1) {
      for (int r = 0; r < 3; ++r) {
        for (int k = 0; k < pieces; ++k) m.attention.add(3000 / pieces, 0);
      }
    }
    const double p = cm::predict_ms(*base, m);
    const double s = cm::attention_share(base->model(), m.layout, m.shape(), base->attention());
    INFO("pieces " << pieces << " share " << s);
    CHECK(cm::predict_ms(model, m) == Approx(0.8 * p * (1.0 + 1.5 * s)).epsilon(0.03));
  }
  // and the partitioner's stage time sees the same term (stage_time_ms = F + B calibrated)
  const cm::StageLayout l{3, 0, false, false};
  const cm::MicroShape dense{2, 2048, 0, {}};
  const cm::LayerCost st = cm::stage_cost(*base, l, 1, dense, cm::Recompute::None);
  const double share = cm::attention_share(base->model(), l, dense, base->attention());
  const auto ops = cm::stage_op_times(model, st, l, dense);
  CHECK(cm::stage_time_ms(model, st, cm::shape_tokens(base->model(), dense), share) ==
        Approx(ops.forward_ms + ops.backward_ms));
}

TEST_CASE("the attention term stays 0 where the points do not call for it", "[calibration]") {
  const auto base = analytic();
  // a pure line of the whole prediction (no attention bias): the term buys nothing
  const cm::Calibration c = cm::fit_calibration(*base, attention_biased(*base, 1.3, 0.0, 0.005, 9));
  for (const cm::OpFit& f : c.compute) CHECK(f.attention_gamma == 0);
  // padded rows of one length only: every point has the same share, the term is not identifiable
  std::vector<cm::Measurement> one;
  for (const auto& m : attention_biased(*base, 1.0, 3.0, 0.005, 11)) {
    if (m.seq == 1024 && !m.attention.varlen()) one.push_back(m);
  }
  REQUIRE(one.size() >= 4);
  for (const cm::OpFit& f : cm::fit_calibration(*base, one).compute) CHECK(f.attention_gamma == 0);
}

TEST_CASE("an identity calibration keeps every op time and stage time bit for bit", "[calibration]") {
  const auto base = analytic();
  cm::Calibration c;
  c.base = {base->model().name, base->device().name, base->describe(), cm::cost_model_fingerprint(*base)};
  for (std::size_t k = 0; k < 4; ++k) {
    c.compute[k].op = static_cast<cm::MeasuredOp>(k);
    c.compute[k].fitted = true;
    for (double centre : {8.0, 10.5, 13.0}) {
      cm::RegionFit r;
      r.center_log2_tokens = centre;
      c.compute[k].regions.push_back(r);
    }
  }
  c.transfers[1].inter_node = true;
  const cm::CalibratedCostModel id(base, c);
  cm::StageLayout l{3, 0, true, false};
  for (std::int64_t rows : {1, 3, 7}) {
    for (std::int64_t seq : {100, 700, 3000}) {
      for (cm::Recompute rc : {cm::Recompute::None, cm::Recompute::Selective, cm::Recompute::Full}) {
        const cm::LayerCost s = cm::stage_cost(*base, l, 1, rows, seq, 0, rc);
        const cm::MicroShape shape{rows, seq, 0, {}};
        const double tokens = cm::shape_tokens(base->model(), shape);
        CHECK(cm::stage_time_ms(id, s, tokens, cm::attention_share(base->model(), l, shape, base->attention())) == s.total_ms());
        const auto a = cm::stage_op_times(*base, s, l, shape), b = cm::stage_op_times(id, s, l, shape);
        CHECK(a.forward_ms == b.forward_ms);
        CHECK(a.backward_ms == b.backward_ms);
        CHECK(a.backward_input_ms == b.backward_input_ms);
        CHECK(a.backward_weight_ms == b.backward_weight_ms);
      }
    }
  }
}

TEST_CASE("a calibration file whose time falls as tokens grow is refused naming the file, field and region",
          "[calibration][negative][regression]") {
  const auto base = analytic();
  const std::string good = cm::fit_calibration(*base, synthetic(*base, 1.2, 0.1, 0.01, false)).to_json();
  auto j = nlohmann::json::parse(good);
  REQUIRE(j["compute"][0]["regions"].size() >= 3);
  auto refused = [](const nlohmann::json& edited, const std::vector<std::string>& parts) {
    try {
      cm::Calibration::from_json(edited.dump(1), "cal.json");
      FAIL("accepted");
    } catch (const packpipe::Error& e) {
      for (const auto& p : parts) CHECK_THAT(e.what(), Contains(p));
    }
  };
  // The issue's file: a region at twice the tokens made ten times faster (73 ms, then 9.7 ms).
  {
    auto e = j;
    auto& r = e["compute"][0]["regions"][1];
    r["a"] = e["compute"][0]["regions"][0]["a"].get<double>() / 10;
    r["b"] = 0.0;
    r["through_origin"] = true;
    refused(e, {"cal.json", "/compute/0/regions/1", "calibrated F time falls as tokens grow", "region 0",
                "never makes more tokens faster"});
  }
  {  // a falling intercept alone
    auto e = j;
    auto& r = e["compute"][1]["regions"][2];
    r["b"] = r["b"].get<double>() - 1000;
    r["through_origin"] = false;
    refused(e, {"/compute/1/regions/2", "calibrated B time falls"});
  }
  // The other invariants the fit guarantees.
  {
    auto e = j;
    e["compute"][0]["global"]["through_origin"] = true;
    e["compute"][0]["global"]["b"] = 0.5;
    refused(e, {"/compute/0/global/b", "through the origin has b 0"});
  }
  {
    auto e = j;
    e["compute"][0]["regions"][0]["points"] = e["compute"][0]["regions"][0]["points"].get<int>() + 1;
    refused(e, {"/compute/0/regions", "the regions hold", "the regions split the op's points"});
  }
  {
    auto e = j;
    e["compute"][0]["regions"][0]["center_log2_tokens"] = e["compute"][0]["regions"][0]["max_log2_tokens"].get<double>() + 0.5;
    refused(e, {"/compute/0/regions/0/center_log2_tokens", "within its points' range"});
  }
  {
    auto e = j;
    e["compute"][0]["regions"][1]["min_log2_tokens"] = e["compute"][0]["regions"][0]["max_log2_tokens"];
    refused(e, {"/compute/0/regions/1", "expected above region 0 in tokens"});
  }
  {
    auto e = j;
    e["compute"][0]["regions"][0]["min_predicted_ms"] = 0.0;
    refused(e, {"/compute/0/regions/0/min_predicted_ms"});
  }
  {
    auto e = j;
    e["compute"][0]["regions"][0]["global_fallback"] = !e["compute"][0]["regions"][0]["global_fallback"].get<bool>();
    refused(e, {"/compute/0/regions/0/global_fallback"});
  }
  {
    auto e = j;
    e["compute"][2]["fitted"] = true;  // I: no points measured
    refused(e, {"/compute/2/fitted"});
  }
  {
    auto e = j;
    e["compute"][0]["from"] = "I + W";
    refused(e, {"/compute/0/from"});
  }
  {
    auto e = j;
    e["options"]["regions"] = false;
    refused(e, {"/compute/0/regions", "expected none"});
  }
  {
    auto e = j;
    e["transfers"][1]["latency_ms"] = 3.0;  // a link without a fit
    refused(e, {"/transfers/1", "without a fit"});
  }
  CHECK_NOTHROW(cm::Calibration::from_json(good, "cal.json"));
}

TEST_CASE("every fitted calibration passes its reader, falling regions pooled", "[calibration][property]") {
  const auto base = analytic();
  const auto seed = GENERATE(take(12, random(1, 1000000)));
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
  std::vector<cm::Measurement> ms = synthetic(*base, 1.0, 0.0, 0.05, seed % 2 == 0, static_cast<std::uint64_t>(seed));
  // Each shape's time scaled by its own random factor, some ten times: fits whose raw regions fall.
  std::uniform_real_distribution<double> f(0.1, 3.0);
  for (auto& m : ms) {
    if (cm::is_compute(m.op) && rng() % 3 == 0) m.ms *= f(rng);
  }
  cm::FitOptions o;
  o.min_region_points = 2 + static_cast<std::int64_t>(rng() % 20);
  const cm::Calibration c = cm::fit_calibration(*base, ms, o);
  const cm::Calibration back = cm::Calibration::from_json(c.to_json(), "fit.json");
  CHECK(back.to_json() == c.to_json());
}

TEST_CASE("schedule factors: round trip, the rule for kinds not fitted, and bad files refused naming the field",
          "[calibration][negative]") {
  const auto base = analytic();
  cm::Calibration c = cm::fit_calibration(*base, synthetic(*base, 1.2, 0.1, 0.01, false));
  REQUIRE(c.schedules.empty());
  CHECK(c.schedule_factor(packpipe::ScheduleKind::GPipe) == 1.0);  // none fitted: 1
  c.schedules = {{"1f1b", 1.01, 6, 0.004}, {"wait-free-cyclic", 1.05, 4, 0.01}};
  const std::string good = c.to_json();
  const cm::Calibration d = cm::Calibration::from_json(good, "cal.json");
  CHECK(d.to_json() == good);
  REQUIRE(d.schedules.size() == 2);
  CHECK(d.schedule_factor(packpipe::ScheduleKind::OneFOneB) == 1.01);
  CHECK(d.schedule_factor(packpipe::ScheduleKind::WaitFreeCyclic) == 1.05);
  // A kind never measured is not preferred: it takes the largest fitted factor.
  CHECK(d.schedule_factor(packpipe::ScheduleKind::ZeroBubble) == 1.05);
  CHECK_THAT(cm::CalibratedCostModel(base, d).describe(), Contains("wait-free-cyclic x1.050"));
  // A file written before schedule factors has none.
  std::string old = good;
  const auto at = old.find(",\n \"schedules\"");
  REQUIRE(at != std::string::npos);
  old = old.substr(0, at) + "\n}\n";
  {
    auto v1 = nlohmann::json::parse(old);
    v1["version"] = 1;
    CHECK(cm::Calibration::from_json(v1.dump(1), "old.json").schedules.empty());
  }
  // Version 2 without the key, or with none fitted (its writer writes version 1 then), is refused.
  check_calibration_error(old, {"cal.json", "/schedules", "at least one fitted schedule kind", "found none"});
  {
    auto empty = nlohmann::json::parse(good);
    empty["schedules"] = nlohmann::json::array();
    check_calibration_error(empty.dump(1), {"cal.json", "/schedules", "version 1", "found []"});
  }

  const auto check = check_calibration_error;
  auto with = [&](std::vector<cm::ScheduleFit> fits) {
    cm::Calibration e = c;
    e.schedules = std::move(fits);
    // to_json writes what it is given; the reader checks it
    return e.to_json();
  };
  check(with({{"2f2b", 1.0, 5, 0}}), {"cal.json", "/schedules/0/schedule", "found \"2f2b\"", "1f1b"});
  check(with({{"1f1b", 1.0, 5, 0}, {"1f1b", 1.1, 5, 0}}), {"/schedules/1/schedule", "once each"});
  check(with({{"wait-free-cyclic", 1.0, 5, 0}, {"1f1b", 1.1, 5, 0}}), {"/schedules/1/schedule", "in the order"});
  check(with({{"1f1b", 2.5, 5, 0}}), {"/schedules/0/factor", "expected in [1, 2]", "found 2.5"});
  check(with({{"1f1b", 0.9, 5, 0}}), {"/schedules/0/factor", "found 0.9"});
  // Version 2 holds the factors; a version-1 file (what every reader of 1 opens) has none.
  CHECK(nlohmann::json::parse(good)["version"] == 2);
  CHECK(nlohmann::json::parse(cm::fit_calibration(*base, synthetic(*base, 1.2, 0.1, 0.01, false)).to_json())["version"] == 1);
  {
    auto v1 = nlohmann::json::parse(good);
    v1["version"] = 1;
    check(v1.dump(1), {"cal.json", "/schedules", "a version-1 file has no schedule factors"});
    v1["version"] = 3;
    check(v1.dump(1), {"cal.json", "/version", "expected 1 to 2, found 3"});
  }
  check(with({{"1f1b", 1.0, 2, 0}}), {"/schedules/0/iterations", "at least 3", "found 2"});
  check(with({{"1f1b", 1.0, 5, -1}}), {"/schedules/0/spread", "found -1"});
  std::string s = good;
  s.replace(s.find("\"factor\": 1.01"), 14, "\"factor\": \"1\"");
  check(s, {"cal.json", "/schedules/0", "factor"});

  // Iteration lines carry the plan's schedule; a name that is not a kind is refused.
  const std::string h = header() + "\n";
  const cm::MeasurementSet ok = cm::parse_measurements(
      h + f_line() + "\n" +
          R"({"op":"iteration","iteration":0,"replica":0,"measured_ms":9.5,"predicted_ms":8,"schedule":"zero-bubble"})",
      "m.jsonl");
  REQUIRE(ok.iterations.size() == 1);
  CHECK(ok.iterations[0].schedule == "zero-bubble");
  CHECK(cm::parse_measurements(cm::measurements_to_jsonl(ok), "again").iterations[0].schedule == "zero-bubble");
  check_parse_error(
      h + R"({"op":"iteration","iteration":0,"replica":0,"measured_ms":9.5,"predicted_ms":8,"schedule":"fast"})",
      {"m.jsonl line 2", "schedule must be empty (unknown) or one of", "found 'fast'"});
  check_parse_error(
      h + R"({"op":"iteration","iteration":0,"replica":0,"measured_ms":9.5,"predicted_ms":8,"schedule":3})",
      {"m.jsonl line 2", "'schedule'", "expected a string"});
  check_parse_error(
      h + R"({"op":"iteration","iteration":0,"replica":0,"measured_ms":9.5,"predicted_ms":8,"schedule":""})",
      {"m.jsonl line 2", "'schedule'", "leave the field out"});
}

TEST_CASE("a calibration file with a field its writer never writes is refused naming it", "[calibration][negative]") {
  const auto base = analytic();
  cm::Calibration c = cm::fit_calibration(*base, synthetic(*base, 1.2, 0.1, 0.01, false));
  c.schedules = {{"1f1b", 1.01, 6, 0.004}};
  const auto good = nlohmann::json::parse(c.to_json());
  // every object of the file, a misspelt field added to each in turn
  const std::vector<nlohmann::json::json_pointer> objects = {
      nlohmann::json::json_pointer(""),           nlohmann::json::json_pointer("/base"),
      nlohmann::json::json_pointer("/options"),   nlohmann::json::json_pointer("/compute/0"),
      nlohmann::json::json_pointer("/compute/0/global"), nlohmann::json::json_pointer("/transfers/1"),
      nlohmann::json::json_pointer("/schedules/0"),
      nlohmann::json::json_pointer("/compute/0/regions/0")};
  REQUIRE(!good["compute"][0]["regions"].empty());  // the fit has regions: each region object is checked
  for (const auto& at : objects) {
    INFO(at.to_string());
    nlohmann::json j = good;
    j[at]["schedule_factor"] = 1.5;
    check_calibration_error(j.dump(1), {"cal.json", at.to_string() + "/schedule_factor", "unknown field", "expected"});
  }
  CHECK(cm::Calibration::from_json(good.dump(1), "cal.json").to_json() == c.to_json());
}
