// Calibration of any cost model from measured iterations (docs/design/013-calibration.md):
// per compute op kind (F, B, I, W) a robust fit measured = a x predicted + b, per region of
// log2(tokens), of the base model's stage op times (costmodel/stage_ops.h) against measurements
// (costmodel/measurements.h); per link an alpha-beta fit of the transfers. A Calibration is data
// (a JSON file, "packpipe-calibration" v1); CalibratedCostModel applies it to every planner path
// through the stage op arithmetic and the communication model. Deterministic: the same
// measurements in any order give the same bits, and the same file gives the same model.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/schedule_kind.h"
#include "costmodel/cost_model.h"
#include "costmodel/measurements.h"
#include "costmodel/stage_ops.h"

namespace packpipe::costmodel {

/// How fit_calibration fits.
struct FitOptions {
  /// A log2(tokens) bucket with fewer points (after pooling) takes its op kind's global fit.
  std::int64_t min_region_points = 8;
  /// Outlier rule: a point whose relative residual is more than this many robust standard
  /// deviations (1.4826 x MAD) from the median residual is rejected; the fit is repeated until
  /// the kept set no longer changes.
  double outlier_mads = 3.0;
  /// At most this many fit / reject rounds.
  int max_iterations = 20;
  /// Fit per region of log2(tokens) (false: one global fit per op kind).
  bool regions = true;
  /// The quantile of the measured times of one transfer size taken as its transfer time
  /// (waits are upper bounds: see 013).
  double transfer_quantile = 0.1;
};
/// Throws InvalidArgument naming the field for an option out of range (min_region_points in
/// [2, 2^31], outlier_mads in [1, 100], max_iterations in [1, 1000], transfer_quantile in [0, 1]).
void check_fit_options(const FitOptions& o);

/// The range of slopes and the largest intercept a fit may have (a file with others is refused):
/// measured times a million times the model's, or a millionth of them, are measurements of another
/// model, or in other units.
inline constexpr double kMinCalibrationSlope = 1e-6;
inline constexpr double kMaxCalibrationSlope = 1e6;
inline constexpr double kMaxCalibrationInterceptMs = 1e9;
/// The range of a fitted link's bandwidth, bytes per ms (1 KB/s to 1 PB/s): outside it, transfer
/// times overflow the schedules' arithmetic or are not transfers.
inline constexpr double kMinCalibrationBytesPerMs = 1;
inline constexpr double kMaxCalibrationBytesPerMs = 1e15;

/// One line measured = a x predicted + b over a set of points, with its statistics.
struct RegionFit {
  double a = 1, b = 0;
  double center_log2_tokens = 0;  ///< mean log2(tokens) of the points: where (a, b) holds exactly
  double min_log2_tokens = 0, max_log2_tokens = 0;
  double min_predicted_ms = 0, max_predicted_ms = 0;  ///< range of the base predictions
  std::int64_t points = 0;    ///< points fitted (rejected ones included)
  std::int64_t rejected = 0;  ///< outliers left out of the final fit
  double error_before = 0;    ///< median |base prediction - measured| / measured over the points
  double error_after = 0;     ///< the same with the calibrated prediction
  bool global_fallback = false;  ///< too few points: the op kind's global fit
  bool through_origin = false;   ///< b fixed at 0 (predictions too narrow for a slope, or a line that is not increasing)
  double apply(double predicted_ms) const { return a * predicted_ms + b; }
};

/// The range of an op kind's attention term gamma (see OpFit).
inline constexpr double kMinAttentionGamma = -1;    ///< exclusive: the attention part never costs 0 or less
inline constexpr double kMaxAttentionGamma = 100;   ///< inclusive

/// The fit of one compute op kind. The lines apply to the base prediction with its attention part
/// reweighted: p' = p x (1 + attention_gamma x s), s the stage's attention share of forward FLOPs
/// (costmodel::attention_share), so the token-linear part and the attention part of a time are
/// fitted as separate terms: measured ~ a (p (1 - s)) + a (1 + gamma) (p s) + b.
struct OpFit {
  MeasuredOp op = MeasuredOp::Forward;
  bool fitted = false;         ///< false: no points; the op's times are those of the fallback rule
  std::string from;            ///< "measured", or for B "I + W" (no B measured: pairs of its halves)
  /// How much more (> 0) or less (< 0) the attention part costs than the base model says, relative
  /// to the token-linear part; in (kMinAttentionGamma, kMaxAttentionGamma]. 0 when the points do
  /// not tell (too little spread in s, or a fit no better than without the term).
  double attention_gamma = 0;
  RegionFit global;            ///< every point of the kind
  std::vector<RegionFit> regions;  ///< by center_log2_tokens ascending; empty: the global fit everywhere
};

/// The fit of one link kind's transfers: time = latency_ms + bytes / bytes_per_ms.
struct TransferFit {
  bool inter_node = false;
  bool fitted = false;
  double latency_ms = 0, bytes_per_ms = 0;
  std::int64_t points = 0;  ///< send and recv measurements
  std::int64_t sizes = 0;   ///< points fitted: octaves of byte counts with at least 6 samples each
  double error_before = 0;  ///< median |p2p_ms - quantile| / quantile over the points (base comm model)
  double error_after = 0;   ///< the same with the fitted line
};

/// The range of a schedule factor (ScheduleFit). What a schedule adds to its ops' times is never
/// negative (a ratio below 1 is the op fits' error, fitted as 1), and a kind measured at more than
/// twice its re-simulated makespan is not a schedule's overhead but a wrong op fit (not fitted).
inline constexpr double kMinScheduleFactor = 1;
inline constexpr double kMaxScheduleFactor = 2;
/// Iterations of a kind a factor needs (fewer: the kind is not fitted).
inline constexpr std::int64_t kMinScheduleIterations = 3;

/// How one schedule kind runs on the machine against its simulation: the median over measured
/// iterations of that kind of measured makespan / makespan re-simulated with the calibrated op and
/// transfer times (at least 1). What the op fits cannot see (an executor's per-schedule waits and
/// dispatch, a transport's ordering) is in it; the planner ranks the kind's schedules by simulated
/// makespan times it, and stretches their timelines' waits by it (docs/design/013-calibration.md).
struct ScheduleFit {
  std::string schedule;       ///< a name of kScheduleKindNames
  double factor = 1;          ///< in [kMinScheduleFactor, kMaxScheduleFactor]
  std::int64_t iterations = 0;  ///< measured iterations of the kind fitted (at least kMinScheduleIterations)
  double spread = 0;          ///< median |ratio - factor| / factor over them
};

/// What a calibration was fitted over: a calibration is refused over another base model.
struct CalibrationBase {
  std::string model, device, description;
  std::string fingerprint;  ///< cost_model_fingerprint of the base model
};

/// A fitted calibration: data, immutable once made, safe to share between threads.
struct Calibration {
  CalibrationBase base;
  FitOptions options;
  std::array<OpFit, 4> compute;        ///< F, B, I, W (MeasuredOp order)
  std::array<TransferFit, 2> transfers;  ///< intra-node, inter-node
  /// Fitted schedule kinds, in kScheduleKindNames order (empty: none; see schedule_factor).
  std::vector<ScheduleFit> schedules;
  std::int64_t measurements = 0;       ///< measurements it was fitted on
  std::string source;                  ///< the file it was loaded from (not saved)

