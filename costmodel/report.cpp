#include "costmodel/report.h"

#include <cmath>

#include "common/errors.h"

namespace packpipe::costmodel {

double bigscience_params(const ModelSpec& m, std::int64_t seq) {
  PACKPIPE_CHECK_ARG(m.arch == Architecture::DecoderOnly,
                     "the BigScience parameter formula is for decoder-only models; model '{}' is encoder-decoder",
                     m.name);
  PACKPIPE_CHECK_ARG(seq > 0, "seq must be positive, found {}", seq);
  const double l = static_cast<double>(m.num_layers), h = static_cast<double>(m.hidden);
  return l * (12 * h * h + 13 * h) + static_cast<double>(m.vocab) * h + static_cast<double>(seq) * h + 2 * h;
}

double bigscience_tflops_per_gpu(double params, std::int64_t seq, std::int64_t global_batch, double iteration_s,
                                 std::int64_t gpus, int factor) {
  PACKPIPE_CHECK_ARG(params > 0 && std::isfinite(params), "params must be positive, found {}", params);
  PACKPIPE_CHECK_ARG(seq > 0, "seq must be positive, found {}", seq);
  PACKPIPE_CHECK_ARG(global_batch > 0, "global_batch must be positive, found {}", global_batch);
  PACKPIPE_CHECK_ARG(iteration_s > 0 && std::isfinite(iteration_s), "iteration time must be a finite number > 0 (seconds), found {}",
                     iteration_s);
  PACKPIPE_CHECK_ARG(gpus > 0, "gpus must be positive, found {}", gpus);
  PACKPIPE_CHECK_ARG(factor == 3 || factor == 4, "factor must be 3 (no recompute) or 4 (full recompute), found {}",
                     factor);
  return params * factor * 2.0 * static_cast<double>(seq) * static_cast<double>(global_batch) /
         (iteration_s * static_cast<double>(gpus) * 1e12);
}

double megatron_iteration_flops(const ModelSpec& m, std::int64_t global_batch, std::int64_t seq, bool full_recompute) {
  PACKPIPE_CHECK_ARG(m.arch == Architecture::DecoderOnly, "Megatron's FLOPs formula is for decoder-only models; "
                     "model '{}' is encoder-decoder", m.name);
  PACKPIPE_CHECK_ARG(global_batch > 0, "global_batch must be positive, found {}", global_batch);
  PACKPIPE_CHECK_ARG(seq > 0, "seq must be positive, found {}", seq);
  const double B = static_cast<double>(global_batch), s = static_cast<double>(seq);
  const double l = static_cast<double>(m.num_layers), h = static_cast<double>(m.hidden);
  const double V = static_cast<double>(m.vocab);
  if (full_recompute) return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
}

ThroughputReport throughput_report(double model_flops, double samples, double tokens, double iteration_s,
                                   std::int64_t gpus, const DeviceSpec& device) {
  PACKPIPE_CHECK_ARG(model_flops >= 0 && std::isfinite(model_flops), "model_flops must be non-negative, found {}",
                     model_flops);
  PACKPIPE_CHECK_ARG(samples >= 0 && tokens >= 0, "samples and tokens must be non-negative, found {} and {}", samples,
                     tokens);
  PACKPIPE_CHECK_ARG(iteration_s > 0 && std::isfinite(iteration_s), "iteration time must be a finite number > 0 (seconds), found {}",
                     iteration_s);
  PACKPIPE_CHECK_ARG(gpus > 0, "gpus must be positive, found {}", gpus);
  validate(device);
  ThroughputReport r;
  r.iteration_s = iteration_s;
  r.samples_per_s = samples / iteration_s;
  r.tokens_per_s = tokens / iteration_s;
  r.tflops_per_gpu = model_flops / (iteration_s * static_cast<double>(gpus) * 1e12);
  r.mfu = r.tflops_per_gpu / device.peak_tflops;
  return r;
}

}  // namespace packpipe::costmodel
