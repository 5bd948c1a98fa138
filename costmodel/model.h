// Model and device descriptions for the cost model: named presets and JSON files.
#pragma once

#include <cstdint>
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
};

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
/// Checks every size is positive and consistent; throws InvalidArgument naming the field.
void validate(const ModelSpec& m);
/// As above for a device, its analytic constants included (check_analytic_options).
void validate(const DeviceSpec& d);

}  // namespace packpipe::costmodel
