// Instruction stream generation: properties of build_plan's streams on synthetic schedules
// (GPipe, 1F1B, interleaved 1F1B, zero-bubble I/W split; S up to 8, chunks up to 3; decoder-only
// and encoder-decoder), checked by the validator and by independent re-derivations here.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include <catch2/catch.hpp>

#include "common/errors.h"
#include "plan/instructions.h"
#include "plan/builder.h"
#include "planner/planner.h"
#include "tests/support/synthetic_plans.h"
#include "schedule/schedules.h"
#include "schedule/simulator.h"
#include "plan/validator.h"

using namespace packpipe::schedule;
using namespace packpipe::plan;
using namespace packpipe::planner;
namespace syn = packpipe::test::synthetic;

namespace {

std::string violations_text(const Plan& p, const ValidationReport& rep) {
  std::string s;
  for (std::size_t i = 0; i < rep.violations.size() && i < 8; ++i) s += to_string(rep.violations[i], &p) + "\n";
  return s;
}

struct Params {
  std::string kind;
  std::int64_t ranks, chunks, mbs;
  bool encdec;
};

Params random_params(std::mt19937_64& rng) {
  static const char* kinds[] = {"gpipe", "1f1b", "zero-bubble"};
  Params p;
  p.kind = kinds[rng() % 3];
  p.ranks = 1 + static_cast<std::int64_t>(rng() % 8);
  p.chunks = 1 + static_cast<std::int64_t>(rng() % 3);
  const std::int64_t groups = 1 + static_cast<std::int64_t>(rng() % 4);
  p.mbs = p.chunks > 1 ? p.ranks * groups : 1 + static_cast<std::int64_t>(rng() % 24);
  p.encdec = (rng() % 3 == 0) && (p.ranks * p.chunks == 1 || (p.ranks * p.chunks) % 2 == 0);
  return p;
}

}  // namespace

TEST_CASE("instructions: opcode names round trip and fields are documented", "[interface]") {
  for (int i = 0; i < kOpcodeCount; ++i) {
    const auto op = static_cast<Opcode>(i);
    CHECK(opcode_from_name(opcode_name(op)) == op);
  }
  CHECK(is_compute(Opcode::Forward));
  CHECK(is_compute(Opcode::BackwardWeight));
  CHECK_FALSE(is_compute(Opcode::SendActStart));
  CHECK((opcode_fields(Opcode::RecvActStart) & kFieldShape) != 0);
  CHECK((opcode_fields(Opcode::BackwardWeight) & (kFieldIn | kFieldOut)) == 0);
  REQUIRE_THROWS_AS(opcode_from_name("FORWARD"), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(opcode_from_name("FORWARD"), Catch::Matchers::Contains("FORWARD"));
  Instruction f;
  f.op = Opcode::Forward;
  f.mb = 3;
  f.stage = 1;
  f.in = 2;
  CHECK(to_string(f) == "FWD mb=3 stage=1 in=b2 in2=- out=-");
}

TEST_CASE("instructions: the validator passes on every plan of random batches for every schedule", "[stress]") {
  std::mt19937_64 rng(0x5eed0001);
  std::map<std::string, int> seen;
  for (int t = 0; t < 1500; ++t) {
    const Params q = random_params(rng);
    const std::uint64_t seed = rng();
    const Plan p = syn::random_plan(q.kind, q.ranks, q.chunks, q.mbs, seed, false, q.encdec);
    const ValidationReport rep = validate(p);
    INFO(q.kind << " S=" << q.ranks << " chunks=" << q.chunks << " mbs=" << q.mbs << " encdec=" << q.encdec << "\n"
                << violations_text(p, rep));
    REQUIRE(rep.ok());
    REQUIRE_NOTHROW(validate_or_throw(p));
    ++seen[q.kind + (q.chunks > 1 ? "/interleaved" : "")];
  }
  for (const char* k : {"gpipe", "1f1b", "zero-bubble", "gpipe/interleaved", "1f1b/interleaved", "zero-bubble/interleaved"}) {
    CHECK(seen[k] > 50);
  }
}

TEST_CASE("instructions: every op kind appears and streams hold the schedule's compute order", "[interface]") {
  for (const char* kind : {"gpipe", "1f1b", "zero-bubble"}) {
    const syn::Case c = syn::random_case(kind, 4, 2, 8, 7);
    const Plan p = make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, c.options);
    std::set<Opcode> ops;
    for (std::size_t r = 0; r < p.streams.size(); ++r) {
      std::vector<ScheduledOp> compute;
      for (const auto& ins : p.streams[r]) {
        ops.insert(ins.op);
        if (!is_compute(ins.op)) continue;
        ScheduledOp o;
        o.kind = ins.op == Opcode::Forward ? OpKind::Forward
                 : ins.op == Opcode::Backward ? OpKind::Backward
                 : ins.op == Opcode::BackwardInput ? OpKind::BackwardInput
                                                   : OpKind::BackwardWeight;
        o.mb = ins.mb;
        o.vstage = ins.stage;
        compute.push_back(o);
      }
      REQUIRE(compute.size() == c.schedule.ops[r].size());
      for (std::size_t i = 0; i < compute.size(); ++i) {
        CHECK(compute[i].kind == c.schedule.ops[r][i].kind);
        CHECK(compute[i].mb == c.schedule.ops[r][i].mb);
        CHECK(compute[i].vstage == c.schedule.ops[r][i].vstage);
      }
      // Markers first and last, then reduce and step at the end.
      CHECK(p.streams[r].front().op == Opcode::IterBegin);
      CHECK(p.streams[r].back().op == Opcode::IterEnd);
      CHECK(p.streams[r][p.streams[r].size() - 2].op == Opcode::OptStep);
    }
    for (Opcode o : {Opcode::LoadMb, Opcode::Forward, Opcode::SendActStart, Opcode::SendActWait, Opcode::RecvActStart,
                     Opcode::RecvActWait, Opcode::SendGradStart, Opcode::SendGradWait, Opcode::RecvGradStart,
                     Opcode::RecvGradWait, Opcode::FreeBuf, Opcode::ReduceGrad, Opcode::OptStep}) {
      CHECK(ops.count(o) == 1);
    }
    if (std::string(kind) == "zero-bubble") {
      CHECK(ops.count(Opcode::BackwardInput) == 1);
      CHECK(ops.count(Opcode::BackwardWeight) == 1);
      CHECK(ops.count(Opcode::Backward) == 0);
    } else {
      CHECK(ops.count(Opcode::Backward) == 1);
    }
  }
}

