// The executor's overhead per instruction: plans run with a handler that does nothing (zero-length
// ops, no payload) on the in-process transport, so the time is the interpreter's dispatch, slot
// bookkeeping, size checks and (with several ranks) the transport's matching and waits. One rank
// (dispatch only, a 4-chunk plan on one rank) and four ranks on persistent threads; each runs the
// plan `reps` times per benchmark iteration. Counters: ns_per_instruction (wall time / the
// instructions of all ranks) and own_ns_per_instruction (the executor's own time as it records
// it: wall time minus handler, wait and posting time, per instruction).
// With PACKPIPE_BENCH_SMALL=1, small plans.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/executor.h"
#include "runtime/inprocess.h"
#include "tests/support/synthetic_plans.h"

namespace {

namespace pl = packpipe::plan;
namespace rt = packpipe::runtime;
namespace syn = packpipe::test::synthetic;

bool small() {
  const char* s = std::getenv("PACKPIPE_BENCH_SMALL");
  return s != nullptr && std::strcmp(s, "1") == 0;
}

// Zero-length ops: every buffer is one shared 8-byte block declared at the plan's size.
class NullHandler final : public rt::StageHandler {
 public:
  NullHandler() : block_(rt::host_buffer(8)) {}
  rt::Buffer load(const rt::OpContext& c) override { return sized(c.shape); }
  rt::Buffer forward(const rt::OpContext& c, const rt::Buffer*, const rt::Buffer*) override { return sized(c.out_shape); }
  rt::Buffer backward(const rt::OpContext& c, const rt::Buffer*) override { return sized(c.out_shape); }
  void backward_weight(const rt::OpContext&) override {}
  void reduce_grad(const rt::OpContext&) override {}
  void optimizer_step(const rt::OpContext&) override {}
  rt::Buffer allocate(const rt::OpContext& c) override { return sized(c.shape); }

 private:
  rt::Buffer sized(const pl::TensorShape* s) {
    rt::Buffer b = block_;
    b.bytes = s != nullptr ? s->bytes() : 8;
    b.materialized = std::min<std::uint64_t>(8, b.bytes);
    return b;
  }
  rt::Buffer block_;
};

// Runs `plan` `reps` times on each rank's persistent thread; returns the executor's own ns summed.
std::int64_t run_reps(const pl::Plan& plan, int reps, bool validate) {
  rt::InProcessGroup group(plan.ranks);
  std::vector<std::thread> threads;
  std::atomic<std::int64_t> own{0};
  for (std::uint32_t r = 0; r < plan.ranks; ++r) {
    threads.emplace_back([&, r] {
      auto t = group.transport(r);
      NullHandler h;
      rt::ExecutorOptions o;
      o.validate = validate;
      o.record = false;
      rt::Executor ex(h, *t, o);
      std::int64_t mine = 0;
      for (int k = 0; k < reps; ++k) mine += ex.run(plan).overhead_ns();
      own += mine;
    });
  }
  for (auto& t : threads) t.join();
  return own.load();
}

void BM_ExecutorOverhead(benchmark::State& state) {
  const auto ranks = state.range(0);
  const bool validate = state.range(1) != 0;
  const pl::Plan plan = ranks == 1 ? syn::random_plan("1f1b", 1, 4, small() ? 4 : 32, 3)
                                   : syn::random_plan("1f1b", ranks, 1, small() ? 4 : 32, 3);
  const int reps = small() ? 2 : 50;
  std::int64_t own = 0;
  for (auto _ : state) own += run_reps(plan, reps, validate);
  const double instructions = static_cast<double>(plan.instruction_count()) * reps;
  state.counters["instructions"] = static_cast<double>(plan.instruction_count());
  // Wall time per instruction of the whole pipeline (all ranks' instructions).
  state.counters["ns_per_instruction"] =
      benchmark::Counter(instructions, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["own_ns_per_instruction"] =
      static_cast<double>(own) / (instructions * static_cast<double>(state.iterations()));
}
BENCHMARK(BM_ExecutorOverhead)
    ->ArgsProduct({{1, 4}, {0, 1}})
    ->ArgNames({"ranks", "validate"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
