// make_profiled_cost_model: profiles plus the analytic model as the fallback for unprofiled shapes.
// Kept apart from profiled.cpp so ProfiledCostModel links without the analytic model.
#include <memory>

#include "costmodel/analytic.h"
#include "costmodel/profiled.h"

namespace packpipe::costmodel {

std::unique_ptr<CostModel> make_profiled_cost_model(const std::vector<std::string>& paths, const ModelSpec& model,
                                                    const DeviceSpec& device) {
  Profile profile = load_profiles(paths);
  return std::make_unique<ProfiledCostModel>(std::move(profile), model, device,
                                             std::make_unique<AnalyticCostModel>(model, device));
}

}  // namespace packpipe::costmodel
