// Python bindings of planner/measure.h: measurements of an executed plan from the executor's
// per-instruction times (measurements_from), and a cost model against measurements
// (validate_measurements, ValidationReport, validation_plot_json). Thin lambdas; checks live in C++.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "common/errors.h"
#include "planner/measure.h"

namespace py = pybind11;
namespace cm = packpipe::costmodel;
namespace pl = packpipe::plan;

namespace packpipe::bindings {

namespace {

using ReportClass = py::class_<planner::ValidationReport>;
using OpErrorsClass = py::class_<planner::OpErrors>;
using CheckClass = py::class_<planner::IterationCheck>;

// One rank's (start_ns, end_ns) pairs from an integer array of shape (n, 2) (RankRecord.times) or a
// sequence of pairs; None or an empty sequence: not recorded.
std::vector<std::pair<std::int64_t, std::int64_t>> rank_times(const py::handle& obj, std::size_t r) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  if (obj.is_none() || py::len(obj) == 0) return out;
  const py::array a = py::array::ensure(obj);
  PACKPIPE_CHECK_ARG(a && a.ndim() == 2 && a.shape(1) == 2 && (a.dtype().kind() == 'i' || a.dtype().kind() == 'u'),
                     "times[{}]: expected (start_ns, end_ns) integer pairs, an array of shape (n, 2) as "
                     "RankRecord.times; found {}", r, std::string(py::repr(obj)).substr(0, 80));
  if (a.dtype().kind() == 'u') {  // unsigned values above INT64_MAX would wrap to negative times
    const auto w = a.cast<py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>>().unchecked<2>();
    for (py::ssize_t i = 0; i < w.shape(0); ++i) {
      for (py::ssize_t k = 0; k < 2; ++k) {
        PACKPIPE_CHECK_ARG(w(i, k) <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                           "times[{}][{}]: {} ns does not fit a signed 64-bit time", r, i, w(i, k));
      }
    }
  }
  const auto v = a.cast<py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>>();
  const auto u = v.unchecked<2>();
  out.reserve(static_cast<std::size_t>(u.shape(0)));
  for (py::ssize_t i = 0; i < u.shape(0); ++i) out.emplace_back(u(i, 0), u(i, 1));
  return out;
}

}  // namespace

void declare_measure(py::module_& m) {
  ReportClass(m, "ValidationReport", "A cost model against measurements: per-op and per-iteration errors");
  OpErrorsClass(m, "OpErrors", "Errors of one op kind: relative error = (predicted - measured) / measured");
  CheckClass(m, "IterationCheck", "One measured iteration of one replica re-simulated with the cost model");
}

