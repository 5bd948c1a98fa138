// Cost models from real profiles (DynaPipe grids and per-point files, Aceso, Metis, AIOB):
// readers (costmodel/profile_readers.h), interpolation of efficiency between grid points, and
// leave-one-out validation. Design and equations: docs/design/003-costmodel-profiles.md.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "costmodel/cost_model.h"
#include "costmodel/profile_readers.h"

namespace packpipe::costmodel {

/// A cost model answering from measured grids. Per (layer kind, tp, recompute) it keeps a grid over
/// micro-batch size, sequence length and (T5 decoder) decoder length; repeated measurements of a
/// shape resolve to their median (DynaPipe keeps the maximum).
///
/// Time: per grid (never across tp, recompute or kind) a non-negative least-squares fit
/// t ~ a + Wm / Pm + Wa / Pa (Wm, Wa: matrix-product and attention FLOPs from forward_flops; tokens
/// for the FLOP-free embedding) gives a curve whose efficiency FLOPs / t falls for small shapes. The
/// measured time relative to that curve is interpolated multilinearly in log2 mbs, log2 seq (and
/// log2 dec_seq) in one of two forms, chosen per grid by leave-one-out on the grid's own points:
/// the ratio measured / fitted (fit in relative error; multiplied back) or the difference
/// measured - fitted (fit in absolute error; added back, never below the grid's smallest time).
/// Grid points are reproduced exactly. Below the grid the shape is clamped to the smallest profiled
/// one (latency floor); above the largest profiled value of an axis (or in an OOM hole of the
/// triangular grid) the residual is held and the answer flagged Provenance::Extrapolated; beyond
/// twice the largest profiled value the query is refused (InvalidArgument naming the argument, the
/// value and the limit).
///
/// Memory: the same scheme with stored (and peak) bytes on 1, b*L, b*L^2 (decoder: 1, b*d, b*s,
/// b*d^2, b*d*s), i.e. the linear and quadratic terms in tokens and sequence length; stored and peak
/// choose their forms separately.
///
/// Recompute modes the profile lacks for a kind and tp it measures without recompute are derived
/// from that grid (Provenance::Derived): the profiled forward, the profiled backward plus the
/// recomputed forward (all of it under full recompute, its attention share under selective), the
/// profiled memory plus the fallback's difference between the modes.
///
/// Shapes whose other discrete axes are not profiled go to `fallback` (normally AnalyticCostModel)
/// with its provenance (Analytic); without a fallback they throw InvalidArgument.
/// Immutable after construction; query() does no allocation and is safe from many threads.
class ProfiledCostModel final : public CostModel {
 public:
  /// Builds the tables; throws InvalidArgument when the profile has no usable points or holds
  /// layer kinds the model lacks (decoder layers for a decoder-only model).
  ProfiledCostModel(Profile profile, ModelSpec model, DeviceSpec device, std::unique_ptr<CostModel> fallback = nullptr);
  ~ProfiledCostModel() override;
  ProfiledCostModel(const ProfiledCostModel&) = delete;
  ProfiledCostModel& operator=(const ProfiledCostModel&) = delete;

  LayerCost query(const Query& q) const override;
  /// As CostModel::query_rows (bit-identical to query() per row): checks, grid, the (seq,
  /// dec_seq) cell and its weights are found once; per row only the mbs bracket (advanced along
  /// the growing size) and the fit. Rows above twice the largest profiled mbs end the batch.
  /// Allocation-free unless the fallback allocates.
  std::int64_t query_rows(const Query& q, std::int64_t count, LayerCost* out) const override;
  /// The lengths its grids interpolate on or read (FLOP features, boundary bytes), with the
  /// fallback's.
  LengthUse lengths_used(LayerKind kind) const override;
  const ModelSpec& model() const override;
  const DeviceSpec& device() const override;
  /// From the device's interconnect figures; point-to-point latency and bandwidth replaced by the
  /// alpha-beta fit of measured p2p samples when the profile has them.
  const CommModel& comm() const override;
  std::string describe() const override;
  /// The kernel the profile was measured with (Profile::kernel()).
  AttentionKernel attention() const override;

