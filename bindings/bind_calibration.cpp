// Python bindings of cost-model calibration: measured op times (Measurement, IterationMeasurement,
// MeasurementSet and their JSON Lines file), FitOptions, Calibration (fit, file form, statistics),
// CalibratedCostModel and cost_model_fingerprint. Thin lambdas; every check lives in C++.
#include <memory>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "common/file_io.h"
#include "costmodel/calibration.h"
#include "costmodel/measurements.h"

namespace py = pybind11;
namespace cm = packpipe::costmodel;

namespace packpipe::bindings {

namespace {

using MeasurementClass = py::class_<cm::Measurement>;
using IterationClass = py::class_<cm::IterationMeasurement>;
using SetClass = py::class_<cm::MeasurementSet>;
using OptionsClass = py::class_<cm::FitOptions>;
using CalibrationClass = py::class_<cm::Calibration, std::shared_ptr<cm::Calibration>>;
using CalibratedClass = py::class_<cm::CalibratedCostModel, cm::CostModel, std::shared_ptr<cm::CalibratedCostModel>>;

cm::MeasuredOp op_from_name(const std::string& name) { return cm::measured_op_from_name(name); }
cm::Recompute recompute_from(const std::string& name) { return cm::recompute_from_name(name); }

// Part `key` of the calibration's file form as Python objects (the statistics of every fit).
py::object file_part(const cm::Calibration& c, const char* key) {
  const py::object form = py::module_::import("json").attr("loads")(c.to_json());
  return form[key];
}

// A layout field of a measurement as a read/write property.
template <typename T>
void def_layout(MeasurementClass& cls, const char* name, T cm::StageLayout::*f, const char* doc) {
  cls.def_property(
      name, [f](const cm::Measurement& m) { return m.layout.*f; },
      [f, name](cm::Measurement& m, const py::handle& v) {
        if constexpr (std::is_same_v<T, bool>) {
          m.layout.*f = bool_arg(v, name);
        } else {
          m.layout.*f = count_arg<T>(v, name);
        }
      },
      doc);
}

const std::vector<const char*> kMeasurementFields = {
    "op",   "encoder_layers", "decoder_layers", "embedding", "postprocess", "tp",    "rows",
    "seq",  "dec_seq",        "recompute",      "bytes",     "ms",          "iteration", "replica",
    "rank", "stage",          "mb",             "index",     "start_ms",    "peer"};

void define_measurement(py::module_& m) {
  auto cls = py::reinterpret_borrow<MeasurementClass>(m.attr("Measurement"));
  cls.def(py::init([](const std::string& op, const py::kwargs& kwargs) {
            cm::Measurement x;
            x.op = cm::measured_op_from_name(op);
            py::object self = py::cast(x);
            for (const auto& [k, v] : kwargs) self.attr(k) = v;  // each field's own setter checks it
            return self.cast<cm::Measurement>();
          }),
          py::arg("op") = "F",
          "One measured op: Measurement(op, encoder_layers=, decoder_layers=, embedding=, postprocess=, tp=, rows=, "
          "seq=, dec_seq=, recompute=, bytes=, ms=, iteration=, replica=, rank=, stage=, mb=, index=, start_ms=, "
          "peer=); fields not given keep their defaults");
  def_named(cls, "op", &cm::Measurement::op, &cm::measured_op_name, &op_from_name,
            "F, B, I, W (compute ops) or send, recv (one end of a transfer)");
  def_layout(cls, "encoder_layers", &cm::StageLayout::encoder_layers, "encoder (decoder-only: all) layers of the stage");
  def_layout(cls, "decoder_layers", &cm::StageLayout::decoder_layers, "decoder layers of the stage (encoder-decoder)");
  def_layout(cls, "embedding", &cm::StageLayout::has_embedding, "the stage holds the token embedding");
  def_layout(cls, "postprocess", &cm::StageLayout::has_postprocess, "the stage holds the LM head and the loss");
  def_field(cls, "tp", &cm::Measurement::tp, "tensor-parallel size");
  def_field(cls, "rows", &cm::Measurement::rows, "micro-batch rows");
  def_field(cls, "seq", &cm::Measurement::seq, "padded tokens per row (encoder side of encoder-decoder models)");
  def_field(cls, "dec_seq", &cm::Measurement::dec_seq, "padded decoder tokens per row, else 0");
  def_named(cls, "recompute", &cm::Measurement::recompute, &cm::recompute_name, &recompute_from,
            "none, selective or full");
  def_field(cls, "bytes", &cm::Measurement::bytes, "transfers: bytes moved; compute ops: 0");
  def_field(cls, "ms", &cm::Measurement::ms, "measured duration");
  def_field(cls, "iteration", &cm::Measurement::iteration, "iteration");
  def_field(cls, "replica", &cm::Measurement::replica, "data-parallel replica");
  def_field(cls, "rank", &cm::Measurement::rank, "pipeline rank");
  def_field(cls, "stage", &cm::Measurement::stage, "virtual stage of the instruction");
  def_field(cls, "mb", &cm::Measurement::mb, "micro-batch");
  def_field(cls, "index", &cm::Measurement::index, "instruction index in its rank's stream");
  def_field(cls, "start_ms", &cm::Measurement::start_ms, "start, ms after the iteration's first instruction started");
  cls.def_property(
      "peer", [](const cm::Measurement& x) { return x.peer; },
      [](cm::Measurement& x, const py::object& v) { x.peer = int_of<std::int64_t>(v, "peer"); },
      "transfers: the other rank; compute ops: -1");
  cls.def_property_readonly("tokens", &cm::Measurement::tokens, "rows x (seq + dec_seq)");
  def_value(cls, kMeasurementFields);

  auto it = py::reinterpret_borrow<IterationClass>(m.attr("IterationMeasurement"));
  it.def(py::init([](const py::object& iteration, const py::object& replica, double measured_ms, double predicted_ms,
                      const std::string& schedule) {
           cm::IterationMeasurement x;
           x.iteration = count_arg<std::uint64_t>(iteration, "iteration");
           x.replica = count_arg<std::uint32_t>(replica, "replica");
           x.measured_ms = measured_ms;
           x.predicted_ms = predicted_ms;
           PACKPIPE_CHECK_ARG(schedule.empty() || enum_find(kScheduleKindNames, schedule) != nullptr,
                              "IterationMeasurement: schedule must be '' (unknown) or one of {}, found '{}'",
                              enum_name_list(kScheduleKindNames), schedule);
           x.schedule = schedule;
           return x;
         }),
         py::kw_only(), py::arg("iteration") = 0, py::arg("replica") = 0, py::arg("measured_ms") = 0.0,
         py::arg("predicted_ms") = 0.0, py::arg("schedule") = "",
         "One iteration of one replica: measured makespan beside the planned one, and the plan's schedule kind ('': "
         "unknown)");
  def_field(it, "iteration", &cm::IterationMeasurement::iteration, "iteration");
  def_field(it, "replica", &cm::IterationMeasurement::replica, "data-parallel replica");
  def_field(it, "measured_ms", &cm::IterationMeasurement::measured_ms, "first start to last end over its ranks");
  def_field(it, "predicted_ms", &cm::IterationMeasurement::predicted_ms, "the plan's makespan (0: unknown)");
  it.def_property_readonly("schedule", [](const cm::IterationMeasurement& x) { return x.schedule; },
                           "the plan's schedule kind ('': unknown)");
  def_value(it, {"iteration", "replica", "measured_ms", "predicted_ms", "schedule"});

  auto set = py::reinterpret_borrow<SetClass>(m.attr("MeasurementSet"));
  set.def(py::init([](const std::vector<cm::Measurement>& ops, const std::vector<cm::IterationMeasurement>& iterations,
                      const std::string& model, const std::string& device, const std::string& source) {
            cm::MeasurementSet s;
            s.ops = ops;
            s.iterations = iterations;
            s.header = {model, device, source};
            return s;
          }),
          py::arg("ops") = std::vector<cm::Measurement>{}, py::arg("iterations") = std::vector<cm::IterationMeasurement>{},
          py::kw_only(), py::arg("model") = "", py::arg("device") = "", py::arg("source") = "",
          "Measurements of executed iterations (one or more files' worth)");
  set.def_readwrite("ops", &cm::MeasurementSet::ops, "the op measurements (a copy: assign to change)")
      .def_readwrite("iterations", &cm::MeasurementSet::iterations, "the iteration lines (a copy: assign to change)")
      .def_property(
          "model", [](const cm::MeasurementSet& s) { return s.header.model; },
          [](cm::MeasurementSet& s, const std::string& v) { s.header.model = v; }, "the model the plans were made for")
      .def_property(
          "device", [](const cm::MeasurementSet& s) { return s.header.device; },
          [](cm::MeasurementSet& s, const std::string& v) { s.header.device = v; }, "where they ran")
      .def_property(
          "source", [](const cm::MeasurementSet& s) { return s.header.source; },
          [](cm::MeasurementSet& s, const std::string& v) { s.header.source = v; }, "how they were measured")
      .def("append", &cm::MeasurementSet::append, py::arg("other"),
           "Appends other's ops and iterations (the header stays this one's)")
      .def("to_jsonl", &cm::measurements_to_jsonl, "The file form (packpipe-measurements v1 JSON Lines)")
      .def("__len__", [](const cm::MeasurementSet& s) { return s.ops.size(); })
      .def(py::pickle([](const cm::MeasurementSet& s) { return cm::measurements_to_jsonl(s); },
                      [](const std::string& text) { return cm::parse_measurements(text, "<pickled measurements>"); }));
  def_repr(set, {"ops", "iterations", "model", "device", "source"});

  m.def("parse_measurements", &cm::parse_measurements, py::arg("text"), py::arg("what") = "<measurements>",
        "Parses packpipe-measurements v1 JSON Lines read from `what`; errors name it, the line and the field");
  m.def("read_measurements", &cm::read_measurements, py::arg("path"), "Reads a measurement file");
  m.def(
      "write_measurements",
      [](const py::object& path_obj, const cm::MeasurementSet& measurements, const py::object& inputs) {
        const std::string path = path_arg(path_obj, "path");
        check_output_is_not_input(path, paths_arg(inputs, "inputs"), "write_measurements path");
        cm::write_measurements(path, measurements);
      },
      py::arg("path"), py::arg("measurements"), py::kw_only(), py::arg("inputs") = py::tuple(),
      "Writes a measurement file (str or os.PathLike) atomically; ValueError when `path` is one of `inputs` (the "
      "files the job reads, such as the measurements it appends to: same inode through links and relative paths)");
}

void define_fit_options(py::module_& m) {
  auto cls = py::reinterpret_borrow<OptionsClass>(m.attr("FitOptions"));
  cls.def(py::init([](const py::object& min_region_points, double outlier_mads, const py::object& max_iterations,
                      const BoolArg& regions, double transfer_quantile) {
            cm::FitOptions o;
            o.min_region_points = count_arg<std::int64_t>(min_region_points, "min_region_points");
            o.outlier_mads = outlier_mads;
            o.max_iterations = count_arg<int>(max_iterations, "max_iterations");
            o.regions = bool_of(regions, "regions");
            o.transfer_quantile = transfer_quantile;
            cm::check_fit_options(o);
            return o;
          }),
          py::kw_only(), py::arg("min_region_points") = cm::FitOptions{}.min_region_points,
          py::arg("outlier_mads") = cm::FitOptions{}.outlier_mads,
          py::arg("max_iterations") = cm::FitOptions{}.max_iterations, py::arg("regions") = cm::FitOptions{}.regions,
          py::arg("transfer_quantile") = cm::FitOptions{}.transfer_quantile,
          "How fit_calibration fits (the CLI's calibrate flags); a value out of range raises ValueError");
  def_field(cls, "min_region_points", &cm::FitOptions::min_region_points,
            "a log2(tokens) region with fewer points takes its op kind's global fit", &cm::check_fit_options);
  def_field(cls, "outlier_mads", &cm::FitOptions::outlier_mads,
            "points beyond this many robust deviations (1.4826 MAD) of the median residual are rejected",
            &cm::check_fit_options);
  def_field(cls, "max_iterations", &cm::FitOptions::max_iterations, "fit / reject rounds at most",
            &cm::check_fit_options);
  def_field(cls, "regions", &cm::FitOptions::regions, "fit per log2(tokens) region (False: one fit per op kind)",
            &cm::check_fit_options);
  def_field(cls, "transfer_quantile", &cm::FitOptions::transfer_quantile,
            "quantile of one transfer size's measured times taken as its time", &cm::check_fit_options);
  def_value(cls, {"min_region_points", "outlier_mads", "max_iterations", "regions", "transfer_quantile"});
}

// The ops of a MeasurementSet or of a sequence of Measurement objects.
std::vector<cm::Measurement> ops_arg(const py::object& measurements) {
  if (py::isinstance<cm::MeasurementSet>(measurements)) return measurements.cast<const cm::MeasurementSet&>().ops;
  // (a sequence of Measurement; anything else named, not pybind11's cast error)
  std::vector<cm::Measurement> out;
  if (py::isinstance<py::sequence>(measurements) && !py::isinstance<py::str>(measurements)) {
    std::size_t k = 0;
    for (const py::handle x : measurements) {
      if (!py::isinstance<cm::Measurement>(x)) {
        throw py::type_error(fmt::format("measurements[{}]: expected a Measurement, found {}", k,
                                         std::string(py::str(py::type::of(x).attr("__name__")))));
      }
      out.push_back(x.cast<cm::Measurement>());
      ++k;
    }
    return out;
  }
  throw py::type_error(fmt::format("measurements: expected a MeasurementSet or a sequence of Measurement, found {}",
                                   std::string(py::str(py::type::of(measurements).attr("__name__")))));
}

void define_calibration_class(py::module_& m) {
  auto cls = py::reinterpret_borrow<CalibrationClass>(m.attr("Calibration"));
  cls.def_static("from_json", &cm::Calibration::from_json, py::arg("text"), py::arg("what") = "<calibration>",
                 "Parses the file form read from `what` (e.g. bytes rank 0 broadcast); errors name it and the field")
      .def_static("load", &cm::Calibration::load, py::arg("path"), "Reads a calibration file")
      .def("save", &cm::Calibration::save, py::arg("path"), "Writes the file form atomically")
      .def("to_json", &cm::Calibration::to_json, "The file form (deterministic: same fit, same bytes)")
      .def(
          "apply",
          [](const cm::Calibration& c, const std::string& op, double tokens, double predicted_ms, double share) {
            PACKPIPE_CHECK_ARG(share >= 0 && share <= 1, "Calibration.apply: share must be in [0, 1], found {}", share);
            return c.apply(cm::measured_op_from_name(op), tokens, predicted_ms, share);
          },
          py::arg("op"), py::arg("tokens"), py::arg("predicted_ms"), py::arg("share") = 0.0,
          "Calibrated time of compute op F, B, I or W predicted `predicted_ms` by the base model at `tokens`, the "
          "stage's attention share of forward FLOPs being `share` (the op's attention_gamma reweights it)")
      .def_property_readonly("base", [](const cm::Calibration& c) { return file_part(c, "base"); },
                             "what it was fitted over: model, device, description, fingerprint")
      .def_property_readonly("options", [](const cm::Calibration& c) { return c.options; }, "the FitOptions used")
      .def_readonly("measurements", &cm::Calibration::measurements, "measurements it was fitted on")
      .def_readonly("source", &cm::Calibration::source, "the file it was loaded from ('' otherwise)")
      .def_property_readonly("compute", [](const cm::Calibration& c) { return file_part(c, "compute"); },
                             "per op kind F, B, I, W: fitted, from, attention_gamma, global fit and regions (a, b, points, rejected, "
                             "error_before, error_after, ...)")
      .def_property_readonly("transfers", [](const cm::Calibration& c) { return file_part(c, "transfers"); },
                             "per link (intra, inter): fitted, latency_ms, bytes_per_ms, points, sizes, errors")
      .def_property_readonly("schedules", [](const cm::Calibration& c) { return file_part(c, "schedules"); },
                             "fitted schedule kinds: schedule, factor (measured / simulated makespan), iterations, "
                             "spread")
      .def(
          "schedule_factor", [](const cm::Calibration& c, const std::string& schedule) {
            return c.schedule_factor(schedule_kind_from_name(schedule));
          },
          py::arg("schedule"),
          "The factor the planner multiplies a schedule kind's simulated makespan by (a kind not fitted: the largest "
          "fitted one; 1 without any)");
  def_repr(cls, {"measurements", "source"});

  auto cal = py::reinterpret_borrow<CalibratedClass>(m.attr("CalibratedCostModel"));
  cal.def(py::init([](const std::shared_ptr<cm::CostModel>& base, const cm::Calibration& calibration) {
            return std::make_shared<cm::CalibratedCostModel>(base, calibration);
          }),
          py::arg("base"), py::arg("calibration"),
          "`base` with `calibration` applied; ValueError when it was fitted over another model (naming both)")
      .def_property_readonly("base", [](const cm::CalibratedCostModel& c) {
        return std::const_pointer_cast<cm::CostModel>(c.base_ptr());
      }, "the uncalibrated model");

  m.def("fit_calibration",
        [](const cm::CostModel& cost_model, const py::object& measurements, const cm::FitOptions& options) {
          const std::vector<cm::Measurement> ops = ops_arg(measurements);
          py::gil_scoped_release release;
          return cm::fit_calibration(cost_model, ops, options);
        },
        py::arg("cost_model"), py::arg("measurements"), py::arg("options") = cm::FitOptions{},
        "Fits a Calibration of an uncalibrated cost model to a MeasurementSet or a list of Measurement (any order: "
        "the same bits)");
  m.def("predict_ms", &cm::predict_ms, py::arg("cost_model"), py::arg("measurement"),
        "The cost model's time of a measurement's op and shape (calibrated when the model is)");
  m.def("cost_model_fingerprint", &cm::cost_model_fingerprint, py::arg("cost_model"),
        "16 hex digits identifying an uncalibrated cost model (what a calibration is checked against)");
}

}  // namespace

void declare_calibration(py::module_& m) {
  MeasurementClass(m, "Measurement", "One measured op: shape, duration and provenance");
  IterationClass(m, "IterationMeasurement", "One measured iteration of one replica");
  SetClass(m, "MeasurementSet", "Measurements of executed iterations: header, ops and iteration lines");
  OptionsClass(m, "FitOptions", "How fit_calibration fits");
  CalibrationClass(m, "Calibration", "A fitted calibration of a cost model (data; a JSON file)");
  CalibratedClass(m, "CalibratedCostModel", "A cost model with a calibration applied to its op times and transfers");
}

void define_calibration(py::module_& m) {
  define_measurement(m);
  define_fit_options(m);
  define_calibration_class(m);
}

}  // namespace packpipe::bindings
