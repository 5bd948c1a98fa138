// Faults end every rank with a named error within the timeout, never a hang: a rank that throws, a
// rank that never starts, ranks given different plans, a corrupted payload, a receive whose size
// disagrees with the send.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "runtime/local.h"
#include "runtime/replay.h"
#include "tests/support/synthetic_plans.h"

using namespace packpipe::runtime;
namespace pl = packpipe::plan;
namespace syn = packpipe::test::synthetic;

namespace {

ReplayOptions fast() {
  ReplayOptions o;
  o.time_scale = 0;
  o.payload_bytes = 256;
  return o;
}

// A replay handler that throws at one instruction of its rank.
class Throwing : public ReplayHandler {
 public:
  Throwing(std::size_t at) : ReplayHandler(fast()), at_(at) {}
  Buffer forward(const OpContext& c, const Buffer* in, const Buffer* in2) override {
    check(c);
    return ReplayHandler::forward(c, in, in2);
  }
  Buffer backward(const OpContext& c, const Buffer* g) override {
    check(c);
    return ReplayHandler::backward(c, g);
  }
  Buffer load(const OpContext& c) override {
    check(c);
    return ReplayHandler::load(c);
  }

 private:
  void check(const OpContext& c) {
    if (c.index >= at_) throw std::runtime_error("injected failure: out of memory in the model");
  }
  std::size_t at_;
};

// Wraps a transport; flips one byte of the n-th activation it sends.
class Corrupting : public Transport {
 public:
  Corrupting(std::unique_ptr<Transport> t, int nth) : t_(std::move(t)), nth_(nth) {}
  std::uint32_t rank() const override { return t_->rank(); }
  std::uint32_t ranks() const override { return t_->ranks(); }
  std::unique_ptr<Request> send(const Buffer& b, std::uint32_t peer, Channel ch) override {
    if (ch != Channel::Activation || count_++ != nth_ || b.materialized == 0) return t_->send(b, peer, ch);
    Buffer copy = host_buffer(b.bytes, b.materialized);
    std::memcpy(copy.data, b.data, b.materialized);
    static_cast<std::uint8_t*>(copy.data)[b.materialized / 2] ^= 0x40;
    return t_->send(copy, peer, ch);
  }
  std::unique_ptr<Request> recv(const Buffer& b, std::uint32_t peer, Channel ch) override { return t_->recv(b, peer, ch); }
  void abort(const std::string& why) noexcept override { t_->abort(why); }
  std::string abort_reason() const override { return t_->abort_reason(); }

