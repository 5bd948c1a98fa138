#include "costmodel/model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/json.h"

namespace packpipe::costmodel {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

ModelSpec decoder_only(const char* name, std::int64_t layers, std::int64_t h, std::int64_t heads,
                       std::int64_t kv_heads, std::int64_t head_dim, std::int64_t ffn, bool gated,
                       std::int64_t vocab) {
  ModelSpec m;
  m.name = name;
  m.arch = Architecture::DecoderOnly;
  m.num_layers = layers;
  m.hidden = h;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.head_dim = head_dim;
  m.ffn_hidden = ffn;
  m.gated_mlp = gated;
  m.vocab = vocab;
  return m;
}

ModelSpec encoder_decoder(const char* name, std::int64_t enc, std::int64_t dec, std::int64_t h,
                          std::int64_t heads, std::int64_t head_dim, std::int64_t ffn, std::int64_t vocab) {
  ModelSpec m = decoder_only(name, 0, h, heads, heads, head_dim, ffn, false, vocab);
  m.arch = Architecture::EncoderDecoder;
  m.encoder_layers = enc;
  m.decoder_layers = dec;
  return m;
}

// Shapes: GPT sizes as in Megatron/Aceso (vocab padded to 51200); gpt-6.7b, gpt-13b and t5-11b
// take hidden, heads, kv_channels and ffn from DynaPipe's experiment model configs (gpt-13b has
// hidden 5140 there); llama-7b from its published config; t5-770m as Aceso profiles it.
const std::vector<ModelSpec>& model_presets() {
  static const std::vector<ModelSpec> presets = {
      decoder_only("gpt-350m", 24, 1024, 16, 16, 64, 4096, false, 51200),
      decoder_only("gpt-1.3b", 24, 2048, 16, 16, 128, 8192, false, 51200),
      decoder_only("gpt-2.6b", 32, 2560, 32, 32, 80, 10240, false, 51200),
      decoder_only("gpt-6.7b", 32, 4096, 32, 32, 128, 16384, false, 51200),
      decoder_only("gpt-13b", 40, 5140, 40, 40, 128, 20560, false, 51200),
      decoder_only("llama-7b", 32, 4096, 32, 32, 128, 11008, true, 32000),
      decoder_only("llama-13b", 40, 5120, 40, 40, 128, 13824, true, 32000),
      encoder_decoder("t5-770m", 24, 24, 1024, 16, 64, 4096, 32128),
      encoder_decoder("t5-11b", 24, 24, 1024, 128, 128, 65536, 32128),
  };
  return presets;
}

DeviceSpec device(const char* name, double tflops, double mem_gb, double hbm, double intra, double inter) {
  DeviceSpec d;
  d.name = name;
  d.peak_tflops = tflops;
  d.memory_gb = mem_gb;
  d.hbm_gbps = hbm;
  d.intra_node_gbps = intra;
  d.intra_node_latency_us = 10;
  d.inter_node_gbps = inter;
  d.inter_node_latency_us = 20;
  d.gpus_per_node = 8;
  d.attention = AttentionKernel::Flash;  // what trainers run on these GPUs (015)
  return d;
}

// Dense fp16/bf16 tensor-core peaks and memory from the vendor data sheets (SXM parts); intra-node
// = NVLink bandwidth per direction per GPU; inter-node = one 100/200/400 Gb/s NIC per GPU.
const std::vector<DeviceSpec>& device_presets() {
  static const std::vector<DeviceSpec> presets = {
      device("V100-32GB", 125, 32, 900, 150, 12.5),
      device("A100-40GB", 312, 40, 1555, 300, 25),
      device("A100-80GB", 312, 80, 2039, 300, 25),
      device("H100-80GB", 989, 80, 3350, 450, 50),
      device("H200", 989, 141, 4800, 450, 50),
  };
  return presets;
}

bool is_json_path(const std::string& s) { return s.size() > 5 && s.compare(s.size() - 5, 5, ".json") == 0; }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  PACKPIPE_CHECK(in.good(), "cannot open '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json parse(const std::string& text, const std::string& name) {
  nlohmann::json j;
  try {
    j = packpipe::parse_json(text, name);  // duplicate keys refused, depth bounded
  } catch (const Error& e) {
    PACKPIPE_THROW(InvalidArgument, "{}", e.what());
  }
  PACKPIPE_CHECK_ARG(j.is_object(), "{}: expected a JSON object, found {}", name, j.type_name());
  return j;
}

template <typename T>
void take(const nlohmann::json& j, std::initializer_list<const char*> keys, T& out, const std::string& name,
          const std::string& prefix = "") {
  for (const char* k : keys) {
    if (!j.contains(k)) continue;
    const auto& v = j.at(k);
    if constexpr (std::is_same_v<T, bool>) {
      PACKPIPE_CHECK_ARG(v.is_boolean(), "{}: '{}{}' must be true or false, found {}", name, prefix, k, v.dump());
    } else if constexpr (std::is_same_v<T, std::string>) {
      PACKPIPE_CHECK_ARG(v.is_string(), "{}: '{}{}' must be a string, found {}", name, prefix, k, v.dump());
    } else if constexpr (std::is_integral_v<T>) {
      PACKPIPE_CHECK_ARG(v.is_number_integer(), "{}: '{}{}' must be an integer, found {}", name, prefix, k, v.dump());
    } else {
      PACKPIPE_CHECK_ARG(v.is_number(), "{}: '{}{}' must be a number, found {}", name, prefix, k, v.dump());
    }
    out = v.get<T>();
    return;
  }
}

void reject_unknown(const nlohmann::json& j, const std::vector<std::string>& known, const std::string& name,
                    const std::string& prefix = "") {
  for (auto it = j.begin(); it != j.end(); ++it) {
    PACKPIPE_CHECK_ARG(std::find(known.begin(), known.end(), it.key()) != known.end(), "{}: unknown key '{}{}'", name,
                       prefix, it.key());
  }
}

/// A key and its aliases given together are one field given twice: refused naming them.
void refuse_aliases(const nlohmann::json& j, const std::vector<const char*>& keys, const std::string& name) {
  std::vector<std::string> given;
  for (const char* k : keys) {
    if (j.contains(k)) given.emplace_back(k);
  }
  PACKPIPE_CHECK_ARG(given.size() <= 1, "{}: '{}' and '{}' name the same field; keep one", name, given.size() > 0 ? given[0] : "",
                     given.size() > 1 ? given[1] : "");
}

/// A field the file must give (under one of `keys`, its aliases): refused naming it and what it is
/// when none is there (rather than by the check of its default value).
void require(const nlohmann::json& j, std::initializer_list<const char*> keys, const std::string& name,
             const char* what) {
  for (const char* k : keys) {
    if (j.contains(k)) return;
  }
  std::string alias;
  for (auto it = keys.begin() + 1; it < keys.end(); ++it) alias += fmt::format("{}'{}'", alias.empty() ? "" : ", ", *it);
  PACKPIPE_THROW(InvalidArgument, "{}: missing field '{}'{} ({})", name, *keys.begin(),
                 alias.empty() ? std::string() : " (or " + alias + ")", what);
}

/// The "attention" key of a model or device file, when given.
std::optional<AttentionKernel> take_kernel(const nlohmann::json& j, const std::string& name) {
  if (!j.contains("attention")) return std::nullopt;
  const auto& v = j.at("attention");
  PACKPIPE_CHECK_ARG(v.is_string(), "{}: 'attention' must be one of {} (the attention kernel), found {}", name,
                     enum_name_list(kAttentionKernelNames), v.dump());
  const std::string k = v.get<std::string>();
  for (const auto& e : kAttentionKernelNames) {
    if (k == e.name) return e.value;
  }
  PACKPIPE_THROW(InvalidArgument, "{}: 'attention' must be one of {} (the attention kernel), found '{}'", name,
                 enum_name_list(kAttentionKernelNames), k);
}

/// The keys of the analytic model's constants in device files.
std::vector<std::string> analytic_keys() {
  std::vector<std::string> keys;
  for (const auto& f : kAnalyticFields) keys.emplace_back(f.name);
  keys.emplace_back(kAnalyticTpCommunication);
  return keys;
}

/// The range check of one numeric constant: empty when `v` is valid, else what it must be.
std::string analytic_field_problem(const std::string& field, double v) {
  if (field == "max_efficiency" || field == "attention_efficiency" || field == "flash_efficiency") {
    return v > 0 && v <= 1 ? std::string() : std::string("in (0, 1]");
  }
  if (field == "backward_factor" || field == "flash_backward_factor") return v > 0 && std::isfinite(v) ? std::string() : std::string("a finite number > 0");
  return v >= 0 && std::isfinite(v) ? std::string() : std::string("a finite number >= 0");
}

}  // namespace

