// One entry point for the CLI, the bindings and the planner: a cost model from names and files.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "costmodel/cost_model.h"
#include "costmodel/profile_readers.h"

namespace packpipe::costmodel {

struct CostModelConfig {
  std::string model = "gpt-6.7b";    ///< preset name or .json file
  std::string device = "A100-40GB";  ///< preset name or .json file
  std::vector<std::string> profiles; ///< empty: the analytic model
  std::string calibration;           ///< a calibration file (costmodel/calibration.h) applied over it; empty: none
  /// With profiles: Fit (ProfiledCostModel) or Linear (DynaPipe's rule, LinearProfiledCostModel).
  ProfileInterpolation interpolation = ProfileInterpolation::Fit;
  /// The attention kernel the trainer runs ("eager" or "flash"); empty: the model's, else the
  /// device's (attention_kernel). With profiles it must be the one they were measured with.
  std::string attention;
};

/// The analytic model, or the profiled one when profiles are given, calibrated when a calibration
/// file is given (CalibratedCostModel; refused when fitted over another model). Throws as the
/// loaders do, and InvalidArgument for an unknown kernel or one the profiles were not measured with.
std::unique_ptr<CostModel> make_cost_model(const CostModelConfig& config);

}  // namespace packpipe::costmodel
