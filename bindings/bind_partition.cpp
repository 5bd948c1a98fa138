// Python bindings of the micro-batch partition: the option classes packpipe.PipelineShape and
// packpipe.PartitionOptions (one spelling per parameter, the CLI's), the results packpipe.Partition
// and packpipe.MicroBatch (arrays are zero-copy views), packpipe.PartitionCache and
// packpipe.partition(cost_model, input_lengths, target_lengths, *, shape, options, cache) and
// packpipe.balanced_stage_layers(cost_model, shape, rows, seq, dec_seq).
#include <cstdint>
#include <limits>
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
#include "planner/planner.h"

namespace py = pybind11;

namespace packpipe::bindings {

namespace {

namespace cm = packpipe::costmodel;
namespace part = packpipe::partition;

using ShapeClass = py::class_<part::PipelineShape>;
using OptionsClass = py::class_<part::PartitionOptions>;
using MicroBatchClass = py::class_<part::MicroBatch>;
using PartitionClass = py::class_<part::Partition>;

/// A read-only numpy view of the vector `member` of the bound object `self`.
template <typename Obj, typename T>
auto view_of(std::vector<T> Obj::*member) {
  return [member](const py::object& self) { return view_vector(self.cast<const Obj&>().*member, self); };
}

/// Layers per virtual stage from a sequence of integers (a list, a tuple or a 1-D integer array): each
/// through count_arg, named "stage_layers[i]"; anything else raises ValueError naming stage_layers.
std::vector<std::int64_t> stage_layers_arg(const py::object& value) {
  const bool sequence = py::isinstance<py::sequence>(value) && !py::isinstance<py::str>(value) &&
                        !py::isinstance<py::bytes>(value);
  PACKPIPE_CHECK_ARG(sequence, "stage_layers must be a sequence of integers (layers per virtual stage), found {} of "
                     "type {}", std::string(py::repr(value)),
                     std::string(py::str(py::type::of(value).attr("__name__"))));
  const auto seq = py::reinterpret_borrow<py::sequence>(value);
  std::vector<std::int64_t> out;
  out.reserve(seq.size());
  for (std::size_t v = 0; v < seq.size(); ++v) {
    out.push_back(count_arg<std::int64_t>(seq[v], ("stage_layers[" + std::to_string(v) + "]").c_str()));
  }
  return out;
}

const std::vector<const char*> kShapeFields = {"stages", "chunks", "layers_per_stage", "dp", "tp", "zero", "memory_mb"};

void define_shape(py::module_& m) {
  auto cls = py::reinterpret_borrow<ShapeClass>(m.attr("PipelineShape"));
  cls.def(py::init([](const py::object& stages, const py::object& chunks, const py::object& layers_per_stage,
                      const py::object& dp, const py::object& tp, const py::object& zero, double memory_mb,
                      const py::object& stage_layers) {
            part::PipelineShape s;
            s.stages = count_arg<std::int64_t>(stages, "stages");
            s.chunks = count_arg<std::int64_t>(chunks, "chunks");
            s.layers_per_stage = count_arg<std::int64_t>(layers_per_stage, "layers_per_stage");
            s.dp = count_arg<std::int64_t>(dp, "dp");
            s.tp = count_arg<std::int64_t>(tp, "tp");
            s.zero_stage = count_arg<int>(zero, "zero");
            s.memory_limit_mb = memory_mb;
            s.stage_layers = stage_layers_arg(stage_layers);
            part::check_shape(s);
            return s;
          }),
          py::kw_only(), py::arg("stages") = 1, py::arg("chunks") = 1, py::arg("layers_per_stage") = 0,
          py::arg("dp") = 1, py::arg("tp") = 1, py::arg("zero") = 1, py::arg("memory_mb") = 0.0,
          py::arg("stage_layers") = py::tuple(),
          "The pipeline of one training job (the CLI's --stages, --chunks, --layers-per-stage, --dp, --tp, --zero, "
          "--memory-mb, --layer-split). Sizes out of range raise ValueError naming the field.");
  def_field(cls, "stages", &part::PipelineShape::stages, "pipeline ranks", &part::check_shape);
  def_field(cls, "chunks", &part::PipelineShape::chunks, "virtual stages per rank (interleaved schedules)",
            &part::check_shape);
  def_field(cls, "layers_per_stage", &part::PipelineShape::layers_per_stage,
            "transformer layers per virtual stage; 0: the model's layers / (stages x chunks)", &part::check_shape);
  def_field(cls, "dp", &part::PipelineShape::dp, "data-parallel replicas", &part::check_shape);
  def_field(cls, "tp", &part::PipelineShape::tp, "tensor-parallel ranks", &part::check_shape);
  def_field(cls, "zero", &part::PipelineShape::zero_stage, "ZeRO stage of the optimizer state (0-3)",
            &part::check_shape);
  def_field(cls, "memory_mb", &part::PipelineShape::memory_limit_mb,
            "memory limit per device, MB = 1e6 bytes; 0: the device's memory", &part::check_shape);
  cls.def_property(
      "stage_layers", [](const part::PipelineShape& s) { return s.stage_layers; },
      [](part::PipelineShape& s, const py::object& value) {
        part::PipelineShape c = s;
        c.stage_layers = stage_layers_arg(value);
        part::check_shape(c);  // on a copy: a refused value leaves the shape as it was
        s = std::move(c);
      },
      "layers of each virtual stage in pipeline order, an uneven split (e.g. balanced_stage_layers()); one entry "
      "per virtual stage, each at least 1; []: layers_per_stage, or the model's layers split evenly. "
      "Encoder-decoder models: the first half are encoder stages, the second decoder stages");
  std::vector<const char*> fields = kShapeFields;
  fields.push_back("stage_layers");
  def_value(cls, fields);
  // The repr round-trips through eval: stage_layers as a list (not "[n items]"), and only when set.
  cls.attr("__repr__") = py::cpp_function(
      [](const py::handle& self) {
        std::string out = record_repr(self, kShapeFields);
        const auto& layers = self.cast<const part::PipelineShape&>().stage_layers;
        if (layers.empty()) return out;
        out.pop_back();
        return out + ", stage_layers=" + std::string(py::repr(py::cast(layers))) + ")";
      },
      py::name("__repr__"), py::is_method(cls));
}


}  // namespace

LayoutSet layout_set_arg(const py::object& value) {
  if (py::isinstance<py::str>(value)) return layout_set_from_names(value.cast<std::string>());
  PACKPIPE_CHECK_ARG(py::isinstance<py::sequence>(value) && !py::isinstance<py::bytes>(value),
                     "layouts must be a sequence of layout names ({}), found {}", enum_name_list(kLayoutNames),
                     std::string(py::repr(value)));
  LayoutSet set = 0;
  for (const auto& item : py::reinterpret_borrow<py::sequence>(value)) {
    PACKPIPE_CHECK_ARG(py::isinstance<py::str>(item), "layouts: expected layout names ({}), found {}",
                       enum_name_list(kLayoutNames), std::string(py::repr(item)));
    const LayoutSet bit = layout_bit(layout_from_name(item.cast<std::string>()));
    PACKPIPE_CHECK_ARG((set & bit) == 0, "layouts {}: '{}' is listed twice", std::string(py::repr(value)),
                       item.cast<std::string>());
    set |= bit;
  }
  PACKPIPE_CHECK_ARG(set != 0, "layouts must name at least one layout ({})", enum_name_list(kLayoutNames));
  return set;
}

// A layout name or None (the method's default).
std::optional<Layout> optional_layout(const py::object& value) {
  if (value.is_none()) return std::nullopt;
  PACKPIPE_CHECK_ARG(py::isinstance<py::str>(value), "layout must be None or one of {}, found {}",
                     enum_name_list(kLayoutNames), py::repr(value).cast<std::string>());
  return layout_from_name(value.cast<std::string>());
}

py::tuple layout_set_list(LayoutSet set) {
  py::list out;
  for (const auto& e : kLayoutNames) {
    if (has_layout(set, e.value)) out.append(e.name);
  }
  return py::tuple(out);
}

namespace {

void define_options(py::module_& m) {
  auto cls = py::reinterpret_borrow<OptionsClass>(m.attr("PartitionOptions"));
  cls.def(py::init([](const std::string& method, const py::object& mbs, const py::object& tokens,
                      const py::object& round_multiple, const std::string& recompute, const std::string& oversize,
                      const std::string& cost_basis, const std::string& order, const BoolArg& pack_windows,
                      const py::object& threads, const py::object& layouts, const py::object& layout,
                      const py::object& capacity, const std::string& slicing, const py::object& min_slice_tokens) {
            part::PartitionOptions o;
            o.method = part::partition_method_from_name(method);
            o.microbatch_size = count_arg<std::int64_t>(mbs, "mbs");
            o.token_budget = count_arg<std::uint64_t>(tokens, "tokens");
            o.round_multiple = count_arg<std::int64_t>(round_multiple, "round_multiple");
            o.recompute = part::recompute_policy_from_name(recompute);
            o.oversize = part::oversize_policy_from_name(oversize);
            o.basis = part::cost_basis_from_name(cost_basis);
            o.order = part::enc_dec_order_from_name(order);
            o.pack_windows = bool_of(pack_windows, "pack_windows");
            o.threads = count_arg<int>(threads, "threads");
            o.layouts = layout_set_arg(layouts);
            o.layout = optional_layout(layout);
            o.capacity = count_arg<std::uint64_t>(capacity, "capacity");
            o.slicing = part::slice_policy_from_name(slicing);
            o.min_slice_tokens = count_arg<std::uint32_t>(min_slice_tokens, "min_slice_tokens");
            return o;
          }),
          py::kw_only(), py::arg("method") = "dp", py::arg("mbs") = 0, py::arg("tokens") = 0,
          py::arg("round_multiple") = 8, py::arg("recompute") = "auto", py::arg("oversize") = "error",
          py::arg("cost_basis") = "auto", py::arg("order") = "auto", py::arg("pack_windows") = false,
          py::arg("threads") = 0, py::arg("layouts") = py::make_tuple("padded", "packed"), py::arg("layout") = py::none(),
          py::arg("capacity") = 0, py::arg("slicing") = "auto", py::arg("min_slice_tokens") = 64,
          "How a global batch is cut into micro-batches (the CLI's --method, --mbs, --tokens, --round-multiple, "
          "--recompute, --oversize, --cost-basis, --order, --pack-windows, --threads, --layouts, --layout, "
          "--capacity, --slicing, --min-slice-tokens). Names are checked when set (ValueError listing the valid "
          "ones); ranges when used.");
  def_named(cls, "method", &part::PartitionOptions::method, &part::partition_method_name,
            &part::partition_method_from_name, "dp, dynapipe, fixed, tokens, packing, wlb or slicing");
  def_field(cls, "mbs", &part::PartitionOptions::microbatch_size, "fixed / packing: samples (rows) per micro-batch");
  def_field(cls, "tokens", &part::PartitionOptions::token_budget, "tokens: padded tokens per micro-batch");
  def_field(cls, "round_multiple", &part::PartitionOptions::round_multiple,
            "padded lengths rounded up to this multiple");
  def_named(cls, "recompute", &part::PartitionOptions::recompute, &part::recompute_policy_name,
            &part::recompute_policy_from_name, "activation recompute allowed: auto, none, selective or full");
  def_named(cls, "oversize", &part::PartitionOptions::oversize, &part::oversize_policy_name,
            &part::oversize_policy_from_name,
            "a sample that cannot fit alone: error, truncate, drop or slice (decoder-only: cut into slices that fit)");
  def_named(cls, "cost_basis", &part::PartitionOptions::basis, &part::cost_basis_name, &part::cost_basis_from_name,
            "how micro-batch time and memory are computed: auto, stages or dynapipe");
  def_named(cls, "order", &part::PartitionOptions::order, &part::enc_dec_order_name, &part::enc_dec_order_from_name,
            "encoder-decoder sample order for dp: auto, sorted (DynaPipe's) or path");
  def_field(cls, "pack_windows", &part::PartitionOptions::pack_windows,
            "dp / dynapipe: pack each window's samples when cheaper");
  def_field(cls, "threads", &part::PartitionOptions::threads,
            "threads building the window table (0: automatic, at most 2); the result is the same");
  cls.def_property(
      "layouts", [](const part::PartitionOptions& o) { return layout_set_list(o.layouts); },
      [](part::PartitionOptions& o, const py::object& v) { o.layouts = layout_set_arg(v); },
      "the layouts the executor runs: 'padded' and/or 'packed' (varlen attention), which the dp method's "
      "micro-batches may take, and 'packed-mask' (dense rows under a block mask); a baseline is a candidate for the "
      "plan only in one of them");
  cls.def_property(
      "layout",
      [](const part::PartitionOptions& o) {
        return o.layout ? py::object(py::str(layout_name(*o.layout))) : py::object(py::none());
      },
      [](part::PartitionOptions& o, const py::object& v) { o.layout = optional_layout(v); },
      "packing: 'packed' (rows flattened under varlen attention, the default) or 'packed-mask' (dense rows, block "
      "mask); fixed: 'padded' (the default) or 'packed' (a micro-batch's samples flattened into one varlen row, HF's "
      "DataCollatorWithFlattening); None: the method's default (refused when set for another method)");
  def_field(cls, "capacity", &part::PartitionOptions::capacity,
            "packing / wlb: tokens per row (0: the longest sample's); slicing: the slice length");
  def_named(cls, "slicing", &part::PartitionOptions::slicing, &part::slice_policy_name, &part::slice_policy_from_name,
            "dp, decoder-only: 'auto' (long samples may be cut into slices that pipeline) or 'off'");
  def_field(cls, "min_slice_tokens", &part::PartitionOptions::min_slice_tokens, "the shortest slice, tokens");
  def_field(cls, "slices_refused", &part::PartitionOptions::slices_refused,
            "non-empty: slices cannot run where the plan is executed, and why; the partition then cuts none, and a "
            "sample that fits only sliced is refused with this reason (PlanLoader(labels='unshifted') sets it)");
  def_value(cls, {"method", "mbs", "tokens", "round_multiple", "recompute", "oversize", "cost_basis", "order",
                  "pack_windows", "threads", "layouts", "layout", "capacity", "slicing", "min_slice_tokens",
                  "slices_refused"});
  // The repr round-trips through eval: layouts as a tuple of names (not "[n items]").
  cls.attr("__repr__") = py::cpp_function(
      [](const py::handle& self) {
        std::string out = record_repr(self, {"method", "mbs", "tokens", "round_multiple", "recompute", "oversize",
                                             "cost_basis", "order", "pack_windows", "threads"});
        const auto& o = self.cast<const part::PartitionOptions&>();
        out.pop_back();
        return out + ", layouts=" + std::string(py::repr(layout_set_list(o.layouts))) + ", layout=" +
               (o.layout ? "'" + std::string(layout_name(*o.layout)) + "'" : std::string("None")) +
               ", capacity=" + std::to_string(o.capacity) + ", slicing='" + part::slice_policy_name(o.slicing) +
               "', min_slice_tokens=" + std::to_string(o.min_slice_tokens) + ")";
      },
      py::name("__repr__"), py::is_method(cls));
}

void define_results(py::module_& m) {
  auto mb = py::reinterpret_borrow<MicroBatchClass>(m.attr("MicroBatch"));
  mb.def_property_readonly("samples", view_of(&part::MicroBatch::samples),
                           "uint32 indices into the global batch, in row order (read-only view)")
      .def_property_readonly("row_offsets", view_of(&part::MicroBatch::row_offsets),
                             "packed rows as CSR offsets into samples (rows + 1 entries); empty: one row per sample")
      .def_property_readonly("rows", &part::MicroBatch::rows, "rows (sequences)")
      .def_property_readonly(
          "layout", [](const part::MicroBatch& b) { return std::string(layout_name(b.layout)); },
          "'padded' (one sample a row), 'packed' (one row, varlen attention) or 'packed-mask' (rows, block mask)")
      .def_property_readonly(
          "attention",
          [](const part::MicroBatch& b) {
            return py::make_tuple(b.attention.self, b.attention.dec_self, b.attention.cross, b.attention.prefix,
                                  b.attention.prefix_tokens);
          },
          "packed: the attention sums (sum of l^2, sum of d^2, sum of d x l, sum of l x p and sum of p over its "
          "slices' kept prefixes) the cost model charged; else zeros")
      .def_property_readonly(
          "spans",
          [](const part::MicroBatch& b) {
            py::list out;
            for (const auto& sp : b.spans) out.append(py::make_tuple(sp.begin, sp.length));
            return out;
          },
          "slices: per sample in `samples`, (begin, length), the tokens of the sample it holds (a slice attends to "
          "the begin tokens before it, kept from earlier micro-batches); empty: every sample whole")
      .def_readonly("padded_len", &part::MicroBatch::padded_len,
                    "tokens every row is padded to (encoder, or the whole sample)")
      .def_readonly("padded_dec_len", &part::MicroBatch::padded_dec_len,
                    "decoder tokens per row (encoder-decoder), else 0")
      .def_readonly("tokens", &part::MicroBatch::tokens, "real tokens, input plus target")
      .def_property_readonly(
          "recompute", [](const part::MicroBatch& b) { return std::string(cm::recompute_name(b.recompute)); },
          "activation recompute: none, selective or full")
      .def_readonly("time_ms", &part::MicroBatch::time_ms,
                    "predicted forward + backward (+ recompute) time of its slowest stage")
      .def_readonly("stored_mb", &part::MicroBatch::stored_mb,
                    "activations stored per in-flight copy on its largest stage (MB = 1e6 bytes)")
      .def_readonly("peak_mb", &part::MicroBatch::peak_mb, "transient peak on its largest stage");
  def_repr(mb, {"rows", "padded_len", "padded_dec_len", "tokens", "recompute", "time_ms", "stored_mb", "peak_mb"});

  auto p = py::reinterpret_borrow<PartitionClass>(m.attr("Partition"));
  p.def_property_readonly(
       "microbatches",
       [](const py::object& self) { return views_of(self.cast<const part::Partition&>().microbatches, self); },
       "the micro-batches (MicroBatch, views into this result), in the order of the sample order used")
      .def_readonly("ranks", &part::Partition::ranks, "micro-batch indices per data-parallel rank, ascending")
      .def_readonly("alternatives", &part::Partition::alternatives,
                    "dp: other partitions of the batch that fit (other micro-batch counts, sliced or not), which the "
                    "planner simulates too (the objective is the 1F1B bound)")
      .def_readonly("rank_time_ms", &part::Partition::rank_time_ms, "sum of time_ms per data-parallel rank")
      .def_property_readonly("order", view_of(&part::Partition::order), "sample order the windows were cut from")
      .def_readonly("objective_ms", &part::Partition::objective_ms,
                    "what the method minimised ((S-1) tau/c + sum/d for dp and dynapipe)")
      .def_readonly("tau_ms", &part::Partition::tau_ms,
                    "cap charged (dynapipe: the chosen candidate; others: the realised max)")
      .def_readonly("max_time_ms", &part::Partition::max_time_ms, "realised max over micro-batches")
      .def_readonly("sum_time_ms", &part::Partition::sum_time_ms, "sum over micro-batches")
      .def_readonly("predicted_iteration_ms", &part::Partition::predicted_iteration_ms,
                    "(S-1) max/c + sum/d: the 1F1B bound, not a simulation")
      .def_readonly("input_tokens", &part::Partition::input_tokens, "real input tokens (after truncation)")
      .def_readonly("target_tokens", &part::Partition::target_tokens, "real target tokens (after truncation)")
      .def_readonly("padded_input_tokens", &part::Partition::padded_input_tokens, "rows x padded lengths, input")
      .def_readonly("padded_target_tokens", &part::Partition::padded_target_tokens, "rows x padded lengths, target")
      .def_readonly("efficiency", &part::Partition::efficiency, "real / padded tokens, input and target together")
      .def_readonly("input_efficiency", &part::Partition::input_efficiency, "encoder (or whole-sample) side")
      .def_readonly("target_efficiency", &part::Partition::target_efficiency, "decoder side (0 for decoder-only)")
      .def_property_readonly(
          "cost_basis", [](const part::Partition& r) { return std::string(part::cost_basis_name(r.basis)); },
          "the basis the times and memory use: stages or dynapipe")
      .def_property_readonly(
          "dynapipe_recompute",
          [](const part::Partition& r) { return std::string(cm::recompute_name(r.dynapipe_recompute)); },
          "dynapipe: the iteration-wide recompute mode chosen")
      .def_readonly("memory_limit_mb", &part::Partition::memory_limit_mb, "the memory limit checked")
      .def_property_readonly("truncated", view_of(&part::Partition::truncated),
                             "sample ids truncated (oversize 'truncate')")
      .def_property_readonly("dropped", view_of(&part::Partition::dropped), "sample ids dropped (oversize 'drop')")
      .def_readonly("tau_evaluations", &part::Partition::tau_evaluations, "min-sum DP runs (one per cap tried)");
  def_repr(p, {"microbatches", "objective_ms", "predicted_iteration_ms", "efficiency", "cost_basis"});
}

}  // namespace

namespace {

// The integer value of `value` (a Python or numpy integer, through __index__); InvalidArgument naming
// `arg` for anything else, a bool included (True is no count).
py::object integer_of(const py::handle& value, const char* arg) {
  auto type_name = [&] { return std::string(py::str(py::type::of(value).attr("__name__"))); };
  PACKPIPE_CHECK_ARG(!PyBool_Check(value.ptr()) && type_name() != "bool_",
                     "{} must be an integer, found {} of type {}", arg, std::string(py::repr(value)), type_name());
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    PACKPIPE_THROW(InvalidArgument, "{} must be an integer, found {} of type {}", arg, std::string(py::repr(value)),
                   type_name());
  }
  return py::reinterpret_steal<py::object>(index);
}

}  // namespace

