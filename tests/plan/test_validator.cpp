// The validator: it accepts generated plans (test_instructions.cpp) and here must find every kind
// of fault injected into a valid plan, naming the rank, the instruction and what it expected.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "plan/builder.h"
#include "planner/planner.h"
#include "tests/support/synthetic_plans.h"
#include "plan/format.h"
#include "plan/validator.h"

using namespace packpipe::plan;
using namespace packpipe::planner;
namespace syn = packpipe::test::synthetic;

namespace {

bool has_kind(const ValidationReport& r, const std::string& kind) {
  return std::any_of(r.violations.begin(), r.violations.end(), [&](const Violation& v) { return v.kind == kind; });
}

std::string all_text(const Plan& p, const ValidationReport& r) {
  std::string s;
  for (const auto& v : r.violations) s += to_string(v, &p) + "\n";
  return s;
}

// Index of the first instruction of `op` on `rank` (after `from`), or -1.
std::int64_t find_op(const Plan& p, std::uint32_t rank, Opcode op, std::size_t from = 0) {
  for (std::size_t i = from; i < p.streams[rank].size(); ++i)
    if (p.streams[rank][i].op == op) return static_cast<std::int64_t>(i);
  return -1;
}

Plan base_plan(const char* kind = "1f1b") { return syn::random_plan(kind, 4, 1, 6, 42); }

}  // namespace

TEST_CASE("validator: a valid plan has no violations and reports peaks", "[interface]") {
  const Plan p = base_plan();
  const ValidationReport r = validate(p);
  REQUIRE(r.ok());
  REQUIRE(r.peak_bytes.size() == p.ranks);
  for (std::uint32_t k = 0; k < p.ranks; ++k) {
    CHECK(r.peak_bytes[k] > p.static_bytes[k]);
    CHECK(r.peak_buffers[k] == p.buffer_slots[k]);
    CHECK(r.peak_buffer_bytes[k] > 0);
  }
}

TEST_CASE("validator: memory peak equals an independent recount of stored activations", "[interface]") {
  std::mt19937_64 rng(7);
  for (int t = 0; t < 100; ++t) {
    const char* kinds[] = {"gpipe", "1f1b", "zero-bubble"};
    const Plan p = syn::random_plan(kinds[t % 3], 1 + static_cast<std::int64_t>(rng() % 6), 1, 1 + static_cast<std::int64_t>(rng() % 12), rng());
    const ValidationReport r = validate(p);
    REQUIRE(r.ok());
    for (std::uint32_t k = 0; k < p.ranks; ++k) {
      // Recount from the schedule's compute order alone.
      double stored = 0, peak = 0;
      for (const auto& op : p.timeline[k]) {
        const std::size_t i = p.at(op.mb, op.vstage);
        peak = std::max(peak, static_cast<double>(p.static_bytes[k]) + stored + static_cast<double>(p.peak_bytes[i]));
        if (op.kind == OpKind::Forward) stored += static_cast<double>(p.stored_bytes[i]);
        if (op.kind == OpKind::Backward || op.kind == OpKind::BackwardWeight) stored -= static_cast<double>(p.stored_bytes[i]);
      }
      CHECK(static_cast<double>(r.peak_bytes[k]) == Approx(peak).epsilon(1e-12));
    }
  }
}

TEST_CASE("validator: memory over the limit is reported with the rank and the figures", "[negative]") {
  Plan p = base_plan("gpipe");
  const ValidationReport ok = validate(p);
  REQUIRE(ok.ok());
  const std::uint64_t top = *std::max_element(ok.peak_bytes.begin(), ok.peak_bytes.end());
  p.memory_limit_bytes = top - 1;
  const ValidationReport r = validate(p);
  REQUIRE(has_kind(r, "memory"));
  CHECK(all_text(p, r).find("expected at most the limit") != std::string::npos);
  // Buffers counted on request push the peak up.
  p.memory_limit_bytes = top;
  CHECK(validate(p).ok());
  ValidateOptions o;
  o.count_buffers = true;
  CHECK(has_kind(validate(p, o), "memory"));
  REQUIRE_THROWS_AS(validate_or_throw(p, o), packpipe::Error);
  REQUIRE_THROWS_WITH(validate_or_throw(p, o), Catch::Matchers::Contains("memory"));
}