void define_measure(py::module_& m) {
  auto e = py::reinterpret_borrow<OpErrorsClass>(m.attr("OpErrors"));
  e.def_property_readonly("op", [](const planner::OpErrors& x) { return cm::measured_op_name(x.op); }, "F, B, I, W, "
                                                                                                   "send or recv")
      .def_readonly("count", &planner::OpErrors::count, "measurements compared")
      .def_readonly("median_abs", &planner::OpErrors::median_abs, "median |relative error|")
      .def_readonly("p90_abs", &planner::OpErrors::p90_abs, "90th percentile of |relative error|")
      .def_readonly("bias", &planner::OpErrors::bias, "median relative error (positive: predicted too long)");
  def_repr(e, {"op", "count", "median_abs", "p90_abs", "bias"});

  auto c = py::reinterpret_borrow<CheckClass>(m.attr("IterationCheck"));
  c.def_readonly("iteration", &planner::IterationCheck::iteration, "iteration")
      .def_readonly("replica", &planner::IterationCheck::replica, "replica")
      .def_readonly("ops", &planner::IterationCheck::ops, "compute ops re-simulated")
      .def_readonly("predicted_ms", &planner::IterationCheck::predicted_ms, "makespan of the measured order")
      .def_readonly("measured_ms", &planner::IterationCheck::measured_ms, "measured makespan (nan: unknown)")
      .def_readonly("planned_ms", &planner::IterationCheck::planned_ms, "the plan's makespan (nan: unknown)")
      .def_readonly("schedule", &planner::IterationCheck::schedule, "the plan's schedule kind ('': unknown)");
  def_repr(c, {"iteration", "replica", "ops", "predicted_ms", "measured_ms", "planned_ms"});

  auto r = py::reinterpret_borrow<ReportClass>(m.attr("ValidationReport"));
  r.def_readonly("cost_model", &planner::ValidationReport::cost_model, "the model's description")
      .def_readonly("ops", &planner::ValidationReport::ops, "OpErrors per op kind measured")
      .def_readonly("iterations", &planner::ValidationReport::iterations, "IterationCheck per (iteration, replica)")
      .def_readonly("iterations_compared", &planner::ValidationReport::iterations_compared,
                    "iterations with a measured makespan")
      .def_readonly("iteration_median_abs", &planner::ValidationReport::iteration_median_abs,
                    "median |relative error| of their makespans")
      .def_readonly("iteration_p90_abs", &planner::ValidationReport::iteration_p90_abs, "90th percentile of it")
      .def_readonly("iteration_bias", &planner::ValidationReport::iteration_bias, "median relative error")
      .def_readonly("predicted_ms", &planner::ValidationReport::predicted_ms, "prediction of every measurement");
  def_repr(r, {"cost_model", "ops", "iterations", "iterations_compared", "iteration_median_abs"});

  m.def(
      "measurements_from",
      [](const pl::Plan& plan, const py::sequence& times, const py::object& tp, const py::object& iteration) {
        planner::InstructionTimes t;
        for (std::size_t k = 0; k < py::len(times); ++k) t.push_back(rank_times(times[k], k));
        planner::MeasureOptions o;
        o.tp = count_arg<std::int64_t>(tp, "tp");
        if (!iteration.is_none()) o.iteration = count_arg<std::int64_t>(iteration, "iteration");
        py::gil_scoped_release release;
        const planner::PlanMeasurements pm = planner::measurements_from(plan, t, o);
        cm::MeasurementSet set;
        set.ops = pm.ops;
        if (pm.has_iteration) set.iterations.push_back(pm.iteration);
        return set;
      },
      py::arg("plan"), py::arg("times"), py::arg("tp") = 1, py::arg("iteration") = py::none(),
      "Measurements of an executed plan: `times` per rank (start_ns, end_ns) per instruction on one clock, "
      "RankRecord.times arrays or lists of pairs (None or []: not recorded); the iteration line needs every rank. "
      "`iteration`: the number they carry (None: the plan's), so that steps of several epochs or loaders stay "
      "apart");
  m.def(
      "validate_measurements",
      [](const cm::CostModel& cost_model, const cm::MeasurementSet& measurements) {
        py::gil_scoped_release release;
        return planner::validate_measurements(cost_model, measurements);
      },
      py::arg("cost_model"), py::arg("measurements"),
      "The cost model's op times against every measurement, and each measured iteration re-simulated");
  m.def(
      "fit_schedule_factors",
      [](const std::shared_ptr<cm::CostModel>& base, const cm::Calibration& calibration,
         const cm::MeasurementSet& measurements) {
        py::gil_scoped_release release;
        return planner::fit_schedule_factors(base, calibration, measurements);
      },
      py::arg("base"), py::arg("calibration"), py::arg("measurements"),
      "`calibration` (fitted over the uncalibrated `base`) with its schedule factors fitted: per schedule kind named "
      "by at least 3 iteration lines, the median of measured / re-simulated makespan");
  m.def("validation_plot_json", &planner::validation_plot_json, py::arg("report"), py::arg("measurements"),
        "Predicted and measured pairs as JSON for a plot (packpipe-validation-plot v1)");
}

}  // namespace packpipe::bindings
