// `packpipe costmodel show|query`: the model and device a cost model describes, and one query.
// `validate` and `import` are added by add_costmodel_profile_commands.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "common/errors.h"
#include "costmodel/cost_model.h"
#include "costmodel/factory.h"
#include "costmodel/flops.h"
#include "costmodel/model.h"
#include "costmodel/stage_ops.h"

namespace packpipe::cli {

namespace cm = packpipe::costmodel;

namespace {

void print_json(const Json& j) { std::printf("%s\n", j.dump(2).c_str()); }

Json model_json(const cm::ModelSpec& m) {
  Json j;
  j["name"] = m.name;
  j["arch"] = cm::architecture_name(m.arch);
  if (m.arch == cm::Architecture::DecoderOnly) {
    j["num_layers"] = m.num_layers;
  } else {
    j["encoder_layers"] = m.encoder_layers;
    j["decoder_layers"] = m.decoder_layers;
  }
  j["hidden"] = m.hidden;
  j["heads"] = m.heads;
  j["kv_heads"] = m.kv_heads;
  j["head_dim"] = m.head_dim;
  j["ffn_hidden"] = m.ffn_hidden;
  j["gated_mlp"] = m.gated_mlp;
  j["vocab"] = m.vocab;
  j["bytes_per_param"] = m.bytes_per_param;
  if (m.attention) j["attention"] = cm::attention_kernel_name(*m.attention);
  if (!m.activation_dtype.empty()) j["dtype"] = m.activation_dtype;
  j["layer_params"] = m.layer_params(false);
  if (m.arch == cm::Architecture::EncoderDecoder) j["decoder_layer_params"] = m.layer_params(true);
  j["total_params"] = m.total_params();
  return j;
}

Json device_json(const cm::DeviceSpec& d) {
  Json analytic;
  for (const auto& f : cm::kAnalyticFields) analytic[f.name] = d.analytic.*f.member;
  analytic[cm::kAnalyticTpCommunication] = d.analytic.tp_communication;
  return Json{{"name", d.name},
              {"peak_tflops", d.peak_tflops},
              {"memory_gb", d.memory_gb},
              {"hbm_gbps", d.hbm_gbps},
              {"intra_node_gbps", d.intra_node_gbps},
              {"intra_node_latency_us", d.intra_node_latency_us},
              {"inter_node_gbps", d.inter_node_gbps},
              {"inter_node_latency_us", d.inter_node_latency_us},
              {"gpus_per_node", d.gpus_per_node},
              {"attention", cm::attention_kernel_name(d.attention)},
              {"analytic", std::move(analytic)}};
}

struct QueryOptions {
  std::string model = "gpt-6.7b";
  std::string device = "A100-40GB";
  std::vector<std::string> profiles;
  std::string calibration;
  std::string interpolation = "fit";
  std::string kind = "encoder";
  std::string recompute = "none";
  std::int64_t tp = 1;
  std::int64_t mbs = 1;
  std::int64_t seq = 0;
  std::int64_t enc_seq = 0;
  std::int64_t dec_seq = 0;
  std::vector<std::int64_t> segments, dec_segments;  ///< a packed varlen row of these samples
  std::string attention;  ///< --attention: eager, flash; empty: the model's, else the device's
  std::vector<std::int64_t> prefix;  ///< per segment: tokens of its sample before it (a slice's kept keys)
  std::int64_t layers = 1;
  std::int64_t dp = 1;
  int zero = 0;
  bool json = false;
};

Json run_query(const QueryOptions& o) {
  PACKPIPE_CHECK_ARG(o.seq == 0 || o.enc_seq == 0 || o.seq == o.enc_seq,
                     "--seq ({}) and --enc-seq ({}) disagree; give one of them", o.seq, o.enc_seq);
  cm::CostModelConfig config;
  config.model = o.model;
  config.device = o.device;
  config.profiles = o.profiles;
  config.calibration = o.calibration;
  config.attention = o.attention;
  config.interpolation = cm::profile_interpolation_from_name(o.interpolation);
  const auto model = cm::make_cost_model(config);
  const cm::ModelSpec& m = model->model();
  cm::Query q;
  q.kind = cm::layer_kind_from_name(o.kind);
  q.num_layers = o.layers;
  q.tp = o.tp;
  q.mbs = o.mbs;
  q.seq = o.seq != 0 ? o.seq : o.enc_seq;
  q.dec_seq = o.dec_seq;
  q.recompute = cm::recompute_from_name(o.recompute);
  if (!o.segments.empty() || !o.dec_segments.empty()) {
    // One row of these samples back to back under varlen attention (layout packed).
    PACKPIPE_CHECK_ARG(o.seq == 0 && o.enc_seq == 0 && o.dec_seq == 0 && o.mbs == 1,
                       "--segments (--dec-segments) describe the whole packed row: leave out --seq, --enc-seq, --dec-seq "
                       "and --mbs");
    const cm::Query p = cm::packed_query(m, o.segments, o.dec_segments, "--segments", o.prefix);
    q.seq = p.seq;
    q.dec_seq = p.dec_seq;
    q.attention = p.attention;
  }
  PACKPIPE_CHECK_ARG(o.prefix.empty() || !o.segments.empty(),
                     "--prefix needs --segments (the slices' lengths, one prefix each)");
  const bool needs_seq = !(m.arch == cm::Architecture::EncoderDecoder && q.kind == cm::LayerKind::PostProcess);
  PACKPIPE_CHECK_ARG(!needs_seq || q.seq > 0, "--seq (or --enc-seq) must be a positive length, found {}", q.seq);
  const cm::LayerCost c = model->query(q);

  cm::StageLayout layout;
  if (q.kind == cm::LayerKind::Encoder) layout.encoder_layers = q.num_layers;
  if (q.kind == cm::LayerKind::Decoder) layout.decoder_layers = q.num_layers;
  layout.has_embedding = q.kind == cm::LayerKind::Embedding;
  layout.has_postprocess = q.kind == cm::LayerKind::PostProcess;
  const cm::StaticMemory sm = cm::stage_static_memory(m, layout, q.tp, o.dp, o.zero);

  Json j;
  j["model"] = m.name;
  j["device"] = model->device().name;
  j["cost_model"] = model->describe();
  j["attention_kernel"] = cm::attention_kernel_name(model->attention());
  j["query"] = Json{{"kind", cm::layer_kind_name(q.kind)}, {"layers", q.num_layers}, {"tp", q.tp},
                    {"mbs", q.mbs},                        {"seq", q.seq},          {"dec_seq", q.dec_seq},
                    {"recompute", cm::recompute_name(q.recompute)},
                    {"layout", q.attention.varlen() ? "packed" : "padded"}};
  if (q.attention.varlen()) {
    j["query"]["attention"] = Json{{"self", q.attention.self}, {"dec_self", q.attention.dec_self},
                                   {"cross", q.attention.cross}, {"prefix", q.attention.prefix},
                                   {"prefix_tokens", q.attention.prefix_tokens}};
  }
  j["forward_ms"] = c.forward_ms;
  j["backward_ms"] = c.backward_ms;
  j["recompute_ms"] = c.recompute_ms;
  j["total_ms"] = c.total_ms();
  j["stored_bytes"] = c.stored_bytes;
  j["peak_bytes"] = c.peak_bytes;
  j["boundary_bytes"] = c.boundary_bytes;
  j["boundary_p2p_ms"] = c.boundary_bytes > 0 ? model->comm().p2p_ms(c.boundary_bytes) : 0.0;
  if (model->calibration() != nullptr) {  // the calibrated op times of the queried layers as one stage
    const cm::StageOpTimes t = cm::stage_op_times(*model, c, layout, cm::MicroShape{q.mbs, q.seq, q.dec_seq, q.attention});
    j["calibrated"] = Json{{"forward_ms", t.forward_ms},
                           {"backward_ms", t.backward_ms},
                           {"backward_input_ms", t.backward_input_ms},
                           {"backward_weight_ms", t.backward_weight_ms}};
  }
  j["time_source"] = cm::provenance_name(c.time_source);
  j["memory_source"] = cm::provenance_name(c.memory_source);
  j["static"] = Json{{"dp", o.dp},
                     {"zero", o.zero},
                     {"params_bytes", sm.params_bytes},
                     {"grads_bytes", sm.grads_bytes},
                     {"optimizer_bytes", sm.optimizer_bytes},
                     {"total_bytes", sm.total()}};
  return j;
}

void print_query(const Json& j) {
  const Json& q = j["query"];
  std::printf("%s on %s: %s\n", j["model"].get<std::string>().c_str(), j["device"].get<std::string>().c_str(),
              j["cost_model"].get<std::string>().c_str());
  std::string layout = q.value("layout", std::string("padded"));
  if (q.contains("attention")) {
    const Json& a = q["attention"];
    layout += fmt::format(" (varlen attention: sum l^2 {}", a["self"].get<std::int64_t>());
    if (a["dec_self"].get<std::int64_t>() > 0) {
      layout += fmt::format(", sum d^2 {}, sum d l {}", a["dec_self"].get<std::int64_t>(), a["cross"].get<std::int64_t>());
    }
    if (a.value("prefix_tokens", std::int64_t{0}) > 0) {
      layout += fmt::format(", slices keeping {} prefix tokens, sum l p {}", a["prefix_tokens"].get<std::int64_t>(),
                            a["prefix"].get<std::int64_t>());
    }
    layout += ")";
  }
  layout += fmt::format(", {} attention", j.value("attention_kernel", std::string("eager")));
  std::printf("  query       %lld x %s, tp %lld, mbs %lld, seq %lld%s, recompute %s, %s\n",
              static_cast<long long>(q["layers"].get<std::int64_t>()), q["kind"].get<std::string>().c_str(),
              static_cast<long long>(q["tp"].get<std::int64_t>()), static_cast<long long>(q["mbs"].get<std::int64_t>()),
              static_cast<long long>(q["seq"].get<std::int64_t>()),
              q["dec_seq"].get<std::int64_t>() > 0 ? fmt::format(" / dec {}", q["dec_seq"].get<std::int64_t>()).c_str() : "",
              q["recompute"].get<std::string>().c_str(), layout.c_str());
  std::printf("  time        forward %.3f ms, backward %.3f ms, recompute %.3f ms, total %.3f ms (%s)\n",
              j["forward_ms"].get<double>(), j["backward_ms"].get<double>(), j["recompute_ms"].get<double>(),
              j["total_ms"].get<double>(), j["time_source"].get<std::string>().c_str());
  if (j.contains("calibrated")) {
    const Json& t = j["calibrated"];
    std::printf("  calibrated  forward %.3f ms, backward %.3f ms (recompute included; input %.3f ms, weight %.3f ms)\n",
                t["forward_ms"].get<double>(), t["backward_ms"].get<double>(), t["backward_input_ms"].get<double>(),
                t["backward_weight_ms"].get<double>());
  }
  auto mb = [](const Json& v) { return human_bytes(static_cast<std::uint64_t>(v.get<double>())); };
  std::printf("  activations stored %s, transient peak %s (%s)\n", mb(j["stored_bytes"]).c_str(),
              mb(j["peak_bytes"]).c_str(), j["memory_source"].get<std::string>().c_str());
  std::printf("  boundary    %s to the next stage (%.3f ms point-to-point in a node)\n", mb(j["boundary_bytes"]).c_str(),
              j["boundary_p2p_ms"].get<double>());
  const Json& s = j["static"];
  std::printf("  static      params %s, grads %s, optimizer %s, total %s (dp %lld, ZeRO %d)\n",
              mb(s["params_bytes"]).c_str(), mb(s["grads_bytes"]).c_str(), mb(s["optimizer_bytes"]).c_str(),
              mb(s["total_bytes"]).c_str(), static_cast<long long>(s["dp"].get<std::int64_t>()), s["zero"].get<int>());
}

Json show_json(const cm::CostModelConfig& config) {
  const auto model = cm::make_cost_model(config);
  Json j;
  j["model"] = model_json(model->model());
  j["device"] = device_json(model->device());
  j["cost_model"] = model->describe();
  j["attention_kernel"] = cm::attention_kernel_name(model->attention());
  const cm::CommModel& c = model->comm();
  j["comm"] = Json{{"intra_latency_ms", c.intra_latency_ms},
                   {"intra_bytes_per_ms", c.intra_bytes_per_ms},
                   {"inter_latency_ms", c.inter_latency_ms},
                   {"inter_bytes_per_ms", c.inter_bytes_per_ms}};
  j["model_presets"] = cm::model_preset_names();
  j["device_presets"] = cm::device_preset_names();
  return j;
}

void print_show(const Json& j) {
  const Json& m = j["model"];
  const Json& d = j["device"];
  std::printf("model   %s (%s): ", m["name"].get<std::string>().c_str(), m["arch"].get<std::string>().c_str());
  if (m.contains("num_layers")) {
    std::printf("%lld layers", static_cast<long long>(m["num_layers"].get<std::int64_t>()));
  } else {
    std::printf("%lld encoder + %lld decoder layers", static_cast<long long>(m["encoder_layers"].get<std::int64_t>()),
                static_cast<long long>(m["decoder_layers"].get<std::int64_t>()));
  }
  std::printf(", hidden %lld, heads %lld (kv %lld, dim %lld), ffn %lld%s, vocab %lld, %.3fB params\n",
              static_cast<long long>(m["hidden"].get<std::int64_t>()), static_cast<long long>(m["heads"].get<std::int64_t>()),
              static_cast<long long>(m["kv_heads"].get<std::int64_t>()),
              static_cast<long long>(m["head_dim"].get<std::int64_t>()),
              static_cast<long long>(m["ffn_hidden"].get<std::int64_t>()), m["gated_mlp"].get<bool>() ? " gated" : "",
              static_cast<long long>(m["vocab"].get<std::int64_t>()),
              static_cast<double>(m["total_params"].get<std::int64_t>()) / 1e9);
  std::printf("device  %s: %.0f TFLOP/s, %.0f GB at %.0f GB/s; links %.1f GB/s in a node, %.1f GB/s across, %lld GPUs/node\n",
              d["name"].get<std::string>().c_str(), d["peak_tflops"].get<double>(), d["memory_gb"].get<double>(),
              d["hbm_gbps"].get<double>(), d["intra_node_gbps"].get<double>(), d["inter_node_gbps"].get<double>(),
              static_cast<long long>(d["gpus_per_node"].get<std::int64_t>()));
  std::printf("cost    %s\n", j["cost_model"].get<std::string>().c_str());
  std::printf("kernel  %s attention\n", j.value("attention_kernel", std::string("eager")).c_str());
  auto join = [](const Json& a) {
    std::string s;
    for (const auto& x : a) s += (s.empty() ? "" : ", ") + x.get<std::string>();
    return s;
  };
  std::printf("presets models: %s\n        devices: %s\n", join(j["model_presets"]).c_str(),
              join(j["device_presets"]).c_str());
}

}  // namespace

void register_costmodel_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand("costmodel", "Time and memory of pipeline stages: analytic or from profiles");
  cmd->require_subcommand(1);

