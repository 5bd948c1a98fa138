// What an execution measured against what its plans predicted: a summary (measured and simulated
// makespans, per-op-kind duration ratios, the executor's own time per instruction) and a Chrome /
// Perfetto trace with the measured timeline of every rank beside the planned one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "runtime/executor.h"

namespace packpipe::runtime {

/// One plan as executed: the plan and every rank's record (same clock epoch).
struct ExecutedPlan {
  const plan::Plan* plan = nullptr;
  std::vector<RankRecord> records;  ///< [rank]
};

/// Measured against planned, for one executed plan.
struct PlanFigures {
  std::uint64_t iteration = 0;
  std::uint32_t replica = 0;
  double measured_ms = 0;   ///< first instruction start to last end over every rank
  double simulated_ms = 0;  ///< the plan's makespan x time scale
  double ratio() const { return simulated_ms > 0 ? measured_ms / simulated_ms : 0; }
};

/// Measured against planned, over a run.
struct RunSummary {
  std::vector<PlanFigures> plans;
  double measured_ms = 0;            ///< sum of the plans' measured makespans
  double simulated_ms = 0;           ///< sum of their simulated makespans (scaled)
  double median_ratio = 0;           ///< median over plans of measured / simulated
  /// Per compute op kind ("F", "B", "I", "W"): median of measured / planned duration, and the count.
  std::vector<std::tuple<std::string, double, std::uint64_t>> op_ratios;
  std::uint64_t instructions = 0;    ///< executed, over every rank
  double overhead_ns_per_instruction = 0;  ///< the executor's own time (not handler, waits or posting) / instructions
  double wait_fraction = 0;          ///< time in waits / rank time
};

/// Summarises executed plans; `time_scale` is the factor from planned to executed durations.
RunSummary summarize(const std::vector<ExecutedPlan>& runs, double time_scale);

/// Chrome trace JSON: process "measured" (every rank's compute ops and communication waits as
/// executed, ms since the first start) and process "planned" (each plan's simulated timeline,
/// scaled, placed at its measured start).
std::string trace_json(const std::vector<ExecutedPlan>& runs, double time_scale);

}  // namespace packpipe::runtime