 private:
  std::unique_ptr<Transport> t_;
  int nth_;
  int count_ = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `plans[r]` on rank r (all from one group); returns every rank's error ("" if it finished).
std::vector<std::string> run_ranks(const std::vector<const pl::Plan*>& plans, const ExecutorOptions& eo,
                                   const std::vector<bool>& start, const HandlerFactory& handlers) {
  InProcessGroup group(static_cast<std::uint32_t>(plans.size()));
  std::vector<std::string> errors(plans.size());
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < plans.size(); ++r) {
    if (!start[r]) continue;
    threads.emplace_back([&, r] {
      try {
        auto t = group.transport(r);
        auto h = handlers(r);
        Executor ex(*h, *t, eo);
        ex.run(*plans[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST_CASE("faults: a rank that throws at a random instruction ends every rank, naming it", "[negative]") {
  std::mt19937_64 rng(0xfa17);
  for (int t = 0; t < 40; ++t) {
    const std::int64_t S = 2 + static_cast<std::int64_t>(rng() % 5);
    const pl::Plan p = syn::random_plan(t % 2 ? "1f1b" : "zero-bubble", S, 1, S + 2, rng());
    const auto bad = static_cast<std::uint32_t>(rng() % static_cast<std::uint64_t>(S));
    std::vector<std::size_t> points;  // where the handler is called for compute or loads
    for (std::size_t i = 0; i < p.streams[bad].size(); ++i) {
      const auto op = p.streams[bad][i].op;
      if (op == pl::Opcode::Forward || op == pl::Opcode::Backward || op == pl::Opcode::BackwardInput ||
          op == pl::Opcode::LoadMb)
        points.push_back(i);
    }
    const std::size_t at = t % 4 == 0 ? points.front() : points[rng() % points.size()];
    ExecutorOptions eo;
    eo.timeout_s = 30;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<const pl::Plan*> plans(static_cast<std::size_t>(S), &p);
    const auto errors = run_ranks(plans, eo, std::vector<bool>(static_cast<std::size_t>(S), true), [&](std::uint32_t r) {
      return r == bad ? std::unique_ptr<StageHandler>(new Throwing(at)) : std::unique_ptr<StageHandler>(new ReplayHandler(fast()));
    });
    CHECK(seconds_since(t0) < eo.timeout_s);  // ended by the abort, not by timeouts
    INFO("S=" << S << " bad rank " << bad << " at " << at);
    REQUIRE_THAT(errors[bad], Catch::Matchers::Contains("injected failure") &&
                                  Catch::Matchers::Contains(fmt::format("rank {}, iteration {}, instruction", bad, p.iteration)));
    for (std::size_t r = 0; r < errors.size(); ++r) {
      INFO("rank " << r << ": " << errors[r]);
      // Every rank ends with an error, unless it had finished before the failure.
      if (!errors[r].empty() && r != bad) CHECK_THAT(errors[r], Catch::Matchers::Contains("injected failure"));
    }
    // A failure at the rank's first compute op leaves every other rank waiting for data that never
    // comes: all of them must end with the error (none may report success).
    if (at == points.front()) {
      for (const auto& e : errors) CHECK_FALSE(e.empty());
    }
  }
}

TEST_CASE("faults: a rank that never starts ends the others at the timeout, naming what they awaited", "[negative]") {
  const pl::Plan p = syn::random_plan("1f1b", 4, 1, 6, 5);
  ExecutorOptions eo;
  eo.timeout_s = 0.3;
  std::vector<const pl::Plan*> plans(4, &p);
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = run_ranks(plans, eo, {true, true, false, true},  // rank 2 never starts
                                [](std::uint32_t) { return std::make_unique<ReplayHandler>(fast()); });
  CHECK(seconds_since(t0) < 10);
  bool named = false;
  for (std::uint32_t r : {0u, 1u, 3u}) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE_FALSE(errors[r].empty());
    named = named || (errors[r].find("waiting for rank 2") != std::string::npos);
  }
  CHECK(named);
}

TEST_CASE("faults: ranks given different plans end with both fingerprints, before any data moves", "[negative]") {
  const pl::Plan a = syn::random_plan("1f1b", 3, 1, 5, 1);
  pl::Plan b = syn::random_plan("1f1b", 3, 1, 5, 2);  // same pipeline, other micro-batches
  ExecutorOptions eo;
  eo.timeout_s = 10;
  const auto errors = run_ranks({&a, &b, &a}, eo, {true, true, true},
                                [](std::uint32_t) { return std::make_unique<ReplayHandler>(fast()); });
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE_THAT(errors[r], Catch::Matchers::Contains("plan disagreement") && Catch::Matchers::Contains("fingerprint 0x"));
  }
  CHECK_THAT(errors[0], Catch::Matchers::Contains("rank 0") && Catch::Matchers::Contains("rank 1"));
}

TEST_CASE("faults: a corrupted payload is caught where it is received", "[negative]") {
  const pl::Plan p = syn::random_plan("gpipe", 3, 1, 4, 8);
  for (int nth : {0, 2}) {
    ExecutorOptions eo;
    eo.timeout_s = 10;
    try {
      run_local(p, [](std::uint32_t) { return std::make_unique<ReplayHandler>(fast()); }, eo,
                [nth](InProcessGroup& g, std::uint32_t r) -> std::unique_ptr<Transport> {
                  if (r != 1) return g.transport(r);
                  return std::make_unique<Corrupting>(g.transport(r), nth);
                });
      FAIL("a corrupted payload passed");
    } catch (const packpipe::Error& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK_THAT(m, Catch::Matchers::Contains("payload check failed") && Catch::Matchers::Contains("received from rank 1"));
      CHECK_THAT(m, Catch::Matchers::Contains("rank 2, iteration"));
    }
  }
}

TEST_CASE("faults: a receive whose size disagrees with the send fails on both sides", "[negative]") {
  const pl::Plan a = syn::random_plan("gpipe", 2, 1, 3, 4);
  pl::Plan b = a;
  // Rank 1's first activation receive posted for another shape (a bigger one).
  pl::TensorShape big;
  for (auto& ins : b.streams[1]) {
    if (ins.op == pl::Opcode::RecvActStart) {
      big = b.shapes[ins.shape];
      big.rows += 1;
      b.shapes.push_back(big);
      ins.shape = static_cast<std::uint32_t>(b.shapes.size() - 1);
      break;
    }
  }
  SECTION("caught by the plan agreement before any data moves") {
    ExecutorOptions eo;
    eo.timeout_s = 10;
    eo.validate = false;
    const auto errors = run_ranks({&a, &b}, eo, {true, true},
                                  [](std::uint32_t) { return std::make_unique<ReplayHandler>(fast()); });
    for (const auto& e : errors) CHECK_THAT(e, Catch::Matchers::Contains("plan disagreement"));
  }
  SECTION("caught by the transport when nothing else checks") {
    ExecutorOptions eo;
    eo.timeout_s = 10;
    eo.validate = false;
    eo.check_agreement = false;
    const auto errors = run_ranks({&a, &b}, eo, {true, true},
                                  [](std::uint32_t) { return std::make_unique<ReplayHandler>(fast()); });
    for (std::size_t r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << errors[r]);
      CHECK_THAT(errors[r], Catch::Matchers::Contains("rank 0 sent") && Catch::Matchers::Contains("rank 1 posted a receive of"));
    }
  }
}

TEST_CASE("faults: an unvalidated plan with more buffer slots than instructions is refused before allocating",
          "[negative]") {
  pl::Plan p = syn::random_plan("1f1b", 2, 1, 3, 4);
  p.buffer_slots[1] = std::uint32_t{1} << 31;  // a corrupt header: billions of slots
  ExecutorOptions eo;
  eo.timeout_s = 2;
  eo.validate = false;
  const auto errors = run_ranks({&p, &p}, eo, {true, true},
                                [](std::uint32_t) { return std::make_unique<ReplayHandler>(fast()); });
  CHECK_THAT(errors[1], Catch::Matchers::Contains("buffer_slots[1]: expected at most the stream's") &&
                            Catch::Matchers::Contains("found 2147483648"));
  CHECK_FALSE(errors[0].empty());  // its peer ends too, by the abort
}

TEST_CASE("faults: an unvalidated stream out of ITER_BEGIN ... ITER_END order is refused, handlers never see it",
          "[negative]") {
  const pl::Plan good = syn::random_plan("1f1b", 1, 1, 2, 4);
  ExecutorOptions eo;
  eo.timeout_s = 2;
  eo.validate = false;
  auto run_one = [&](const pl::Plan& p) {
    return run_ranks({&p}, eo, {true}, [](std::uint32_t) { return std::make_unique<ReplayHandler>(fast()); })[0];
  };
  REQUIRE(run_one(good).empty());
  REQUIRE(good.streams[0].front().op == pl::Opcode::IterBegin);
  REQUIRE(good.streams[0].back().op == pl::Opcode::IterEnd);
  pl::Plan no_begin = good;
  no_begin.streams[0].erase(no_begin.streams[0].begin());
  CHECK_THAT(run_one(no_begin), Catch::Matchers::Contains("malformed plan: an instruction before ITER_BEGIN"));
  pl::Plan twice = good;
  twice.streams[0].insert(twice.streams[0].begin() + 1, good.streams[0].front());
  CHECK_THAT(run_one(twice), Catch::Matchers::Contains("malformed plan: a second ITER_BEGIN"));
  pl::Plan no_end = good;
  no_end.streams[0].pop_back();
  CHECK_THAT(run_one(no_end), Catch::Matchers::Contains("malformed plan: the stream ends without ITER_END"));
  pl::Plan after_end = good;
  after_end.streams[0].push_back(good.streams[0][1]);
  CHECK_THAT(run_one(after_end), Catch::Matchers::Contains("malformed plan: an instruction after ITER_END"));
}

TEST_CASE("faults: a wait that times out names the rank, iteration, instruction, peer and micro-batch", "[negative]") {
  const pl::Plan p = syn::random_plan("1f1b", 2, 1, 3, 6);
  ExecutorOptions eo;
  eo.timeout_s = 0.2;
  eo.check_agreement = false;
  const auto errors = run_ranks({&p, &p}, eo, {false, true},
                                [](std::uint32_t) { return std::make_unique<ReplayHandler>(fast()); });
  INFO(errors[1]);
  CHECK_THAT(errors[1], Catch::Matchers::Contains("rank 1, iteration") && Catch::Matchers::Contains("instruction") &&
                            Catch::Matchers::Contains("RECV_ACT_WAIT mb=0") &&
                            Catch::Matchers::Contains("timed out after 0.2 s waiting for the activation of micro-batch 0 stage 0 from rank 0"));
}