std::int64_t int_arg(const py::handle& value, const char* arg, std::int64_t lo, std::int64_t hi) {
  const py::object v = integer_of(value, arg);
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (x == -1 && overflow == 0 && PyErr_Occurred() != nullptr) PyErr_Clear();
  PACKPIPE_CHECK_ARG(overflow == 0 && x >= lo && x <= hi, "{} must be an integer in [{}, {}], found {}", arg, lo, hi,
                     std::string(py::repr(v)));
  return static_cast<std::int64_t>(x);
}

std::vector<std::int64_t> int_list_arg(const py::handle& value, const char* arg, std::int64_t lo, std::int64_t hi) {
  PACKPIPE_CHECK_ARG(py::isinstance<py::sequence>(value) && !py::isinstance<py::str>(value) &&
                         !py::isinstance<py::bytes>(value),
                     "{} must be a list of integers, found {} of type {}", arg, std::string(py::repr(value)),
                     std::string(py::str(py::type::of(value).attr("__name__"))));
  std::vector<std::int64_t> out;
  const auto seq = py::reinterpret_borrow<py::sequence>(value);
  for (std::size_t k = 0; k < seq.size(); ++k) {
    const std::string name = fmt::format("{}[{}]", arg, k);
    out.push_back(int_arg(seq[k], name.c_str(), lo, hi));
  }
  return out;
}

