// The analytic model's stored activations against measured ones: the error per layer kind and
// recompute mode, the fit of its activation calibration (AnalyticOptions::activation_*) on one or
// more profiles, and the documented safety margin. docs/design/002-costmodel.md, "Activation memory".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/analytic_options.h"
#include "costmodel/profile_readers.h"

namespace packpipe::costmodel {

/// The safety margin of the calibrated estimate: it may fall short of a profiled stored activation
/// by at most kActivationMarginRelative of it, plus kActivationMarginOutput layer outputs
/// (e x b x tokens x h bytes: profiles of large shapes taken with fewer layers carry a larger share
/// of the last layer's live output), plus kActivationMarginBytes (allocator granularity).
inline constexpr double kActivationMarginRelative = 0.03;
inline constexpr double kActivationMarginOutput = 0.75;
inline constexpr double kActivationMarginBytes = 2e6;

/// Bytes the calibrated estimate may fall short of `profiled_bytes` at one shape (the margin above).
double activation_margin_bytes(const ModelSpec& model, LayerKind kind, std::int64_t mbs, std::int64_t seq,
                               std::int64_t dec_seq, double profiled_bytes);

/// Errors of one group of points (estimate / profiled - 1, in percent).
struct ActivationError {
  LayerKind kind = LayerKind::Encoder;
  Recompute rc = Recompute::None;
  std::size_t points = 0;
  double mean_abs_pct = 0;     ///< mean |error|
  double worst_below_pct = 0;  ///< most negative error (0 when never below)
  double worst_above_pct = 0;  ///< most positive error (0 when never above)
  std::size_t beyond_margin = 0;  ///< points below the profile by more than the safety margin
};

/// The stored-activation errors of one model against one profile.
struct ActivationReport {
  std::string model;                   ///< ModelSpec name
  ActivationError all;                 ///< every point (kind and rc of the first group)
  std::vector<ActivationError> groups; ///< per (layer kind, recompute mode), in that order
};

/// Errors of the analytic stored activations under `options` (layer_activation_bytes with the
/// calibration) against every measured stored value of the profile's encoder and decoder layers,
/// repeated shapes reduced to their median. Throws InvalidArgument when the profile measures none.
ActivationReport activation_error(const Profile& profile, const ModelSpec& model, const AnalyticOptions& options);

/// A profile and the model it measured, for a fit over several.
struct ActivationSource {
  const Profile* profile = nullptr;
  const ModelSpec* model = nullptr;
};

/// Fewest measured points a fit needs.
inline constexpr std::size_t kMinActivationPoints = 8;
/// Measured stored activations (distinct shapes) of encoder and decoder layers in `profile`.
std::size_t activation_points(const Profile& profile, const ModelSpec& model);

/// `options` with activation_token_bytes, activation_score_bytes and activation_layer_bytes
/// fitted to the measured stored activations of `sources` (least squares in relative error, every
/// term >= 0; repeated shapes as their median); the other fields are kept. Throws InvalidArgument
/// when the sources measure fewer than kMinActivationPoints points.
AnalyticOptions fit_activation(const std::vector<ActivationSource>& sources, AnalyticOptions options);

}  // namespace packpipe::costmodel