std::int64_t ModelSpec::total_layers() const {
  return arch == Architecture::DecoderOnly ? num_layers : encoder_layers + decoder_layers;
}

std::int64_t ModelSpec::layer_params(bool decoder_layer) const {
  const std::int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  const std::int64_t attn = hidden * (q + 2 * kv) + q * hidden + q + 2 * kv + hidden;  // weights + biases
  const std::int64_t mlp = (gated_mlp ? 3 : 2) * hidden * ffn_hidden + ffn_hidden + hidden;
  const std::int64_t norms = 2 * 2 * hidden;
  std::int64_t p = attn + mlp + norms;
  if (decoder_layer) p += attn + 2 * hidden;  // cross-attention and its norm
  return p;
}

std::int64_t ModelSpec::total_params() const {
  const std::int64_t layers = arch == Architecture::DecoderOnly
                                  ? num_layers * layer_params(false)
                                  : encoder_layers * layer_params(false) + decoder_layers * layer_params(true);
  return layers + embedding_params() + 2 * hidden;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const auto& m : model_presets()) out.push_back(m.name);
  return out;
}

std::vector<std::string> device_preset_names() {
  std::vector<std::string> out;
  for (const auto& d : device_presets()) out.push_back(d.name);
  return out;
}

ModelSpec parse_model_json(const std::string& text, const std::string& name) {
  const auto j = parse(text, name);
  reject_unknown(j, std::vector<std::string>{"name", "arch", "num_layers", "encoder_layers", "decoder_layers", "encoder_num_layers",
                     "decoder_num_layers", "hidden", "hidden_size", "heads", "num_attn_heads",
                     "num_attention_heads", "kv_heads", "num_query_groups", "head_dim", "kv_channels",
                     "ffn_hidden", "ffn_hidden_size", "gated_mlp", "vocab", "vocab_size", "bytes_per_param",
                     "attention", "dtype"},
                 name);
  for (const auto& aliases : std::vector<std::vector<const char*>>{
           {"encoder_layers", "encoder_num_layers"},
           {"decoder_layers", "decoder_num_layers"},
           {"hidden", "hidden_size"},
           {"heads", "num_attn_heads", "num_attention_heads"},
           {"kv_heads", "num_query_groups"},
           {"head_dim", "kv_channels"},
           {"ffn_hidden", "ffn_hidden_size"},
           {"vocab", "vocab_size"}}) {
    refuse_aliases(j, aliases, name);
  }
  ModelSpec m;
  m.name = name;
  std::string arch;
  take(j, {"name"}, m.name, name);
  take(j, {"num_layers"}, m.num_layers, name);
  take(j, {"encoder_layers", "encoder_num_layers"}, m.encoder_layers, name);
  take(j, {"decoder_layers", "decoder_num_layers"}, m.decoder_layers, name);
  take(j, {"arch"}, arch, name);
  const bool has_num = j.contains("num_layers");
  const bool has_sides = m.encoder_layers != 0 || m.decoder_layers != 0 || j.contains("encoder_layers") ||
                         j.contains("encoder_num_layers") || j.contains("decoder_layers") ||
                         j.contains("decoder_num_layers");
  PACKPIPE_CHECK_ARG(!(has_num && has_sides),
                     "{}: 'num_layers' (a decoder-only model) and 'encoder_layers'/'decoder_layers' (an encoder-decoder "
                     "model) are both given; keep the ones of the model's architecture",
                     name);
  if (arch.empty()) {
    m.arch = (m.encoder_layers > 0 || m.decoder_layers > 0) ? Architecture::EncoderDecoder : Architecture::DecoderOnly;
  } else {
    const auto* it = std::find_if(std::begin(kArchitectureNames), std::end(kArchitectureNames),
                                  [&](const auto& x) { return arch == x.name; });
    PACKPIPE_CHECK_ARG(it != std::end(kArchitectureNames), "{}: 'arch' must be one of {}, found '{}'", name,
                       enum_name_list(kArchitectureNames), arch);
    m.arch = it->value;
  }
  take(j, {"hidden", "hidden_size"}, m.hidden, name);
  take(j, {"heads", "num_attn_heads", "num_attention_heads"}, m.heads, name);
  m.kv_heads = m.heads;
  take(j, {"kv_heads", "num_query_groups"}, m.kv_heads, name);
  m.head_dim = m.heads > 0 ? m.hidden / m.heads : 0;
  const bool head_dim_given = j.contains("head_dim") || j.contains("kv_channels");
  PACKPIPE_CHECK_ARG(head_dim_given || m.heads <= 0 || m.hidden <= 0 || m.hidden % m.heads == 0,
                     "{}: heads ({}) does not divide hidden ({}): the head width would be {} and {} hidden units "
                     "left over; give 'head_dim' (kv_channels) when heads x head_dim differs from hidden",
                     name, m.heads, m.hidden, m.heads > 0 ? m.hidden / m.heads : 0,
                     m.heads > 0 ? m.hidden % m.heads : 0);
  take(j, {"head_dim", "kv_channels"}, m.head_dim, name);
  m.ffn_hidden = 4 * m.hidden;
  take(j, {"ffn_hidden", "ffn_hidden_size"}, m.ffn_hidden, name);
  take(j, {"gated_mlp"}, m.gated_mlp, name);
  m.vocab = 51200;
  take(j, {"vocab", "vocab_size"}, m.vocab, name);
  take(j, {"bytes_per_param"}, m.bytes_per_param, name);
  m.attention = take_kernel(j, name);
  if (j.contains("dtype")) {
    const auto& v = j.at("dtype");
    PACKPIPE_CHECK_ARG(v.is_string(), "{}: 'dtype' must be one of fp16, bf16, fp32, fp64 (the activations between "
                       "stages), found {}", name, v.dump());
    m.activation_dtype = v.get<std::string>();
  }
  // (after the fields given are read: a field of the wrong type is named as such first)
  if (!has_sides) {
    require(j, {"num_layers"}, name, "the transformer layers of a decoder-only model; an encoder-decoder model gives "
            "'encoder_layers' and 'decoder_layers'");
  } else {
    require(j, {"encoder_layers", "encoder_num_layers"}, name, "the encoder layers of an encoder-decoder model");
    require(j, {"decoder_layers", "decoder_num_layers"}, name, "the decoder layers of an encoder-decoder model");
  }
  require(j, {"hidden", "hidden_size"}, name, "the model width");
  require(j, {"heads", "num_attn_heads", "num_attention_heads"}, name, "the attention heads");
  validate(m);
  return m;
}

