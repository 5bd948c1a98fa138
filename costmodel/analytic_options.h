// The constants of the analytic cost model (costmodel/analytic.h). They describe a machine, so
// they travel with its DeviceSpec (DeviceSpec::analytic) and a device file may set every one of
// them. Equations and how the defaults were fitted: docs/design/002-costmodel.md.
#pragma once

#include <string>

namespace packpipe::costmodel {

/// Calibration knobs of the analytic model. The defaults were fitted on the DynaPipe GPT-6.7B and
/// T5-11B A100-40GB profiles (benchmarks/analytic_vs_profile.cpp; errors on all points in the
/// design note); every device preset carries them.
struct AnalyticOptions {
  double max_efficiency = 0.73;          ///< achieved fraction of peak for large GEMMs
  double half_efficiency_tokens = 160;   ///< tokens per micro-batch (b x s) at which GEMM efficiency halves
  double half_efficiency_width = 290;    ///< per-GPU GEMM width (min(h, q/tp, ffn/tp)) at which it halves
  double attention_efficiency = 1.0;     ///< efficiency of the score/context products relative to GEMMs
  double memory_traffic = 2.4;           ///< HBM bytes moved per byte of (no-recompute) activations, forward
  double layer_overhead_ms = 1.56;       ///< latency floor of one layer's forward or backward (host + launches)
  double recompute_overhead_ms = 0.6;    ///< latency floor of a selective (core-attention) recompute
  double backward_factor = 1.6;          ///< backward compute / forward compute
  /// The flash kernel (AttentionKernel::Flash): its achieved fraction of peak on long rows
  /// (FlashAttention-2 reports 50-73% of A100's forward peak, FlashAttention-3 75% of H100's), and
  /// its backward FLOPs over its forward FLOPs (five products against two: the scores recomputed).
  double flash_efficiency = 0.5;
  double flash_backward_factor = 2.5;
  // Activation calibration: stored bytes per layer beyond the closed forms, as the profiles measure
  // them (the last profiled layer's live output shared over the layers, allocator rounding).
  double activation_token_bytes = 0.68;  ///< per token and hidden unit (b x tokens x h)
  double activation_score_bytes = 0.034; ///< per attention score (a b s^2 / tp; decoders self + cross)
  double activation_layer_bytes = 1.4e5; ///< per layer, whatever the shape
  bool tp_communication = true;          ///< add Megatron's tensor-parallel all-reduces (not overlapped)
};

/// One numeric field of AnalyticOptions: its key in device files and reports, and the member.
struct AnalyticField {
  const char* name;
  double AnalyticOptions::*member;
};
/// The one table of the numeric fields (tp_communication, a flag, is the only other field).
inline constexpr AnalyticField kAnalyticFields[] = {
    {"max_efficiency", &AnalyticOptions::max_efficiency},
    {"half_efficiency_tokens", &AnalyticOptions::half_efficiency_tokens},
    {"half_efficiency_width", &AnalyticOptions::half_efficiency_width},
    {"attention_efficiency", &AnalyticOptions::attention_efficiency},
    {"memory_traffic", &AnalyticOptions::memory_traffic},
    {"layer_overhead_ms", &AnalyticOptions::layer_overhead_ms},
    {"recompute_overhead_ms", &AnalyticOptions::recompute_overhead_ms},
    {"backward_factor", &AnalyticOptions::backward_factor},
    {"flash_efficiency", &AnalyticOptions::flash_efficiency},
    {"flash_backward_factor", &AnalyticOptions::flash_backward_factor},
    {"activation_token_bytes", &AnalyticOptions::activation_token_bytes},
    {"activation_score_bytes", &AnalyticOptions::activation_score_bytes},
    {"activation_layer_bytes", &AnalyticOptions::activation_layer_bytes},
};
/// The key of the flag in device files and reports.
inline constexpr const char* kAnalyticTpCommunication = "tp_communication";

/// Checks every field: efficiencies in (0, 1], the backward factors finite and > 0, the others finite
/// and >= 0.
/// Throws InvalidArgument "`where`: '`prefix`field' must be ..., found v" (`where` names the device
/// or its file, `prefix` is e.g. "analytic." for a field of a device file's "analytic" object).
void check_analytic_options(const AnalyticOptions& o, const std::string& where, const std::string& prefix = "");

}  // namespace packpipe::costmodel
