// Python bindings of the schedules, the simulator and the search: packpipe.ScheduleProblem (from a
// cost model, micro-batches and a PipelineShape, or from cost arrays), .simulate() and .search(), results as
// packpipe.Schedule with per-rank ops as zero-copy numpy structured arrays. Thin lambdas; every
// check lives in C++; the GIL is released while simulating and searching.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/arrays.h"
#include "bindings/bind.h"
#include "common/errors.h"
#include "costmodel/cost_model.h"
#include "partition/partition.h"
#include "partition/pipeline.h"
#include "schedule/schedules.h"
#include "schedule/search.h"
#include "schedule/simulator.h"
#include "plan/trace.h"

namespace py = pybind11;
namespace cm = packpipe::costmodel;
namespace part = packpipe::partition;
namespace sched = packpipe::schedule;
namespace pl = packpipe::plan;

namespace packpipe::bindings {

namespace {

// A problem plus what the recompute fallback needs (only when built from a cost model).
struct PyProblem {
  sched::SimProblem problem;
  std::shared_ptr<cm::CostModel> cost;
  part::PipelineShape shape;
  std::vector<part::VirtualStage> vstages;
  std::vector<part::MicroBatch> mbs;
};

struct PySearch {
  sched::SearchResult result;
};

py::dtype op_dtype() {
  py::list names, formats, offsets;
  auto field = [&](const char* name, const char* format, std::size_t offset) {
    names.append(name);
    formats.append(format);
    offsets.append(offset);
  };
  field("kind", "u1", offsetof(pl::ScheduledOp, kind));
  field("mb", "<u4", offsetof(pl::ScheduledOp, mb));
  field("vstage", "<u4", offsetof(pl::ScheduledOp, vstage));
  field("start_ms", "<f8", offsetof(pl::ScheduledOp, start_ms));
  field("end_ms", "<f8", offsetof(pl::ScheduledOp, end_ms));
  py::dict d;
  d["names"] = names;
  d["formats"] = formats;
  d["offsets"] = offsets;
  d["itemsize"] = sizeof(pl::ScheduledOp);
  return py::dtype::from_args(d);
}

/// A (rows, cols) cost array argument (real_array_arg: floating or exact integer values); None gives
/// zeros unless `required`.
std::vector<double> matrix(const py::object& obj, const char* arg, std::int64_t rows, std::int64_t cols, bool required) {
  if (obj.is_none()) {
    PACKPIPE_CHECK_ARG(!required, "{} is required", arg);
    return std::vector<double>(static_cast<std::size_t>(rows * cols), 0.0);
  }
  RealArray a = real_array_arg(obj, arg, 2);
  PACKPIPE_CHECK_ARG(a.shape[0] == rows && a.shape[1] == cols, "{} must have shape ({}, {}), found ({}, {})", arg,
                     rows, cols, a.shape[0], a.shape[1]);
  return std::move(a.values);
}

/// Every value of `v` (a (rows, cols) array row-major, or a vector when cols is 0) in [0, 1e15]
/// (ms or bytes: sums of any count of them stay finite): the first one that is not is named by its index.
void check_cost_values(const std::vector<double>& v, const char* arg, std::int64_t cols) {
  constexpr double kMost = 1e15;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] >= 0 && v[i] <= kMost) continue;
    const std::string at = cols > 0 ? fmt::format("[{}, {}]", i / static_cast<std::size_t>(cols),
                                                  i % static_cast<std::size_t>(cols))
                                    : fmt::format("[{}]", i);
    PACKPIPE_THROW(::packpipe::InvalidArgument, "{}{} must be in [0, {:g}], found {}", arg, at, kMost, v[i]);
  }
}