DeviceSpec parse_device_json(const std::string& text, const std::string& name) {
  const auto j = parse(text, name);
  std::vector<std::string> known = {"name", "peak_tflops", "memory_gb", "hbm_gbps", "intra_node_gbps",
                                    "intra_node_latency_us", "inter_node_gbps", "inter_node_latency_us",
                                    "gpus_per_node", "analytic", "attention"};
  const std::vector<std::string> constants = analytic_keys();
  known.insert(known.end(), constants.begin(), constants.end());
  reject_unknown(j, known, name);
  DeviceSpec d;
  d.name = name;
  d.intra_node_latency_us = 10;
  d.inter_node_latency_us = 20;
  take(j, {"name"}, d.name, name);
  take(j, {"peak_tflops"}, d.peak_tflops, name);
  take(j, {"memory_gb"}, d.memory_gb, name);
  take(j, {"hbm_gbps"}, d.hbm_gbps, name);
  take(j, {"intra_node_gbps"}, d.intra_node_gbps, name);
  take(j, {"intra_node_latency_us"}, d.intra_node_latency_us, name);
  take(j, {"inter_node_gbps"}, d.inter_node_gbps, name);
  take(j, {"inter_node_latency_us"}, d.inter_node_latency_us, name);
  take(j, {"gpus_per_node"}, d.gpus_per_node, name);
  if (const auto k = take_kernel(j, name)) d.attention = *k;
  // The analytic model's constants: an "analytic" object, or flat keys beside the others.
  const nlohmann::json* nested = nullptr;
  if (j.contains("analytic")) {
    nested = &j.at("analytic");
    PACKPIPE_CHECK_ARG(nested->is_object(), "{}: 'analytic' must be an object of the analytic model's constants ({}), found {}",
                       name, fmt::join(constants, ", "), nested->dump());
    reject_unknown(*nested, constants, name, "analytic.");
  }
  auto source = [&](const char* key) -> std::pair<const nlohmann::json*, std::string> {
    const bool flat = j.contains(key), in = nested != nullptr && nested->contains(key);
    PACKPIPE_CHECK_ARG(!(flat && in), "{}: '{}' is given twice, as a key and in 'analytic'; keep one", name, key);
    if (in) return {nested, "analytic."};
    return {flat ? &j : nullptr, ""};
  };
  for (const auto& f : kAnalyticFields) {
    const auto [obj, prefix] = source(f.name);
    if (obj == nullptr) continue;
    double& v = d.analytic.*f.member;
    take(*obj, {f.name}, v, name, prefix);
    const std::string problem = analytic_field_problem(f.name, v);
    PACKPIPE_CHECK_ARG(problem.empty(), "{}: '{}{}' must be {}, found {}", name, prefix, f.name, problem, v);
  }
  if (const auto [obj, prefix] = source(kAnalyticTpCommunication); obj != nullptr) {
    take(*obj, {kAnalyticTpCommunication}, d.analytic.tp_communication, name, prefix);
  }
  require(j, {"peak_tflops"}, name, "the dense 16-bit matrix-multiply peak of one GPU, in TFLOP/s");
  require(j, {"memory_gb"}, name, "the memory of one GPU, in GB");
  require(j, {"hbm_gbps"}, name, "the memory bandwidth of one GPU, in GB/s");
  require(j, {"intra_node_gbps"}, name, "the point-to-point bandwidth of one GPU inside a node, in GB/s");
  require(j, {"inter_node_gbps"}, name, "the bandwidth of one GPU across nodes, in GB/s");
  validate(d);
  return d;
}