TEST_CASE("validator: a missing forward or backward is counted", "[negative]") {
  Plan p = base_plan();
  const auto i = find_op(p, 2, Opcode::Backward);
  REQUIRE(i >= 0);
  p.streams[2][static_cast<std::size_t>(i)].op = Opcode::BackwardInput;  // I without W
  const ValidationReport r = validate(p);
  REQUIRE(has_kind(r, "count"));
  CHECK(all_text(p, r).find("weight (W)") != std::string::npos);
}

TEST_CASE("validator: W before its I, and a backward before its forward, are order violations", "[negative]") {
  Plan p = syn::random_plan("zero-bubble", 2, 1, 4, 5);
  auto& st = p.streams[1];
  const auto w = find_op(p, 1, Opcode::BackwardWeight);
  const auto i = find_op(p, 1, Opcode::BackwardInput);
  REQUIRE(w > i);
  // Move the W before its I.
  Instruction wi = st[static_cast<std::size_t>(w)];
  st.erase(st.begin() + w);
  std::int64_t target = -1;
  for (std::size_t k = 0; k < st.size(); ++k) {
    if (st[k].op == Opcode::BackwardInput && st[k].mb == wi.mb && st[k].stage == wi.stage) target = static_cast<std::int64_t>(k);
  }
  REQUIRE(target >= 0);
  st.insert(st.begin() + target, wi);
  const ValidationReport r = validate(p);
  REQUIRE(has_kind(r, "order"));
  CHECK(all_text(p, r).find("after its input gradient") != std::string::npos);
}

TEST_CASE("validator: swapped receive starts break the per-channel order", "[negative]") {
  Plan p = base_plan();
  auto& st = p.streams[1];
  std::vector<std::size_t> recvs;
  for (std::size_t k = 0; k < st.size(); ++k)
    if (st[k].op == Opcode::RecvActStart) recvs.push_back(k);
  REQUIRE(recvs.size() >= 2);
  // Exchange what the first two receives claim to carry (micro-batches differ).
  std::swap(st[recvs[0]].mb, st[recvs[1]].mb);
  std::swap(st[recvs[0]].shape, st[recvs[1]].shape);
  const ValidationReport r = validate(p);
  REQUIRE(has_kind(r, "channel"));
  const std::string text = all_text(p, r);
  CHECK(text.find("activation channel rank 0 -> rank 1, message #0") != std::string::npos);
  CHECK(text.find("rank 1, instruction " + std::to_string(recvs[0])) != std::string::npos);
}

TEST_CASE("validator: a receive of a different shape is a channel violation", "[negative]") {
  Plan p = base_plan();
  const auto i = find_op(p, 2, Opcode::RecvActStart);
  REQUIRE(i >= 0);
  TensorShape s = p.shapes[p.streams[2][static_cast<std::size_t>(i)].shape];
  s.seq += 64;
  p.shapes.push_back(s);
  p.streams[2][static_cast<std::size_t>(i)].shape = static_cast<std::uint32_t>(p.shapes.size() - 1);
  const ValidationReport r = validate(p);
  REQUIRE(has_kind(r, "channel"));
  CHECK(all_text(p, r).find("shape") != std::string::npos);
}

TEST_CASE("validator: a send without receive is unmatched and deadlocks its wait", "[negative]") {
  Plan p = base_plan();
  auto& st = p.streams[1];
  const auto i = find_op(p, 1, Opcode::RecvActStart);
  REQUIRE(i >= 0);
  // Drop the receive start and everything using its buffer on the receiving rank.
  const std::uint32_t buf = st[static_cast<std::size_t>(i)].out;
  st.erase(st.begin() + i);
  const ValidationReport r = validate(p);
  REQUIRE(has_kind(r, "channel"));
  CHECK(all_text(p, r).find("has no matching receive") != std::string::npos);
  (void)buf;
}

