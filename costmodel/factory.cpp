#include "costmodel/factory.h"

#include "costmodel/analytic.h"
#include "costmodel/profiled.h"

namespace packpipe::costmodel {

std::unique_ptr<CostModel> make_cost_model(const CostModelConfig& config) {
  ModelSpec model = load_model(config.model);
  DeviceSpec device = load_device(config.device);
  if (config.profiles.empty()) return std::make_unique<AnalyticCostModel>(std::move(model), std::move(device));
  return make_profiled_cost_model(config.profiles, model, device, config.interpolation);
}

}  // namespace packpipe::costmodel