TEST_CASE("instructions: receive waits sit just before their consumer", "[interface]") {
  std::mt19937_64 rng(0x5eed0002);
  for (int t = 0; t < 200; ++t) {
    const Params q = random_params(rng);
    const Plan p = syn::random_plan(q.kind, q.ranks, q.chunks, q.mbs, rng(), false, q.encdec);
    for (const auto& st : p.streams) {
      for (std::size_t i = 0; i < st.size(); ++i) {
        if (st[i].op != Opcode::RecvActWait && st[i].op != Opcode::RecvGradWait) continue;
        // Only other waits or loads of the same op may stand between the wait and the consumer.
        std::size_t j = i + 1;
        while (j < st.size() && (st[j].op == Opcode::RecvActWait || st[j].op == Opcode::RecvGradWait ||
                                 st[j].op == Opcode::LoadMb))
          ++j;
        REQUIRE(j < st.size());
        CHECK(is_compute(st[j].op));
        CHECK(st[j].mb == st[i].mb);
        CHECK(st[j].stage == st[i].stage);
        CHECK(st[j].in == st[i].in);
      }
    }
  }
}

TEST_CASE("instructions: per-channel send order equals receive order, independently recounted", "[interface]") {
  std::mt19937_64 rng(0x5eed0003);
  for (int t = 0; t < 300; ++t) {
    const Params q = random_params(rng);
    const Plan p = syn::random_plan(q.kind, q.ranks, q.chunks, q.mbs, rng(), false, q.encdec);
    std::map<std::tuple<std::uint32_t, std::uint32_t, int>, std::vector<std::pair<std::uint32_t, std::uint32_t>>> sends,
        recvs;
    for (std::uint32_t r = 0; r < p.ranks; ++r) {
      for (const auto& ins : p.streams[r]) {
        if (ins.op == Opcode::SendActStart) sends[{r, ins.peer, 0}].push_back({ins.mb, ins.stage + 1});
        if (ins.op == Opcode::SendGradStart) sends[{r, ins.peer, 1}].push_back({ins.mb, ins.stage - 1});
        if (ins.op == Opcode::RecvActStart) recvs[{ins.peer, r, 0}].push_back({ins.mb, ins.stage});
        if (ins.op == Opcode::RecvGradStart) recvs[{ins.peer, r, 1}].push_back({ins.mb, ins.stage});
      }
    }
    CHECK(sends == recvs);
  }
}

