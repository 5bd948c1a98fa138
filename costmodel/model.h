// Model and device descriptions for the cost model: named presets and JSON files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "costmodel/analytic_options.h"

namespace packpipe::costmodel {

enum class Architecture { DecoderOnly, EncoderDecoder };
/// The one name table: "decoder_only", "encoder_decoder" (the `arch` of model files and reports).
inline constexpr EnumName<Architecture> kArchitectureNames[] = {{Architecture::DecoderOnly, "decoder_only"},
                                                                {Architecture::EncoderDecoder, "encoder_decoder"}};
/// The architecture's name in kArchitectureNames.
constexpr const char* architecture_name(Architecture a) { return enum_name(kArchitectureNames, a); }
/// Architecture from its name; throws InvalidArgument listing the names.
inline Architecture architecture_from_name(const std::string& name) {
  return enum_from_name(kArchitectureNames, name, "architecture");
}

/// The attention kernel a trainer runs, which decides what attention stores and costs
/// (docs/design/015-long-context.md): Eager materialises the scores (Megatron's core attention,
/// PyTorch's math path: Korthikanti et al.'s 5 a s^2 b bytes a layer, the full square's FLOPs);
/// Flash never writes them (FlashAttention 2/3, cuDNN, PyTorch's flash and memory-efficient SDPA:
/// a 4-byte log-sum-exp per query and head, causal blocks skipped).
enum class AttentionKernel : std::uint8_t { Eager = 0, Flash = 1 };
/// The one name table: "eager", "flash" (model, device and profile files, reports, Python).
inline constexpr EnumName<AttentionKernel> kAttentionKernelNames[] = {{AttentionKernel::Eager, "eager"},
                                                                      {AttentionKernel::Flash, "flash"}};
/// The kernel's name in kAttentionKernelNames.
constexpr const char* attention_kernel_name(AttentionKernel k) { return enum_name(kAttentionKernelNames, k); }
/// Kernel from its name; throws InvalidArgument listing the names.
inline AttentionKernel attention_kernel_from_name(const std::string& name) {
  return enum_from_name(kAttentionKernelNames, name, "attention kernel");
}

/// Largest sizes a model may have (validate): far above any real model, low enough that every
/// product the cost model forms of them stays exact in 64 bits.
inline constexpr std::int64_t kMaxModelLayers = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxModelWidth = std::int64_t{1} << 20;  ///< hidden, head_dim
inline constexpr std::int64_t kMaxModelHeads = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxModelFfn = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxModelVocab = std::int64_t{1} << 26;

/// Transformer shape. Decoder-only models use `num_layers`; encoder-decoder models use
/// `encoder_layers` and `decoder_layers`.
struct ModelSpec {
  std::string name;
  Architecture arch = Architecture::DecoderOnly;
  std::int64_t num_layers = 0;
  std::int64_t encoder_layers = 0;
  std::int64_t decoder_layers = 0;
  std::int64_t hidden = 0;        ///< h
  std::int64_t heads = 0;         ///< attention (query) heads
  std::int64_t kv_heads = 0;      ///< key/value heads (= heads without GQA)
  std::int64_t head_dim = 0;      ///< kv_channels; heads * head_dim need not equal hidden
  std::int64_t ffn_hidden = 0;    ///< MLP inner size
  bool gated_mlp = false;         ///< SwiGLU / GeGLU: three MLP matrices instead of two
  std::int64_t vocab = 0;
  std::int64_t bytes_per_param = 2;  ///< fp16 / bf16 weights and activations
  /// The attention kernel the model is trained with (a model file's "attention"); unset: the
  /// device's (DeviceSpec::attention). See attention_kernel().
  std::optional<AttentionKernel> attention;
  /// The dtype of the activations it sends between pipeline stages (a model file's "dtype": "fp16",
  /// "bf16", "fp32" or "fp64"); empty: unset, and planning takes bf16 unless told otherwise.
  std::string activation_dtype;

  /// Layers of the whole model (encoder + decoder for encoder-decoder).
  std::int64_t total_layers() const;
  /// Parameters of one transformer layer (encoder layer, or decoder layer with cross-attention).
  std::int64_t layer_params(bool decoder_layer = false) const;
  /// Embedding parameters (vocab x hidden; tied with the LM head).
  std::int64_t embedding_params() const { return vocab * hidden; }
  /// All parameters (layers + embedding + final norms).
  std::int64_t total_params() const;
};

/// One accelerator type and its interconnect.
struct DeviceSpec {
  std::string name;
  double peak_tflops = 0;        ///< dense fp16/bf16 tensor-core peak, TFLOP/s
  double memory_gb = 0;          ///< device memory, GB (1e9 bytes)
  double hbm_gbps = 0;           ///< memory bandwidth, GB/s
  double intra_node_gbps = 0;    ///< per-GPU point-to-point bandwidth inside a node, GB/s
  double intra_node_latency_us = 0;
  double inter_node_gbps = 0;    ///< per-GPU bandwidth across nodes, GB/s
  double inter_node_latency_us = 0;
  std::int64_t gpus_per_node = 8;
  /// Constants of the analytic cost model for this device (the A100-fitted defaults on presets).
  AnalyticOptions analytic;
  /// The attention kernel trainers run on this device: Flash on the GPU presets; a device file's
  /// "attention", Eager when it has none (the formulas such files were written against).
  AttentionKernel attention = AttentionKernel::Eager;
};

/// The kernel a model runs on a device: the model's when it names one, else the device's.
inline AttentionKernel attention_kernel(const ModelSpec& m, const DeviceSpec& d) {
  return m.attention.has_value() ? *m.attention : d.attention;
}

/// Names of the model presets ("gpt-1.3b", "gpt-6.7b", "gpt-13b", "llama-7b", "t5-770m", "t5-11b", ...).
std::vector<std::string> model_preset_names();
/// Names of the device presets ("V100-32GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200").
std::vector<std::string> device_preset_names();
/// A model preset by name (case-insensitive) or a JSON file path (ends in .json); throws
/// InvalidArgument listing the presets for an unknown name, Error naming the file and field for a bad file.
ModelSpec load_model(const std::string& name_or_path);
/// A device preset by name or a JSON file path; errors as load_model.
DeviceSpec load_device(const std::string& name_or_path);
/// Parses a model from JSON text (keys as in ModelSpec, plus DynaPipe/Megatron spellings
/// num_attn_heads, kv_channels, ffn_hidden_size, hidden_size, encoder_num_layers, decoder_num_layers).
ModelSpec parse_model_json(const std::string& text, const std::string& name);
/// Parses a device from JSON text (keys as in DeviceSpec). The analytic model's constants
/// (AnalyticOptions, keys as its fields) come in an "analytic" object or as flat keys beside the
/// others (not both for one field); missing ones keep the defaults. Throws InvalidArgument naming
/// `name` and the field for an unknown key, a wrong type or a value out of range.
DeviceSpec parse_device_json(const std::string& text, const std::string& name);
/// Checks every size is positive, within the kMaxModel* limits and consistent (bytes_per_param 1,
/// 2, 4 or 8); throws InvalidArgument naming the field.
void validate(const ModelSpec& m);
/// As above for a device, its analytic constants included (check_analytic_options).
void validate(const DeviceSpec& d);

}  // namespace packpipe::costmodel
