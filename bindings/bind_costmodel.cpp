// Python bindings of the cost model: packpipe.CostModel (analytic, or from profiles), its query
// result, stage composition, static memory, communication and the throughput report. Thin
// lambdas; every check lives in C++.
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "costmodel/calibration.h"
#include "costmodel/cost_model.h"
#include "costmodel/factory.h"
#include "costmodel/flops.h"
#include "common/file_io.h"
#include "costmodel/model.h"
#include "costmodel/profile_readers.h"
#include "costmodel/profiled.h"
#include "costmodel/report.h"

namespace py = pybind11;
namespace cm = packpipe::costmodel;

namespace packpipe::bindings {

namespace {

cm::Query make_query(const std::string& kind, std::int64_t mbs, std::int64_t seq, std::int64_t dec_seq,
                     std::int64_t tp, const std::string& recompute, std::int64_t layers) {
  cm::Query q;
  q.kind = cm::layer_kind_from_name(kind);
  q.mbs = mbs;
  q.seq = seq;
  q.dec_seq = dec_seq;
  q.tp = tp;
  q.recompute = cm::recompute_from_name(recompute);
  q.num_layers = layers;
  return q;
}

py::dict model_dict(const cm::ModelSpec& m) {
  py::dict d;
  d["name"] = m.name;
  d["arch"] = cm::architecture_name(m.arch);
  d["num_layers"] = m.num_layers;
  d["encoder_layers"] = m.encoder_layers;
  d["decoder_layers"] = m.decoder_layers;
  d["hidden"] = m.hidden;
  d["heads"] = m.heads;
  d["kv_heads"] = m.kv_heads;
  d["head_dim"] = m.head_dim;
  d["ffn_hidden"] = m.ffn_hidden;
  d["gated_mlp"] = m.gated_mlp;
  d["vocab"] = m.vocab;
  d["bytes_per_param"] = m.bytes_per_param;
  d["dtype"] = m.activation_dtype.empty() ? py::object(py::none()) : py::object(py::str(m.activation_dtype));
  d["attention"] = m.attention ? py::object(py::str(cm::attention_kernel_name(*m.attention))) : py::object(py::none());
  d["total_params"] = m.total_params();
  return d;
}

// A profile point from a Python tuple in the file's point_columns order; None is "not measured".
cm::ProfilePoint point_from(const py::handle& h, std::size_t k) {
  static constexpr const char* kFields[] = {"kind", "tp", "rc", "variant", "mbs", "seq", "dec_seq",
                                            "fwd_ms", "bwd_ms", "stored_bytes", "peak_bytes"};
  PACKPIPE_CHECK_ARG(py::isinstance<py::tuple>(h) || py::isinstance<py::list>(h),
                     "points[{}]: expected a tuple (kind, tp, rc, variant, mbs, seq, dec_seq, fwd_ms, bwd_ms, "
                     "stored_bytes, peak_bytes), found {}", k, std::string(py::repr(h)));
  const py::sequence t = py::reinterpret_borrow<py::sequence>(h);
  PACKPIPE_CHECK_ARG(py::len(t) == 11, "points[{}]: expected 11 values (kind, tp, rc, variant, mbs, seq, dec_seq, "
                     "fwd_ms, bwd_ms, stored_bytes, peak_bytes), found {}", k, py::len(t));
  // Each value cast on its own, so a wrong type names its point and field.
  auto as = [&](std::size_t i, auto type) {
    using T = decltype(type);
    try {
      return t[i].cast<T>();
    } catch (const py::cast_error&) {
      PACKPIPE_THROW(::packpipe::InvalidArgument, "points[{}] {}: expected {}, found {}", k, kFields[i],
                     std::is_same_v<T, std::string> ? "a name" : std::is_floating_point_v<T> ? "a number or None"
                                                                                             : "an integer",
                     std::string(py::repr(t[i])));
    }
  };
  // A measured figure is a finite number; None is "not measured" (NaN would pass for it silently).
  auto num = [&](std::size_t i) {
    if (t[i].is_none()) return cm::kNotMeasured;
    const double v = as(i, double{});
    PACKPIPE_CHECK_ARG(std::isfinite(v), "points[{}] {} must be finite (None: not measured), found {}", k,
                       kFields[i], v);
    return v;
  };
  cm::ProfilePoint p;
  p.kind = cm::layer_kind_from_name(as(0, std::string{}));
  p.tp = as(1, std::int64_t{});
  p.rc = cm::recompute_from_name(as(2, std::string{}));
  p.variant = as(3, std::int64_t{});
  p.mbs = as(4, std::int64_t{});
  p.seq = as(5, std::int64_t{});
  p.dec_seq = as(6, std::int64_t{});
  p.fwd_ms = num(7);
  p.bwd_ms = num(8);
  p.stored_bytes = num(9);
  p.peak_bytes = num(10);
  return p;
}

py::dict loo_dict(const cm::LooErrors& e) {
  return py::module_::import("json").attr("loads")(cm::loo_errors_json(e)).cast<py::dict>();
}

py::dict device_dict(const cm::DeviceSpec& v) {
  py::dict d;
  d["name"] = v.name;
  d["peak_tflops"] = v.peak_tflops;
  d["memory_gb"] = v.memory_gb;
  d["hbm_gbps"] = v.hbm_gbps;
  d["intra_node_gbps"] = v.intra_node_gbps;
  d["intra_node_latency_us"] = v.intra_node_latency_us;
  d["inter_node_gbps"] = v.inter_node_gbps;
  d["inter_node_latency_us"] = v.inter_node_latency_us;
  d["gpus_per_node"] = v.gpus_per_node;
  d["attention"] = cm::attention_kernel_name(v.attention);
  py::dict analytic;
  for (const auto& f : cm::kAnalyticFields) analytic[f.name] = v.analytic.*f.member;
  analytic[cm::kAnalyticTpCommunication] = v.analytic.tp_communication;
  d["analytic"] = analytic;
  return d;
}

}  // namespace

void declare_costmodel(py::module_& m) {
  py::class_<cm::LayerCost>(m, "LayerCost", "Time (ms) and memory (bytes) of a cost-model query");
  py::class_<cm::StaticMemory>(m, "StaticMemory", "Parameters, gradients and optimizer state on one GPU (bytes)");
  py::class_<cm::CostModel, std::shared_ptr<cm::CostModel>>(m, "CostModel",
                                                              "Cost model: analytic, or from profiles when given");
}

void define_costmodel(py::module_& m) {
  py::reinterpret_borrow<py::class_<cm::LayerCost>>(m.attr("LayerCost"))
      .def_readonly("forward_ms", &cm::LayerCost::forward_ms)
      .def_readonly("backward_ms", &cm::LayerCost::backward_ms, "excludes recompute")
      .def_readonly("recompute_ms", &cm::LayerCost::recompute_ms)
      .def_readonly("stored_bytes", &cm::LayerCost::stored_bytes)
      .def_readonly("peak_bytes", &cm::LayerCost::peak_bytes, "transient, on top of stored")
      .def_readonly("boundary_bytes", &cm::LayerCost::boundary_bytes)
      .def_property_readonly("total_ms", &cm::LayerCost::total_ms)
      .def_property_readonly("time_source", [](const cm::LayerCost& c) { return cm::provenance_name(c.time_source); })
      .def_property_readonly("memory_source",
                             [](const cm::LayerCost& c) { return cm::provenance_name(c.memory_source); })
      .def("to_dict",
           [](const cm::LayerCost& c) {
             py::dict d;
             d["forward_ms"] = c.forward_ms;
             d["backward_ms"] = c.backward_ms;
             d["recompute_ms"] = c.recompute_ms;
             d["total_ms"] = c.total_ms();
             d["stored_bytes"] = c.stored_bytes;
             d["peak_bytes"] = c.peak_bytes;
             d["boundary_bytes"] = c.boundary_bytes;
             d["time_source"] = cm::provenance_name(c.time_source);
             d["memory_source"] = cm::provenance_name(c.memory_source);
             return d;
           })
      .def("__repr__", [](const cm::LayerCost& c) {
        return "LayerCost(forward_ms=" + std::to_string(c.forward_ms) + ", backward_ms=" + std::to_string(c.backward_ms) +
               ", recompute_ms=" + std::to_string(c.recompute_ms) + ", stored_bytes=" + std::to_string(c.stored_bytes) +
               ", time_source=" + cm::provenance_name(c.time_source) + ")";
      });

  py::reinterpret_borrow<py::class_<cm::StaticMemory>>(m.attr("StaticMemory"))
      .def_readonly("params_bytes", &cm::StaticMemory::params_bytes)
      .def_readonly("grads_bytes", &cm::StaticMemory::grads_bytes)
      .def_readonly("optimizer_bytes", &cm::StaticMemory::optimizer_bytes)
      .def_property_readonly("total_bytes", &cm::StaticMemory::total);

  auto cost = py::reinterpret_borrow<py::class_<cm::CostModel, std::shared_ptr<cm::CostModel>>>(m.attr("CostModel"));
  cost.def(py::init([](const std::string& model, const std::string& device, const std::vector<std::string>& profiles,
                       const std::string& calibration, const std::string& interpolation, const py::object& attention) {
             cm::CostModelConfig config{model, device, profiles, calibration};
             config.interpolation = cm::profile_interpolation_from_name(interpolation);
             if (!attention.is_none()) {
               PACKPIPE_CHECK_ARG(py::isinstance<py::str>(attention),
                                  "CostModel: attention must be None or one of {}, found {}",
                                  enum_name_list(cm::kAttentionKernelNames), py::repr(attention).cast<std::string>());
               config.attention = attention.cast<std::string>();
               cm::attention_kernel_from_name(config.attention);  // names the kernels for an unknown one
             }
             py::gil_scoped_release release;
             return std::shared_ptr<cm::CostModel>(cm::make_cost_model(config));
           }),
           py::arg("model") = "gpt-6.7b", py::arg("device") = "A100-40GB",
           py::arg("profiles") = std::vector<std::string>{}, py::arg("calibration") = "", py::kw_only(),
           py::arg("interpolation") = "fit", py::arg("attention") = py::none(),
           "Model and device presets or .json files; profiles (files or folders) select the profiled model, "
           "interpolated by packpipe's fits ('fit') or DynaPipe's multilinear rule ('linear'); calibration (a "
           "file of `packpipe costmodel calibrate`) is applied over it; attention the kernel the trainer runs "
           "('eager' or 'flash'; None: the model file's, else the device's: flash on the GPU presets)")
      .def_property_readonly(
          "attention", [](const cm::CostModel& c) { return std::string(cm::attention_kernel_name(c.attention())); },
          "The attention kernel the costs are for: 'flash' (no stored scores) or 'eager'")
      .def_property_readonly(
          "calibration",
          [](const cm::CostModel& self) -> py::object {
            const cm::Calibration* c = self.calibration();
            return c == nullptr ? py::object(py::none()) : py::cast(std::make_shared<cm::Calibration>(*c));
          },
          "The Calibration applied (a copy), or None");
  def_ints(cost,
          "query",
          [](const cm::CostModel& self, const std::string& kind, std::int64_t mbs, std::int64_t seq,
             std::int64_t dec_seq, std::int64_t tp, const std::string& recompute, std::int64_t layers,
             const py::object& segments, const py::object& dec_segments, const py::object& prefix) {
            cm::Query q = make_query(kind, mbs, seq, dec_seq, tp, recompute, layers);
            PACKPIPE_CHECK_ARG(prefix.is_none() || !segments.is_none(),
                               "prefix (the slices' kept tokens, one per segment) needs segments");
            if (!segments.is_none() || !dec_segments.is_none()) {
              PACKPIPE_CHECK_ARG(mbs == 1 && seq == 0 && dec_seq == 0,
                                 "segments (dec_segments) describe the whole packed row: leave out mbs, seq and "
                                 "dec_seq");
              const auto lim = std::numeric_limits<std::int64_t>::max();
              const cm::Query p = cm::packed_query(
                  self.model(), segments.is_none() ? std::vector<std::int64_t>{} : int_list_arg(segments, "segments", 0, lim),
                  dec_segments.is_none() ? std::vector<std::int64_t>{} : int_list_arg(dec_segments, "dec_segments", 0, lim),
                  "segments", prefix.is_none() ? std::vector<std::int64_t>{} : int_list_arg(prefix, "prefix", 0, lim));
              q.seq = p.seq;
              q.dec_seq = p.dec_seq;
              q.attention = p.attention;
            }
            return self.query(q);
          },
          py::arg("kind") = "encoder", py::arg("mbs") = 1, py::arg("seq") = 0, py::arg("dec_seq") = 0,
          py::arg("tp") = 1, py::arg("recompute") = "none", py::arg("layers") = 1, py::arg("segments") = py::none(),
          py::arg("dec_segments") = py::none(), py::arg("prefix") = py::none(),
          "Time and memory of `layers` layers of `kind` for one micro-batch of `mbs` samples padded to `seq` "
          "tokens, or (segments=[l1, l2, ...], dec_segments for encoder-decoder models) for one packed row of those "
          "samples under varlen attention; prefix=[p1, p2, ...] makes them slices that attend to p kept tokens of "
          "their sample before them");
  def_ints(cost,
          "stage_cost",
          [](const cm::CostModel& self, std::int64_t encoder_layers, std::int64_t decoder_layers, bool has_embedding,
             bool has_postprocess, std::int64_t mbs, std::int64_t seq, std::int64_t dec_seq, std::int64_t tp,
             const std::string& recompute) {
            return cm::stage_cost(self, cm::StageLayout{encoder_layers, decoder_layers, has_embedding, has_postprocess},
                                  tp, mbs, seq, dec_seq, cm::recompute_from_name(recompute));
          },
          py::arg("encoder_layers") = 0, py::arg("decoder_layers") = 0, py::arg("has_embedding") = false,
          py::arg("has_postprocess") = false, py::arg("mbs") = 1, py::arg("seq") = 0, py::arg("dec_seq") = 0,
          py::arg("tp") = 1, py::arg("recompute") = "none",
          "One micro-batch on a stage holding these layers (embedding and LM head included where flagged)");
  def_ints(cost,
          "stage_static_memory",
          [](const cm::CostModel& self, std::int64_t encoder_layers, std::int64_t decoder_layers, bool has_embedding,
             bool has_postprocess, std::int64_t tp, std::int64_t dp, int zero) {
            return cm::stage_static_memory(self.model(),
                                           cm::StageLayout{encoder_layers, decoder_layers, has_embedding, has_postprocess},
                                           tp, dp, zero);
          },
          py::arg("encoder_layers") = 0, py::arg("decoder_layers") = 0, py::arg("has_embedding") = false,
          py::arg("has_postprocess") = false, py::arg("tp") = 1, py::arg("dp") = 1, py::arg("zero") = 0);
  def_ints(cost,
          "p2p_ms", [](const cm::CostModel& self, double bytes, bool inter_node) { return self.comm().p2p_ms(bytes, inter_node); },
          py::arg("bytes"), py::arg("inter_node") = false);
  def_ints(cost,
          "all_reduce_ms",
          [](const cm::CostModel& self, double bytes, std::int64_t n, bool inter_node) {
            return self.comm().all_reduce_ms(bytes, n, inter_node);
          },
          py::arg("bytes"), py::arg("n"), py::arg("inter_node") = false);
  def_ints(cost,
          "all_gather_ms",
          [](const cm::CostModel& self, double bytes, std::int64_t n, bool inter_node) {
            return self.comm().all_gather_ms(bytes, n, inter_node);
          },
          py::arg("bytes"), py::arg("n"), py::arg("inter_node") = false);
  def_ints(cost,
          "reduce_scatter_ms",
          [](const cm::CostModel& self, double bytes, std::int64_t n, bool inter_node) {
            return self.comm().reduce_scatter_ms(bytes, n, inter_node);
          },
          py::arg("bytes"), py::arg("n"), py::arg("inter_node") = false);
  cost.def_property_readonly("model", [](const cm::CostModel& self) { return model_dict(self.model()); })
      .def_property_readonly("device", [](const cm::CostModel& self) { return device_dict(self.device()); })
      .def("describe", &cm::CostModel::describe)
      .def("__repr__", [](const cm::CostModel& self) { return "CostModel(" + self.describe() + ")"; });

  def_ints(m, "static_memory", &cm::static_memory, py::arg("params"), py::arg("dp") = 1, py::arg("zero") = 0,
        "Mixed-precision Adam state of `params` parameters on one GPU under data parallelism and ZeRO");
  m.def(
      "write_profile",
      [](const py::object& path_obj, const py::list& points, const std::string& model, const std::string& device,
         const std::vector<std::string>& notes, const std::vector<std::string>& sources, const std::string& attention,
         const py::object& inputs) {
        const std::string path = path_arg(path_obj, "path");
        check_output_is_not_input(path, paths_arg(inputs, "inputs"), "write_profile path");
        cm::Profile p;
        if (!attention.empty()) p.attention = cm::attention_kernel_from_name(attention);
        p.model = model;
        p.device = device;
        p.notes = notes;
        p.sources = sources;
        for (std::size_t k = 0; k < points.size(); ++k) p.points.push_back(point_from(points[k], k));
        const std::string text = cm::write_packpipe_profile(p);
        cm::parse_profile(text, path);  // what the readers accept, checked before anything is written
        write_file_atomic(path, text);
      },
      py::arg("path"), py::arg("points"), py::arg("model") = "", py::arg("device") = "",
      py::arg("notes") = std::vector<std::string>{}, py::arg("sources") = std::vector<std::string>{},
      py::arg("attention") = "", py::kw_only(), py::arg("inputs") = py::tuple(),
      "Writes packpipe's profile file (str or os.PathLike, atomically; ValueError when it is one of `inputs`, the "
      "files the job reads, by inode): points are tuples (kind, tp, rc, variant, mbs, seq, dec_seq, "
      "fwd_ms, bwd_ms, stored_bytes, peak_bytes), times per layer in ms, memory in bytes, None = not measured; "
      "attention the kernel they were measured with ('eager' or 'flash'; empty: eager)");
  m.def(
      "read_profile",
      [](const std::vector<std::string>& paths) {
        const cm::Profile p = cm::load_profiles(paths);
        py::list points;
        auto opt = [](double v) { return std::isnan(v) ? py::object(py::none()) : py::object(py::float_(v)); };
        for (const auto& x : p.points) {
          points.append(py::make_tuple(cm::layer_kind_name(x.kind), x.tp, cm::recompute_name(x.rc), x.variant, x.mbs,
                                       x.seq, x.dec_seq, opt(x.fwd_ms), opt(x.bwd_ms), opt(x.stored_bytes),
                                       opt(x.peak_bytes)));
        }
        py::dict d;
        d["model"] = p.model;
        d["device"] = p.device;
        d["points"] = points;
        d["notes"] = p.notes;
        d["sources"] = p.sources;
        d["attention"] = cm::attention_kernel_name(p.kernel());
        return d;
      },
      py::arg("paths"),
      "Profiles in any format packpipe reads (files or folders), merged: model, device, points (tuples as in "
      "write_profile), notes, sources");
  m.def(
      "profile_leave_one_out",
      [](const std::vector<std::string>& paths, const std::string& model) {
        const cm::LooReport r = cm::leave_one_out(cm::load_profiles(paths), cm::load_model(model));
        py::dict d = loo_dict(r.all);
        py::list parts;
        for (const auto& b : r.by_stage_rc) {
          py::dict x = loo_dict(b.errors);
          x["kind"] = cm::layer_kind_name(b.kind);
          x["recompute"] = cm::recompute_name(b.rc);
          parts.append(x);
        }
        d["by_kind"] = parts;
        return d;
      },
      py::arg("paths"), py::arg("model"),
      "Leave-one-out errors (MAPE, percent) of the profiled model on the profiles' own grid points");
  m.def("model_presets", &cm::model_preset_names);
  m.def("device_presets", &cm::device_preset_names);
  def_ints(m,
      "bigscience_params", [](const std::string& model, std::int64_t seq) { return cm::bigscience_params(cm::load_model(model), seq); },
      py::arg("model"), py::arg("seq"), "P = l (12 h^2 + 13 h) + V h + s h + 2 h");
  def_ints(m, "bigscience_tflops_per_gpu", &cm::bigscience_tflops_per_gpu, py::arg("params"), py::arg("seq"),
        py::arg("global_batch"), py::arg("iteration_s"), py::arg("gpus"), py::arg("factor") = 4,
        "P * factor * 2 * s * GBS / (T * N * 1e12); factor 4 with full recompute, 3 without");
  def_ints(m,
      "training_flops",
      [](const std::string& model, std::int64_t mbs, std::int64_t seq, std::int64_t dec_seq) {
        return cm::training_flops(cm::load_model(model), mbs, seq, dec_seq);
      },
      py::arg("model"), py::arg("mbs"), py::arg("seq"), py::arg("dec_seq") = 0,
      "Model FLOPs (3 x forward) of one dense micro-batch of mbs rows x seq tokens; for packed or sliced "
      "micro-batches (a slice's attention reaches its kept prefix) use the planner's model_flops "
      "(IterationResult.model_flops), which counts each sample once, whole");
  def_ints(m,
      "throughput_report",
      [](double model_flops, double samples, double tokens, double iteration_s, std::int64_t gpus,
         const std::string& device) {
        const cm::ThroughputReport r =
            cm::throughput_report(model_flops, samples, tokens, iteration_s, gpus, cm::load_device(device));
        py::dict d;
        d["iteration_s"] = r.iteration_s;
        d["samples_per_s"] = r.samples_per_s;
        d["tokens_per_s"] = r.tokens_per_s;
        d["tflops_per_gpu"] = r.tflops_per_gpu;
        d["mfu"] = r.mfu;
        return d;
      },
      py::arg("model_flops"), py::arg("samples"), py::arg("tokens"), py::arg("iteration_s"), py::arg("gpus"),
      py::arg("device"), "Tokens per second, TFLOPs per GPU and MFU of an iteration");
}

}  // namespace packpipe::bindings