std::shared_ptr<PyProblem> from_costs(const py::object& forward, const py::object& backward,
                                      const py::object& backward_weight, const py::object& stored,
                                      const py::object& peak, const py::object& transfer,
                                      const py::object& static_bytes, const py::object& ranks_arg,
                                      double memory_limit_bytes) {
  const auto ranks = int_of<std::int64_t>(ranks_arg, "ranks");
  constexpr std::int64_t kMaxRanks = std::int64_t{1} << 16;
  PACKPIPE_CHECK_ARG(ranks >= 1 && ranks <= kMaxRanks, "ranks must be in [1, {}], found {}", kMaxRanks, ranks);
  PACKPIPE_CHECK_ARG(std::isfinite(memory_limit_bytes) && memory_limit_bytes >= 0,
                     "memory_limit_bytes must be finite and not negative (0: no limit), found {}", memory_limit_bytes);
  RealArray f = real_array_arg(forward, "forward_ms", 2);  // (micro-batches, virtual stages)
  const std::int64_t m = f.shape[0], V = f.shape[1];
  sched::StageCostTable t;
  t.microbatches = m;
  t.vstages = V;
  t.forward_ms = std::move(f.values);
  t.backward_ms = matrix(backward, "backward_ms", m, V, true);
  t.backward_weight_ms = matrix(backward_weight, "backward_weight_ms", m, V, false);
  t.stored_bytes = matrix(stored, "stored_bytes", m, V, false);
  t.peak_bytes = matrix(peak, "peak_bytes", m, V, false);
  t.send_bytes.assign(static_cast<std::size_t>(m * V), 0.0);
  if (static_bytes.is_none()) {
    t.static_bytes.assign(static_cast<std::size_t>(std::max<std::int64_t>(ranks, 0)), 0.0);
  } else {
    t.static_bytes = real_array_arg(static_bytes, "static_bytes", 1).values;
  }
  check_cost_values(t.forward_ms, "forward_ms", V);
  check_cost_values(t.backward_ms, "backward_ms", V);
  check_cost_values(t.backward_weight_ms, "backward_weight_ms", V);
  check_cost_values(t.stored_bytes, "stored_bytes", V);
  check_cost_values(t.peak_bytes, "peak_bytes", V);
  check_cost_values(t.static_bytes, "static_bytes", 0);
  auto out = std::make_shared<PyProblem>();
  out->problem = sched::make_sim_problem(std::move(t), ranks, cm::CommModel{}, 1, memory_limit_bytes);
  if (!transfer.is_none()) {
    out->problem.transfer_ms = matrix(transfer, "transfer_ms", m, V, false);
    check_cost_values(out->problem.transfer_ms, "transfer_ms", V);
  }
  return out;
}

/// Micro-batch `i` of ScheduleProblem's argument: a MicroBatch (of a Partition) as it is, or a tuple
/// (rows, padded_len[, padded_dec_len[, recompute]]) bounded before anything is allocated from it
/// (rows x samples), as `packpipe schedule` reads them.
part::MicroBatch microbatch_arg(const py::handle& item, std::size_t i) {
  if (py::isinstance<part::MicroBatch>(item)) return item.cast<part::MicroBatch>();
  const auto t = item.cast<py::tuple>();
  PACKPIPE_CHECK_ARG(t.size() >= 2 && t.size() <= 4,
                     "microbatches[{}] must be a MicroBatch or (rows, padded_len[, padded_dec_len[, recompute]])", i);
  part::MicroBatch mb;
  const std::string where = "microbatches[" + std::to_string(i) + "]";
  const auto rows = unsigned_arg(t[0], (where + " rows").c_str(), std::uint64_t{1} << 20);
  PACKPIPE_CHECK_ARG(rows >= 1, "{}: rows must be at least 1, found {}", where, rows);
  mb.samples.resize(static_cast<std::size_t>(rows));
  constexpr std::uint64_t kMaxLen = std::uint64_t{1} << 24;
  mb.padded_len = static_cast<std::int64_t>(unsigned_arg(t[1], (where + " padded_len").c_str(), kMaxLen));
  PACKPIPE_CHECK_ARG(mb.padded_len >= 1, "{}: padded_len must be at least 1, found 0", where);
  if (t.size() >= 3) {
    mb.padded_dec_len = static_cast<std::int64_t>(unsigned_arg(t[2], (where + " padded_dec_len").c_str(), kMaxLen));
  }
  if (t.size() >= 4) mb.recompute = cm::recompute_from_name(t[3].cast<std::string>());
  return mb;
}