TEST_CASE("validator: a wait placed before the send it needs deadlocks, with the wait named", "[negative]") {
  // Rank 0 waits for the gradient of micro-batch 0 before sending the activation rank 1 needs.
  Plan p = syn::random_plan("gpipe", 2, 1, 2, 3);
  auto& st = p.streams[0];
  const auto send = find_op(p, 0, Opcode::SendActStart);
  const auto rs = find_op(p, 0, Opcode::RecvGradStart);
  const auto rw = find_op(p, 0, Opcode::RecvGradWait);
  REQUIRE(send >= 0);
  REQUIRE(rs > send);
  REQUIRE(rw > rs);
  const Instruction start = st[static_cast<std::size_t>(rs)], wait = st[static_cast<std::size_t>(rw)];
  st.erase(st.begin() + rw);
  st.erase(st.begin() + rs);
  st.insert(st.begin() + send, wait);
  st.insert(st.begin() + send, start);
  const ValidationReport r = validate(p);
  REQUIRE(has_kind(r, "deadlock"));
  const std::string text = all_text(p, r);
  CHECK(text.find("rank 0, instruction " + std::to_string(send + 1)) != std::string::npos);
  CHECK(text.find("waiting for rank 1") != std::string::npos);
}

TEST_CASE("validator: computing on a received buffer before its wait is a dataflow violation", "[negative]") {
  Plan p = base_plan();
  auto& st = p.streams[3];
  const auto w = find_op(p, 3, Opcode::RecvActWait);
  REQUIRE(w >= 0);
  // Move the wait after the consumer.
  const Instruction wait = st[static_cast<std::size_t>(w)];
  std::size_t c = static_cast<std::size_t>(w) + 1;
  while (st[c].op != Opcode::Forward) ++c;
  st.insert(st.begin() + static_cast<std::int64_t>(c) + 1, wait);
  st.erase(st.begin() + w);
  const ValidationReport r = validate(p);
  REQUIRE(has_kind(r, "dataflow"));
  CHECK(all_text(p, r).find("before its receive wait") != std::string::npos);
}

TEST_CASE("validator: forward reading another micro-batch's activation is a dataflow violation", "[negative]") {
  Plan p = syn::random_plan("1f1b", 1, 3, 4, 8);  // same-rank hand-over
  auto& st = p.streams[0];
  std::vector<std::size_t> fw;
  for (std::size_t k = 0; k < st.size(); ++k)
    if (st[k].op == Opcode::Forward && st[k].stage == 1) fw.push_back(k);
  REQUIRE(fw.size() >= 2);
  st[fw[0]].mb = st[fw[1]].mb;
  const ValidationReport r = validate(p);
  REQUIRE(has_kind(r, "dataflow"));
}

TEST_CASE("validator: buffer misuse is reported", "[negative]") {
  SECTION("double free") {
    Plan p = base_plan();
    const auto f = find_op(p, 0, Opcode::FreeBuf);
    REQUIRE(f >= 0);
    auto& st = p.streams[0];
    st.insert(st.begin() + f, st[static_cast<std::size_t>(f)]);
    const ValidationReport r = validate(p);
    REQUIRE(has_kind(r, "buffer"));
    CHECK(all_text(p, r).find("freed twice") != std::string::npos);
  }
  SECTION("leak") {
    Plan p = base_plan();
    auto& st = p.streams[0];
    std::size_t last = st.size();
    while (st[--last].op != Opcode::FreeBuf) {
    }
    st.erase(st.begin() + static_cast<std::int64_t>(last));
    const ValidationReport r = validate(p);
    REQUIRE(has_kind(r, "buffer"));
    CHECK(all_text(p, r).find("never freed") != std::string::npos);
  }
  SECTION("free while the send is pending") {
    Plan p = base_plan();
    auto& st = p.streams[0];
    const auto w = find_op(p, 0, Opcode::SendActWait);
    REQUIRE(w >= 0);
    REQUIRE(st[static_cast<std::size_t>(w) + 1].op == Opcode::FreeBuf);
    std::swap(st[static_cast<std::size_t>(w)], st[static_cast<std::size_t>(w) + 1]);
    const ValidationReport r = validate(p);
    REQUIRE(has_kind(r, "buffer"));
    CHECK(all_text(p, r).find("send from it is pending") != std::string::npos);
  }
  SECTION("slot out of range") {
    Plan p = base_plan();
    const auto f = find_op(p, 0, Opcode::FreeBuf);
    p.streams[0][static_cast<std::size_t>(f)].in = p.buffer_slots[0];
    const ValidationReport r = validate(p);
    REQUIRE(has_kind(r, "field"));
    CHECK(all_text(p, r).find("expected a buffer slot below") != std::string::npos);
  }
  SECTION("allocation into a live slot") {
    Plan p = base_plan();
    auto& st = p.streams[3];
    const auto rs = find_op(p, 3, Opcode::RecvActStart);
    const auto ld = find_op(p, 3, Opcode::LoadMb);
    REQUIRE(rs >= 0);
    REQUIRE(ld > rs);
    st[static_cast<std::size_t>(ld)].out = st[static_cast<std::size_t>(rs)].out;
    CHECK(has_kind(validate(p), "buffer"));
  }
}

