// The dry run: the plan's streams executed under the rendezvous model, one handler per opcode.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "plan/dry_run.h"
#include "plan/validator.h"
#include "tests/support/synthetic_plans.h"

using namespace packpipe::plan;
namespace syn = packpipe::test::synthetic;

TEST_CASE("dry run: valid plans finish; every receive gets the send of its message", "[interface]") {
  std::mt19937_64 rng(7);
  for (int t = 0; t < 120; ++t) {
    const char* kinds[] = {"gpipe", "1f1b", "zero-bubble"};
    const std::string kind = kinds[rng() % 3];
    const std::int64_t S = 1 + static_cast<std::int64_t>(rng() % 6), C = 1 + static_cast<std::int64_t>(rng() % 2);
    const std::int64_t N = S * (1 + static_cast<std::int64_t>(rng() % 4));
    const bool encdec = (rng() % 3 == 0) && (S * C) % 2 == 0;
    const Plan p = syn::random_plan(kind, S, C, N, rng(), false, encdec);
    std::vector<std::string> problems;
    DryRun dry(p, [&](const char* k, std::int64_t r, std::int64_t i, std::string m) {
      problems.push_back(std::string(k) + " " + std::to_string(r) + ":" + std::to_string(i) + " " + m);
      return true;
    });
    INFO(kind << " S=" << S << " C=" << C << " N=" << N);
    REQUIRE(dry.run());
    REQUIRE(problems.empty());
    std::size_t waits = 0;
    for (std::size_t r = 0; r < p.ranks; ++r) {
      REQUIRE(dry.position(r) == p.streams[r].size());
      for (std::size_t i = 0; i < p.streams[r].size(); ++i) {
        const Instruction& w = p.streams[r][i];
        const auto [sr, si] = dry.matched_send(r, i);
        if (w.op != Opcode::RecvActWait && w.op != Opcode::RecvGradWait) {
          CHECK(sr == -1);
          continue;
        }
        ++waits;
        REQUIRE(sr >= 0);
        const Instruction& s = p.streams[sr][si];
        CHECK(s.op == (w.op == Opcode::RecvActWait ? Opcode::SendActStart : Opcode::SendGradStart));
        CHECK(s.mb == w.mb);
        CHECK(s.peer == r);
        CHECK(static_cast<std::uint32_t>(sr) == w.peer);
        CHECK(s.stage == (w.op == Opcode::RecvActWait ? w.stage - 1 : w.stage + 1));
      }
    }
    std::size_t messages = 0;
    for (const auto& c : dry.channels()) {
      CHECK(c.sends.size() == c.recvs.size());
      CHECK(c.sends_posted == c.sends.size());
      messages += c.sends.size();
    }
    CHECK(waits == messages);
    // Every (mb, stage) ran once forward and once backward (or its two halves).
    for (std::size_t k = 0; k < dry.forwards().size(); ++k) {
      CHECK(dry.forwards()[k] == 1);
      CHECK(dry.backwards()[k] + dry.input_grads()[k] == 1);
      CHECK(dry.input_grads()[k] == dry.weight_grads()[k]);
    }
  }
}

TEST_CASE("dry run: sends swapped on a channel are reported (a send of data not yet produced)", "[negative]") {
  Plan p = syn::random_plan("1f1b", 2, 1, 4, 3);
  // Rank 0 posts the send of micro-batch 1 where micro-batch 0 was sent.
  auto& st = p.streams[0];
  std::size_t a = st.size(), b = st.size();
  for (std::size_t i = 0; i < st.size(); ++i) {
    if (st[i].op != Opcode::SendActStart) continue;
    if (a == st.size()) {
      a = i;
    } else {
      b = i;
      break;
    }
  }
  REQUIRE(b < st.size());
  std::swap(st[a], st[b]);  // rank 0 now sends micro-batch 1 before 0 on the activation channel
  std::vector<std::pair<std::string, std::string>> problems;
  DryRun dry(p, [&](const char* k, std::int64_t, std::int64_t, std::string m) {
    problems.emplace_back(k, std::move(m));
    return true;
  });
  dry.run();
  bool found = false;
  for (const auto& [k, m] : problems) {
    UNSCOPED_INFO(k << ": " << m);
    found = found || k == "dataflow" || k == "deadlock" || k == "buffer";
  }
  CHECK(found);
  // The validator reports the same through its own pass over the dry run.
  CHECK_FALSE(validate(p).ok());
}

TEST_CASE("dry run: the reporter stops the run", "[interface]") {
  Plan p = syn::random_plan("gpipe", 3, 1, 3, 5);
  for (auto& st : p.streams) {
    for (auto& ins : st) {
      if (ins.op == Opcode::FreeBuf) ins.op = Opcode::IterBegin;  // nothing is ever freed
    }
  }
  int calls = 0;
  DryRun dry(p, [&](const char*, std::int64_t, std::int64_t, std::string) { return ++calls < 2; });
  CHECK_FALSE(dry.run());
  CHECK(calls == 2);
}
