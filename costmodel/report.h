// Throughput reports: the BigScience TFLOPs-per-GPU formula, model FLOPs utilisation, and helpers
// that turn an iteration time into tokens per second and TFLOPs per GPU.
#pragma once

#include <cstdint>

#include "costmodel/model.h"

namespace packpipe::costmodel {

/// BigScience parameter count of a GPT model with `seq` learned positions:
/// P = l (12 h^2 + 13 h) + V h + s h + 2 h (GPT-1.3B, s 2048: 1,317,654,528). Decoder-only only.
double bigscience_params(const ModelSpec& m, std::int64_t seq);

/// BigScience TFLOPs per GPU: P * factor * 2 * s * GBS / (T_iter * N_gpu * 1e12), factor 4 with
/// full activation recompute (an extra forward), 3 without. Throws InvalidArgument for
/// non-positive sizes or a factor other than 3 or 4.
double bigscience_tflops_per_gpu(double params, std::int64_t seq, std::int64_t global_batch, double iteration_s,
                                 std::int64_t gpus, int factor = 4);

/// Megatron's exact FLOPs of one iteration of a GPT model: 72 B s l h^2 (1 + s / 6h + V / 12lh)
/// without recompute, 96 B s l h^2 (1 + s / 6h + V / 16lh) with full recompute.
double megatron_iteration_flops(const ModelSpec& m, std::int64_t global_batch, std::int64_t seq, bool full_recompute);

/// Throughput of a plan from its iteration time.
struct ThroughputReport {
  double iteration_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;  ///< model FLOPs (no recompute) per second per GPU, in TFLOP/s
  double mfu = 0;             ///< tflops_per_gpu / the device's peak
};

/// Report for an iteration of `model_flops` (forward + backward, no recompute: a sum of
/// training_flops over dense micro-batches; for packed or sliced ones the planner's model_flops,
/// which counts each sample once, whole) processing `samples` samples of `tokens` tokens in
/// `iteration_s` seconds on `gpus` GPUs of `device`.
ThroughputReport throughput_report(double model_flops, double samples, double tokens, double iteration_s,
                                   std::int64_t gpus, const DeviceSpec& device);

}  // namespace packpipe::costmodel