TEST_CASE("validator: fields out of range or on the wrong rank", "[negative]") {
  Plan p = base_plan();
  SECTION("stage of another rank") {
    const auto f = find_op(p, 0, Opcode::Forward);
    p.streams[0][static_cast<std::size_t>(f)].stage = 1;
    const ValidationReport r = validate(p);
    REQUIRE(has_kind(r, "field"));
    CHECK(all_text(p, r).find("runs on rank 1") != std::string::npos);
  }
  SECTION("wrong peer") {
    const auto s = find_op(p, 0, Opcode::SendActStart);
    p.streams[0][static_cast<std::size_t>(s)].peer = 2;
    CHECK(all_text(p, validate(p)).find("peer: expected rank 1") != std::string::npos);
  }
  SECTION("micro-batch out of range") {
    const auto f = find_op(p, 0, Opcode::Forward);
    p.streams[0][static_cast<std::size_t>(f)].mb = 99;
    CHECK(all_text(p, validate(p)).find("micro-batch: expected below 6, found 99") != std::string::npos);
  }
  SECTION("opcode out of range") {
    p.streams[0][1].op = static_cast<Opcode>(200);
    CHECK(has_kind(validate(p), "field"));
  }
  SECTION("reduce before the backward passes") {
    const auto g = find_op(p, 0, Opcode::ReduceGrad);
    auto& st = p.streams[0];
    const Instruction red = st[static_cast<std::size_t>(g)];
    st.erase(st.begin() + g);
    st.insert(st.begin() + 1, red);
    const ValidationReport r = validate(p);
    REQUIRE(has_kind(r, "order"));
    CHECK(all_text(p, r).find("REDUCE_GRAD of stage 0: expected after its 6 backward passes") != std::string::npos);
  }
}

TEST_CASE("validator: broken headers are reported without crashing", "[negative]") {
  SECTION("stage map") {
    Plan p = base_plan();
    p.stage_rank[1] = 9;
    CHECK(has_kind(validate(p), "header"));
  }
  SECTION("table sizes") {
    Plan p = base_plan();
    p.stored_bytes.pop_back();
    const ValidationReport r = validate(p);
    REQUIRE(has_kind(r, "header"));
    CHECK(r.violations.front().message.find("stored_bytes") != std::string::npos);
  }
  SECTION("loss weight") {
    Plan p = base_plan();
    p.microbatches[2].loss_weight = 1.0 / 6;
    const ValidationReport r = validate(p);
    REQUIRE(has_kind(r, "header"));
    CHECK(all_text(p, r).find("loss tokens / global loss tokens") != std::string::npos);
  }
  SECTION("a rank without a stage") {
    Plan p = base_plan();
    p.stage_rank[3] = 2;
    CHECK(all_text(p, validate(p)).find("rank 3 runs no stage") != std::string::npos);
  }
  SECTION("empty plan") {
    Plan p;
    const ValidationReport r = validate(p);
    CHECK(has_kind(r, "header"));
  }
}

