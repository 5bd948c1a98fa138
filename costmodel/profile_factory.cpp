// make_profiled_cost_model: profiles plus the analytic model as the fallback for unprofiled shapes.
// Kept apart from profiled.cpp so ProfiledCostModel links without the analytic model.
#include <memory>

#include <fmt/format.h>

#include "common/errors.h"

#include "costmodel/activation_fit.h"
#include "costmodel/analytic.h"
#include "costmodel/profiled.h"
#include "costmodel/profiled_linear.h"

namespace packpipe::costmodel {

std::unique_ptr<CostModel> make_profiled_cost_model(const std::vector<std::string>& paths, const ModelSpec& model,
                                                    const DeviceSpec& device, ProfileInterpolation interpolation) {
  Profile profile = load_profiles(paths);
  PACKPIPE_CHECK_ARG(!model.attention.has_value() || *model.attention == profile.kernel(),
                     "model '{}' names {} attention, but the profiles were measured with {} attention: a profile "
                     "answers for the kernel it measured (leave the kernel out, or profile with {})",
                     model.name, attention_kernel_name(*model.attention), attention_kernel_name(profile.kernel()),
                     attention_kernel_name(*model.attention));
  // The analytic fallback answers what the grids lack (the memory of kinds the profile does not
  // measure); its activation calibration is fitted to the profile's measured activations when
  // there are enough of them (docs/design/002-costmodel.md).
  AnalyticOptions options = device.analytic;
  if (activation_points(profile, model) >= kMinActivationPoints) {
    const AnalyticOptions fitted = fit_activation({{&profile, &model}}, options);
    const ActivationReport before = activation_error(profile, model, options);
    const ActivationReport after = activation_error(profile, model, fitted);
    profile.notes.push_back(fmt::format(
        "analytic fallback: activation calibration fitted on {} measured stored activations (per token and hidden "
        "unit {:.3g} B, per attention score {:.3g} B, per layer {:.3g} MB); mean |error| {:.2f}% -> {:.2f}%",
        after.all.points, fitted.activation_token_bytes, fitted.activation_score_bytes,
        fitted.activation_layer_bytes / 1e6, before.all.mean_abs_pct, after.all.mean_abs_pct));
    options = fitted;
  }
  // The grids answer for the kernel the profile was measured with, so the fallback does too.
  ModelSpec measured = model;
  measured.attention = profile.kernel();
  auto fallback = std::make_unique<AnalyticCostModel>(measured, device, options);
  if (interpolation == ProfileInterpolation::Linear) {
    return std::make_unique<LinearProfiledCostModel>(std::move(profile), model, device, std::move(fallback));
  }
  return std::make_unique<ProfiledCostModel>(std::move(profile), model, device, std::move(fallback));
}

}  // namespace packpipe::costmodel
