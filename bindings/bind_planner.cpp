// Python binding of the planning job for one global batch: packpipe.plan_batch(...).
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

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

py::dict figures_dict(const planner::MethodFigures& f) {
  py::dict d;
  d["feasible"] = f.feasible;
  d["microbatches"] = f.microbatches;
  d["efficiency"] = f.efficiency;
  d["iteration_ms"] = f.iteration_ms;
  d["peak_mb"] = f.peak_mb;
  d["schedule"] = f.schedule;
  d["why"] = f.why;
  return d;
}

py::list grid_list(const planner::BaselineGrid& g) {
  py::list out;
  for (std::size_t i = 0; i < g.mbs.size(); ++i) {
    py::dict d = figures_dict(g.figures[i]);
    d["mbs"] = g.mbs[i];
    out.append(d);
  }
  return out;
}

}  // namespace

void declare_planner(py::module_&) {}

void define_planner(py::module_& m) {
  m.def(
      "plan_batch",
      [](const std::shared_ptr<cm::CostModel>& cost, const py::object& input_lengths, const py::object& target_lengths,
         std::int64_t stages, std::int64_t layers_per_stage, std::int64_t chunks, std::int64_t dp, std::int64_t tp,
         int zero_stage, double memory_mb, const std::string& method, const std::string& schedule,
         const std::string& recompute, std::int64_t round_multiple, const py::object& seed,
         const py::object& iteration, bool validate, bool baselines, const std::vector<std::int64_t>& baseline_mbs,
         const std::shared_ptr<PyPartitionCache>& cache, const std::string& oversize) {
        PACKPIPE_CHECK_ARG(cost != nullptr, "cost_model must not be None");
        part::BatchLengths b;
        b.input = lengths_arg(input_lengths, "input_lengths");
        b.target = lengths_arg(target_lengths, "target_lengths");
        PACKPIPE_CHECK_ARG(b.target.empty() || b.target.size() == b.input.size(),
                           "target_lengths has {} entries but input_lengths has {}", b.target.size(), b.input.size());
        planner::PlannerOptions o;
        o.shape.stages = stages;
        o.shape.layers_per_stage = layers_per_stage;
        o.shape.chunks = chunks;
        o.shape.dp = dp;
        o.shape.tp = tp;
        o.shape.zero_stage = zero_stage;
        o.shape.memory_limit_mb = memory_mb;
        o.partition.method = part::partition_method_from_name(method);
        o.partition.recompute = part::recompute_policy_from_name(recompute);
        o.partition.round_multiple = round_multiple;
        o.partition.oversize = part::oversize_policy_from_name(oversize);
        o.schedule = schedule;
        o.search.seed = unsigned_arg(seed, "seed", std::numeric_limits<std::uint64_t>::max());
        const std::uint64_t iter = unsigned_arg(iteration, "iteration", std::numeric_limits<std::uint64_t>::max());
        o.validate = validate;
        o.baselines = baselines;
        o.baseline_mbs = baseline_mbs;
        planner::check_planner_options(o);  // ValueError naming the argument before anything is planned
        const PyPartitionCache::Use use(cache.get(), cost);
        planner::IterationResult r;
        {
          py::gil_scoped_release release;
          const auto vstages = part::virtual_stages(cost->model(), o.shape);
          r = planner::plan_iteration(b, nullptr, iter, *cost, vstages, o, use.get());
        }
        py::dict d;
        py::list plans;
        for (auto& p : r.plans) plans.append(std::make_shared<pl::Plan>(std::move(p)));
        d["plans"] = plans;
        d["packpipe"] = figures_dict(r.packpipe);
        if (baselines) {
          d["fixed"] = grid_list(r.fixed);
          d["packing"] = grid_list(r.packing);
        }
        d["iteration"] = r.iteration;
        d["samples"] = r.samples;
        d["tokens"] = r.tokens;
        d["truncated"] = r.truncated;
        d["dropped"] = r.dropped;
        d["model_flops"] = r.model_flops;
        d["partition_ms"] = r.partition_ms;
        d["schedule_ms"] = r.schedule_ms;
        d["build_ms"] = r.build_ms;
        d["planning_ms"] = r.planning_ms;
        return d;
      },
      py::arg("cost_model"), py::arg("input_lengths"), py::arg("target_lengths") = py::none(), py::kw_only(),
      py::arg("stages") = 4, py::arg("layers_per_stage") = 0, py::arg("chunks") = 1, py::arg("dp") = 1,
      py::arg("tp") = 1, py::arg("zero_stage") = 1, py::arg("memory_mb") = 0.0, py::arg("method") = "dp",
      py::arg("schedule") = "search", py::arg("recompute") = "auto", py::arg("round_multiple") = 8,
      py::arg("seed") = py::int_(1234), py::arg("iteration") = py::int_(0), py::arg("validate") = false,
      py::arg("baselines") = false, py::arg("baseline_mbs") = std::vector<std::int64_t>{1, 2, 4, 8, 16, 32, 64},
      py::arg("cache") = nullptr, py::arg("oversize") = "error",
      "Plan one global batch: micro-batches, schedule search and per-rank instruction streams. Returns a dict with "
      "'plans' (one packpipe.Plan per data-parallel replica), the figures of packpipe's plan and, with "
      "baselines=True, of the fixed and packing baselines for every micro-batch size of baseline_mbs. cache: a "
      "packpipe.PartitionCache kept across iterations (shape costs), or None. oversize: a sample that cannot fit "
      "even alone is an error ('error', the default, naming it), 'truncate'd or 'drop'ped; 'truncated' and "
      "'dropped' count them and 'samples' / 'tokens' are what is trained. Sizes out of range raise ValueError "
      "naming the argument.");
}

}  // namespace packpipe::bindings