TEST_CASE("instructions: buffer slots are reused and bounded by the buffers live at once", "[interface]") {
  std::mt19937_64 rng(0x5eed0004);
  for (int t = 0; t < 200; ++t) {
    const Params q = random_params(rng);
    const Plan p = syn::random_plan(q.kind, q.ranks, q.chunks, q.mbs, rng(), false, q.encdec);
    const ValidationReport rep = validate(p);
    REQUIRE(rep.ok());
    for (std::uint32_t r = 0; r < p.ranks; ++r) {
      std::size_t allocations = 0;
      for (const auto& ins : p.streams[r]) allocations += ins.out != kNone;
      // Lowest-free-slot-first allocation uses exactly as many slots as buffers are live at once.
      CHECK(p.buffer_slots[r] == rep.peak_buffers[r]);
      CHECK(p.buffer_slots[r] <= allocations);
      if (q.mbs >= 4 && allocations > 0) CHECK(p.buffer_slots[r] < allocations);
    }
  }
}

TEST_CASE("instructions: same-rank adjacent stages hand over without communication", "[interface]") {
  // One rank with four virtual stages: no communication at all.
  const Plan p = syn::random_plan("1f1b", 1, 4, 5, 11);
  REQUIRE(p.vstages == 4);
  for (const auto& ins : p.streams[0]) {
    CHECK(ins.op != Opcode::SendActStart);
    CHECK(ins.op != Opcode::RecvActStart);
    CHECK(ins.op != Opcode::SendGradStart);
    CHECK(ins.op != Opcode::RecvGradStart);
  }
  // The forward of stage v reads the very buffer the forward of stage v - 1 wrote.
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> out_of;
  for (const auto& ins : p.streams[0]) {
    if (ins.op != Opcode::Forward) continue;
    if (ins.stage > 0) CHECK(ins.in == out_of.at({ins.mb, ins.stage - 1}));
    out_of[{ins.mb, ins.stage}] = ins.out;
  }
  REQUIRE(validate(p).ok());
}

TEST_CASE("instructions: header carries token-weighted losses, shapes and recompute modes", "[interface]") {
  const syn::Case c = syn::random_case("1f1b", 4, 1, 9, 3, false, true);
  const Plan p = make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, c.options);
  double sum = 0;
  std::uint64_t tokens = 0, loss = 0;
  for (const auto& mb : c.mbs) {
    tokens += mb.tokens;
    for (auto s : mb.samples) loss += c.lengths.target[s];  // encoder-decoder: every target token carries loss
  }
  REQUIRE(p.global_tokens == tokens);
  REQUIRE(p.global_loss_tokens == loss);
  for (std::size_t m = 0; m < c.mbs.size(); ++m) {
    std::uint64_t mine = 0;
    for (auto s : c.mbs[m].samples) mine += c.lengths.target[s];
    CHECK(p.microbatches[m].loss_tokens == mine);
    CHECK(p.microbatches[m].loss_weight == static_cast<double>(mine) / static_cast<double>(loss));
    CHECK(p.microbatches[m].samples == c.mbs[m].samples);
    CHECK(p.microbatches[m].rows == c.mbs[m].rows());
    for (std::size_t v = 0; v < p.vstages; ++v) CHECK(p.recompute[p.at(m, v)] == static_cast<std::uint8_t>(c.mbs[m].recompute));
    sum += p.microbatches[m].loss_weight;
  }
  CHECK(sum == Approx(1.0));
  // Weights differ from 1 / #micro-batches when token counts differ.
  bool differs = false;
  for (const auto& mb : p.microbatches) differs = differs || std::abs(mb.loss_weight - 1.0 / 9) > 1e-6;
  CHECK(differs);
  // Decoder stages send the encoder output with their own activation.
  for (std::uint32_t r = 0; r < p.ranks; ++r) {
    for (const auto& ins : p.streams[r]) {
      if (ins.op != Opcode::SendActStart) continue;
      const TensorShape& s = p.shapes[ins.shape];
      const auto& mb = p.microbatches[ins.mb];
      CHECK(s.rows == mb.rows);
      CHECK(s.hidden == 1024);
      if (ins.stage >= p.vstages / 2) {
        CHECK(s.seq == mb.padded_dec_len);
        CHECK(s.enc_seq == mb.padded_len);
      } else {
        CHECK(s.seq == mb.padded_len);
        CHECK(s.enc_seq == 0);
      }
    }
  }
  // A dp total of tokens changes the weights' denominator.
  PlanOptions o = c.options;
  o.global_tokens = tokens * 4;
  o.global_loss_tokens = p.global_loss_tokens * 4;
  o.dp = 4;
  const Plan q = make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, o);
  CHECK(q.microbatches[0].loss_weight == Approx(p.microbatches[0].loss_weight / 4));
  CHECK(validate(q).ok());
}

