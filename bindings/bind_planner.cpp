// Python bindings of the planner: packpipe.plan_batch(cost_model, input_lengths, ...) plans one global
// batch, packpipe.plan_epoch(cost_model, dataset, ...) every iteration of an epoch (an iterator over
// PlannedIteration, planned ahead in parallel); results are bound classes (IterationResult,
// MethodFigures, BaselineGrid) whose plans are packpipe.Plan objects.
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/arrays.h"
#include "bindings/bind.h"
#include "bindings/bind_planner.h"
#include "common/errors.h"
#include "dataloader/multitask.h"
#include "dataloader/sampler.h"
#include "planner/epoch.h"
#include "planner/loader.h"
#include "planner/planner.h"

namespace py = pybind11;

namespace packpipe::bindings {

namespace {

namespace cm = packpipe::costmodel;
namespace dl = packpipe::dataloader;
namespace part = packpipe::partition;
namespace pl = packpipe::plan;

using FiguresClass = py::class_<planner::MethodFigures>;
using BaselineClass = py::class_<planner::BaselineFigures>;
using ResultClass = py::class_<PyIterationResult, std::shared_ptr<PyIterationResult>>;
using PlannedClass = py::class_<PyPlannedIteration, std::shared_ptr<PyPlannedIteration>>;
using EpochClass = py::class_<PyEpochPlanner, std::shared_ptr<PyEpochPlanner>>;

const std::vector<std::int64_t> kBaselineMbs = planner::PlannerOptions{}.baseline_mbs;

/// What the plans tell a trainer and which schedules it accepts (keywords of plan_batch and plan_epoch).
struct TrainerArgs {
  std::string loss = "all", dtype = "bf16", family = "any";
  bool tied_embedding = false, split_backward = true, fallback = false;
  double min_gain = planner::PlannerOptions{}.min_gain;
  std::string baseline_schedule = "as-run";
  void apply(planner::PlannerOptions& o) const {
    o.min_gain = min_gain;
    o.baseline_schedule = planner::baseline_schedule_from_name(baseline_schedule);
    o.loss_mode = pl::loss_mode_from_name(loss);
    o.dtype = pl::dtype_from_name(dtype);
    o.family = planner::schedule_family_from_name(family);
    o.tied_embedding = tied_embedding;
    o.allow_split_backward = split_backward;
    o.fallback = fallback;
  }
};

/// The activation dtype keyword of plan_batch and plan_epoch: as given, else the cost model's model file's
/// ("dtype"), else bf16.
std::string dtype_arg(const py::object& dtype, const cm::CostModel& cost) {
  if (dtype.is_none()) return cost.model().activation_dtype.empty() ? "bf16" : cost.model().activation_dtype;
  PACKPIPE_CHECK_ARG(py::isinstance<py::str>(dtype),
                     "dtype must be one of fp16, bf16, fp32, fp64, or None (the model file's dtype, else bf16), found {}",
                     std::string(py::repr(dtype)));
  return dtype.cast<std::string>();
}

/// The context length keywords of plan_batch and plan_epoch (max_seq_len, max_target_len, seq_policy).
planner::ContextLength context_args(const py::object& max_seq_len, const py::object& max_target_len,
                                    const std::string& seq_policy) {
  planner::ContextLength c;
  c.max_seq_len = count_arg<std::uint32_t>(max_seq_len, "max_seq_len");
  c.max_target_len = count_arg<std::uint32_t>(max_target_len, "max_target_len");
  c.policy = planner::seq_policy_from_name(seq_policy);
  return c;
}

/// The options of plan_batch() and plan_epoch() as the library takes them.
planner::PlannerOptions planner_options(const part::PipelineShape& shape, const part::PartitionOptions& options,
                                        const std::string& schedule, const py::object& seed, bool validate,
                                        bool baselines, const py::object& baseline_mbs,
                                        const TrainerArgs& trainer, const planner::ContextLength& context) {
  planner::PlannerOptions o;
  trainer.apply(o);
  o.context = context;
  o.shape = shape;
  o.partition = options;
  o.schedule = schedule;
  o.search.seed = count_arg<std::uint64_t>(seed, "seed");
  o.validate = validate;
  o.baselines = baselines;
  // the planner checks the sizes (naming --baseline-mbs too); here only that they are integers
  o.baseline_mbs = int_list_arg(baseline_mbs, "baseline_mbs", std::numeric_limits<std::int64_t>::min(),
                                std::numeric_limits<std::int64_t>::max());
  o.baseline_rows = o.baseline_mbs;  // the packing baselines' rows per micro-batch: the same sizes
  return o;
}

/// Why `obj` is no refs argument: what plan_batch(refs=) takes and what was found.
[[noreturn]] void refuse_refs(const std::string& found) {
  PACKPIPE_THROW(InvalidArgument,
                 "refs must be a structured array with fields task (uint32), index (uint64) and optionally offset "
                 "(uint32), as PlannedIteration.refs, or a sequence of (task, index) pairs or (task, index, offset) "
                 "triples; found {}",
                 found);
}

/// Refs from a 1-D structured array with the fields task (uint32), index (uint64) and optionally
/// offset (uint32) at any offsets (PlannedIteration.refs' dtype, or a packed one), read byte-wise:
/// no cast, no alignment assumed.
std::vector<SampleRef> structured_refs(const py::array& a) {
  const py::dict fields = a.dtype().attr("fields");
  auto has = [&](const char* name, const py::dtype& dt) {
    return fields.contains(name) && fields[name].cast<py::tuple>()[0].cast<py::dtype>().equal(dt);
  };
  const bool with_offset = fields.size() == 3 && has("offset", py::dtype::of<std::uint32_t>());
  const bool ok = (fields.size() == 2 || with_offset) && has("task", py::dtype::of<std::uint32_t>()) &&
                  has("index", py::dtype::of<std::uint64_t>());
  if (!ok) refuse_refs(fmt::format("dtype {}", std::string(py::str(a.dtype()))));
  PACKPIPE_CHECK_ARG(a.ndim() == 1, "refs must be one-dimensional, found {} dimensions", a.ndim());
  auto at = [&](const char* name) { return fields[name].cast<py::tuple>()[1].cast<std::size_t>(); };
  const std::size_t task_at = at("task"), index_at = at("index"), offset_at = with_offset ? at("offset") : 0;
  std::vector<SampleRef> out(static_cast<std::size_t>(a.shape(0)));
  const auto* base = static_cast<const char*>(a.data());
  for (std::size_t k = 0; k < out.size(); ++k) {
    const char* row = base + static_cast<py::ssize_t>(k) * a.strides(0);
    std::memcpy(&out[k].task, row + task_at, sizeof(out[k].task));
    std::memcpy(&out[k].index, row + index_at, sizeof(out[k].index));
    if (with_offset) std::memcpy(&out[k].offset, row + offset_at, sizeof(out[k].offset));
  }
  return out;
}

/// The refs argument of plan_batch: nothing for None; else one SampleRef per sample, from a
/// structured array (structured_refs) or a sequence of (task, index) pairs or (task, index, offset)
/// triples of integers (an (n, 2) or (n, 3) integer array too), each value checked (never negative,
/// task and offset below 2^32). Throws InvalidArgument naming refs, the entry, what was expected and
/// what was found, and when the count is not `samples`.
std::optional<std::vector<SampleRef>> refs_arg(const py::object& obj, std::size_t samples) {
  if (obj.is_none()) return std::nullopt;
  std::vector<SampleRef> out;
  const bool array = py::isinstance<py::array>(obj);
  if (array && py::reinterpret_borrow<py::array>(obj).dtype().has_fields()) {
    out = structured_refs(py::reinterpret_borrow<py::array>(obj));
  } else {
    if (array) {
      const auto a = py::reinterpret_borrow<py::array>(obj);
      if (a.ndim() != 2 || (a.shape(1) != 2 && a.shape(1) != 3)) {
        refuse_refs(fmt::format("an array of dtype {} and shape {}", std::string(py::str(a.dtype())),
                                std::string(py::str(obj.attr("shape")))));
      }
    } else if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj)) {
      refuse_refs(fmt::format("{} of type {}", std::string(py::repr(obj)),
                              std::string(py::str(py::type::of(obj).attr("__name__")))));
    }
    const auto seq = py::reinterpret_borrow<py::sequence>(obj);
    out.resize(seq.size());
    for (std::size_t k = 0; k < out.size(); ++k) {
      const py::object pair = seq[k];
      const bool is_pair = py::isinstance<py::sequence>(pair) && !py::isinstance<py::str>(pair) &&
                           !py::isinstance<py::bytes>(pair) && (py::len(pair) == 2 || py::len(pair) == 3);
      PACKPIPE_CHECK_ARG(is_pair, "refs[{}] must be a (task, index) pair or a (task, index, offset) triple of "
                         "integers, found {}", k, std::string(py::repr(pair)));
      const std::string at = "refs[" + std::to_string(k) + "]";
      out[k].task = count_arg<std::uint32_t>(pair[py::int_(0)], (at + " task").c_str());
      out[k].index = count_arg<std::uint64_t>(pair[py::int_(1)], (at + " index").c_str());
      if (py::len(pair) == 3) out[k].offset = count_arg<std::uint32_t>(pair[py::int_(2)], (at + " offset").c_str());
    }
  }
  PACKPIPE_CHECK_ARG(out.size() == samples, "refs has {} entries but input_lengths has {} (one (task, index) per "
                     "sample)", out.size(), samples);
  return out;
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

/// numpy dtype of SampleRef: (task u4, index u8, offset u4).
py::dtype ref_dtype() {
  py::dict d;
  d["names"] = py::make_tuple("task", "index", "offset");
  d["formats"] = py::make_tuple("<u4", "<u8", "<u4");
  d["offsets"] = py::make_tuple(offsetof(SampleRef, task), offsetof(SampleRef, index), offsetof(SampleRef, offset));
  d["itemsize"] = sizeof(SampleRef);
  return py::dtype::from_args(d);
}

/// A structured array of `refs` (ref_dtype) viewing memory that `owner` keeps alive.
py::array refs_view(const std::vector<SampleRef>& refs, const py::object& owner) {
  return view_array(ref_dtype(), refs.size(), refs.data(), owner);
}

/// A read-only property of an IterationResult viewing the uint32 vector `m` of its trained lengths
/// (IterationResult::trained; kept alive by the result object).
auto trained_view(std::vector<std::uint32_t> part::BatchLengths::*m) {
  return [m](const py::object& self) {
    return view_vector(self.cast<const PyIterationResult&>().result.trained.*m, self);
  };
}

/// The same property of a PlannedIteration (its IterationResult's).
auto planned_trained_view(std::vector<std::uint32_t> part::BatchLengths::*m) {
  return [m](const py::object& self) {
    return trained_view(m)(py::cast(self.cast<const PyPlannedIteration&>().result));
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

  auto g = py::reinterpret_borrow<BaselineClass>(m.attr("BaselineFigures"));
  g.def_property_readonly("family", [](const planner::BaselineFigures& x) { return x.baseline.family(); },
                          "fixed, fixed-packed, tokens, packing, packing-mask, wlb or slicing")
      .def_property_readonly("setting", [](const planner::BaselineFigures& x) { return x.baseline.label(); },
                             "the method and its setting as a user reads it, e.g. 'packing (capacity 4096 x 2 rows)'")
      .def_property_readonly(
          "method", [](const planner::BaselineFigures& x) { return std::string(part::partition_method_name(x.baseline.method)); },
          "the partition method (PartitionOptions.method)")
      .def_property_readonly("mbs", [](const planner::BaselineFigures& x) { return x.baseline.microbatch_size; },
                             "fixed: samples; packing: rows per micro-batch (else 0)")
      .def_property_readonly("tokens", [](const planner::BaselineFigures& x) { return x.baseline.token_budget; },
                             "tokens: padded tokens per micro-batch (else 0)")
      .def_property_readonly("capacity", [](const planner::BaselineFigures& x) { return x.baseline.capacity; },
                             "packing: tokens per row; wlb: tokens per micro-batch (else 0)")
      .def_property_readonly(
          "layout", [](const planner::BaselineFigures& x) { return std::string(layout_name(x.baseline.layout)); },
          "its micro-batches' layout")
      .def_property_readonly(
          "figures",
          [](const py::object& self) {
            return py::cast(&self.cast<const planner::BaselineFigures&>().figures,
                            py::return_value_policy::reference_internal, self);
          },
          "MethodFigures under baseline_schedule: as run (1F1B over its order, by default) or packpipe's search")
      .def_readonly("candidate", &planner::BaselineFigures::candidate,
                    "whether its plan was a candidate for packpipe's (the dp method, and a layout "
                    "PartitionOptions.layouts lists); False: reported only, and packpipe's plan may be slower")
      .def_readonly("scheduled", &planner::BaselineFigures::scheduled,
                    "whether a schedule ran (False: its partition failed, or its schedule cannot run the micro-batch "
                    "count; figures.why says)");
  def_repr(g, {"setting", "scheduled"});

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
      .def_property_readonly(
          "seq_truncated", [](const PyIterationResult& x) { return x.result.context.truncated; },
          "samples the context length (max_seq_len) truncated")
      .def_property_readonly(
          "seq_dropped", [](const PyIterationResult& x) { return x.result.context.dropped; },
          "samples the context length dropped (seq_policy='drop'): in no micro-batch")
      .def_property_readonly(
          "seq_split", [](const PyIterationResult& x) { return x.result.context.split; },
          "samples the context length split into chunks (seq_policy='split')")
      .def_property_readonly(
          "seq_chunks", [](const PyIterationResult& x) { return x.result.context.chunks; },
          "samples of the global batch the split samples became")
      .def_property_readonly(
          "seq_dropped_samples",
          [](const py::object& self) {
            return view_vector(self.cast<const PyIterationResult&>().result.context.dropped_samples, self);
          },
          "uint32 positions of the samples the context length dropped, in the batch as given (plan_batch: "
          "input_lengths; plan_epoch: the sampled global batch)")
      .def_property_readonly(
          "seq_dropped_refs",
          [](const py::object& self) {
            return refs_view(self.cast<const PyIterationResult&>().result.context.dropped_refs, self);
          },
          "the dropped samples' refs (PlannedIteration.refs' dtype; empty without refs)")
      .def_property_readonly(
          "trained_input_lengths", trained_view(&part::BatchLengths::input),
          "uint32 per sample of the batch planned, the tokens trained (decoder-only: whole samples; encoder-decoder: "
          "the encoder side): after the context length and the memory oversize policy, 0 for a dropped sample; "
          "what Plan.microbatches[m]['lengths'] record, in batch order")
      .def_property_readonly(
          "trained_target_lengths", trained_view(&part::BatchLengths::target),
          "uint32 decoder tokens trained per sample (encoder-decoder; empty for decoder-only models)")
      .def_property_readonly(
          "trained_loss_tokens", trained_view(&part::BatchLengths::loss),
          "uint32 loss tokens trained per sample (0 for a dropped sample): the plans' loss_tokens, per sample")
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
      .def_property_readonly("source", result_of(&planner::IterationResult::source),
                             "the partition method's name ('dp': packpipe's), or the setting of the baseline whose "
                             "plan was simulated faster and so is the plan")
      .def_property_readonly("from_baseline", result_of(&planner::IterationResult::from_baseline),
                             "whether the plan is a baseline's (source names it)")
      .def_property_readonly(
          "baselines",
          [](const py::object& self) { return views_of(self.cast<const PyIterationResult&>().result.baselines, self); },
          "BaselineFigures of every baseline of the grid under baseline_schedule (empty without baselines)")
      .def_property_readonly("candidates_ms", result_of(&planner::IterationResult::candidates_ms),
                             "wall time of the baselines' plans as candidates (and their report)")
      .def_property_readonly("partition_ms", result_of(&planner::IterationResult::partition_ms),
                             "wall time of packpipe's partition")
      .def_property_readonly("schedule_ms", result_of(&planner::IterationResult::schedule_ms),
                             "wall time of the schedule search (all replicas)")
      .def_property_readonly("build_ms", result_of(&planner::IterationResult::build_ms),
                             "wall time of building (and validating) the plans")
      .def_property_readonly("planning_ms", result_of(&planner::IterationResult::planning_ms),
                             "partition, schedule, candidates and build together")
      .def_property_readonly("schedule_note", result_of(&planner::IterationResult::schedule_note),
                             "why a named schedule was not used (schedule_fallback=True), else ''");
  def_repr(r, {"iteration", "samples", "tokens", "truncated", "dropped", "seq_truncated", "seq_dropped", "seq_split",
               "plans", "planning_ms"});

  auto it = py::reinterpret_borrow<PlannedClass>(m.attr("PlannedIteration"));
  it.def_readonly("iteration", &PyPlannedIteration::iteration, "the batch's index in its epoch")
      .def_property_readonly(
          "input_lengths",
          [](const py::object& self) { return view_vector(self.cast<const PyPlannedIteration&>().lengths.input, self); },
          "uint32 input lengths (decoder-only: whole samples), in batch order, as planning saw them: after the "
          "context length (max_seq_len: a split sample is one entry per chunk, a dropped one has none), before the "
          "memory oversize policy (what was trained: trained_input_lengths; before the context length: sample_lengths)")
      .def_property_readonly(
          "target_lengths",
          [](const py::object& self) { return view_vector(self.cast<const PyPlannedIteration&>().lengths.target, self); },
          "uint32 target lengths as planning saw them (encoder-decoder; empty for decoder-only models)")
      .def_property_readonly(
          "loss_tokens",
          [](const py::object& self) { return view_vector(self.cast<const PyPlannedIteration&>().lengths.loss, self); },
          "uint32 tokens of each entry that carry loss (the plan_epoch loss mode), in batch order, as planning saw "
          "them (trained: trained_loss_tokens)")
      .def_property_readonly(
          "trained_input_lengths",
          planned_trained_view(&part::BatchLengths::input),
          "uint32 tokens each entry of input_lengths trains: after the context length and the memory oversize "
          "policy (oversize=), 0 for a dropped sample; what Plan.microbatches[m]['lengths'] record")
      .def_property_readonly(
          "trained_target_lengths",
          planned_trained_view(&part::BatchLengths::target),
          "uint32 decoder tokens each entry trains (encoder-decoder; empty for decoder-only models)")
      .def_property_readonly(
          "trained_loss_tokens",
          planned_trained_view(&part::BatchLengths::loss),
          "uint32 loss tokens each entry trains (0 for a dropped sample)")
      .def_property_readonly(
          "sample_lengths",
          [](const py::object& self) { return view_vector(self.cast<const PyPlannedIteration&>().samples.input, self); },
          "uint32 per entry of input_lengths, its dataset sample's length before the context length (a chunk: its "
          "whole sample's; decoder-only: input + target)")
      .def_property_readonly(
          "sample_target_lengths",
          [](const py::object& self) { return view_vector(self.cast<const PyPlannedIteration&>().samples.target, self); },
          "uint32 per entry, its dataset sample's target length before the context length (encoder-decoder; empty "
          "for decoder-only models)")
      .def_property_readonly(
          "refs",
          [](const py::object& self) { return refs_view(self.cast<const PyPlannedIteration&>().refs, self); },
          "each entry's sample in the dataset: a structured array with fields task (u4), index (u8) and offset (u4: "
          "where a chunk of a split sample starts in its tokens; 0 for a whole sample)")
      .def_readonly("result", &PyPlannedIteration::result, "the IterationResult")
      .def_property_readonly(
          "blobs",
          [](const PyPlannedIteration& x) {
            py::list out;
            for (const auto& b : x.blobs) out.append(py::bytes(reinterpret_cast<const char*>(b.data()), b.size()));
            return out;
          },
          "encoded plans (bytes, one per replica; Plan.from_bytes reads one) when plan_epoch(encode=True), else []");
  def_repr(it, {"iteration", "input_lengths", "result"});

  auto e = py::reinterpret_borrow<EpochClass>(m.attr("EpochPlanner"));
  e.def_property_readonly(
       "iterations", [](const PyEpochPlanner& p) { return p.planner->iterations(); },
       "iterations this run plans (after first_iteration, at most `iterations`)")
      .def_property_readonly(
          "epoch_iterations", [](const PyEpochPlanner& p) { return p.planner->epoch_iterations(); },
          "iterations the whole epoch holds")
      .def_property_readonly(
          "vstages", [](const PyEpochPlanner& p) { return p.planner->vstages().size(); },
          "virtual stages planned for")
      .def("__len__", [](const PyEpochPlanner& p) { return p.planner->iterations(); })
      .def("__iter__", [](const py::object& self) { return self; })
      .def(
          "__next__",
          [](PyEpochPlanner& p) {
            planner::PlannedIteration it;
            bool more = false;
            {
              py::gil_scoped_release release;
              more = p.planner->next(it);
            }
            if (!more) throw py::stop_iteration();
            return std::make_shared<PyPlannedIteration>(std::move(it));
          },
          "the next iteration in order (planned ahead in the background; the GIL is released while waiting); a "
          "planning error is raised here, naming the iteration, after every earlier iteration");
  def_repr(e, {"iterations", "vstages"});
}

}  // namespace

void declare_planner(py::module_& m) {
  FiguresClass(m, "MethodFigures", "What one method achieves on one global batch (all data-parallel replicas).");
  BaselineClass(m, "BaselineFigures", "One baseline of the grid (a method and its setting) on one global batch.");
  ResultClass(m, "IterationResult", "The plans and figures of one global batch.");
  PlannedClass(m, "PlannedIteration", "One iteration of plan_epoch(): the sampled batch and its IterationResult.");
  EpochClass(m, "EpochPlanner",
             "The iterations of an epoch, planned in parallel and delivered in order (what plan_epoch() returns). "
             "Deterministic whatever the threads; keeps the dataset and the cost model alive.");
}

void define_planner(py::module_& m) {
  define_results(m);
  const part::PipelineShape four = four_stage_shape();
  def_ints(
      m, "plan_batch",
      [](const std::shared_ptr<cm::CostModel>& cost, const py::object& input_lengths, const py::object& target_lengths,
         const part::PipelineShape& shape, const part::PartitionOptions& options, const std::string& schedule,
         const py::object& seed, const py::object& iteration, bool validate, bool baselines,
         const py::object& baseline_mbs, const std::shared_ptr<PyPartitionCache>& cache,
         const py::object& loss_tokens, const std::string& loss, bool tied_embedding, const py::object& dtype,
         bool split_backward, const std::string& schedule_family, bool schedule_fallback, const py::object& refs,
         const py::object& max_seq_len, const py::object& max_target_len, const std::string& seq_policy,
         const py::object& dataset, double min_gain, const std::string& baseline_schedule) {
        PACKPIPE_CHECK_ARG(cost != nullptr, "cost_model must not be None");
        part::BatchLengths b = batch_arg(input_lengths, target_lengths);
        b.loss = lengths_arg(loss_tokens, "loss_tokens");
        PACKPIPE_CHECK_ARG(b.loss.empty() || b.loss.size() == b.input.size(),
                           "loss_tokens has {} entries but input_lengths has {}", b.loss.size(), b.input.size());
        const std::optional<std::vector<SampleRef>> sample_refs = refs_arg(refs, b.input.size());
        const TrainerArgs trainer{loss, dtype_arg(dtype, *cost), schedule_family, tied_embedding, split_backward, schedule_fallback, min_gain,
                                  baseline_schedule};
        planner::PlannerOptions o = planner_options(shape, options, schedule, seed, validate, baselines,
                                                    baseline_mbs, trainer,
                                                    context_args(max_seq_len, max_target_len, seq_policy));
        if (!dataset.is_none()) {
          PACKPIPE_CHECK_ARG(py::isinstance<dl::MultiTaskDataset>(dataset),
                             "dataset must be a MultiTaskDataset (the one refs index) or None, found {}",
                             std::string(py::str(py::type::of(dataset).attr("__name__"))));
          PACKPIPE_CHECK_ARG(sample_refs.has_value(), "dataset is given without refs: give each sample's refs into it");
          o.dataset = planner::dataset_identity(dataset.cast<const dl::MultiTaskDataset&>());
          const auto& tasks = o.dataset.task_list();
          for (std::size_t k = 0; k < sample_refs->size(); ++k) {
            const SampleRef& r = (*sample_refs)[k];
            PACKPIPE_CHECK_ARG(r.task < tasks.size() && r.index < tasks[r.task].samples,
                               "refs[{}] = ({}, {}) is not a sample of dataset '{}': expected a task below {} and an "
                               "index below its sample count ({})",
                               k, r.task, r.index, dataset.cast<const dl::MultiTaskDataset&>().manifest().path,
                               tasks.size(), r.task < tasks.size() ? tasks[r.task].samples : 0);
            // The planned tokens are the sample's (from its offset): a loader would find them missing.
            const auto& ds = dataset.cast<const dl::MultiTaskDataset&>();
            const bool encdec = cost->model().arch == cm::Architecture::EncoderDecoder;
            const std::uint64_t have = encdec ? ds.input_length(r) : ds.sample_tokens(r.task, r.index);
            PACKPIPE_CHECK_ARG(std::uint64_t{r.offset} + b.input[k] <= have,
                               "refs[{}] = ({}, {}, offset {}): input_lengths[{}] is {}, but the sample has {} {}tokens "
                               "from that offset in dataset '{}'", k, r.task, r.index, r.offset, k, b.input[k],
                               have > r.offset ? have - r.offset : 0, encdec ? "input " : "", ds.manifest().path);
            PACKPIPE_CHECK_ARG(!encdec || b.target.empty() || b.target[k] <= ds.target_length(r),
                               "refs[{}] = ({}, {}): target_lengths[{}] is {}, but the sample has {} target tokens in "
                               "dataset '{}'", k, r.task, r.index, k, b.target.empty() ? 0 : b.target[k],
                               ds.target_length(r), ds.manifest().path);
          }
        }
        const auto iter = count_arg<std::uint64_t>(iteration, "iteration");
        planner::check_planner_options(o);  // ValueError naming the argument before anything is planned
        const PyPartitionCache::Use use(cache.get(), cost);
        planner::IterationResult r;
        {
          py::gil_scoped_release release;
          const auto vstages = part::virtual_stages(cost->model(), o.shape);
          r = planner::plan_iteration(b, sample_refs ? &*sample_refs : nullptr, iter, *cost, vstages, o, use.get());
        }
        return std::make_shared<PyIterationResult>(std::move(r));
      },
      py::arg("cost_model"), py::arg("input_lengths"), py::arg("target_lengths") = py::none(), py::kw_only(),
      py::arg("shape") = four, py::arg("options") = part::PartitionOptions{}, py::arg("schedule") = "search",
      py::arg("seed") = 1234, py::arg("iteration") = 0, py::arg("validate") = false, py::arg("baselines") = false,
      py::arg("baseline_mbs") = kBaselineMbs, py::arg("cache") = nullptr, py::arg("loss_tokens") = py::none(),
      py::arg("loss") = "all", py::arg("tied_embedding") = false, py::arg("dtype") = py::none(),
      py::arg("split_backward") = true, py::arg("schedule_family") = "any", py::arg("schedule_fallback") = false,
      py::arg("refs") = py::none(), py::arg("max_seq_len") = 0, py::arg("max_target_len") = 0,
      py::arg("seq_policy") = "truncate", py::arg("dataset") = py::none(),
      py::arg("min_gain") = planner::PlannerOptions{}.min_gain, py::arg("baseline_schedule") = "as-run",
      "Plan one global batch: micro-batches, schedule search and per-rank instruction streams; an "
      "IterationResult with one packpipe.Plan per data-parallel replica, packpipe's figures and, with "
      "baselines=True, those of the baseline grid (fixed and packing settings over baseline_mbs, ...) under "
      "baseline_schedule: 'as-run' (the schedule named, else 1F1B, interleaved with chunks, over their order, as "
      "their systems run them) or 'search' (packpipe's schedule search: the speed-up is the partition's alone); "
      "the plans are the same either way. "
      "A micro-batch's samples are positions in the input_lengths passed (0 .. len - 1). refs: each sample's "
      "(task, index) in its dataset, one per input_lengths entry, recorded in Plan.microbatches[m]['refs'] and "
      "naming samples in errors: a structured array with fields task (u4) and index (u8), as "
      "PlannedIteration.refs, or a sequence of (task, index) pairs; None: no refs. dataset: the MultiTaskDataset the refs index (checked against it), "
      "recorded in the plans (Plan.dataset) so that loaders refuse another, as plan_epoch's are; None: unknown. "
      "min_gain: packpipe's own partition is the plan only when simulated at least this fraction faster than the "
      "best baseline's plan, and another schedule or order replaces 1F1B (interleaved with chunks) over the given "
      "order, when allowed, only when this much faster (in [0, 1); 0: the least makespan, whichever plan gives it). "
      "schedule: 'search' or one schedule name. cache: a PartitionCache kept across iterations, or None. "
      "loss_tokens: per sample, the tokens that carry loss (default: decoder-only n - 1, encoder-decoder the "
      "target); loss: 'all' or 'targets' (recorded in the plans); tied_embedding: the embedding and the LM head "
      "share a weight (REDUCE_TIED); dtype: activations between stages (None: the model file's \"dtype\", else "
      "bf16); split_backward=False excludes zero-bubble; "
      "schedule_family: 'any', '1f1b', 'gpipe', 'cyclic' or 'zero-bubble'; schedule_fallback: a named schedule "
      "that cannot run the micro-batch count falls back to the search (IterationResult.schedule_note says why). "
      "max_seq_len: the context length (0: none; encoder-decoder: the encoder side, max_target_len the decoder "
      "side, 0: max_seq_len); seq_policy: 'truncate' (keep the first tokens) or 'drop' (in no micro-batch; "
      "IterationResult.seq_dropped_samples), applied before the memory oversize policy; 'split' needs the samples' "
      "tokens (plan_epoch). Out-of-range sizes and unknown names raise ValueError naming the argument.");
  def_ints(
      m, "plan_epoch",
      [](const std::shared_ptr<cm::CostModel>& cost, const dl::MultiTaskDataset& data, const part::PipelineShape& shape,
         const part::PartitionOptions& options, const py::object& global_batch_tokens,
         const py::object& global_batch_samples, const py::object& seed, const std::string& split,
         const py::object& epoch, const py::object& first_iteration, const py::object& iterations,
         const std::string& schedule, bool validate, bool baselines, const py::object& baseline_mbs,
         const py::object& threads, const py::object& depth, bool encode, bool compress, const std::string& loss,
         bool tied_embedding, const py::object& dtype, bool split_backward, const std::string& schedule_family,
         bool schedule_fallback, const py::object& max_seq_len, const py::object& max_target_len,
         const std::string& seq_policy, double min_gain, const std::string& baseline_schedule) {
        PACKPIPE_CHECK_ARG(cost != nullptr, "cost_model must not be None");
        planner::EpochSpec spec;
        spec.sampler = dl::sampler_config(data.manifest());
        spec.sampler.seed = count_arg<std::uint64_t>(seed, "seed");
        spec.sampler.split = dl::split_from_name(split);
        spec.sampler.global_batch_tokens = count_arg<std::uint64_t>(global_batch_tokens, "global_batch_tokens");
        spec.sampler.global_batch_samples = count_arg<std::uint64_t>(global_batch_samples, "global_batch_samples");
        spec.epoch = count_arg<std::uint64_t>(epoch, "epoch");
        spec.first_iteration = count_arg<std::uint64_t>(first_iteration, "first_iteration");
        spec.iterations = count_arg<std::uint64_t>(iterations, "iterations");
        planner::EpochOptions eo;
        eo.threads = count_arg<int>(threads, "threads");
        eo.depth = count_arg<std::size_t>(depth, "depth");
        eo.encode = encode;
        eo.encoding.compress = compress;
        auto out = std::make_shared<PyEpochPlanner>();
        out->cost = cost;
        const TrainerArgs trainer{loss, dtype_arg(dtype, *cost), schedule_family, tied_embedding, split_backward, schedule_fallback, min_gain,
                                  baseline_schedule};
        planner::PlannerOptions o = planner_options(shape, options, schedule, seed, validate, baselines, baseline_mbs,
                                                    trainer, context_args(max_seq_len, max_target_len, seq_policy));
        py::gil_scoped_release release;  // counting the iterations of a token budget is a dry run of the sampler
        out->planner = std::make_unique<planner::EpochPlanner>(data, *cost, std::move(o), std::move(spec), eo);
        return out;
      },
      py::arg("cost_model"), py::arg("dataset"), py::kw_only(), py::arg("shape") = four,
      py::arg("options") = part::PartitionOptions{}, py::arg("global_batch_tokens") = 0,
      py::arg("global_batch_samples") = 0, py::arg("seed") = 1234, py::arg("split") = "train", py::arg("epoch") = 0,
      py::arg("first_iteration") = 0, py::arg("iterations") = 0, py::arg("schedule") = "search",
      py::arg("validate") = false, py::arg("baselines") = false, py::arg("baseline_mbs") = kBaselineMbs,
      py::arg("threads") = 0, py::arg("depth") = 0, py::arg("encode") = false, py::arg("compress") = false,
      py::arg("loss") = "all", py::arg("tied_embedding") = false, py::arg("dtype") = py::none(),
      py::arg("split_backward") = true, py::arg("schedule_family") = "any", py::arg("schedule_fallback") = false,
      py::arg("max_seq_len") = 0, py::arg("max_target_len") = 0, py::arg("seq_policy") = "truncate",
      py::arg("min_gain") = planner::PlannerOptions{}.min_gain, py::arg("baseline_schedule") = "as-run",
      py::keep_alive<0, 2>(),
      "Plan the iterations of an epoch of a MultiTaskDataset as `packpipe plan` does: an EpochPlanner, an "
      "iterator of PlannedIteration in iteration order, planned ahead in parallel (threads: 0 every core; depth: "
      "iterations planned ahead, 0 twice the threads). Exactly one of global_batch_tokens and global_batch_samples "
      "is given; seed seeds the sampler and the schedule search. iterations: at most this many (0: to the end of "
      "the epoch) from first_iteration. encode: also encode every plan (PlannedIteration.blobs). max_seq_len: the "
      "context length, every sample's tokens at most this (0: none; encoder-decoder: the encoder side, "
      "max_target_len the decoder side, 0: max_seq_len), recorded in the plans (Plan.max_seq_len); seq_policy: "
      "'truncate' (keep the first tokens), 'drop' (leave the sample out) or 'split' (decoder-only: consecutive "
      "chunks of at most max_seq_len tokens, each a sample, as Megatron's --seq-length; Plan refs carry each "
      "chunk's offset), applied where each global batch is sampled, before the memory oversize policy. The same "
      "inputs give the same plans whatever threads and depth.");
}

}  // namespace packpipe::bindings
