// Plan generation, validation and serialization: encode / decode speed and bytes per instruction
// of packpipe's binary plan format, against DynaPipe's serialization layout (re-implemented from
// its description: u8 class, i32 micro-batch, i32 stage, i32 buffer count + ids, i32 shape count
// + per shape u8 ndim + 32 bytes per dimension, i32 peer, 4-byte flag on backward) measured in
// the same run. Plans: 40 micro-batches on 8 stages (1F1B and interleaved zero-bubble); with
// PACKPIPE_BENCH_SMALL=1, 4 micro-batches on 2 stages.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "plan/builder.h"
#include "planner/planner.h"
#include "tests/support/synthetic_plans.h"
#include "plan/format.h"
#include "plan/validator.h"

namespace {

using namespace packpipe::plan;
using namespace packpipe::planner;
namespace synthetic = packpipe::test::synthetic;

bool small() {
  const char* s = std::getenv("PACKPIPE_BENCH_SMALL");
  return s != nullptr && std::strcmp(s, "1") == 0;
}

// arg 0: 1F1B, 1 chunk; arg 1: zero-bubble, 2 chunks.
const Plan& plan_for(int which) {
  static const Plan a = small() ? synthetic::random_plan("1f1b", 2, 1, 4, 1) : synthetic::random_plan("1f1b", 8, 1, 40, 1);
  static const Plan b =
      small() ? synthetic::random_plan("zero-bubble", 2, 2, 4, 2) : synthetic::random_plan("zero-bubble", 8, 2, 40, 2);
  return which == 0 ? a : b;
}

void set_counters(benchmark::State& state, const Plan& p, std::size_t bytes) {
  const double n = static_cast<double>(p.instruction_count());
  state.counters["instructions"] = n;
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["bytes_per_instruction"] = static_cast<double>(bytes) / n;
  state.counters["instructions_per_s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

// DynaPipe's layout of one plan per rank (what its ExecutionPlan.serialize writes).
std::vector<std::uint8_t> dynapipe_layout(const Plan& p) {
  std::vector<std::uint8_t> out;
  auto i32 = [&](std::int64_t v) {
    const auto u = static_cast<std::uint32_t>(v);
    for (int k = 0; k < 4; ++k) out.push_back(static_cast<std::uint8_t>(u >> (8 * k)));
  };
  auto shape = [&](const TensorShape& s) {
    out.push_back(3);  // ndim
    for (std::uint32_t d : {s.rows, s.seq, s.hidden}) {
      // 32 bytes per dimension (ISO-8859-1 encoded Python int, zero padded).
      std::string t = std::to_string(d);
      t.resize(32, '\0');
      out.insert(out.end(), t.begin(), t.end());
    }
  };
  i32(static_cast<std::int64_t>(p.ranks));
  for (std::uint32_t r = 0; r < p.ranks; ++r) {
    const auto start = out.size();
    for (int k = 0; k < 8; ++k) i32(0);  // 8 header fields
    for (std::uint32_t v = 0; v < p.vstages; ++v)
      if (p.stage_rank[v] == r) i32(v);
    for (const auto& ins : p.streams[r]) {
      if (ins.op == Opcode::IterBegin || ins.op == Opcode::IterEnd || ins.op == Opcode::ReduceGrad || ins.op == Opcode::OptStep)
        continue;  // DynaPipe has no such instructions
      out.push_back(static_cast<std::uint8_t>(ins.op));
      i32(ins.mb == kNone ? 0 : ins.mb);
      i32(ins.stage == kNone ? 0 : ins.stage);
      std::vector<std::uint32_t> bufs;
      for (std::uint32_t b : {ins.in, ins.in2, ins.out})
        if (b != kNone) bufs.push_back(b);
      i32(static_cast<std::int64_t>(bufs.size()));
      for (auto b : bufs) i32(b);
      // Shapes: the message's (comm and loads) or the micro-batch's activation (compute).
      std::vector<TensorShape> shapes;
      if (ins.shape != kNone) {
        shapes.push_back(p.shapes[ins.shape]);
      } else if (ins.mb != kNone && is_compute(ins.op)) {
        const auto& mb = p.microbatches[ins.mb];
        shapes.push_back(TensorShape{mb.rows, mb.padded_len, 4096, 0, Dtype::BF16});
      }
      i32(static_cast<std::int64_t>(shapes.size()));
      for (const auto& s : shapes) shape(s);
      if (opcode_fields(ins.op) & kFieldPeer) i32(ins.peer);
      if (ins.op == Opcode::Backward || ins.op == Opcode::BackwardInput) i32(0);
    }
    (void)start;
  }
  return out;
}

std::size_t dynapipe_instruction_count(const Plan& p) {
  std::size_t n = 0;
  for (const auto& st : p.streams)
    for (const auto& ins : st)
      n += !(ins.op == Opcode::IterBegin || ins.op == Opcode::IterEnd || ins.op == Opcode::ReduceGrad ||
             ins.op == Opcode::OptStep);
  return n;
}

void BM_BuildPlan(benchmark::State& state) {
  const bool zb = state.range(0) == 1;
  const auto c = small() ? synthetic::random_case(zb ? "zero-bubble" : "1f1b", 2, zb ? 2 : 1, 4, 3)
                         : synthetic::random_case(zb ? "zero-bubble" : "1f1b", 8, zb ? 2 : 1, 40, 3);
  std::size_t n = 0;
  for (auto _ : state) {
    const Plan p = make_plan(c.schedule, c.mbs, c.vstages, c.lengths, &c.costs, c.options);
    n = p.instruction_count();
    benchmark::DoNotOptimize(n);
  }
  state.counters["instructions"] = static_cast<double>(n);
}
BENCHMARK(BM_BuildPlan)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_Validate(benchmark::State& state) {
  const Plan& p = plan_for(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    const auto rep = validate(p);
    benchmark::DoNotOptimize(rep.violations.size());
  }
  state.counters["instructions_per_s"] =
      benchmark::Counter(static_cast<double>(p.instruction_count()), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Validate)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_Encode(benchmark::State& state) {
  const Plan& p = plan_for(static_cast<int>(state.range(0)));
  EncodeOptions o;
  o.compress = state.range(1) != 0;
  std::size_t bytes = 0;
  for (auto _ : state) {
    const auto b = encode_plan(p, o);
    bytes = b.size();
    benchmark::DoNotOptimize(b.data());
  }
  set_counters(state, p, bytes);
}
BENCHMARK(BM_Encode)->ArgsProduct({{0, 1}, {0, 1}})->ArgNames({"zb", "zstd"})->Unit(benchmark::kMicrosecond);

void BM_EncodeStreamsOnly(benchmark::State& state) {
  // Without the optional simulated timeline (19 bytes per compute op) for a like-for-like size.
  Plan p = plan_for(static_cast<int>(state.range(0)));
  p.timeline.clear();
  std::size_t bytes = 0;
  for (auto _ : state) {
    const auto b = encode_plan(p);
    bytes = b.size();
    benchmark::DoNotOptimize(b.data());
  }
  set_counters(state, p, bytes);
}
BENCHMARK(BM_EncodeStreamsOnly)->Arg(0)->Arg(1)->ArgName("zb")->Unit(benchmark::kMicrosecond);

void BM_Decode(benchmark::State& state) {
  const Plan& p = plan_for(static_cast<int>(state.range(0)));
  EncodeOptions o;
  o.compress = state.range(1) != 0;
  const auto b = encode_plan(p, o);
  for (auto _ : state) {
    const Plan q = decode_plan(b.data(), b.size());
    benchmark::DoNotOptimize(q.streams.data());
  }
  set_counters(state, p, b.size());
}
BENCHMARK(BM_Decode)->ArgsProduct({{0, 1}, {0, 1}})->ArgNames({"zb", "zstd"})->Unit(benchmark::kMicrosecond);

void BM_JsonEncode(benchmark::State& state) {
  const Plan& p = plan_for(static_cast<int>(state.range(0)));
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string j = plan_to_json(p, -1);
    bytes = j.size();
    benchmark::DoNotOptimize(j.data());
  }
  set_counters(state, p, bytes);
}
BENCHMARK(BM_JsonEncode)->Arg(0)->ArgName("zb")->Unit(benchmark::kMicrosecond);

// Baseline: DynaPipe's layout, the same plan.
void BM_DynaPipeLayoutEncode(benchmark::State& state) {
  const Plan& p = plan_for(static_cast<int>(state.range(0)));
  std::size_t bytes = 0;
  for (auto _ : state) {
    const auto b = dynapipe_layout(p);
    bytes = b.size();
    benchmark::DoNotOptimize(b.data());
  }
  const double n = static_cast<double>(dynapipe_instruction_count(p));
  state.counters["instructions"] = n;
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["bytes_per_instruction"] = static_cast<double>(bytes) / n;
}
BENCHMARK(BM_DynaPipeLayoutEncode)->Arg(0)->Arg(1)->ArgName("zb")->Unit(benchmark::kMicrosecond);

}  // namespace
