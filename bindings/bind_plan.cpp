// Python bindings of plans and instruction streams: packpipe.Plan (header fields, streams as
// Instruction objects and as numpy structured arrays, validation, JSON and binary forms, PyTorch
// export), packpipe.PlanFileReader / PlanFileWriter.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "costmodel/cost_model.h"
#include "plan/export_pytorch.h"
#include "plan/builder.h"
#include "plan/format.h"
#include "plan/validator.h"

namespace py = pybind11;
namespace pl = packpipe::plan;

namespace packpipe::bindings {

namespace {

// One row of Plan.instructions(rank); -1 marks an absent field.
struct Row {
  std::int32_t mb, stage, peer, in, in2, out, shape;
  std::uint8_t opcode;
  std::uint8_t pad[3];
};
static_assert(sizeof(Row) == 32, "Row layout");

py::object opt(std::uint32_t v) { return v == pl::kNone ? py::object(py::none()) : py::object(py::int_(v)); }
std::int32_t as_i32(std::uint32_t v) { return v == pl::kNone ? -1 : static_cast<std::int32_t>(v); }

py::object row_dtype() {
  py::dict d;
  d["names"] = py::make_tuple("opcode", "mb", "stage", "peer", "in", "in2", "out", "shape");
  d["formats"] = py::make_tuple("u1", "<i4", "<i4", "<i4", "<i4", "<i4", "<i4", "<i4");
  d["offsets"] = py::make_tuple(offsetof(Row, opcode), offsetof(Row, mb), offsetof(Row, stage), offsetof(Row, peer),
                                offsetof(Row, in), offsetof(Row, in2), offsetof(Row, out), offsetof(Row, shape));
  d["itemsize"] = sizeof(Row);
  return py::module_::import("numpy").attr("dtype")(d);
}

py::array stream_array(const pl::Plan& p, std::int64_t rank) {
  PACKPIPE_CHECK_RANGE(rank >= 0 && rank < static_cast<std::int64_t>(p.streams.size()), "rank {} out of range (plan has {})",
                       rank, p.streams.size());
  const auto& st = p.streams[static_cast<std::size_t>(rank)];
  auto* rows = new std::vector<Row>(st.size());
  for (std::size_t i = 0; i < st.size(); ++i) {
    const auto& s = st[i];
    Row& r = (*rows)[i];
    std::memset(&r, 0, sizeof(Row));
    r.opcode = static_cast<std::uint8_t>(s.op);
    r.mb = as_i32(s.mb);
    r.stage = as_i32(s.stage);
    r.peer = as_i32(s.peer);
    r.in = as_i32(s.in);
    r.in2 = as_i32(s.in2);
    r.out = as_i32(s.out);
    r.shape = as_i32(s.shape);
  }
  py::capsule owner(rows, [](void* v) { delete static_cast<std::vector<Row>*>(v); });
  const py::dtype dt = py::reinterpret_borrow<py::dtype>(row_dtype());
  return py::array(dt, {static_cast<py::ssize_t>(rows->size())}, {static_cast<py::ssize_t>(sizeof(Row))}, rows->data(), owner);
}

py::dict mb_dict(const pl::Plan& p, std::size_t m) {
  const auto& mb = p.microbatches[m];
  py::dict d;
  d["rows"] = mb.rows;
  d["padded_len"] = mb.padded_len;
  d["padded_dec_len"] = mb.padded_dec_len;
  d["tokens"] = mb.tokens;
  d["loss_weight"] = mb.loss_weight;
  d["samples"] = mb.samples;
  py::list refs;
  std::vector<std::uint32_t> offsets;
  for (const auto& r : mb.refs) {
    refs.append(py::make_tuple(r.task, r.index));
    offsets.push_back(r.offset);
  }
  d["refs"] = refs;
  d["offsets"] = offsets;
  d["row_offsets"] = mb.row_offsets;
  d["layout"] = layout_name(mb.layout);
  py::list rc;
  for (std::size_t v = 0; v < p.vstages; ++v) {
    const std::size_t i = p.at(m, v);
    rc.append(i < p.recompute.size() && p.recompute[i] <= 2
                  ? costmodel::recompute_name(static_cast<costmodel::Recompute>(p.recompute[i]))
                  : "?");
  }
  d["recompute"] = rc;
  d["loss_tokens"] = mb.loss_tokens;
  d["lengths"] = mb.lengths;
  d["target_lengths"] = mb.target_lengths;
  // Slices: per entry its prefix and the micro-batch of the previous slice (None: none); empty lists
  // without a later slice here.
  d["prefix"] = mb.prefix;
  py::list prev;
  for (const auto x : mb.prev) prev.append(x == pl::kNoSlice ? py::object(py::none()) : py::object(py::int_(x)));
  d["prev"] = prev;
  return d;
}

/// One virtual stage as a dict. "layers" is its range in the model's layer order: for a decoder-only
/// model the same as "encoder_layers" (a decoder-only model's layers are counted there); for an
/// encoder-decoder model the encoder's `encoder_total` layers come first, then the decoder's.
py::dict stage_dict(const pl::StageSpec& s, std::uint32_t encoder_total) {
  py::dict d;
  std::uint32_t begin = s.encoder_begin, end = s.encoder_begin + s.encoder_layers;
  if (s.decoder_layers > 0) {
    if (s.encoder_layers == 0) begin = encoder_total + s.decoder_begin;
    end = encoder_total + s.decoder_begin + s.decoder_layers;
  }
  d["layers"] = py::make_tuple(begin, end);
  d["encoder_layers"] = py::make_tuple(s.encoder_begin, s.encoder_begin + s.encoder_layers);
  d["decoder_layers"] = py::make_tuple(s.decoder_begin, s.decoder_begin + s.decoder_layers);
  d["embedding"] = s.embedding;
  d["head"] = s.head;
  py::list loads;
  for (const auto& t : pl::kLoadTensorNames) {
    if (s.loads & t.value) loads.append(t.name);
  }
  d["loads"] = loads;
  return d;
}

py::dict report_dict(const pl::Plan& p, const pl::ValidationReport& rep) {
  py::list v;
  for (const auto& x : rep.violations) {
    py::dict d;
    d["kind"] = x.kind;
    d["rank"] = x.rank;
    d["index"] = x.index;
    d["message"] = x.message;
    d["text"] = pl::to_string(x, &p);
    v.append(d);
  }
  py::dict d;
  d["ok"] = rep.ok();
  d["violations"] = v;
  d["peak_bytes"] = rep.peak_bytes;
  d["peak_buffer_bytes"] = rep.peak_buffer_bytes;
  d["peak_buffers"] = rep.peak_buffers;
  return d;
}

/// The dataset a plan's refs index: None when unknown, else {"fingerprint": 16 hex digits, "tasks":
/// [{"name", "samples"}, ...] in task order, or None when not recorded}.
py::object dataset_object(const pl::DatasetIdentity& d) {
  if (!d.known()) return py::none();
  py::dict out;
  out["fingerprint"] = fmt::format("{:016x}", d.fingerprint);
  if (d.tasks == nullptr) {
    out["tasks"] = py::none();
  } else {
    py::list tasks;
    for (const auto& t : *d.tasks) tasks.append(py::dict(py::arg("name") = t.name, py::arg("samples") = t.samples));
    out["tasks"] = tasks;
  }
  return out;
}

py::bytes to_bytes(const std::vector<std::uint8_t>& b) {
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace

void declare_plan(py::module_& m) {
  py::class_<pl::Instruction>(m, "Instruction", "One instruction of a rank's stream");
  py::class_<pl::Plan, std::shared_ptr<pl::Plan>>(m, "Plan", "One iteration's plan: header and per-rank instruction streams");
  py::class_<pl::PlanFileReader, std::shared_ptr<pl::PlanFileReader>>(m, "PlanFileReader",
                                                                          "Reads a plan file by iteration (memory-mapped)");
  py::class_<pl::PlanFileWriter, std::shared_ptr<pl::PlanFileWriter>>(m, "PlanFileWriter",
                                                                          "Writes plans to one file, one iteration at a time");
}

void define_plan(py::module_& m) {
  py::reinterpret_borrow<py::class_<pl::Instruction>>(m.attr("Instruction"))
      .def_property_readonly("op", [](const pl::Instruction& i) { return pl::opcode_name(i.op); })
      .def_property_readonly("opcode", [](const pl::Instruction& i) { return static_cast<int>(i.op); })
      .def_property_readonly("mb", [](const pl::Instruction& i) { return opt(i.mb); })
      .def_property_readonly("stage", [](const pl::Instruction& i) { return opt(i.stage); })
      .def_property_readonly("peer", [](const pl::Instruction& i) { return opt(i.peer); })
      .def_property_readonly("in_", [](const pl::Instruction& i) { return opt(i.in); }, "buffer read (None: absent)")
      .def_property_readonly("in2", [](const pl::Instruction& i) { return opt(i.in2); })
      .def_property_readonly("out", [](const pl::Instruction& i) { return opt(i.out); })
      .def_property_readonly("shape", [](const pl::Instruction& i) { return opt(i.shape); }, "index into Plan.shapes")
      .def_property_readonly("is_compute", [](const pl::Instruction& i) { return pl::is_compute(i.op); })
      .def("__eq__", [](const pl::Instruction& a, const pl::Instruction& b) { return a == b; })
      .def("__repr__", [](const pl::Instruction& i) { return "Instruction(" + pl::to_string(i) + ")"; });

  using PlanPtr = std::shared_ptr<pl::Plan>;
  auto plan_cls = py::reinterpret_borrow<py::class_<pl::Plan, PlanPtr>>(m.attr("Plan"));
  plan_cls
      .def_property_readonly("iteration", [](const pl::Plan& p) { return p.iteration; })
      .def_property_readonly("schedule", [](const pl::Plan& p) { return p.schedule; })
      .def_property_readonly("ranks", [](const pl::Plan& p) { return p.ranks; })
      .def_property_readonly("vstages", [](const pl::Plan& p) { return p.vstages; })
      .def_property_readonly("stage_rank", [](const pl::Plan& p) { return p.stage_rank; })
      .def_property_readonly("dp", [](const pl::Plan& p) { return p.dp; })
      .def_property_readonly("replica", [](const pl::Plan& p) { return p.replica; })
      .def_property_readonly("global_tokens", [](const pl::Plan& p) { return p.global_tokens; })
      .def_property_readonly(
          "stages",
          [](const pl::Plan& p) {
            std::uint32_t encoder_total = 0;  // an encoder-decoder model's encoder layers (decoder-only: unused)
            for (const auto& s : p.stages) encoder_total = std::max(encoder_total, s.encoder_begin + s.encoder_layers);
            py::list out;
            for (const auto& s : p.stages) out.append(stage_dict(s, encoder_total));
            return out;
          },
          "Per virtual stage: layers (its [begin, end) range in the model's layer order: a decoder-only model's layers; "
          "an encoder-decoder model's encoder layers, then its decoder layers), encoder_layers and decoder_layers as "
          "[begin, end) ranges (a decoder-only model's layers are its encoder_layers), embedding, head, and the "
          "tensors its LOAD_MB brings (empty list for a format-1 plan)")
      .def_property_readonly("dtype", [](const pl::Plan& p) { return pl::dtype_name(p.dtype); },
                             "Activations' and gradients' dtype between stages")
      .def_property_readonly("loss_mode", [](const pl::Plan& p) { return pl::loss_mode_name(p.loss_mode); },
                             "'all' (every next-token prediction) or 'targets' (target tokens only)")
      .def_property_readonly("global_loss_tokens", [](const pl::Plan& p) { return p.global_loss_tokens; },
                             "Loss tokens of the global batch over every replica (the loss weights' denominator)")
      .def_property_readonly("tied_embedding", [](const pl::Plan& p) { return p.tied_embedding; })
      .def_property_readonly("max_seq_len", [](const pl::Plan& p) { return p.max_seq_len; },
                             "The context length planned for (0: none): every microbatches[m]['lengths'] entry is at "
                             "most it, and position ids restart at 0 for each sample and chunk")
      .def_property_readonly("max_target_len", [](const pl::Plan& p) { return p.max_target_len; },
                             "Encoder-decoder plans: the decoder side's limit (0: none)")
      .def_property_readonly("dataset", [](const pl::Plan& p) { return dataset_object(p.dataset); },
                             "The dataset its sample refs index (loaders refuse another): None when unknown, else a "
                             "dict with fingerprint (16 hex digits, MultiTaskDataset.fingerprint()) and tasks "
                             "([{name, samples}] in task order, None when not recorded)");
  def_ints(plan_cls, "world_rank", &pl::Plan::world_rank, py::arg("replica"), py::arg("rank"),
           "World rank of pipeline rank `rank` of replica `replica`: replica * ranks + rank");
  plan_cls.def_property_readonly("makespan_ms", [](const pl::Plan& p) { return p.makespan_ms; })
      .def_property_readonly("memory_limit_bytes", [](const pl::Plan& p) { return p.memory_limit_bytes; })
      .def_property_readonly("static_bytes", [](const pl::Plan& p) { return p.static_bytes; })
      .def_property_readonly("buffer_slots", [](const pl::Plan& p) { return p.buffer_slots; })
      .def_property_readonly("stored_bytes", [](const pl::Plan& p) { return p.stored_bytes; }, "[mb * vstages + v]")
      .def_property_readonly("peak_bytes", [](const pl::Plan& p) { return p.peak_bytes; }, "[mb * vstages + v]")
      .def_property_readonly("instruction_count", &pl::Plan::instruction_count)
      .def_property_readonly("shapes",
                             [](const pl::Plan& p) {
                               py::list l;
                               for (const auto& s : p.shapes) {
                                 py::dict d;
                                 d["rows"] = s.rows;
                                 d["seq"] = s.seq;
                                 d["hidden"] = s.hidden;
                                 d["enc_seq"] = s.enc_seq;
                                 d["dtype"] = pl::dtype_name(s.dtype);
                                 d["bytes"] = s.bytes();
                                 l.append(d);
                               }
                               return l;
                             })
      .def_property_readonly("microbatches",
                             [](const pl::Plan& p) {
                               py::list l;
                               for (std::size_t i = 0; i < p.microbatches.size(); ++i) l.append(mb_dict(p, i));
                               return l;
                             })
      .def_property_readonly("streams", [](const pl::Plan& p) { return p.streams; },
                             "per rank, a list of Instruction objects (copies)")
      .def_property_readonly("timeline",
                             [](const pl::Plan& p) {
                               py::list l;
                               for (const auto& ops : p.timeline) {
                                 py::list r;
                                 for (const auto& o : ops)
                                   r.append(py::make_tuple(pl::op_kind_token(o.kind), o.mb, o.vstage, o.start_ms, o.end_ms));
                                 l.append(r);
                               }
                               return l;
                             });
  def_ints(plan_cls, "instructions", &stream_array, py::arg("rank"),
           "Rank's stream as a numpy structured array (opcode u1; mb, stage, peer, in, in2, out, shape i4, -1 = absent)");
  def_ints(plan_cls, "validate",
           [](const pl::Plan& p, bool count_buffers) {
             pl::ValidateOptions o;
             o.count_buffers = count_buffers;
             pl::ValidationReport rep;
             {
               py::gil_scoped_release release;
               rep = pl::validate(p, o);
             }
             return report_dict(p, rep);
           },
           py::arg("count_buffers") = false, "Every check of the validator; a dict with ok, violations and peaks");
  plan_cls.def("validate_or_throw",
           [](const pl::Plan& p) {
             py::gil_scoped_release release;
             pl::validate_or_throw(p);
           },
           "Raises RuntimeError listing the first violations");
  def_ints(plan_cls, "to_json", [](const pl::Plan& p, int indent, std::int64_t rank) { return pl::plan_to_json(p, indent, rank); },
           py::arg("indent") = 1, py::arg("rank") = -1);
  def_ints(plan_cls, "to_bytes",
           [](const pl::Plan& p, bool compress) {
             pl::EncodeOptions o;
             o.compress = compress;
             std::vector<std::uint8_t> b;
             {
               py::gil_scoped_release release;
               b = pl::encode_plan(p, o);
             }
             return to_bytes(b);
           },
           py::arg("compress") = false, "The binary form");
  plan_cls.def_static("from_json", [](const std::string& s) { return std::make_shared<pl::Plan>(pl::plan_from_json(s)); },
                  py::arg("text"))
      .def_static("from_bytes",
                  [](const py::bytes& b) {
                    const std::string s = b;
                    return std::make_shared<pl::Plan>(
                        pl::decode_plan(reinterpret_cast<const std::uint8_t*>(s.data()), s.size(), "bytes"));
                  },
                  py::arg("data"))
      .def("pytorch_exportable",
           [](const pl::Plan& p) {
             std::string why;
             const bool ok = pl::pytorch_exportable(p, &why);
             return py::make_tuple(ok, why);
           },
           "(ok, reason): whether every micro-batch shares one shape")
      .def("pytorch_csv", &pl::pytorch_compute_csv, "PyTorch compute_only CSV (RuntimeError if shapes differ)")
      .def("__eq__", [](const pl::Plan& a, const pl::Plan& b) { return a == b; })
      .def("__repr__", [](const pl::Plan& p) {
        return "Plan(iteration=" + std::to_string(p.iteration) + ", schedule='" + p.schedule +
               "', ranks=" + std::to_string(p.ranks) + ", vstages=" + std::to_string(p.vstages) +
               ", microbatches=" + std::to_string(p.microbatches.size()) +
               ", instructions=" + std::to_string(p.instruction_count()) + ")";
      });

  py::reinterpret_borrow<py::class_<pl::PlanFileReader, std::shared_ptr<pl::PlanFileReader>>>(m.attr("PlanFileReader"))
      .def(py::init([](const std::string& path) { return std::make_shared<pl::PlanFileReader>(path); }), py::arg("path"))
      .def("__len__", &pl::PlanFileReader::size)
      .def_property_readonly("iterations",
                             [](const pl::PlanFileReader& r) {
                               std::vector<std::uint64_t> v;
                               for (std::size_t i = 0; i < r.size(); ++i) v.push_back(r.iteration(i));
                               return v;
                             })
      .def("read", [](const pl::PlanFileReader& r, const py::object& iteration, const py::object& replica) {
             const auto it = count_arg<std::uint64_t>(iteration, "iteration");
             const auto rep = count_arg<std::uint32_t>(replica, "replica");
             std::shared_ptr<pl::Plan> p;
             {
               py::gil_scoped_release release;
               p = std::make_shared<pl::Plan>(r.read_iteration(it, rep));
             }
             return p;
           },
           py::arg("iteration"), py::arg("replica") = 0,
           "The plan of `iteration` for data-parallel `replica` (IndexError if absent)")
      .def("__getitem__", [](const pl::PlanFileReader& r, const py::object& position) {
             const auto i = count_arg<std::size_t>(position, "position");
             std::shared_ptr<pl::Plan> p;
             {
               py::gil_scoped_release release;
               p = std::make_shared<pl::Plan>(r.read(i));
             }
             return p;
           },
           py::arg("position"), "The plan at `position` in the file")
      .def_property_readonly("path", &pl::PlanFileReader::path)
      .def_property_readonly("complete", &pl::PlanFileReader::complete,
                             "whether the file holds every iteration its writer declared (False: the planning run "
                             "stopped early; loaders refuse it unless allow_incomplete=True)")
      .def_property_readonly("expected_iterations", &pl::PlanFileReader::expected_iterations,
                             "iterations the writer declared (0: none declared)")
      .def("fingerprint", [](const pl::PlanFileReader& r) { return fmt::format("{:016x}", r.fingerprint()); },
           "16 hex digits identifying the plans the file holds (loader states carry it)")
      .def_property_readonly("dataset", [](const pl::PlanFileReader& r) { return dataset_object(r.dataset()); },
                             "The dataset the plans index, as Plan.dataset (None: the file records none, e.g. an "
                             "older file; loaders then read it unchecked)");

  py::reinterpret_borrow<py::class_<pl::PlanFileWriter, std::shared_ptr<pl::PlanFileWriter>>>(m.attr("PlanFileWriter"))
      .def(py::init([](const py::object& path_obj, const BoolArg& compress, const py::object& inputs) {
             pl::EncodeOptions o;
             o.compress = bool_of(compress, "compress");
             const std::string path = path_arg(path_obj, "path");
             // The files the plans come from must survive: a MultiTaskDataset stands for its manifest and
             // every dataset file (dataset_files).
             const py::module_ pp = py::module_::import("packpipe");
             const py::object files =
                 py::isinstance(inputs, pp.attr("MultiTaskDataset")) ? pp.attr("dataset_files")(inputs) : inputs;
             check_output_is_not_input(path, paths_arg(files, "inputs"), "PlanFileWriter path");
             return std::make_shared<pl::PlanFileWriter>(path, o);
           }),
           py::arg("path"), py::arg("compress") = false, py::kw_only(), py::arg("inputs") = py::tuple(),
           "Write plans to `path` (str or os.PathLike) atomically (it appears at close()). `inputs`: the files the "
           "job reads (paths, or the MultiTaskDataset the plans index: its manifest and dataset files), which "
           "`path` must not be (ValueError). A PlanFileReader of the same path keeps reading the file it opened; "
           "one opened after close() reads the new file")
      .def("append", [](pl::PlanFileWriter& w, const pl::Plan& p) {
             py::gil_scoped_release release;
             w.append(p);
           },
           py::arg("plan"),
           "Append a plan; ValueError at once (nothing written) unless it is the next replica of the last "
           "iteration or replica 0 of the next iteration, and of the dataset of the plans before (the file records it)")
      .def("close", &pl::PlanFileWriter::close)
      .def_property_readonly("plans_written", &pl::PlanFileWriter::plans_written)
      .def("__enter__", [](const std::shared_ptr<pl::PlanFileWriter>& w) { return w; })
      .def("expect_iterations",
           [](pl::PlanFileWriter& w, const py::object& first_iteration, const py::object& count) {
             w.expect_iterations(count_arg<std::uint64_t>(first_iteration, "first_iteration"),
                                 count_arg<std::uint64_t>(count, "count"));
           },
           py::arg("first_iteration"), py::arg("count"),
           "Declare the iterations the file will hold; close() marks it complete only if it holds them")
      .def("discard", &pl::PlanFileWriter::discard, "Drop what was written: nothing appears at the path")
      // An exception inside the with-block discards the file: a failed run leaves nothing behind.
      .def("__exit__", [](pl::PlanFileWriter& w, const py::object& exc_type, const py::object&, const py::object&) {
        if (exc_type.is_none()) {
          w.close();
        } else {
          w.discard();
        }
      });

  m.def("validate_replicas",
        [](const std::vector<std::shared_ptr<pl::Plan>>& plans) {
          std::vector<pl::Plan> v;
          for (const auto& p : plans) {
            if (p == nullptr) throw py::value_error("validate_replicas: a plan is None");
            v.push_back(*p);
          }
          py::list out;
          for (const auto& x : pl::validate_replicas(v)) {
            py::dict d;
            d["kind"] = x.kind;
            d["replica"] = x.rank;
            d["message"] = x.message;
            d["text"] = pl::to_string(x);
            out.append(d);
          }
          return out;
        },
        py::arg("plans"),
        "The plans of one iteration's replicas (replica k at position k) checked against each other: a list of "
        "violations (dicts with kind, replica (-1: the iteration), message, text); empty when they agree");
  m.def("opcode_names", [] {
    std::vector<std::string> v;
    for (int i = 0; i < pl::kOpcodeCount; ++i) v.push_back(pl::opcode_name(static_cast<pl::Opcode>(i)));
    return v;
  }, "Instruction names by opcode value");
}

}  // namespace packpipe::bindings
