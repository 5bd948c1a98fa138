// The embedded default cost model: time from FLOPs over an efficiency that falls for small shapes,
// memory from closed forms for activations under each recompute mode. Equations:
// docs/design/002-costmodel.md.
#pragma once

#include "costmodel/cost_model.h"

namespace packpipe::costmodel {

/// Calibration knobs of the analytic model (defaults fitted to real profiles; see the design note).
struct AnalyticOptions {
  double max_efficiency = 0.6;         ///< achieved fraction of peak for large GEMMs
  double half_efficiency_gflop = 20;   ///< per-GPU GFLOP of a layer at which efficiency is half the max
  double layer_overhead_ms = 0.05;     ///< fixed per-layer launch/latency cost, forward (backward x2)
  double backward_factor = 2.0;        ///< backward time / forward time
};

class AnalyticCostModel final : public CostModel {
 public:
  /// Validates the specs (throws InvalidArgument).
  AnalyticCostModel(ModelSpec model, DeviceSpec device, AnalyticOptions options = {});
  LayerCost query(const Query& q) const override;
  const ModelSpec& model() const override { return model_; }
  const DeviceSpec& device() const override { return device_; }
  const CommModel& comm() const override { return comm_; }
  std::string describe() const override;
  const AnalyticOptions& options() const { return options_; }
  /// Achieved fraction of peak for a layer of `gflop` per GPU.
  double efficiency(double gflop) const;

 private:
  ModelSpec model_;
  DeviceSpec device_;
  CommModel comm_;
  AnalyticOptions options_;
};

}  // namespace packpipe::costmodel