bool bool_arg(const py::handle& value, const char* arg) {
  const py::handle cls = py::type::of(value);
  const std::string type = py::str(cls.attr("__name__"));
  // numpy's bool scalar: numpy.bool_ (numpy.bool from numpy 2)
  const bool numpy_bool = py::str(cls.attr("__module__")).cast<std::string>() == "numpy" && (type == "bool_" || type == "bool");
  PACKPIPE_CHECK_ARG(PyBool_Check(value.ptr()) || numpy_bool, "{} must be True or False, found {} of type {}", arg,
                     std::string(py::repr(value)), type);
  return PyObject_IsTrue(value.ptr()) == 1;
}

std::uint64_t unsigned_arg(const py::handle& value, const char* arg, std::uint64_t max) {
  const py::object v = integer_of(value, arg);
  PACKPIPE_CHECK_ARG(PyObject_RichCompareBool(v.ptr(), py::int_(0).ptr(), Py_GE) == 1,
                     "{} must not be negative, found {}", arg, std::string(py::repr(v)));
  const unsigned long long u = PyLong_AsUnsignedLongLong(v.ptr());
  const bool overflow = u == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr;
  if (overflow) PyErr_Clear();
  PACKPIPE_CHECK_ARG(!overflow && u <= max, "{} must be at most {}, found {}", arg, max, std::string(py::repr(v)));
  return static_cast<std::uint64_t>(u);
}

