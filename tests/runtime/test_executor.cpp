// The executor on the in-process transport: every plan packpipe builds runs to completion with
// every payload verified, and the transport delivers each receive the send the validator matched.
#include <catch2/catch.hpp>

#include <map>
#include <atomic>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "plan/dry_run.h"
#include "plan/validator.h"
#include "runtime/local.h"
#include "runtime/replay.h"
#include "runtime/report.h"
#include "tests/support/synthetic_plans.h"

using namespace packpipe::runtime;
namespace pl = packpipe::plan;
namespace syn = packpipe::test::synthetic;

namespace {

// Replay handlers that add the payload bytes they verified to a shared count when they end.
struct Counting {
  std::atomic<std::uint64_t> verified{0};
  struct Handler : ReplayHandler {
    Handler(ReplayOptions o, std::atomic<std::uint64_t>& n) : ReplayHandler(o), n_(n) {}
    ~Handler() override { n_ += verified_bytes(); }
    std::atomic<std::uint64_t>& n_;
  };
  HandlerFactory factory(ReplayOptions o) {
    return [this, o](std::uint32_t) { return std::make_unique<Handler>(o, verified); };
  }
};

ReplayOptions fast(std::uint64_t payload = 256) {
  ReplayOptions o;
  o.time_scale = 0;
  o.payload_bytes = payload;
  return o;
}

// Data messages of a plan (the dry run's channels) and the executor's control messages.
std::uint64_t expected_messages(const pl::Plan& p) {
  pl::DryRun dry(p);
  std::uint64_t n = 0;
  for (const auto& c : dry.channels()) n += c.sends.size();
  if (p.ranks > 1) n += p.ranks == 2 ? 2 : 2 * std::uint64_t{p.ranks};  // one fingerprint to each neighbour
  return n;
}

// Replica k of dp = 2: the same streams, its own samples and loss weights.
std::vector<pl::Plan> two_replicas(const pl::Plan& p) {
  std::vector<pl::Plan> out(2, p);
  std::uint64_t tokens = 0, loss = 0;
  for (const auto& mb : p.microbatches) {
    tokens += mb.tokens;
    loss += mb.loss_tokens;
  }
  for (std::uint32_t k = 0; k < 2; ++k) {
    pl::Plan& q = out[k];
    q.dp = 2;
    q.replica = k;
    q.global_tokens = 2 * tokens;
    q.global_loss_tokens = 2 * loss;
    for (auto& mb : q.microbatches) {
      mb.loss_weight = static_cast<double>(mb.loss_tokens) / static_cast<double>(q.global_loss_tokens);
      for (auto& s : mb.samples) s += k * 1000000;
      mb.refs.clear();
    }
  }
  return out;
}

}  // namespace

TEST_CASE("runtime: plans of random batches under every schedule run to completion, payloads verified", "[stress]") {
  std::mt19937_64 rng(0x5eed0101);
  std::map<std::string, int> ran;
  std::uint64_t verified = 0, with_comm = 0;
  ExecutorOptions eo;
  eo.timeout_s = 60;
  // ThreadSanitizer runs a sample (PACKPIPE_TEST_SCALE=tsan): the same code, 10x slower.
  const char* scale = std::getenv("PACKPIPE_TEST_SCALE");
  const int batches = scale != nullptr && std::string(scale) == "tsan" ? 120 : 1000;
  for (int t = 0; t < batches; ++t) {
    std::string shape;
    const bool dp2 = t % 3 == 0;
    for (const auto& kp : syn::real_schedule_plans(rng(), &shape)) {
      INFO(kp.kind << " " << shape << (dp2 ? " dp=2" : " dp=1"));
      Counting counting;
      if (dp2) {
        const auto plans = two_replicas(kp.plan);
        for (const auto& q : plans) REQUIRE(pl::validate(q).ok());
        REQUIRE(pl::validate_replicas(plans).empty());
        const auto runs = run_local_replicas(plans, counting.factory(fast()), eo);
        REQUIRE(runs.size() == 2);
        for (std::size_t k = 0; k < 2; ++k) {
          CHECK(runs[k].messages == expected_messages(plans[k]));
          for (std::size_t r = 0; r < plans[k].ranks; ++r) CHECK(runs[k].records[r].times.size() == plans[k].streams[r].size());
        }
      } else {
        const LocalRun run = run_local(kp.plan, counting.factory(fast()), eo);
        CHECK(run.messages == expected_messages(kp.plan));
        for (std::size_t r = 0; r < kp.plan.ranks; ++r) {
          REQUIRE(run.records[r].times.size() == kp.plan.streams[r].size());
          for (const auto& tm : run.records[r].times) CHECK(tm.end_ns >= tm.start_ns);
        }
      }
      const std::uint64_t v = counting.verified;
      CHECK(v > 0);  // loads are verified even on one rank
      verified += v;
      with_comm += kp.plan.ranks > 1;
      ++ran[kp.kind];
    }
  }
  for (const auto& k : {"gpipe", "1f1b", "interleaved-1f1b", "cyclic", "wait-free-cyclic", "zero-bubble"}) {
    INFO(k);
    CHECK(ran[k] > batches / 10);
  }
  CHECK(with_comm > static_cast<std::uint64_t>(batches));
  CHECK(verified > 0);
}

