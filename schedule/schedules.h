// Pipeline schedules for variable micro-batches: per-rank op orders over S ranks and V = S c
// virtual stages (virtual stage v on rank v mod S). GPipe, 1F1B, interleaved 1F1B (Megatron's
// orders), DynaPipe's memory-aware cyclic and wait-free cyclic orders, and a ZB-H1-like
// zero-bubble order that defers weight gradients into bubbles under a memory cap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "common/schedule_kind.h"
#include "schedule/stage_costs.h"
#include "schedule/simulator.h"

namespace packpipe::schedule {

namespace pl = ::packpipe::plan;

// The kinds and their names are in common/schedule_kind.h (a calibration names them too).
using ::packpipe::kScheduleKindNames;
using ::packpipe::kScheduleKinds;
using ::packpipe::schedule_kind_from_name;
using ::packpipe::schedule_kind_name;
using ::packpipe::ScheduleKind;

/// Every kind, in the order of kScheduleKindNames.
const std::vector<ScheduleKind>& all_schedule_kinds();
/// Whether `k` can order `microbatches` micro-batches on `ranks` ranks with `chunks` virtual
/// stages per rank; when not, `why` (if given) says why. 1F1B needs chunks == 1; interleaved 1F1B
/// needs chunks > 1 and a multiple of `ranks` micro-batches (Megatron's groups; a partial last
/// group deadlocks).
bool schedule_supports(ScheduleKind k, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
                       std::string* why = nullptr);
/// As above for `problem` (its ranks, chunks and micro-batches), and interleaved 1F1B is refused for
/// a problem with slices (Megatron's table interleaves the micro-batches' chunks in a fixed order
/// that cannot put a slice's backward before its previous slice's).
bool schedule_supports(ScheduleKind k, const SimProblem& problem, std::string* why = nullptr);
/// Whether `k` runs micro-batches holding slices (every kind but interleaved 1F1B).
bool schedule_runs_slices(ScheduleKind k);

/// Whether `order` (a permutation of the micro-batches) puts every slice edge's prev before its next.
bool respects_slices(const SimProblem& problem, const std::vector<std::uint32_t>& order);
/// `order` as a valid forward order for the problem's slices: a stable topological sort of the
/// slice edges, every micro-batch as early as its position in `order` allows (`order` itself when it
/// is valid, and for a problem without slices). Deterministic; throws InvalidArgument when the
/// edges form a cycle (no order can run them) or name a micro-batch out of range.
std::vector<std::uint32_t> slice_order(const SimProblem& problem, const std::vector<std::uint32_t>& order);
/// The order of backwards for the forward order `order`: each micro-batch after every micro-batch
/// holding a later slice of one of its samples (a stable topological sort of the reversed edges by
/// forward position, Seq1F1B's reversed slices); `order` itself without slices.
std::vector<std::uint32_t> backward_sequence(const SimProblem& problem, const std::vector<std::uint32_t>& order);

struct ScheduleOptions {
  std::int64_t max_in_flight = 0;  ///< cyclic: at most this many micro-batches in flight; 0: no cap
  std::int64_t group_size = 0;     ///< interleaved: micro-batch group per virtual stage, >= ranks and dividing m; 0: ranks (Megatron's default)
  bool memory_aware = true;        ///< cyclic and zero-bubble: hold back forwards that would pass the memory limit
};

/// Builds the per-rank op order of `kind` for micro-batches taken in `order` (a permutation of
/// 0..m-1) into `out` (its buffers are reused; times are zero). Cyclic orders carry their cycles
/// (barriers); wait-free cyclic is the same order without barriers. Cyclic and zero-bubble use
/// the problem's costs (memory, and times for zero-bubble's greedy filling). With slices every kind
/// keeps the slice edges (forwards in order, backwards in the backward sequence; 1F1B runs more
/// forwards when the next backward's forward has not run, as Seq1F1B does). Throws
/// InvalidArgument when `order` is not a permutation, breaks a slice edge (slice_order repairs
/// one) or the kind does not support the shape.
void build_order(ScheduleKind kind, const SimProblem& problem, const std::vector<std::uint32_t>& order,
                 const ScheduleOptions& options, RankOrder& out);
/// Convenience: a fresh RankOrder.
RankOrder build_order(ScheduleKind kind, const SimProblem& problem, const std::vector<std::uint32_t>& order,
                      const ScheduleOptions& options = {});

/// Builds and simulates `kind` with `order` (empty: 0..m-1) and returns the Schedule.
pl::Schedule make_schedule(ScheduleKind kind, const SimProblem& problem, std::vector<std::uint32_t> order = {},
                       const ScheduleOptions& options = {});

/// Megatron's interleaved schedule table: the k-th forward of a rank runs (micro-batch position,
/// chunk) table[k]; backward k runs the same position with chunk c - 1 - chunk.
std::vector<std::pair<std::uint32_t, std::uint32_t>> interleaved_table(std::int64_t microbatches, std::int64_t chunks,
                                                                       std::int64_t group_size);
/// Megatron's warm-up forward count of `rank`: 1F1B min(S - rank - 1, m); interleaved
/// min(2 (S - rank - 1) + (c - 1) group, m c), or all m c when m == S (as Megatron).
std::int64_t warmup_forwards(ScheduleKind kind, std::int64_t ranks, std::int64_t rank, std::int64_t chunks,
                             std::int64_t microbatches, std::int64_t group_size);

}  // namespace packpipe::schedule