part::BatchLengths batch_arg(const py::object& input_lengths, const py::object& target_lengths) {
  part::BatchLengths b;
  b.input = lengths_arg(input_lengths, "input_lengths");
  b.target = lengths_arg(target_lengths, "target_lengths");
  PACKPIPE_CHECK_ARG(b.target.empty() || b.target.size() == b.input.size(),
                     "target_lengths has {} entries but input_lengths has {}", b.target.size(), b.input.size());
  return b;
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
  ShapeClass(m, "PipelineShape", "The pipeline of one training job: ranks, interleaving, replicas, memory.");
  OptionsClass(m, "PartitionOptions", "How a global batch is cut into micro-batches.");
  MicroBatchClass(m, "MicroBatch", "Some samples of a global batch, their padded shape, recompute mode and costs.");
  PartitionClass(m, "Partition", "The micro-batches of one global batch and what they cost.");
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
  define_shape(m);
  define_options(m);
  define_results(m);
  m.def(
      "partition",
      [](const std::shared_ptr<cm::CostModel>& cost, const py::object& input_lengths, const py::object& target_lengths,
         const part::PipelineShape& shape, const part::PartitionOptions& options,
         const std::shared_ptr<PyPartitionCache>& cache) {
        PACKPIPE_CHECK_ARG(cost != nullptr, "cost_model must not be None");
        const part::BatchLengths b = batch_arg(input_lengths, target_lengths);
        part::PartitionOptions o = options;
        const PyPartitionCache::Use use(cache.get(), cost);
        o.cache = use.get();
        py::gil_scoped_release release;
        return part::partition(b, *cost, shape, o);
      },
      py::arg("cost_model"), py::arg("input_lengths"), py::arg("target_lengths") = py::none(), py::kw_only(),
      py::arg("shape") = part::PipelineShape{}, py::arg("options") = part::PartitionOptions{},
      py::arg("cache") = nullptr,
      "Micro-batches of one global batch: a Partition. input_lengths (and target_lengths for encoder-decoder "
      "models): 1-D integer arrays or lists of tokens per sample. cache: a PartitionCache kept across calls (a "
      "training loop's planner), or None; results never depend on it.");
  m.def(
      "evaluate_partition",
      [](const std::shared_ptr<cm::CostModel>& cost, const py::object& input_lengths, const py::object& target_lengths,
         const py::list& microbatches, const part::PipelineShape& shape, const part::PartitionOptions& options,
         const std::string& basis, const std::string& layout) {
        PACKPIPE_CHECK_ARG(cost != nullptr, "cost_model must not be None");
        const part::BatchLengths b = batch_arg(input_lengths, target_lengths);
        std::vector<part::MicroBatch> mbs(microbatches.size());
        for (std::size_t i = 0; i < mbs.size(); ++i) {
          const std::string arg = fmt::format("microbatches[{}]", i);
          const auto item = py::reinterpret_borrow<py::object>(microbatches[i]);
          if (py::isinstance<part::MicroBatch>(item)) {  // a partition's micro-batch: its samples, slices, rows, layout
            const auto& given = item.cast<const part::MicroBatch&>();
            mbs[i].samples = given.samples;
            mbs[i].spans = given.spans;
            mbs[i].row_offsets = given.layout == Layout::PackedMask ? given.row_offsets : std::vector<std::uint32_t>{};
            mbs[i].layout = given.layout;
            continue;
          }
          mbs[i].samples = lengths_arg(item, arg.c_str());
          mbs[i].layout = layout_from_name(layout);
        }
        const part::CostBasis cb = part::cost_basis_from_name(basis);
        py::gil_scoped_release release;
        return part::evaluate_partition(b, *cost, shape, part::virtual_stages(cost->model(), shape), std::move(mbs),
                                        options, cb);
      },
      py::arg("cost_model"), py::arg("input_lengths"), py::arg("target_lengths") = py::none(), py::kw_only(),
      py::arg("microbatches"), py::arg("shape") = part::PipelineShape{}, py::arg("options") = part::PartitionOptions{},
      py::arg("basis") = "stages", py::arg("layout") = "padded",
      "Given micro-batches (MicroBatch objects of a Partition, keeping their layout, rows and slices, or 1-D arrays of "
      "sample indices laid out as `layout`: 'padded', one row per sample, or 'packed', one varlen row) costed on "
      "a cost basis ('stages' or 'dynapipe'): a Partition with their shapes, recompute modes (the fastest that "
      "fits under options.recompute), times, memory and objective (S-1) max/c + sum/d, e.g. to put another "
      "planner's micro-batches on packpipe's footing. Samples in no micro-batch are listed in `dropped` (the "
      "figures are the micro-batches'); ValueError naming a micro-batch that does not fit, an index out of range, "
      "or a sample given twice.");
  m.def(
      "balanced_stage_layers",
      [](const std::shared_ptr<cm::CostModel>& cost, const part::PipelineShape& shape, const py::object& rows,
         const py::object& seq, const py::object& dec_seq) {
        PACKPIPE_CHECK_ARG(cost != nullptr, "cost_model must not be None");
        const auto r = count_arg<std::int64_t>(rows, "rows");
        const auto s = count_arg<std::int64_t>(seq, "seq");
        const auto d = count_arg<std::int64_t>(dec_seq, "dec_seq");
        py::gil_scoped_release release;
        return planner::balanced_stage_layers(*cost, shape, r, s, d);
      },
      py::arg("cost_model"), py::arg("shape"), py::arg("rows"), py::arg("seq"), py::arg("dec_seq") = 0,
      "An uneven layer split for PipelineShape.stage_layers (the CLI's --layer-split balanced): the layers of "
      "each virtual stage of `shape` that balance the stages' forward + backward time of a micro-batch of `rows` "
      "rows of `seq` tokens (`dec_seq` decoder tokens for encoder-decoder models) on the cost model, the "
      "embedding counted on the first stage and the LM head on the last. Uses every layer of the model; [] for "
      "one virtual stage of an encoder-decoder model. ValueError when the model has fewer layers than stages.");
}

}  // namespace packpipe::bindings