std::shared_ptr<PyProblem> from_model(std::shared_ptr<cm::CostModel> cost, const py::object& microbatches,
                                      const part::PipelineShape& shape, const py::object& input_lengths,
                                      const py::object& replica) {
  PACKPIPE_CHECK_ARG(cost != nullptr, "cost_model must be a packpipe.CostModel");
  auto out = std::make_shared<PyProblem>();
  std::vector<std::uint32_t> lengths;
  bool have_lengths = false;
  const bool from_partition = py::isinstance<part::Partition>(microbatches);
  if (from_partition) {
    // A Partition: one data-parallel replica's micro-batches, in its order, as the planner schedules
    // them, and the lengths it was cut from (after its oversize policy).
    PACKPIPE_CHECK_ARG(input_lengths.is_none(),
                       "input_lengths: a Partition carries its own lengths; pass its micro-batches to give others");
    const auto& p = microbatches.cast<const part::Partition&>();
    const std::size_t replicas = p.ranks.empty() ? 1 : p.ranks.size();
    std::size_t k = 0;
    if (!replica.is_none()) {
      k = static_cast<std::size_t>(unsigned_arg(replica, "replica", replicas - 1));
    } else {
      PACKPIPE_CHECK_ARG(replicas == 1,
                         "the Partition has {} data-parallel replicas (Partition.ranks), each its own pipeline: pass "
                         "replica= (0 to {}) to schedule one, as the planner does",
                         replicas, replicas - 1);
    }
    if (p.ranks.empty()) {
      out->mbs = p.microbatches;
    } else {
      for (const auto m : p.ranks[k]) out->mbs.push_back(p.microbatches.at(m));
    }
    lengths = p.lengths.input;
    have_lengths = true;
  } else {
    PACKPIPE_CHECK_ARG(replica.is_none(),
                       "replica: a Partition's data-parallel replica; given micro-batches are one pipeline's already");
    PACKPIPE_CHECK_ARG(py::isinstance<py::sequence>(microbatches) && !py::isinstance<py::str>(microbatches),
                       "microbatches must be a Partition or a sequence of MicroBatch objects or shape tuples, found {}",
                       std::string(py::str(py::type::of(microbatches).attr("__name__"))));
    const auto seq = microbatches.cast<py::sequence>();
    for (std::size_t i = 0; i < seq.size(); ++i) out->mbs.push_back(microbatch_arg(seq[i], i));
    if (!input_lengths.is_none()) {
      lengths = lengths_arg(input_lengths, "input_lengths");
      have_lengths = true;
    }
  }
  PACKPIPE_CHECK_ARG(!out->mbs.empty(), "microbatches is empty");
  out->cost = std::move(cost);
  out->shape = shape;
  out->vstages = part::virtual_stages(out->cost->model(), out->shape);
  out->problem = sched::make_sim_problem(sched::stage_cost_table(*out->cost, out->shape, out->vstages, out->mbs),
                                      *out->cost, out->shape);
  // Slices keep their order in every schedule (forward in slice order, backward in reverse, each
  // stage holding the sample's keys and values until its backward): the links come from the spans
  // and the samples' lengths, which tell a slice from a whole sample.
  const auto sliced =
      std::find_if(out->mbs.begin(), out->mbs.end(), [](const part::MicroBatch& mb) { return mb.has_slices(); });
  if (sliced == out->mbs.end()) return out;
  PACKPIPE_CHECK_ARG(have_lengths,
                     "microbatches[{}] holds slices: pass the Partition itself, or input_lengths= (the batch's input "
                     "lengths it was cut from), so that the schedule keeps the slices in order",
                     sliced - out->mbs.begin());
  try {
    out->problem.slice_edges = part::slice_edges(out->mbs, lengths);
  } catch (const ::packpipe::InvalidArgument& e) {
    if (from_partition) throw;
    PACKPIPE_THROW(::packpipe::InvalidArgument,
                   "microbatches and input_lengths disagree: {} (input_lengths must be the lengths the micro-batches "
                   "were cut from, after any truncation)",
                   e.what());
  }
  return out;
}

std::vector<py::tuple> op_list(const pl::Schedule& s, std::int64_t rank) {
  PACKPIPE_CHECK_RANGE(rank >= 0 && rank < static_cast<std::int64_t>(s.ops.size()), "rank {} outside 0..{}", rank,
                       s.ops.size());
  std::vector<py::tuple> out;
  for (const auto& op : s.ops[static_cast<std::size_t>(rank)]) {
    out.push_back(py::make_tuple(pl::op_kind_token(op.kind), op.mb, op.vstage, op.start_ms, op.end_ms));
  }
  return out;
}

}  // namespace