ModelSpec load_model(const std::string& name_or_path) {
  if (is_json_path(name_or_path)) return parse_model_json(read_text(name_or_path), name_or_path);
  for (const auto& m : model_presets()) {
    if (lower(m.name) == lower(name_or_path)) return m;
  }
  std::string names;
  for (const auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  PACKPIPE_THROW(InvalidArgument, "unknown model '{}' (presets: {}; or a .json file)", name_or_path, names);
}

DeviceSpec load_device(const std::string& name_or_path) {
  if (is_json_path(name_or_path)) return parse_device_json(read_text(name_or_path), name_or_path);
  for (const auto& d : device_presets()) {
    if (lower(d.name) == lower(name_or_path)) return d;
  }
  std::string names;
  for (const auto& n : device_preset_names()) names += (names.empty() ? "" : ", ") + n;
  PACKPIPE_THROW(InvalidArgument, "unknown device '{}' (presets: {}; or a .json file)", name_or_path, names);
}

void validate(const ModelSpec& m) {
  const bool dec_only = m.arch == Architecture::DecoderOnly;
  PACKPIPE_CHECK_ARG(!dec_only || m.num_layers > 0, "model '{}': num_layers must be positive, found {}", m.name,
                     m.num_layers);
  PACKPIPE_CHECK_ARG(dec_only || (m.encoder_layers > 0 && m.decoder_layers > 0),
                     "model '{}': encoder_layers and decoder_layers must be positive, found {} and {}", m.name,
                     m.encoder_layers, m.decoder_layers);
  const std::pair<const char*, std::int64_t> sizes[] = {{"hidden", m.hidden},         {"heads", m.heads},
                                                        {"kv_heads", m.kv_heads},     {"head_dim", m.head_dim},
                                                        {"ffn_hidden", m.ffn_hidden}, {"vocab", m.vocab},
                                                        {"bytes_per_param", m.bytes_per_param}};
  for (const auto& [field, v] : sizes) {
    PACKPIPE_CHECK_ARG(v > 0, "model '{}': {} must be positive, found {}", m.name, field, v);
  }
  // Far above any real model, and low enough that every product the cost model forms of them
  // (parameters, bytes, FLOPs) stays exact and in range.
  const std::tuple<const char*, std::int64_t, std::int64_t> limits[] = {
      {"num_layers", m.num_layers, kMaxModelLayers},         {"encoder_layers", m.encoder_layers, kMaxModelLayers},
      {"decoder_layers", m.decoder_layers, kMaxModelLayers}, {"hidden", m.hidden, kMaxModelWidth},
      {"heads", m.heads, kMaxModelHeads},                    {"kv_heads", m.kv_heads, kMaxModelHeads},
      {"head_dim", m.head_dim, kMaxModelWidth},              {"ffn_hidden", m.ffn_hidden, kMaxModelFfn},
      {"vocab", m.vocab, kMaxModelVocab}};
  for (const auto& [field, v, limit] : limits) {
    PACKPIPE_CHECK_ARG(v <= limit, "model '{}': {} must be at most {}, found {}", m.name, field, limit, v);
  }
  PACKPIPE_CHECK_ARG(m.bytes_per_param == 1 || m.bytes_per_param == 2 || m.bytes_per_param == 4 || m.bytes_per_param == 8,
                     "model '{}': bytes_per_param must be 1, 2, 4 or 8 (fp8, fp16/bf16, fp32, fp64), found {}", m.name,
                     m.bytes_per_param);
  PACKPIPE_CHECK_ARG(m.heads % m.kv_heads == 0, "model '{}': heads ({}) must be a multiple of kv_heads ({})", m.name,
                     m.heads, m.kv_heads);
  const std::string& d = m.activation_dtype;
  PACKPIPE_CHECK_ARG(d.empty() || d == "fp16" || d == "bf16" || d == "fp32" || d == "fp64",
                     "model '{}': dtype must be one of fp16, bf16, fp32, fp64 (the activations between stages), found "
                     "'{}'", m.name, d);
}

void validate(const DeviceSpec& d) {
  const std::pair<const char*, double> fields[] = {{"peak_tflops", d.peak_tflops},
                                                   {"memory_gb", d.memory_gb},
                                                   {"hbm_gbps", d.hbm_gbps},
                                                   {"intra_node_gbps", d.intra_node_gbps},
                                                   {"inter_node_gbps", d.inter_node_gbps}};
  for (const auto& [field, v] : fields) {
    PACKPIPE_CHECK_ARG(v > 0, "device '{}': {} must be positive, found {}", d.name, field, v);
  }
  PACKPIPE_CHECK_ARG(d.intra_node_latency_us >= 0 && d.inter_node_latency_us >= 0,
                     "device '{}': latencies must be non-negative", d.name);
  PACKPIPE_CHECK_ARG(d.gpus_per_node > 0, "device '{}': gpus_per_node must be positive, found {}", d.name,
                     d.gpus_per_node);
  check_analytic_options(d.analytic, fmt::format("device '{}'", d.name), "analytic.");
}

void check_analytic_options(const AnalyticOptions& o, const std::string& where, const std::string& prefix) {
  for (const auto& f : kAnalyticFields) {
    const double v = o.*f.member;
    const std::string problem = analytic_field_problem(f.name, v);
    PACKPIPE_CHECK_ARG(problem.empty(), "{}: '{}{}' must be {}, found {}", where, prefix, f.name, problem, v);
  }
}

}  // namespace packpipe::costmodel