  // show
  {
    auto* sub = cmd->add_subcommand("show", "The model, device and communication figures a cost model uses");
    auto config = std::make_shared<cm::CostModelConfig>();
    auto json = std::make_shared<bool>(false);
    sub->add_option("--model", config->model, "Model preset or .json file (default gpt-6.7b)")->check(model_check());
    sub->add_option("--device", config->device, "Device preset or .json file (default A100-40GB)")->check(device_check());
    sub->add_option("--profile", config->profiles, "Profile file or folder (repeatable); none: the analytic model");
    sub->add_option("--calibration", config->calibration,
                    "Calibration file (`packpipe costmodel calibrate`) applied over the cost model");
    sub->add_option("--attention", config->attention, "The attention kernel: " + enum_name_list(cm::kAttentionKernelNames) +
                        " (default: the model file's, else the device's: flash on the GPU presets)")
        ->check(one_of(cm::kAttentionKernelNames));
    sub->add_flag("--json", *json, "Print one JSON object");
    sub->callback([=] {
      const Json j = show_json(*config);
      if (*json) return print_json(j);
      print_show(j);
    });
  }

  // query
  {
    auto* sub = cmd->add_subcommand("query", "Time and memory of layers for one micro-batch shape");
    auto o = std::make_shared<QueryOptions>();
    sub->add_option("--model", o->model, "Model preset or .json file (default gpt-6.7b)")->check(model_check());
    sub->add_option("--device", o->device, "Device preset or .json file (default A100-40GB)")->check(device_check());
    sub->add_option("--profile", o->profiles, "Profile file or folder (repeatable); none: the analytic model");
    sub->add_option("--calibration", o->calibration,
                    "Calibration file (`packpipe costmodel calibrate`) applied over the cost model");
    sub->add_option("--profile-interpolation", o->interpolation,
                    "With --profile: " + enum_name_list(cm::kProfileInterpolationNames) +
                        " (fit: packpipe's feature fits; linear: DynaPipe's multilinear rule)")
        ->check(one_of(cm::kProfileInterpolationNames));
    sub->add_option("--attention", o->attention, "The attention kernel: " + enum_name_list(cm::kAttentionKernelNames) +
                        " (default: the model file's, else the device's: flash on the GPU presets)")
        ->check(one_of(cm::kAttentionKernelNames));
    sub->add_option("--kind", o->kind, "Layer kind: " + enum_name_list(cm::kLayerKindNames) + " (default encoder)");
    sub->add_option("--layers", o->layers, "Number of consecutive layers (default 1)");
    sub->add_option("--tp", o->tp, "Tensor-parallel degree (default 1)");
    sub->add_option("--mbs", o->mbs, "Micro-batch size in samples (default 1)");
    sub->add_option("--seq", o->seq, "Sequence length (padded tokens per sample)");
    sub->add_option("--enc-seq", o->enc_seq, "Encoder length (encoder-decoder models; same as --seq)");
    sub->add_option("--dec-seq", o->dec_seq, "Decoder length (encoder-decoder models)");
    sub->add_option("--segments", o->segments,
                    "A packed row (layout packed, varlen attention): the lengths of its samples, e.g. --segments 900 "
                    "40 7; replaces --mbs and --seq")
        ->delimiter(',');
    sub->add_option("--prefix", o->prefix,
                    "With --segments: per segment, the tokens of its sample before it that it attends to (a slice's "
                    "kept keys and values; 0 for a whole sample), e.g. --segments 4096 --prefix 28672")
        ->delimiter(',');
    sub->add_option("--dec-segments", o->dec_segments,
                    "Decoder lengths of the packed row's samples (encoder-decoder models, with --segments)")
        ->delimiter(',');
    sub->add_option("--recompute", o->recompute,
                    "Activation recompute: " + enum_name_list(cm::kRecomputeNames) + " (default none)");
    sub->add_option("--dp", o->dp, "Data-parallel size for the static memory (default 1)");
    sub->add_option("--zero", o->zero, "ZeRO stage 0-3 for the static memory (default 0)");
    sub->add_flag("--json", o->json, "Print one JSON object");
    sub->callback([o] {
      const Json j = run_query(*o);
      if (o->json) return print_json(j);
      print_query(j);
    });
  }

  add_costmodel_profile_commands(*cmd);
  add_costmodel_calibration_commands(*cmd);
}

}  // namespace packpipe::cli
