// Python bindings of the micro-batch partition: packpipe.partition(lengths, cost_model, ...).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/arrays.h"
#include "bindings/bind.h"
#include "common/errors.h"
#include "costmodel/cost_model.h"
#include "partition/partition.h"

namespace py = pybind11;

namespace packpipe::bindings {

namespace {

namespace cm = packpipe::costmodel;
namespace part = packpipe::partition;

py::dict mb_dict(const part::MicroBatch& mb) {
  py::dict d;
  d["samples"] = owned_array(std::vector<std::uint32_t>(mb.samples));
  d["row_offsets"] = owned_array(std::vector<std::uint32_t>(mb.row_offsets));
  d["rows"] = mb.rows();
  d["padded_len"] = mb.padded_len;
  d["padded_dec_len"] = mb.padded_dec_len;
  d["tokens"] = mb.tokens;
  d["recompute"] = cm::recompute_name(mb.recompute);
  d["time_ms"] = mb.time_ms;
  d["stored_mb"] = mb.stored_mb;
  d["peak_mb"] = mb.peak_mb;
  return d;
}

py::dict partition_dict(const part::Partition& p) {
  py::dict d;
  py::list mbs;
  for (const auto& mb : p.microbatches) mbs.append(mb_dict(mb));
  d["microbatches"] = mbs;
  d["ranks"] = p.ranks;
  d["rank_time_ms"] = p.rank_time_ms;
  d["order"] = owned_array(std::vector<std::uint32_t>(p.order));
  d["objective_ms"] = p.objective_ms;
  d["tau_ms"] = p.tau_ms;
  d["max_time_ms"] = p.max_time_ms;
  d["sum_time_ms"] = p.sum_time_ms;
  d["predicted_iteration_ms"] = p.predicted_iteration_ms;
  d["efficiency"] = p.efficiency;
  d["input_efficiency"] = p.input_efficiency;
  d["target_efficiency"] = p.target_efficiency;
  d["cost_basis"] = part::cost_basis_name(p.basis);
  d["truncated"] = owned_array(std::vector<std::uint32_t>(p.truncated));
  d["dropped"] = owned_array(std::vector<std::uint32_t>(p.dropped));
  return d;
}

}  // namespace

/// An integer argument that is unsigned in C++, in [0, max]: a negative value or one above max
/// raises ValueError naming the argument (never wraps); a non-integer (a float) raises ValueError
/// too, never cast. Accepts Python ints and numpy integers (__index__).
std::uint64_t unsigned_arg(const py::handle& value, const char* arg, std::uint64_t max) {
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    PACKPIPE_THROW(InvalidArgument, "{} must be an integer, found {} of type {}", arg, std::string(py::repr(value)),
                   std::string(py::str(py::type::of(value).attr("__name__"))));
  }
  const py::object v = py::reinterpret_steal<py::object>(index);
  PACKPIPE_CHECK_ARG(PyObject_RichCompareBool(v.ptr(), py::int_(0).ptr(), Py_GE) == 1,
                     "{} must not be negative, found {}", arg, std::string(py::repr(v)));
  const unsigned long long u = PyLong_AsUnsignedLongLong(v.ptr());
  const bool overflow = u == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr;
  if (overflow) PyErr_Clear();
  PACKPIPE_CHECK_ARG(!overflow && u <= max, "{} must be at most {}, found {}", arg, max, std::string(py::repr(v)));
  return static_cast<std::uint64_t>(u);
}

PyPartitionCache::Use::Use(PyPartitionCache* c, const std::shared_ptr<cm::CostModel>& cost) : owner(c) {
  if (c == nullptr) return;
  PACKPIPE_CHECK_ARG(c->busy.try_lock(), "this PartitionCache is in use by another thread: keep one per thread");
  c->cost = cost;  // held so that no other model can take its address while the memo refers to it
}

PyPartitionCache::Use::~Use() {
  if (owner != nullptr) owner->busy.unlock();
}

part::PartitionCache* PyPartitionCache::Use::get() const { return owner ? &owner->cache : nullptr; }