TEST_CASE("validator: random single-instruction corruptions never crash and are mostly caught", "[stress]") {
  std::mt19937_64 rng(0xbadc0de);
  int caught = 0, total = 0;
  for (int t = 0; t < 400; ++t) {
    const char* kinds[] = {"gpipe", "1f1b", "zero-bubble"};
    Plan p = syn::random_plan(kinds[t % 3], 2 + static_cast<std::int64_t>(rng() % 4), 1 + static_cast<std::int64_t>(rng() % 2) * 0, 4, rng());
    const auto r = static_cast<std::size_t>(rng() % p.ranks);
    auto& st = p.streams[r];
    const auto i = static_cast<std::size_t>(rng() % st.size());
    const int what = static_cast<int>(rng() % 5);
    const Plan before = p;
    switch (what) {
      case 0: st.erase(st.begin() + static_cast<std::int64_t>(i)); break;
      case 1: st.insert(st.begin() + static_cast<std::int64_t>(i), st[i]); break;
      case 2: {
        const auto j = static_cast<std::size_t>(rng() % st.size());
        std::swap(st[i], st[j]);
        break;
      }
      case 3:  // fields the opcode carries only
        if (opcode_fields(st[i].op) & kFieldMb) st[i].mb = (st[i].mb + 1) % 4;
        break;
      case 4:
        if (opcode_fields(st[i].op) & kFieldIn) st[i].in = st[i].in == kNone ? 0 : st[i].in + 1;
        break;
    }
    if (p == before) continue;
    ++total;
    const ValidationReport rep = validate(p);
    caught += rep.ok() ? 0 : 1;

    for (const auto& v : rep.violations) {
      CHECK(!v.kind.empty());
      CHECK(!v.message.empty());
    }
  }
  // Some corruptions are harmless (e.g. swapping two independent FREE_BUFs or loads); nearly all are not.
  CHECK(caught >= total * 9 / 10);
}

