#include "costmodel/factory.h"

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "costmodel/calibration.h"
#include "costmodel/profiled.h"

namespace packpipe::costmodel {

namespace {

std::unique_ptr<CostModel> make_base(const CostModelConfig& config) {
  ModelSpec model = load_model(config.model);
  DeviceSpec device = load_device(config.device);
  if (!config.attention.empty()) model.attention = attention_kernel_from_name(config.attention);
  if (config.profiles.empty()) return std::make_unique<AnalyticCostModel>(std::move(model), std::move(device));
  return make_profiled_cost_model(config.profiles, model, device, config.interpolation);
}

}  // namespace

std::unique_ptr<CostModel> make_cost_model(const CostModelConfig& config) {
  if (config.calibration.empty()) return make_base(config);
  Calibration cal = Calibration::load(config.calibration);
  return std::make_unique<CalibratedCostModel>(std::shared_ptr<const CostModel>(make_base(config)), std::move(cal));
}

}  // namespace packpipe::costmodel