  /// The profile the tables were built from.
  const Profile& profile() const;
  /// Whether (kind, tp, rc) has a measured grid with times (variant 0).
  bool profiled(LayerKind kind, std::int64_t tp, Recompute rc) const;
  /// Whether (kind, tp, rc) is a recompute mode the profile lacks, derived from its no-recompute grid.
  bool derived(LayerKind kind, std::int64_t tp, Recompute rc) const;
  /// Alpha-beta fits of the profile's communication samples (empty without samples).
  const std::vector<AlphaBetaFit>& comm_fits() const;
  /// Parameter bytes of one layer of `kind` at `tp` as the profile measured them (NaN if not).
  double layer_param_bytes(LayerKind kind, std::int64_t tp) const override;

 private:
  struct Impl;
  struct Rows;
  std::unique_ptr<Impl> impl_;
};

/// Loads the profiles at `paths` (files or folders; the format is detected from names and
/// headers) for `model` on `device`; queries outside the profiled discrete axes fall back to the
/// analytic model and say so in the provenance. `interpolation` Fit builds a ProfiledCostModel,
/// Linear a LinearProfiledCostModel (DynaPipe's rule, costmodel/profiled_linear.h). Throws Error
/// naming the file and row of a bad profile. (Defined in profile_factory.cpp so that
/// ProfiledCostModel links without the analytic model.)
std::unique_ptr<CostModel> make_profiled_cost_model(const std::vector<std::string>& paths, const ModelSpec& model,
                                                    const DeviceSpec& device,
                                                    ProfileInterpolation interpolation = ProfileInterpolation::Fit);

/// Leave-one-out errors of one set of predictions, in percent (mean absolute percentage error).
struct LooErrors {
  std::size_t points = 0;             ///< removals (a grid point removed along one axis)
  std::size_t time_predictions = 0;   ///< forward and backward values predicted
  std::size_t memory_predictions = 0; ///< stored activation values predicted
  double time_mape = 0;               ///< ours: fit and residual interpolated in log coordinates
  double memory_mape = 0;             ///< ours, stored bytes
  double linear_time_mape = 0;        ///< plain linear interpolation of time on the raw grid (DynaPipe)
  double linear_memory_mape = 0;      ///< plain linear interpolation of stored bytes on the raw grid
  double peak_memory_mape = 0;        ///< ours, peak bytes
  double linear_peak_memory_mape = 0;
};

/// Errors of one grid (layer kind, tp, recompute, variant) and axis.
struct LooGroup {
  LayerKind kind = LayerKind::Encoder;
  std::int64_t tp = 1;
  Recompute rc = Recompute::None;
  std::int64_t variant = 0;
  std::string axis;  ///< "mbs", "seq" or "dec_seq"
  LooErrors errors;
};

/// Errors of all grids of one layer kind and recompute mode (all tp, variants and axes).
struct LooBreakdown {
  LayerKind kind = LayerKind::Encoder;
  Recompute rc = Recompute::None;
  LooErrors errors;
};

struct LooReport {
  std::string model;   ///< ModelSpec name used for the FLOPs
  std::string device;  ///< from the profile, if it says
  LooErrors all;
  std::vector<LooBreakdown> by_stage_rc;
  std::vector<LooGroup> groups;
};

/// Leave-one-out validation (protocol in docs/design/003-costmodel-profiles.md): every point with
/// profiled neighbours on both sides at the adjacent values of an axis (mbs, seq, dec_seq; other
/// coordinates equal) is removed in turn — for the seq and dec_seq axes the whole slice, as a grid
/// without that axis value — and predicted from those neighbours by our rule and by linear
/// interpolation of the raw values. Nested: the fits and the choice of their forms are redone
/// without the removed points. Throws InvalidArgument when no point is interior.
LooReport leave_one_out(const Profile& profile, const ModelSpec& model);
/// The figures of `e` as one JSON object (field names as in LooErrors), the one form the CLI's
/// report and the Python binding print.
std::string loo_errors_json(const LooErrors& e);

}  // namespace packpipe::costmodel