TEST_CASE("runtime: full-size payloads cross ranks byte for byte", "[interface]") {
  // Every byte of every tensor moved and checked (small shapes).
  for (const char* kind : {"gpipe", "1f1b", "zero-bubble"}) {
    syn::Case c = syn::random_case(kind, 3, 1, 6, 11);
    for (auto& mb : c.mbs) {
      mb.padded_len = 16;
      mb.tokens = 0;
      for (auto s : mb.samples) {
        c.lengths.input[s] = std::min<std::uint32_t>(c.lengths.input[s], 16);
        mb.tokens += c.lengths.input[s];
      }
    }
    c.options.hidden = 8;
    const pl::Plan p = syn::build(c);
    REQUIRE(pl::validate(p).ok());
    Counting counting;
    const LocalRun run = run_local(p, counting.factory(fast(0)));
    const std::uint64_t v = counting.verified;
    std::uint64_t expected = 0;
    for (std::size_t r = 0; r < p.ranks; ++r) {
      for (const auto& ins : p.streams[r]) {
        if (ins.op == pl::Opcode::RecvActStart || ins.op == pl::Opcode::RecvGradStart) expected += p.shapes[ins.shape].bytes();
      }
    }
    INFO(kind);
    CHECK(v >= 2 * expected);  // checked on receipt and again where it is read
  }
}

TEST_CASE("runtime: the executor refuses an invalid plan on every rank", "[negative]") {
  pl::Plan p = syn::random_plan("1f1b", 2, 1, 4, 9);
  p.streams[1].pop_back();
  Counting counting;
  REQUIRE_THROWS_WITH(run_local(p, counting.factory(fast())), Catch::Matchers::Contains("refusing to run an invalid plan"));
}

TEST_CASE("runtime: the summary and trace put measured beside planned", "[interface]") {
  const pl::Plan p = syn::random_plan("1f1b", 2, 1, 4, 21);
  ReplayOptions o = fast();
  o.time_scale = 0.0;
  Counting counting;
  const LocalRun run = run_local(p, counting.factory(o));
  const std::vector<ExecutedPlan> runs{{&p, run.records}};
  const RunSummary s = summarize(runs, 1.0);
  REQUIRE(s.plans.size() == 1);
  CHECK(s.plans[0].measured_ms > 0);
  CHECK(s.plans[0].simulated_ms == Approx(p.makespan_ms));
  std::uint64_t n = 0;
  for (const auto& st : p.streams) n += st.size();
  CHECK(s.instructions == n);
  CHECK(s.overhead_ns_per_instruction > 0);
  const std::string j = trace_json(runs, 1.0);
  CHECK(j.find("\"measured\"") != std::string::npos);
  CHECK(j.find("planned") != std::string::npos);
  CHECK(j.find("\"F0\"") != std::string::npos);
}