void declare_schedule(py::module_& m) {
  py::class_<pl::Schedule>(m, "Schedule", "A simulated pipeline schedule: per-rank ops with start/end (ms)");
  py::class_<PyProblem, std::shared_ptr<PyProblem>>(m, "ScheduleProblem",
                                                    "Costs of one iteration's micro-batches on a pipeline");
  py::class_<PySearch>(m, "ScheduleSearchResult", "Outcome of a schedule search");
}

void define_schedule(py::module_& m) {
  auto sched_cls = py::reinterpret_borrow<py::class_<pl::Schedule>>(m.attr("Schedule"));
  sched_cls
      .def_readonly("name", &pl::Schedule::name)
      .def_readonly("ranks", &pl::Schedule::ranks)
      .def_readonly("vstages", &pl::Schedule::vstages)
      .def_readonly("microbatches", &pl::Schedule::microbatches)
      .def_readonly("makespan_ms", &pl::Schedule::makespan_ms)
      .def_readonly("bubble_fraction", &pl::Schedule::bubble_fraction)
      .def_readonly("peak_bytes", &pl::Schedule::peak_bytes, "per rank")
      .def_readonly("utilization", &pl::Schedule::utilization, "per rank")
      .def_readonly("order", &pl::Schedule::order, "micro-batch order used");
  def_ints(sched_cls, "ops",
          [](py::object self, std::int64_t rank) {
            const auto& s = self.cast<const pl::Schedule&>();
            PACKPIPE_CHECK_RANGE(rank >= 0 && rank < static_cast<std::int64_t>(s.ops.size()), "rank {} outside 0..{}",
                                 rank, s.ops.size());
            const auto& v = s.ops[static_cast<std::size_t>(rank)];
            static const pl::ScheduledOp kEmpty{};
            return py::array(op_dtype(), {static_cast<py::ssize_t>(v.size())}, {},
                             v.empty() ? &kEmpty : v.data(), self);
          },
          py::arg("rank"),
          "Rank's ops as a zero-copy numpy structured array (kind: 0 F, 1 B, 2 I, 3 W; mb; vstage; start_ms; end_ms)");
  def_ints(sched_cls, "op_list", &op_list, py::arg("rank"), "Rank's ops as (token, mb, vstage, start_ms, end_ms) tuples");
  sched_cls.def(
          "chrome_trace",
          [](const pl::Schedule& s, const std::string& process_name) {
            pl::TraceOptions o;
            o.process_name = process_name;
            return pl::chrome_trace_json(s, o);
          },
          py::arg("process_name") = "packpipe", "Chrome trace / Perfetto JSON of the timeline")
      .def("__repr__", [](const pl::Schedule& s) {
        return "Schedule(name='" + s.name + "', makespan_ms=" + std::to_string(s.makespan_ms) +
               ", bubble_fraction=" + std::to_string(s.bubble_fraction) + ")";
      });

  py::reinterpret_borrow<py::class_<PySearch>>(m.attr("ScheduleSearchResult"))
      .def_property_readonly("schedule", [](const PySearch& r) { return r.result.best; })
      .def_property_readonly("feasible", [](const PySearch& r) { return r.result.feasible; })
      .def_property_readonly("recompute", [](const PySearch& r) { return r.result.recompute; })
      .def_property_readonly("simulations", [](const PySearch& r) { return r.result.simulations; })
      .def_property_readonly("early_exits", [](const PySearch& r) { return r.result.early_exits; })
      .def_property_readonly("lower_bound_ms", [](const PySearch& r) { return r.result.lower_bound_ms; });

  auto problem_cls = py::reinterpret_borrow<py::class_<PyProblem, std::shared_ptr<PyProblem>>>(m.attr("ScheduleProblem"));
  problem_cls
      .def(py::init(&from_model), py::arg("cost_model"), py::arg("microbatches"), py::kw_only(),
           py::arg("shape") = four_stage_shape(), py::arg("input_lengths") = py::none(),
           py::arg("replica") = py::none(),
           "From a cost model and micro-batches on the pipeline `shape`: a Partition, MicroBatch objects "
           "(Partition.microbatches) or shapes [(rows, padded_len[, padded_dec_len[, recompute]]), ...]. "
           "Micro-batches holding slices need the lengths they were cut from (a Partition has them, else "
           "input_lengths=), so that every schedule keeps the slices in order. A Partition of several "
           "data-parallel replicas needs replica= (each replica is its own pipeline)")
      .def_static("from_costs", &from_costs, py::arg("forward_ms"), py::arg("backward_ms"),
                  py::arg("backward_weight_ms") = py::none(), py::arg("stored_bytes") = py::none(),
                  py::arg("peak_bytes") = py::none(), py::arg("transfer_ms") = py::none(),
                  py::arg("static_bytes") = py::none(), py::arg("ranks") = 1, py::arg("memory_limit_bytes") = 0.0,
                  "From (micro-batches, virtual stages) cost arrays of floating or integer dtype (lists too); "
                  "transfer_ms[mb, v]: v -> v + 1; static_bytes: one value per rank")
      .def_property_readonly("microbatches", [](const PyProblem& p) { return p.problem.microbatches(); })
      .def_property_readonly("vstages", [](const PyProblem& p) { return p.problem.vstages(); })
      .def_property_readonly("ranks", [](const PyProblem& p) { return p.problem.ranks; })
      .def_property_readonly("memory_limit_bytes", [](const PyProblem& p) { return p.problem.memory_limit_bytes; })
      .def_property_readonly("lower_bound_ms",
                             [](const PyProblem& p) { return sched::makespan_lower_bounds(p.problem).value(); })
      .def(
          "simulate",
          [](const PyProblem& p, const std::string& schedule, const py::object& order) {
            const sched::ScheduleKind k = sched::schedule_kind_from_name(schedule);
            std::vector<std::uint32_t> o;
            if (!order.is_none()) {
              for (const std::int64_t mb : int_list_arg(order, "order", 0, std::numeric_limits<std::uint32_t>::max())) {
                o.push_back(static_cast<std::uint32_t>(mb));
              }
            }
            py::gil_scoped_release release;
            return sched::make_schedule(k, p.problem, o);
          },
          py::arg("schedule"), py::arg("order") = py::none(),
          "Build and simulate one schedule (gpipe, 1f1b, interleaved-1f1b, cyclic, wait-free-cyclic, zero-bubble)");
  def_ints(problem_cls, "search",
          [](const PyProblem& p, const py::object& seed, std::optional<std::vector<std::string>> schedules,
             bool reference, int local_rounds, double margin) {
            sched::SearchOptions o;
            o.margin = margin;  // checked by the search
            o.seed = unsigned_arg(seed, "seed", std::numeric_limits<std::uint64_t>::max());
            PACKPIPE_CHECK_ARG(local_rounds >= 0 && local_rounds <= 1000, "local_rounds must be in [0, 1000], found {}",
                               local_rounds);
            o.local_rounds = local_rounds;
            if (schedules) {
              for (const auto& n : *schedules) o.schedules.push_back(sched::schedule_kind_from_name(n));
            }
            if (p.cost) {
              o.recompute_table = [&p](cm::Recompute rc) {
                auto mbs = p.mbs;
                for (auto& mb : mbs) mb.recompute = rc;
                return sched::stage_cost_table(*p.cost, p.shape, p.vstages, mbs);
              };
            }
            py::gil_scoped_release release;
            PySearch r;
            r.result = reference ? sched::reference_search(p.problem, o) : sched::search_schedule(p.problem, o);
            return r;
          },
          py::arg("seed") = py::int_(0), py::arg("schedules") = py::none(), py::arg("reference") = false,
          py::arg("local_rounds") = 1, py::arg("margin") = 0.0,
          "Search the schedule and micro-batch order (reference=True: the exhaustive DynaPipe-like search); "
          "margin in [0, 1): another kind or order replaces 1F1B (interleaved 1F1B with chunks) over the given "
          "order only when that much faster");

  m.def(
      "schedule_names",
      [] {
        std::vector<std::string> out;
        for (auto k : sched::all_schedule_kinds()) out.emplace_back(sched::schedule_kind_name(k));
        return out;
      },
      "Names of the pipeline schedules");
}

}  // namespace packpipe::bindings