void declare_partition(py::module_& m) {
  py::class_<PyPartitionCache, std::shared_ptr<PyPartitionCache>>(
      m, "PartitionCache",
      "Micro-batch shape costs kept across partition() / plan_batch() calls, as a training loop's planner keeps "
      "them: shapes recur between global batches, so later calls skip most cost-model queries. Results never "
      "depend on it. One per thread (a call while another thread uses it raises); it keeps the last cost model "
      "it served alive.")
      .def(py::init<>())
      .def_property_readonly("shapes", [](const PyPartitionCache& c) { return c.cache.shapes(); },
                             "Micro-batch shapes (rows, lengths) memoised so far")
      .def("__repr__", [](const PyPartitionCache& c) {
        return "<packpipe.PartitionCache shapes=" + std::to_string(c.cache.shapes()) + ">";
      });
}

void define_partition(py::module_& m) {
  m.def(
      "partition",
      [](const py::object& input_lengths, const std::shared_ptr<cm::CostModel>& cost, const py::object& target_lengths,
         std::int64_t stages, std::int64_t layers_per_stage, std::int64_t chunks, std::int64_t dp, std::int64_t tp,
         double memory_mb, int zero_stage, const std::string& method, std::int64_t mbs, const py::object& tokens,
         std::int64_t round_multiple, const std::string& recompute, const std::string& oversize,
         const std::string& basis, bool pack_windows, const std::shared_ptr<PyPartitionCache>& cache,
         const std::string& order, std::int64_t threads) {
        PACKPIPE_CHECK_ARG(cost != nullptr, "cost_model must not be None");
        PACKPIPE_CHECK_ARG(threads >= 0 && threads <= 1024, "threads must be in [0, 1024] (0: automatic), found {}",
                           threads);
        PACKPIPE_CHECK_ARG(mbs >= 0 && mbs <= (std::int64_t{1} << 31), "mbs must be in [0, 2^31], found {}", mbs);
        part::BatchLengths b;
        b.input = lengths_arg(input_lengths, "input_lengths");
        b.target = lengths_arg(target_lengths, "target_lengths");
        PACKPIPE_CHECK_ARG(b.target.empty() || b.target.size() == b.input.size(),
                           "target_lengths has {} entries but input_lengths has {}", b.target.size(), b.input.size());
        part::PipelineShape sh;
        sh.stages = stages;
        sh.layers_per_stage = layers_per_stage;
        sh.chunks = chunks;
        sh.dp = dp;
        sh.tp = tp;
        sh.memory_limit_mb = memory_mb;
        sh.zero_stage = zero_stage;
        part::PartitionOptions o;
        o.method = part::partition_method_from_name(method);
        o.microbatch_size = mbs;
        o.token_budget = unsigned_arg(tokens, "tokens", std::uint64_t{1} << 40);
        o.round_multiple = round_multiple;
        o.recompute = part::recompute_policy_from_name(recompute);
        o.oversize = part::oversize_policy_from_name(oversize);
        o.basis = part::cost_basis_from_name(basis);
        o.pack_windows = pack_windows;
        o.order = part::enc_dec_order_from_name(order);
        o.threads = static_cast<int>(threads);
        const PyPartitionCache::Use use(cache.get(), cost);
        o.cache = use.get();
        part::Partition p;
        {
          py::gil_scoped_release release;
          p = part::partition(b, *cost, sh, o);
        }
        return partition_dict(p);
      },
      py::arg("input_lengths"), py::arg("cost_model"), py::arg("target_lengths") = py::none(), py::arg("stages") = 1,
      py::arg("layers_per_stage") = 0, py::arg("chunks") = 1, py::arg("dp") = 1, py::arg("tp") = 1,
      py::arg("memory_mb") = 0.0, py::arg("zero_stage") = 1, py::arg("method") = "dp", py::arg("mbs") = 0,
      py::arg("tokens") = py::int_(0), py::arg("round_multiple") = 8, py::arg("recompute") = "auto",
      py::arg("oversize") = "error", py::arg("cost_basis") = "auto", py::arg("pack_windows") = false,
      py::arg("cache") = nullptr, py::arg("order") = "auto", py::arg("threads") = 0,
      "Micro-batches of one global batch. input_lengths (and target_lengths for encoder-decoder models): "
      "1-D numpy arrays of uint32 or int64. Returns a dict: microbatches (dicts with numpy 'samples'), "
      "objective_ms, efficiency, predicted_iteration_ms, ranks, truncated, dropped, ... cache: a "
      "packpipe.PartitionCache kept across calls (a training loop's planner), or None. order: "
      "encoder-decoder sample order for dp, 'auto', 'sorted' (DynaPipe's) or 'path'. threads: threads building "
      "the window table (0: automatic, at most 2; the result is the same).");
}

}  // namespace packpipe::bindings
