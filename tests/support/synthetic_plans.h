// Synthetic plans for tests and benchmarks: random micro-batches and costs under textbook
// schedules, built with the library's own schedule orders and plan builder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "partition/pipeline.h"
#include "plan/builder.h"
#include "plan/plan.h"
#include "plan/timeline.h"
#include "schedule/stage_costs.h"

namespace packpipe::test::synthetic {

/// Per-rank compute orders of textbook schedules (times zero; `assign_times` fills them).
/// `kind`: "gpipe", "1f1b" (Megatron's interleaved order when chunks > 1) or "zero-bubble" (that
/// order with each backward split into its input-gradient half and a weight-gradient half deferred
/// by S - 1 - rank ops). The orders are schedule::build_order's. Throws InvalidArgument for an
/// unknown kind, sizes below 1, or an interleaved order whose micro-batches ranks do not divide.
plan::Schedule order(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches);
/// Event-driven list scheduling of `schedule`'s per-rank orders: each op starts when its rank is
/// free and its inputs have arrived (plus `comm_ms` across ranks), lasting StageCostTable::op_ms;
/// sets start/end and the makespan. Throws InvalidArgument if the orders deadlock.
void assign_times(plan::Schedule& schedule, const schedule::StageCostTable& costs, double comm_ms);

/// The parts random_plan builds, for tests that change one of them.
struct Case {
  std::vector<partition::VirtualStage> vstages;
  std::vector<partition::MicroBatch> mbs;
  partition::BatchLengths lengths;  ///< every sample's lengths (its micro-batch's tokens are theirs)
  schedule::StageCostTable costs;
  plan::Schedule schedule;
  plan::PlanOptions options;
};
/// A random but valid test case: micro-batches with random rows and lengths (seeded; same seed,
/// same result), costs from a simple analytic formula, the schedule's times, and the plan options.
/// `same_shape`: every micro-batch gets one shape (exportable to PyTorch).
/// `encoder_decoder`: the first half of the virtual stages is an encoder.
Case random_case(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
                 std::uint64_t seed, bool same_shape = false, bool encoder_decoder = false);
/// The plan of random_case (planner::make_plan).
plan::Plan random_plan(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
                       std::uint64_t seed, bool same_shape = false, bool encoder_decoder = false);
/// A case's plan (planner::make_plan of its parts).
plan::Plan build(const Case& c);

/// A plan of one random batch under one real schedule kind.
struct KindPlan {
  std::string kind;  ///< schedule::schedule_kind_name
  plan::Plan plan;
};
/// One random batch (seeded): S 1-8, chunks 1-2, random micro-batch shapes and costs, decoder-only
/// or encoder-decoder (a quarter), a random communication model, nodes and memory limit, a shuffled
/// micro-batch order; its plans under every real schedule kind that supports the shape (simulated
/// by the schedule component, built by the planner). `shape` (optional) receives "S=.. chunks=..
/// mbs=.. encdec=..".
std::vector<KindPlan> real_schedule_plans(std::uint64_t seed, std::string* shape = nullptr);

}  // namespace packpipe::test::synthetic