TEST_CASE("instructions: sample refs and options are carried into the plan", "[interface]") {
  syn::Case c = syn::random_case("gpipe", 2, 1, 3, 5);
  std::vector<SampleRef> refs;
  for (std::uint32_t i = 0; i < 64; ++i) refs.push_back(SampleRef{i % 3, 1000u + i});
  c.options.sample_refs = &refs;
  c.options.iteration_markers = false;
  c.options.reduce_and_step = false;
  c.options.keep_timeline = false;
  const Plan p = make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, c.options);
  for (const auto& mb : p.microbatches) {
    REQUIRE(mb.refs.size() == mb.samples.size());
    for (std::size_t i = 0; i < mb.samples.size(); ++i) CHECK(mb.refs[i] == refs[mb.samples[i]]);
  }
  for (const auto& st : p.streams) {
    for (const auto& ins : st) {
      CHECK(ins.op != Opcode::IterBegin);
      CHECK(ins.op != Opcode::OptStep);
      CHECK(ins.op != Opcode::ReduceGrad);
    }
  }
  CHECK(p.timeline.empty());
  CHECK(validate(p).ok());
}

TEST_CASE("instructions: deterministic output", "[interface]") {
  const Plan a = syn::random_plan("zero-bubble", 8, 2, 16, 99);
  const Plan b = syn::random_plan("zero-bubble", 8, 2, 16, 99);
  CHECK(a == b);
  const Plan c = syn::random_plan("zero-bubble", 8, 2, 16, 100);
  CHECK(a != c);
}

TEST_CASE("instructions: inconsistent schedules are refused with the op named", "[negative]") {
  syn::Case c = syn::random_case("1f1b", 4, 1, 4, 1);
  SECTION("op on the wrong rank") {
    std::swap(c.schedule.ops[0], c.schedule.ops[1]);
    REQUIRE_THROWS_AS(make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, c.options), packpipe::InvalidArgument);
    REQUIRE_THROWS_WITH(make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, c.options), Catch::Matchers::Contains("runs stage"));
  }
  SECTION("missing backward") {
    c.schedule.ops[2].pop_back();
    REQUIRE_THROWS_WITH(make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, c.options), Catch::Matchers::Contains("lacks"));
  }
  SECTION("duplicate forward") {
    c.schedule.ops[1].push_back(c.schedule.ops[1].front());
    REQUIRE_THROWS_WITH(make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, c.options), Catch::Matchers::Contains("twice"));
  }
  SECTION("hidden size") {
    c.options.hidden = 0;
    REQUIRE_THROWS_WITH(make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, c.options), Catch::Matchers::Contains("hidden"));
  }
  SECTION("micro-batch count") {
    c.mbs.pop_back();
    REQUIRE_THROWS_AS(make_plan(c.schedule, c.mbs, c.vstages, c.lengths, nullptr, c.options), packpipe::InvalidArgument);
  }
}

TEST_CASE("instructions: synthetic orders refuse what they cannot build", "[negative]") {
  REQUIRE_THROWS_WITH(syn::order("pipedream", 2, 1, 4), Catch::Matchers::Contains("pipedream"));
  REQUIRE_THROWS_WITH(syn::order("1f1b", 4, 2, 6), Catch::Matchers::Contains("divisible"));
  REQUIRE_THROWS_AS(syn::order("1f1b", 0, 1, 4), packpipe::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// The real schedules (schedules.h) and their simulator, on random batches.

TEST_CASE("instructions: the validator passes on every plan of random batches for every real schedule", "[stress]") {
  std::mt19937_64 rng(0x5eed0005);
  std::map<std::string, int> built;
  for (int t = 0; t < 1200; ++t) {
    std::string shape;
    for (const auto& kp : syn::real_schedule_plans(rng(), &shape)) {
      const ValidationReport rep = validate(kp.plan);
      INFO(kp.kind << " " << shape << "\n" << violations_text(kp.plan, rep));
      REQUIRE(rep.ok());
      ++built[kp.kind];
    }
  }
  for (ScheduleKind k : all_schedule_kinds()) CHECK(built[schedule_kind_name(k)] > 100);
}
