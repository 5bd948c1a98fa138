// Python bindings of the planner: packpipe.plan_batch(cost_model, input_lengths, ...) plans one global
// batch; results are bound classes (IterationResult, MethodFigures, BaselineGrid) whose plans are
// packpipe.Plan objects.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/arrays.h"
#include "bindings/bind.h"
#include "common/errors.h"
#include "planner/planner.h"

namespace py = pybind11;

namespace packpipe::bindings {

namespace {

namespace cm = packpipe::costmodel;
namespace part = packpipe::partition;
namespace pl = packpipe::plan;

/// An IterationResult whose plans are shared with Python (packpipe.Plan objects, never copied).
struct PyIterationResult {
  planner::IterationResult result;  ///< plans moved out into `plans`
  std::vector<std::shared_ptr<pl::Plan>> plans;
  explicit PyIterationResult(planner::IterationResult&& r) : result(std::move(r)) {
    for (auto& p : result.plans) plans.push_back(std::make_shared<pl::Plan>(std::move(p)));
    result.plans.clear();
  }
};

using FiguresClass = py::class_<planner::MethodFigures>;
using GridClass = py::class_<planner::BaselineGrid>;
using ResultClass = py::class_<PyIterationResult, std::shared_ptr<PyIterationResult>>;

const std::vector<std::int64_t> kBaselineMbs = planner::PlannerOptions{}.baseline_mbs;

/// The options of plan_batch() as the library takes them.
planner::PlannerOptions planner_options(const part::PipelineShape& shape, const part::PartitionOptions& options,
                                        const std::string& schedule, const py::object& seed, bool validate,
                                        bool baselines, const std::vector<std::int64_t>& baseline_mbs) {
  planner::PlannerOptions o;
  o.shape = shape;
  o.partition = options;
  o.schedule = schedule;
  o.search.seed = count_arg<std::uint64_t>(seed, "seed");
  o.validate = validate;
  o.baselines = baselines;
  o.baseline_mbs = baseline_mbs;
  return o;
}

/// A read-only property returning the member `m` of IterationResult by value.
template <typename T>
auto result_of(T planner::IterationResult::*m) {
  return [m](const PyIterationResult& r) { return r.result.*m; };
}

/// A read-only property viewing the member `m` of IterationResult (kept alive by the result object).
template <typename T>
auto result_view(T planner::IterationResult::*m) {
  return [m](const py::object& self) {
    return py::cast(&(self.cast<const PyIterationResult&>().result.*m), py::return_value_policy::reference_internal,
                    self);
  };
}

void define_results(py::module_& m) {
  auto f = py::reinterpret_borrow<FiguresClass>(m.attr("MethodFigures"));
  f.def_readonly("feasible", &planner::MethodFigures::feasible,
                 "partitioned, and every replica's schedule within memory")
      .def_readonly("microbatches", &planner::MethodFigures::microbatches, "micro-batches (all replicas)")
      .def_readonly("efficiency", &planner::MethodFigures::efficiency, "real tokens / padded tokens")
      .def_readonly("iteration_ms", &planner::MethodFigures::iteration_ms,
                    "simulated iteration time, max over replicas (inf when infeasible)")
      .def_readonly("peak_mb", &planner::MethodFigures::peak_mb,
                    "peak memory per pipeline rank, max over replicas (MB = 1e6 bytes)")
      .def_readonly("schedule", &planner::MethodFigures::schedule, "the schedule used (of replica 0)")
      .def_readonly("why", &planner::MethodFigures::why, "why infeasible ('' when feasible)");
  def_repr(f, {"feasible", "microbatches", "efficiency", "iteration_ms", "schedule", "why"});

  auto g = py::reinterpret_borrow<GridClass>(m.attr("BaselineGrid"));
  g.def_readonly("mbs", &planner::BaselineGrid::mbs, "the micro-batch sizes of the grid")
      .def_property_readonly(
          "figures",
          [](const py::object& self) { return views_of(self.cast<const planner::BaselineGrid&>().figures, self); },
          "MethodFigures for each micro-batch size, in the order of mbs")
      .def("__len__", [](const planner::BaselineGrid& x) { return x.mbs.size(); });
  def_repr(g, {"mbs"});

  auto r = py::reinterpret_borrow<ResultClass>(m.attr("IterationResult"));
  r.def_property_readonly("iteration", result_of(&planner::IterationResult::iteration), "the iteration planned")
      .def_property_readonly("samples", result_of(&planner::IterationResult::samples),
                             "samples trained (dropped ones out)")
      .def_property_readonly("tokens", result_of(&planner::IterationResult::tokens),
                             "real tokens trained (truncated samples at their new length)")
      .def_property_readonly("truncated", result_of(&planner::IterationResult::truncated),
                             "samples the oversize policy truncated")
      .def_property_readonly("dropped", result_of(&planner::IterationResult::dropped),
                             "samples the oversize policy dropped")
      .def_property_readonly("model_flops", result_of(&planner::IterationResult::model_flops),
                             "forward + backward FLOPs of the real samples (no padding, no recompute)")
      .def_property_readonly("partition", result_view(&planner::IterationResult::partition),
                             "packpipe's Partition of the batch (every replica's micro-batches)")
      .def_property_readonly(
          "plans", [](const PyIterationResult& x) { return x.plans; },
          "one packpipe.Plan per data-parallel replica, in replica order")
      .def_property_readonly(
          "schedules",
          [](const py::object& self) { return views_of(self.cast<const PyIterationResult&>().result.schedules, self); },
          "the simulated Schedule of each replica (for traces)")
      .def_property_readonly("packpipe", result_view(&planner::IterationResult::packpipe),
                             "MethodFigures of packpipe's plan")
      .def_property_readonly("fixed", result_view(&planner::IterationResult::fixed),
                             "BaselineGrid: fixed micro-batch size, padded to the longest, 1F1B (empty without "
                             "baselines)")
      .def_property_readonly("packing", result_view(&planner::IterationResult::packing),
                             "BaselineGrid: packed rows, fixed rows per micro-batch, 1F1B (empty without baselines)")
      .def_property_readonly("partition_ms", result_of(&planner::IterationResult::partition_ms),
                             "wall time of packpipe's partition")
      .def_property_readonly("schedule_ms", result_of(&planner::IterationResult::schedule_ms),
                             "wall time of the schedule search (all replicas)")
      .def_property_readonly("build_ms", result_of(&planner::IterationResult::build_ms),
                             "wall time of building (and validating) the plans")
      .def_property_readonly("planning_ms", result_of(&planner::IterationResult::planning_ms),
                             "the three together");
  def_repr(r, {"iteration", "samples", "tokens", "truncated", "dropped", "plans", "planning_ms"});

}

}  // namespace

void declare_planner(py::module_& m) {
  FiguresClass(m, "MethodFigures", "What one method achieves on one global batch (all data-parallel replicas).");
  GridClass(m, "BaselineGrid", "Figures of a baseline for each micro-batch size of the grid.");
  ResultClass(m, "IterationResult", "The plans and figures of one global batch.");
}

void define_planner(py::module_& m) {
  define_results(m);
  const part::PipelineShape four = four_stage_shape();
  m.def(
      "plan_batch",
      [](const std::shared_ptr<cm::CostModel>& cost, const py::object& input_lengths, const py::object& target_lengths,
         const part::PipelineShape& shape, const part::PartitionOptions& options, const std::string& schedule,
         const py::object& seed, const py::object& iteration, bool validate, bool baselines,
         const std::vector<std::int64_t>& baseline_mbs, const std::shared_ptr<PyPartitionCache>& cache) {
        PACKPIPE_CHECK_ARG(cost != nullptr, "cost_model must not be None");
        const part::BatchLengths b = batch_arg(input_lengths, target_lengths);
        const planner::PlannerOptions o =
            planner_options(shape, options, schedule, seed, validate, baselines, baseline_mbs);
        const auto iter = count_arg<std::uint64_t>(iteration, "iteration");
        planner::check_planner_options(o);  // ValueError naming the argument before anything is planned
        const PyPartitionCache::Use use(cache.get(), cost);
        planner::IterationResult r;
        {
          py::gil_scoped_release release;
          const auto vstages = part::virtual_stages(cost->model(), o.shape);
          r = planner::plan_iteration(b, nullptr, iter, *cost, vstages, o, use.get());
        }
        return std::make_shared<PyIterationResult>(std::move(r));
      },
      py::arg("cost_model"), py::arg("input_lengths"), py::arg("target_lengths") = py::none(), py::kw_only(),
      py::arg("shape") = four, py::arg("options") = part::PartitionOptions{}, py::arg("schedule") = "search",
      py::arg("seed") = 1234, py::arg("iteration") = 0, py::arg("validate") = false, py::arg("baselines") = false,
      py::arg("baseline_mbs") = kBaselineMbs, py::arg("cache") = nullptr,
      "Plan one global batch: micro-batches, schedule search and per-rank instruction streams; an "
      "IterationResult with one packpipe.Plan per data-parallel replica, packpipe's figures and, with "
      "baselines=True, those of the fixed and packing baselines for every micro-batch size of baseline_mbs. "
      "schedule: 'search' or one schedule name. cache: a PartitionCache kept across iterations, or None. "
      "Out-of-range sizes and unknown names raise ValueError naming the argument.");
}

}  // namespace packpipe::bindings