TEST_CASE("validator: every field a runtime or trainer reads is checked (mutations are refused)", "[negative][mutation]") {
  for (const bool encdec : {false, true}) {
    for (const char* kind : {"1f1b", "zero-bubble", "gpipe"}) {
      const std::int64_t chunks = std::string(kind) == "gpipe" ? 2 : 1;
      Plan good = syn::random_plan(kind, 4, chunks, 6, 7, false, encdec);
      if (good.timeline.empty()) {  // a small simulated timeline: one forward per rank
        good.makespan_ms = 10;
        good.timeline.resize(good.ranks);
        for (std::uint32_t v = 0; v < good.vstages; ++v) {
          auto& ops = good.timeline[good.stage_rank[v]];
          if (ops.empty()) ops.push_back(ScheduledOp{OpKind::Forward, 0, v, 1.0 * v, 1.0 * v + 1});
        }
      }
      REQUIRE(validate(good).ok());
      auto refused = [&](const char* what, const std::function<void(Plan&)>& mutate) {
        Plan p = good;
        mutate(p);
        // The mutation travels through the binary form, as a tampered file would.
        const auto blob = encode_plan(p);
        const Plan back = decode_plan(blob.data(), blob.size(), "mutated");
        INFO(what << " (" << kind << (encdec ? ", encoder-decoder" : "") << ")");
        CHECK_FALSE(validate(back).ok());
      };
      refused("a sample in two micro-batches", [](Plan& p) { p.microbatches[1].samples[0] = p.microbatches[0].samples[0]; });
      refused("a sample twice in one micro-batch", [](Plan& p) {
        auto& mb = p.microbatches[2];
        mb.samples.push_back(mb.samples[0]);
        mb.lengths.push_back(mb.lengths[0]);
        if (!mb.target_lengths.empty()) mb.target_lengths.push_back(mb.target_lengths[0]);
        if (!mb.row_offsets.empty()) mb.row_offsets.back() += 1; else mb.rows += 1;
      });
      // Format 2: what a trainer reads besides the streams.
      refused("the LM head on another stage", [](Plan& p) {
        p.stages.back().head = false;
        p.stages.front().head = true;
      });
      refused("layers that skip one", [](Plan& p) { p.stages[1].encoder_begin += 1; });
      refused("a stage with no layer", [](Plan& p) {
        p.stages[1].encoder_layers = 0;
        p.stages[1].decoder_layers = 0;
      });
      refused("no embedding on the first stage", [](Plan& p) { p.stages[0].embedding = false; });
      refused("a sample's length changed", [](Plan& p) { p.microbatches[0].lengths[0] += 1; });
      refused("more loss tokens than tokens", [](Plan& p) { p.microbatches[0].loss_tokens = p.microbatches[0].tokens + 1; });
      refused("global loss tokens below the micro-batches'", [](Plan& p) { p.global_loss_tokens -= 1; });
      refused("a forward with another recompute mode", [](Plan& p) {
        for (auto& ins : p.streams[0]) {
          if (ins.op == Opcode::Forward) {
            ins.mode = (ins.mode + 1) % 3;
            break;
          }
        }
      });
      refused("a REDUCE_TIED without a tied embedding", [](Plan& p) {
        Instruction t;
        t.op = Opcode::ReduceTied;
        t.stage = 0;
        p.streams[p.stage_rank[0]].insert(p.streams[p.stage_rank[0]].end() - 1, t);
      });
      refused("a tied embedding without REDUCE_TIED", [](Plan& p) { p.tied_embedding = true; });
      refused("a padded length below the tokens", [](Plan& p) { p.microbatches[0].padded_len = 1; });
      refused("tokens above rows x padded length", [](Plan& p) {
        auto& mb = p.microbatches[0];
        mb.tokens = std::uint64_t{mb.rows} * (mb.padded_len + mb.padded_dec_len) + 1;
      });
      refused("a shape's sequence length unlike its micro-batch's", [](Plan& p) {
        for (auto& s : p.shapes) s.seq += 8;
      });
      refused("a shape of sequence length 0", [](Plan& p) { p.shapes[0].seq = 0; });
      refused("a shape of hidden size 0", [](Plan& p) { p.shapes[0].hidden = 0; });
      refused("zero global tokens", [](Plan& p) { p.global_tokens = 0; });
      refused("a negative makespan", [](Plan& p) { p.makespan_ms = -1; });
      refused("a NaN makespan", [](Plan& p) { p.makespan_ms = std::nan(""); });
      refused("a loss weight above 1", [](Plan& p) { p.microbatches[0].loss_weight = 2; });
      refused("a negative loss weight", [](Plan& p) { p.microbatches[0].loss_weight = -0.1; });
      if (!encdec) {
        refused("a decoder length on a decoder-only model", [](Plan& p) { p.microbatches[1].padded_dec_len = 64; });
      } else {
        refused("a missing decoder length on an encoder-decoder model", [](Plan& p) { p.microbatches[1].padded_dec_len = 0; });
      }
      if (!good.timeline.empty()) {
        refused("a timeline op after the makespan", [](Plan& p) { p.timeline[0][0].end_ms = p.makespan_ms * 3 + 1; });
        refused("a timeline op ending before it starts", [](Plan& p) {
          p.timeline[0][0].end_ms = p.timeline[0][0].start_ms - 1;
        });
        refused("a timeline op of a missing micro-batch", [](Plan& p) { p.timeline[0][0].mb = 1000; });
        refused("a timeline op on the wrong rank", [](Plan& p) { p.timeline[0][0].vstage = p.vstages - 1; });
      }
      if (!good.microbatches[0].refs.empty()) {
        // One id naming the dataset sample twice trains it twice.
        refused("a dataset sample twice under one sample id", [](Plan& p) {
          p.microbatches[1].refs[0] = p.microbatches[0].refs[0];
          p.microbatches[1].samples[0] = p.microbatches[0].samples[0];
        });
        // Under another id it is another draw of a weighted task's sample: fine when it trains the
        // same tokens, refused when the two draws train other tokens of it.
        Plan rep = good;
        rep.microbatches[1].refs[0] = rep.microbatches[0].refs[0];
        REQUIRE(rep.microbatches[0].lengths.size() == rep.microbatches[0].refs.size());
        const bool same_tokens = rep.microbatches[1].lengths[0] == rep.microbatches[0].lengths[0];
        const auto blob = encode_plan(rep);
        const ValidationReport r = validate(decode_plan(blob.data(), blob.size()));
        CHECK(r.ok() == same_tokens);
        if (!same_tokens) {
          REQUIRE_FALSE(r.violations.empty());
          CHECK(r.violations.front().message.find("overlap") != std::string::npos);
        }
      }
      // The context length and the chunks of samples split at it (format 4).
      const auto named = [](Plan& p) {  // every sample a dataset sample of its own
        for (auto& mb : p.microbatches) {
          mb.refs.clear();
          for (auto s : mb.samples) mb.refs.push_back(SampleRef{0, s});
        }
      };
      refused("a sample over the plan's context length", [](Plan& p) {
        std::uint32_t longest = 0;
        for (const auto& mb : p.microbatches) {
          for (auto l : mb.lengths) longest = std::max(longest, l);
        }
        p.max_seq_len = longest - 1;
      });
      if (!encdec) {
        refused("a decoder limit in a decoder-only plan", [](Plan& p) { p.max_target_len = 4096; });
        refused("two chunks of one dataset sample that overlap", [&](Plan& p) {
          named(p);
          REQUIRE(p.microbatches[0].lengths[0] > 1);
          p.microbatches[0].refs[0] = SampleRef{5, 5, 0};
          p.microbatches[1].refs[0] = SampleRef{5, 5, p.microbatches[0].lengths[0] - 1};
        });
        Plan chunks = good;  // the same chunks one token apart are fine
        named(chunks);
        chunks.microbatches[0].refs[0] = SampleRef{5, 5, 0};
        chunks.microbatches[1].refs[0] = SampleRef{5, 5, chunks.microbatches[0].lengths[0]};
        const auto blob = encode_plan(chunks);
        CHECK(validate(decode_plan(blob.data(), blob.size())).ok());
      } else {
        refused("a decoder side over max_target_len", [](Plan& p) {
          std::uint32_t longest = 0;
          for (const auto& mb : p.microbatches) {
            for (auto l : mb.target_lengths) longest = std::max(longest, l);
          }
          p.max_target_len = longest - 1;
        });
        refused("a chunk of an encoder-decoder sample", [&](Plan& p) {
          named(p);
          p.microbatches[0].refs[0].offset = 3;
        });
      }
      // Tables against the streams.
      refused("a loss weight off by one unit in the last place", [](Plan& p) {
        p.microbatches[0].loss_weight = std::nextafter(p.microbatches[0].loss_weight, 2.0);
      });
      refused("one stage of a micro-batch with another recompute mode", [](Plan& p) {
        p.recompute[p.at(1, p.vstages - 1)] = static_cast<std::uint8_t>((p.recompute[p.at(1, 0)] + 1) % 3);
      });
      refused("a buffer slot no instruction allocates", [](Plan& p) { p.buffer_slots[1] += 1; });
      refused("a shape no instruction uses", [](Plan& p) { p.shapes.push_back(p.shapes.back()); });
      refused("an activation of another hidden size", [](Plan& p) {
        for (auto& s : p.shapes) if (s.hidden > 1) { s.hidden += 1; break; }
      });
      refused("an activation of an integer dtype", [](Plan& p) {
        for (auto& s : p.shapes) if (s.hidden > 1) s.dtype = Dtype::I32;
      });
      refused("loaded token ids of a floating dtype", [](Plan& p) {
        for (auto& s : p.shapes) if (s.hidden == 1) s.dtype = Dtype::BF16;
      });
      refused("loaded token ids of hidden size 2", [](Plan& p) {
        for (auto& s : p.shapes) if (s.hidden == 1) { s.hidden = 2; break; }
      });
      refused("a forward that drops its loaded inputs", [](Plan& p) {
        for (auto& ins : p.streams[p.stage_rank[0]]) if (ins.op == Opcode::Forward && ins.in2 != kNone) { ins.in2 = kNone; break; }
      });
      // The timeline is the streams' compute order with causal times.
      refused("two timeline ops of a rank swapped", [](Plan& p) { std::swap(p.timeline[0][0], p.timeline[0][1]); });
      refused("a timeline op of another kind", [](Plan& p) {
        auto& op = p.timeline[1].back();
        op.kind = op.kind == OpKind::Forward ? OpKind::Backward : OpKind::Forward;
      });
      refused("a timeline op of another micro-batch", [](Plan& p) { p.timeline[1][0].mb = 1; });
      refused("a timeline op missing", [](Plan& p) { p.timeline[2].pop_back(); });
      refused("a makespan other than the last op's end", [](Plan& p) { p.makespan_ms *= 1.5; });
      refused("timeline ops of a rank overlapping", [](Plan& p) {
        auto& ops = p.timeline[0];
        ops[1].start_ms = ops[0].start_ms + (ops[0].end_ms - ops[0].start_ms) / 2;
      });
      refused("a forward before the previous stage's forward ends", [](Plan& p) {
        for (auto& op : p.timeline[1]) if (op.kind == OpKind::Forward) { op.start_ms = 0; break; }
      });
      refused("a backward before its forward ends", [](Plan& p) {
        const std::uint32_t r = p.stage_rank[p.vstages - 1];
        for (auto& op : p.timeline[r]) {
          if (op.kind != OpKind::Forward) {
            op.start_ms = 0;
            break;
          }
        }
      });
    }
  }
}