  /// Calibrated time of compute op `op` (F, B, I or W) predicted `predicted_ms` by the base model
  /// at `tokens` with attention share `share` (attention_share): the prediction reweighted by the
  /// op's attention_gamma, then the regions' lines blended linearly in log2(tokens) between their
  /// centres (the edge region's beyond), never below a tenth of the (blended) slope times the
  /// reweighted prediction. An op kind without a fit returns predicted_ms. InvalidArgument for a
  /// transfer op.
  double apply(MeasuredOp op, double tokens, double predicted_ms, double share) const;
  /// The factor of schedule kind `k` (ScheduleFit): its own fit; for a kind not fitted, the
  /// largest fitted factor (no kind is preferred without a measurement of it); 1 without any.
  double schedule_factor(ScheduleKind k) const;
  /// Calibrated op times of a stage from its base op times: F and B by their fits; I and W by
  /// theirs, or, when not fitted, the calibrated backward split in the base ratio; W at most B.
  StageOpTimes apply(const StageOpTimes& base_ops, double tokens, double share) const;
  /// Calibrated forward + backward of a stage (the partitioner's stage time).
  double stage_ms(double tokens, double forward_ms, double backward_ms, double share) const;
  /// Whether some op kind has a non-zero attention_gamma (callers may skip computing shares).
  bool uses_attention_share() const;
  /// The base communication model with each fitted link's latency and bandwidth replaced.
  CommModel apply(const CommModel& base_comm) const;
  /// The JSON file form (format "packpipe-calibration", version 1). Deterministic; doubles round-trip.
  std::string to_json() const;
  /// Parses the JSON form read from `what`; throws Error naming `what` and the field (JSON
  /// pointer) with expected versus found for anything missing, mistyped or out of range. An op
  /// fit without "attention_gamma" (a file written before the term existed) has gamma 0.
  static Calibration from_json(const std::string& text, const std::string& what);
  /// from_json of a regular file; `source` is set to `path`.
  static Calibration load(const std::string& path);
  /// Writes to_json() to `path` atomically.
  void save(const std::string& path) const;
};

/// Every invariant fit_calibration guarantees (the fit checks its own result with it), checked by
/// the file reader from_json, so no file breaks what a fit never writes: slopes and intercepts in range, a line through
/// the origin with b 0, schedule factors of known, distinct kinds in order and in range, regions ascending and disjoint in tokens, splitting the op's points, a
/// region below min_region_points on its op's global line, consistent point ranges and counts, and
/// (013's promise) adjacent regions whose blend never makes the calibrated time fall as tokens grow
/// (the check fit_calibration pools regions by). Throws Error naming `what` (the file), the field
/// (JSON pointer) and the region, with expected versus found.
void check_calibration(const Calibration& calibration, const std::string& what);

/// 16 hex digits identifying a base cost model: XXH64 of its model and device specs, its
/// communication model and its stage op times at fixed probe shapes. Two models that answer alike
/// have the same fingerprint whatever files they were read from. Throws InvalidArgument for a
/// calibrated model (fingerprint its base).
std::string cost_model_fingerprint(const CostModel& cm);

/// The base model's (uncalibrated) prediction of measurement `m`: stage_op_times for compute ops,
/// p2p_ms of the bytes for transfers (inter-node when rank and peer fall in different nodes of
/// gpus_per_node / tp ranks). With a calibrated `cm`, the calibrated prediction. Throws
/// InvalidArgument when the model refuses the shape.
double predict_ms(const CostModel& cm, const Measurement& m);
/// Whether a transfer between ranks `rank` and `peer` crosses nodes for a model's device and tp.
bool crosses_nodes(const CostModel& cm, std::int64_t tp, std::int64_t rank, std::int64_t peer);

/// Fits a calibration of `base` (not itself calibrated) to `measurements` (any order; sorted
/// canonically first, so the result does not depend on it). Throws InvalidArgument naming the
/// measurement (index and provenance) for one check_measurement refuses or whose shape the base
/// model refuses, for bad options, and naming the op kind for a fit outside [kMinCalibrationSlope,
/// kMaxCalibrationSlope], a link for a bandwidth outside the kCalibrationBytesPerMs range, or
/// kMaxCalibrationInterceptMs.
Calibration fit_calibration(const CostModel& base, const std::vector<Measurement>& measurements,
                            const FitOptions& options = {});

/// A cost model with a calibration applied: every query, memory figure and description of the
/// base; stage op times (stage_op_times, stage_time_ms) and the communication model calibrated.
/// Thread-safe as the base.
class CalibratedCostModel : public CostModel {
 public:
  /// Throws InvalidArgument when `calibration` was fitted over another model (fingerprint, model
  /// or device differ), naming both, or when `base` is itself calibrated.
  CalibratedCostModel(std::shared_ptr<const CostModel> base, Calibration calibration);
  LayerCost query(const Query& q) const override { return base_->query(q); }
  std::int64_t query_rows(const Query& q, std::int64_t count, LayerCost* out) const override {
    return base_->query_rows(q, count, out);
  }
  std::int64_t memory_rows(const Query& q, std::int64_t count, LayerCost* out) const override {
    return base_->memory_rows(q, count, out);
  }
  LengthUse lengths_used(LayerKind kind) const override { return base_->lengths_used(kind); }
  const ModelSpec& model() const override { return base_->model(); }
  const DeviceSpec& device() const override { return base_->device(); }
  const CommModel& comm() const override { return comm_; }
  AttentionKernel attention() const override { return base_->attention(); }
  std::string describe() const override;
  const Calibration* calibration() const override { return &cal_; }
  double layer_param_bytes(LayerKind kind, std::int64_t tp) const override { return base_->layer_param_bytes(kind, tp); }
  /// The uncalibrated model.
  const CostModel& base() const { return *base_; }
  const std::shared_ptr<const CostModel>& base_ptr() const { return base_; }

 private:
  std::shared_ptr<const CostModel> base_;
  Calibration cal_;
  CommModel comm_;
};

}  // namespace packpipe::costmodel
