// From executed plans to measurements, and measurements against a cost model
// (docs/design/013-calibration.md): `measurements_from` turns a plan and the times the executor
// recorded for each of its instructions into per-op measurements (costmodel/measurements.h);
// `validate_measurements` compares a cost model's op times with them and re-simulates each
// measured iteration's per-rank op order with the schedule simulator.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/calibration.h"
#include "costmodel/measurements.h"
#include "plan/plan.h"

namespace packpipe::planner {

namespace cm = ::packpipe::costmodel;
namespace pl = ::packpipe::plan;

/// [rank][instruction]: (start_ns, end_ns) of each instruction of a plan's streams, on one clock
/// shared by the plan's ranks (runtime::run_local's records; separate processes shift their
/// records by their executors' epochs). A rank with an empty list was not recorded.
using InstructionTimes = std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>;

struct MeasureOptions {
  std::int64_t tp = 1;  ///< tensor-parallel size the plan ran with (plans do not record it)
  /// The iteration number the measurements carry; negative: the plan's. A trainer that measures
  /// several epochs (or loaders) numbers its steps so that no two share a number.
  std::int64_t iteration = -1;
};

/// What one executed plan measured.
struct PlanMeasurements {
  std::vector<cm::Measurement> ops;  ///< by rank, then instruction index
  bool has_iteration = false;        ///< every rank was recorded
  cm::IterationMeasurement iteration;
};

/// Measurements of one executed plan (a format-2 plan: its stage layouts are the measurements'
/// shapes). Compute instructions (FWD, BWD, BWD_I, BWD_W) become F, B, I and W with their
/// instruction's duration (at least 1 ns, the clock's resolution). A transfer, matched between its two ranks per channel in posting order
/// as the transports match it, becomes one send and one recv measurement of the plan's shape bytes,
/// each the time from the later of the two START instructions to that side's WAIT end: an upper
/// bound of the transfer, exact when that side waited through it (013 says why a low quantile of
/// them is fitted). Transfers with an unrecorded side are left out. The iteration (measured makespan
/// beside plan.makespan_ms) needs every rank. start_ms counts from the earliest recorded start.
/// Throws InvalidArgument for a plan without stage layouts, a rank count or instruction count
/// that does not match `times`, an end before its start, or tp < 1.
PlanMeasurements measurements_from(const pl::Plan& plan, const InstructionTimes& times,
                                   const MeasureOptions& options = {});

/// Errors of one op kind: relative error = (predicted - measured) / measured.
struct OpErrors {
  cm::MeasuredOp op = cm::MeasuredOp::Forward;
  std::int64_t count = 0;          ///< measurements compared (transfers measured at 0 ms are left out)
  double median_abs = 0;           ///< median |relative error|
  double p90_abs = 0;              ///< 90th percentile of |relative error|
  double bias = 0;                 ///< median relative error (positive: the model predicts too long)
};

/// Errors of `cost`'s op times (costmodel::predict_ms: calibrated when `cost` is) against every
/// measurement of `ops`, per op kind measured, in MeasuredOp order; `predicted` (optional) receives
/// each measurement's prediction. Throws InvalidArgument naming the measurement for one
/// check_measurement refuses or whose shape the model refuses.
std::vector<OpErrors> op_errors(const cm::CostModel& cost, const std::vector<cm::Measurement>& ops,
                                std::vector<double>* predicted = nullptr);

/// One measured iteration of one replica re-simulated.
struct IterationCheck {
  std::uint64_t iteration = 0;
  std::uint32_t replica = 0;
  std::int64_t ops = 0;            ///< compute ops re-simulated
  double predicted_ms = 0;         ///< makespan of the measured per-rank order with the model's op times
  double measured_ms = std::numeric_limits<double>::quiet_NaN();  ///< from the iteration line (NaN: none)
  double planned_ms = std::numeric_limits<double>::quiet_NaN();   ///< the plan's makespan from that line
  std::string schedule;            ///< the plan's schedule kind from that line (empty: unknown)
};

/// A cost model against measurements.
struct ValidationReport {
  std::string cost_model;                 ///< the model's description
  std::vector<OpErrors> ops;              ///< per op kind measured, in MeasuredOp order
  std::vector<IterationCheck> iterations; ///< by (iteration, replica)
  std::int64_t iterations_compared = 0;   ///< with a measured makespan
  double iteration_median_abs = 0, iteration_p90_abs = 0, iteration_bias = 0;  ///< over those
  std::vector<double> predicted_ms;       ///< per measurement of the set, in its order
};

/// Compares `cost`'s op times (predict_ms: calibrated when `cost` is) with every measurement of
/// `set`, and re-simulates every (iteration, replica) whose compute ops were measured: its stage
/// cost table from the measured shapes (schedule::set_stage_cost, the planner's arithmetic), its
/// per-rank op order from the provenance (rank, instruction index), transfers from the cost
/// model's communication, no memory limit, with schedule::Simulator. Barrier (cyclic) schedules
/// are re-simulated without their barriers, as the executor runs them. Throws InvalidArgument
/// naming the measurement or the iteration for a shape the model refuses, an iteration whose ops
/// are incomplete (a (micro-batch, stage) without its ops) or inconsistent (one (micro-batch,
/// stage) with two shapes, a stage on a rank the simulator's placement v mod S does not give), and
/// for two iteration lines of one (iteration, replica) that disagree, and for a set with no op measurements.
/// With a calibration that has schedule factors, an iteration whose line names its schedule is
/// predicted at the re-simulated makespan times its kind's factor (Calibration::schedule_factor).
ValidationReport validate_measurements(const cm::CostModel& cost, const cm::MeasurementSet& set);

/// `calibration` (fitted over `base`) with its schedule factors fitted to `set`: per schedule
/// kind named by at least kMinScheduleIterations iteration lines with a measured makespan, the
/// median of measured / re-simulated makespan (validate_measurements with the calibration's op and
/// transfer times, any earlier schedule factors dropped), at least kMinScheduleFactor. Kinds with
/// fewer iterations, or a median above kMaxScheduleFactor, are left out (Calibration::schedule_factor);
/// the ops of iterations without such a line are not re-simulated.
/// Throws as validate_measurements and CalibratedCostModel.
cm::Calibration fit_schedule_factors(std::shared_ptr<const cm::CostModel> base, cm::Calibration calibration,
                                     const cm::MeasurementSet& set);

/// Predicted and measured pairs for a plot: JSON {"format": "packpipe-validation-plot",
/// "version": 1, "cost_model", "ops": [{"op", "tokens": [...], ("bytes": [...] for transfers,)
/// "predicted_ms": [...], "measured_ms": [...]}], "iterations": [{"iteration", "replica", "ops",
/// "predicted_ms", "measured_ms", "planned_ms"}]} (null where unknown; 013 documents it).
/// Throws InvalidArgument when `report` has not one prediction per measurement of `set`.
std::string validation_plot_json(const ValidationReport& report, const cm::MeasurementSet& set);

}  // namespace packpipe::planner
