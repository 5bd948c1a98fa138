// The embedded default cost model: time from FLOPs over an efficiency that falls for small shapes,
// plus memory traffic and tensor-parallel all-reduces; memory from the closed forms of Korthikanti
// et al. (2022) for activations under each recompute mode. Equations: docs/design/002-costmodel.md.
#pragma once

#include "costmodel/analytic_options.h"
#include "costmodel/cost_model.h"

namespace packpipe::costmodel {

class AnalyticCostModel final : public CostModel {
 public:
  /// The model with the device's constants (DeviceSpec::analytic). Validates the specs (throws
  /// InvalidArgument naming the field).
  AnalyticCostModel(ModelSpec model, DeviceSpec device);
  /// The model with `options` in place of the device's constants (e.g. a fit). Validates the specs
  /// and the options (throws InvalidArgument naming the field).
  AnalyticCostModel(ModelSpec model, DeviceSpec device, AnalyticOptions options);
  /// Allocation-free and thread-safe; throws InvalidArgument only for bad input.
  LayerCost query(const Query& q) const override;
  /// As CostModel::query_rows (bit-identical to query() per row); the validation, the FLOP
  /// factors and the efficiency width term are computed once for all rows. Allocation-free.
  std::int64_t query_rows(const Query& q, std::int64_t count, LayerCost* out) const override;
  /// Memory only (the same formulas as query_rows, no time): several times cheaper per row.
  std::int64_t memory_rows(const Query& q, std::int64_t count, LayerCost* out) const override;
  /// Embedding and encoder layers: seq; decoder layers: both; the post-process: dec_seq of an
  /// encoder-decoder model, seq otherwise.
  LengthUse lengths_used(LayerKind kind) const override;
  const ModelSpec& model() const override { return model_; }
  const DeviceSpec& device() const override { return device_; }
  const CommModel& comm() const override { return comm_; }
  std::string describe() const override;
  const AnalyticOptions& options() const { return options_; }
  /// The kernel the model runs on the device (attention_kernel(model, device)).
  AttentionKernel attention() const override { return kernel_; }
  /// Achieved fraction of peak of a GEMM over `tokens` rows with per-GPU width `width`:
  /// max_efficiency * tokens / (tokens + half_tokens) * width / (width + half_width).
  double efficiency(double tokens, double width) const;

 private:
  struct RowPlan;
  /// Validates `q` (throws InvalidArgument as query() does) and fills what does not depend on mbs.
  void plan(const Query& q, RowPlan& p) const;
  /// The answer for micro-batch size `mbs` under plan `p` (all layers of the query).
  LayerCost row(const RowPlan& p, std::int64_t mbs) const;

  ModelSpec model_;
  DeviceSpec device_;
  CommModel comm_;
  AnalyticOptions options_;
  AttentionKernel kernel_ = AttentionKernel::Eager;  ///< attention_kernel(model, device)
  double flop_per_ms_ = 0;  ///< peak FLOP per millisecond
  double hbm_per_ms_ = 0;   ///< HBM bytes per millisecond
};

/// Activation bytes of one layer on one GPU under a recompute mode (Korthikanti et al. 2022,
/// tensor parallelism without sequence parallelism; see the design note): the closed forms, plus
/// the calibration terms of `calibration` when given (what the model's queries store). `kind`
/// Encoder or Decoder; exposed for tests, the activation report and the derived recompute modes.
double layer_activation_bytes(const ModelSpec& m, LayerKind kind, std::int64_t tp, std::int64_t mbs,
                              std::int64_t seq, std::int64_t dec_seq, Recompute rc,
                              const AnalyticOptions* calibration = nullptr);

}  // namespace packpipe::costmodel