TEST_CASE("validator: the replicas of one iteration agree and share no sample", "[negative][mutation]") {
  std::vector<Plan> good;
  std::uint32_t next = 0;
  std::uint64_t tokens = 0;
  for (std::uint32_t k = 0; k < 3; ++k) {
    Plan p = syn::random_plan("1f1b", 2, 1, 3, 100 + k);
    p.iteration = 5;
    p.dp = 3;
    p.replica = k;
    for (auto& mb : p.microbatches) {
      for (std::size_t i = 0; i < mb.samples.size(); ++i) {
        if (!mb.refs.empty()) mb.refs[i] = SampleRef{0, next};
        mb.samples[i] = next++;
      }
      tokens += mb.tokens;
    }
    good.push_back(p);
  }
  std::uint64_t loss = 0;
  for (const auto& p : good) {
    for (const auto& mb : p.microbatches) loss += mb.loss_tokens;
  }
  for (auto& p : good) {
    p.global_tokens = tokens;
    p.global_loss_tokens = loss;
    for (auto& mb : p.microbatches) mb.loss_weight = static_cast<double>(mb.loss_tokens) / static_cast<double>(loss);
    REQUIRE(validate(p).ok());
  }
  for (const auto& x : validate_replicas(good)) FAIL(to_string(x));
  auto refused = [&](const char* what, const std::function<void(std::vector<Plan>&)>& mutate) {
    std::vector<Plan> v = good;
    mutate(v);
    INFO(what);
    const auto out = validate_replicas(v);
    CHECK_FALSE(out.empty());
    for (const auto& x : out) CHECK(x.kind == "replicas");
  };
  refused("a replica missing", [](std::vector<Plan>& v) { v.pop_back(); });
  refused("dp edited", [](std::vector<Plan>& v) { for (auto& p : v) p.dp = 4; });
  refused("one replica's dp edited", [](std::vector<Plan>& v) { v[1].dp = 1; });
  refused("a sample in two replicas", [](std::vector<Plan>& v) {
    v[2].microbatches[0].samples[0] = v[0].microbatches[0].samples[0];
  });
  if (!good[0].microbatches[0].refs.empty()) {
    // Another draw of the sample in another replica: refused only when it trains other tokens.
    std::vector<Plan> rep = good;
    rep[2].microbatches[0].refs[0] = rep[0].microbatches[0].refs[0];
    const bool same_tokens = rep[2].microbatches[0].lengths[0] == rep[0].microbatches[0].lengths[0];
    CHECK(validate_replicas(rep).empty() == same_tokens);
  }
  // Chunks of one dataset sample may sit in several replicas, one token once.
  auto chunk = [](std::vector<Plan>& v, std::uint32_t offset) {
    for (auto& p : v) {
      for (auto& mb : p.microbatches) {
        mb.refs.clear();
        for (auto s : mb.samples) mb.refs.push_back(SampleRef{0, s});
      }
    }
    v[0].microbatches[0].refs[0] = SampleRef{9, 9, 0};
    v[2].microbatches[0].refs[0] = SampleRef{9, 9, offset};
  };
  std::vector<Plan> apart = good;
  chunk(apart, apart[0].microbatches[0].lengths[0]);
  for (const auto& x : validate_replicas(apart)) FAIL(to_string(x));
  REQUIRE(good[0].microbatches[0].lengths[0] > 1);
  refused("chunks of one dataset sample overlapping across replicas", [&](std::vector<Plan>& v) { chunk(v, 1); });
  refused("a replica of another iteration", [](std::vector<Plan>& v) { v[1].iteration = 7; });
  refused("global tokens unlike the replicas' tokens", [](std::vector<Plan>& v) { for (auto& p : v) p.global_tokens += 1; });
  refused("another pipeline", [](std::vector<Plan>& v) { v[2].ranks = 3; });
}
