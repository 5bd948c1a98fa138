// Python bindings of the loader: packpipe.microbatch_layout and packpipe.assemble_microbatch for one
// micro-batch of a plan, and packpipe.RankLoader, an iterator of RankIteration (a plan and the
// LoadedTensors of one pipeline rank) assembled ahead on a background thread. Tensors are
// zero-copy, read-only numpy views whose base keeps their LoadedTensors alive.
#include <cstdint>
#include <memory>
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
#include "plan/plan.h"
#include "planner/loader.h"

namespace py = pybind11;

namespace packpipe::bindings {

namespace {

namespace cm = packpipe::costmodel;
namespace dl = packpipe::dataloader;
namespace pl = packpipe::plan;
using planner::LoadedTensors;

/// One iteration of a RankLoader: the replica's plan (a packpipe.Plan) and its loads.
struct PyRankIteration {
  std::uint64_t iteration = 0;
  std::shared_ptr<pl::Plan> plan;
  std::vector<std::shared_ptr<LoadedTensors>> loads;
};

/// What RankLoader() returns; the dataset is kept alive by keep_alive, the planner's cost model here.
struct PyRankLoader {
  std::shared_ptr<cm::CostModel> cost;
  std::unique_ptr<planner::RankLoader> loader;
  ~PyRankLoader() {
    // Stops the background assembly and joins it without holding the GIL.
    py::gil_scoped_release release;
    loader.reset();
  }
};

using LoadedClass = py::class_<LoadedTensors, std::shared_ptr<LoadedTensors>>;
using RankIterationClass = py::class_<PyRankIteration, std::shared_ptr<PyRankIteration>>;
using RankLoaderClass = py::class_<PyRankLoader, std::shared_ptr<PyRankLoader>>;

/// A tensor of LoadedTensors: its LoadTensor bit, member and whether it is [rows, dec_seq].
struct TensorField {
  pl::LoadTensor bit;
  std::vector<std::int64_t> LoadedTensors::*member;
  bool decoder;
};
constexpr TensorField kTensorFields[] = {{pl::kLoadInputIds, &LoadedTensors::input_ids, false},
                                         {pl::kLoadPositionIds, &LoadedTensors::position_ids, false},
                                         {pl::kLoadLabels, &LoadedTensors::labels, false},
                                         {pl::kLoadDecoderInputIds, &LoadedTensors::decoder_input_ids, true},
                                         {pl::kLoadDecoderLabels, &LoadedTensors::decoder_labels, true}};

/// The name of a LoadTensor bit (kLoadTensorNames).
const char* tensor_name(pl::LoadTensor bit) { return enum_name(pl::kLoadTensorNames, bit); }

/// A read-only 2-D int64 view [rows, cols] of `v`, kept alive by `owner`.
template <typename T>
py::array matrix_view(const std::vector<T>& v, std::uint32_t rows, std::uint32_t cols, py::handle owner) {
  static const T kEmpty{};
  py::array a(py::dtype::of<T>(), {static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)}, {},
              v.empty() ? &kEmpty : v.data(), owner);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

/// The tensor `f` of the LoadedTensors `self` as a view, or None when its stage does not load it.
py::object tensor_of(const py::object& self, const TensorField& f) {
  const auto& t = self.cast<const LoadedTensors&>();
  if ((t.loads & f.bit) == 0) return py::none();
  return matrix_view(t.*f.member, t.rows, f.decoder ? t.dec_seq : t.seq, self);
}

void define_loaded(py::module_& m) {
  auto c = py::reinterpret_borrow<LoadedClass>(m.attr("LoadedTensors"));
  c.def_readonly("mb", &LoadedTensors::mb, "the micro-batch")
      .def_readonly("stage", &LoadedTensors::stage, "the virtual stage whose LOAD_MB this is")
      .def_readonly("rows", &LoadedTensors::rows, "rows of every tensor")
      .def_readonly("seq", &LoadedTensors::seq, "columns of the encoder (or whole-sample) tensors: the padded length")
      .def_readonly("dec_seq", &LoadedTensors::dec_seq,
                    "columns of the decoder tensors: the padded decoder length (0 for decoder-only plans)")
      .def_readonly("loss_tokens", &LoadedTensors::loss_tokens,
                    "labels (decoder-only) or decoder labels (encoder-decoder) other than ignore_index over the "
                    "micro-batch, whatever the stage loads")
      .def_property_readonly(
          "loads",
          [](const LoadedTensors& t) {
            std::vector<std::string> names;
            for (const auto& f : kTensorFields) {
              if (t.loads & f.bit) names.emplace_back(tensor_name(f.bit));
            }
            return names;
          },
          "names of the tensors the stage loads, in kLoadTensorNames order")
      .def_property_readonly(
          "tensors",
          [](const py::object& self) {
            py::dict d;
            for (const auto& f : kTensorFields) {
              py::object a = tensor_of(self, f);
              if (!a.is_none()) d[tensor_name(f.bit)] = a;
            }
            return d;
          },
          "dict name -> read-only int64 array [rows, seq] ([rows, dec_seq] for decoder tensors), zero-copy views "
          "that keep this object alive");
  for (const auto& f : kTensorFields) {
    c.def_property_readonly(
        tensor_name(f.bit), [f](const py::object& self) { return tensor_of(self, f); },
        "read-only int64 array (a zero-copy view), or None when the stage does not load it");
  }
  def_repr(c, {"mb", "stage", "rows", "seq", "dec_seq", "loads", "loss_tokens"});
}

void define_rank_loader(py::module_& m) {
  auto it = py::reinterpret_borrow<RankIterationClass>(m.attr("RankIteration"));
  it.def_readonly("iteration", &PyRankIteration::iteration, "the iteration")
      .def_readonly("plan", &PyRankIteration::plan, "the replica's packpipe.Plan")
      .def_readonly("loads", &PyRankIteration::loads,
                    "LoadedTensors, one per LOAD_MB of the rank's stream in stream order (rank=None: rank 0's, then "
                    "rank 1's, ...)");
  def_repr(it, {"iteration", "plan", "loads"});

  auto l = py::reinterpret_borrow<RankLoaderClass>(m.attr("RankLoader"));
  l.def(py::init([](const dl::MultiTaskDataset& data, const std::shared_ptr<PyEpochPlanner>& epoch,
                    const py::object& plan_file, const py::object& first_iteration, const py::object& iterations,
                    const py::object& replica, const py::object& rank, const py::object& depth,
                    const py::object& ignore_index, const py::object& pad_id, const py::object& decoder_start_id,
                    const BoolArg& allow_incomplete) {
          PACKPIPE_CHECK_ARG((epoch != nullptr) != !plan_file.is_none(),
                             "RankLoader: give exactly one of planner (an EpochPlanner from plan_epoch) and plan_file");
          planner::RankLoaderOptions o;
          o.replica = count_arg<std::uint32_t>(replica, "replica");
          o.rank = rank.is_none() ? -1 : count_arg<std::int64_t>(rank, "rank");
          o.depth = count_arg<std::size_t>(depth, "depth");
          o.tokens = planner::TokenOptions{signed_arg<std::int64_t>(ignore_index, "ignore_index"),
                                           signed_arg<std::int64_t>(pad_id, "pad_id"),
                                           signed_arg<std::int64_t>(decoder_start_id, "decoder_start_id")};
          o.allow_incomplete = bool_of(allow_incomplete, "allow_incomplete");
          const auto first = count_arg<std::uint64_t>(first_iteration, "first_iteration");
          const auto count = count_arg<std::uint64_t>(iterations, "iterations");
          auto out = std::make_shared<PyRankLoader>();
          if (epoch != nullptr) {
            PACKPIPE_CHECK_ARG(first == 0 && count == 0,
                               "RankLoader: first_iteration and iterations apply to plan_file; give them to "
                               "plan_epoch for a planner");
            std::unique_ptr<planner::EpochPlanner> p = epoch->planner.take();
            out->cost = epoch->cost;
            py::gil_scoped_release release;
            out->loader = std::make_unique<planner::RankLoader>(data, std::move(p), o);
          } else {
            if (!py::isinstance<py::str>(plan_file) && !py::hasattr(plan_file, "__fspath__")) {
              throw py::type_error("plan_file must be a str or an os.PathLike, found " +
                                   std::string(py::str(py::type::of(plan_file).attr("__name__"))));
            }
            const py::object fspath = py::module_::import("os").attr("fspath")(plan_file);
            if (!py::isinstance<py::str>(fspath)) throw py::type_error("plan_file must name a path as str, not bytes");
            const std::string path = fspath.cast<std::string>();
            py::gil_scoped_release release;
            out->loader = std::make_unique<planner::RankLoader>(data, path, first, count, o);
          }
          return out;
        }),
        py::arg("dataset"), py::arg("planner") = nullptr, py::kw_only(), py::arg("plan_file") = py::none(),
        py::arg("first_iteration") = 0, py::arg("iterations") = 0, py::arg("replica") = 0, py::arg("rank") = 0,
        py::arg("depth") = 2, py::arg("ignore_index") = -100, py::arg("pad_id") = 0, py::arg("decoder_start_id") = 0,
        py::arg("allow_incomplete") = false, py::keep_alive<1, 2>(),
        "Assemble the plans and the LOAD_MB tensors of one pipeline rank (rank=None: every rank) of one replica, "
        "iteration after iteration on a background thread up to `depth` iterations ahead. Exactly one of planner "
        "(an EpochPlanner from plan_epoch over this dataset, which the loader takes over: using it afterwards raises "
        "RuntimeError) and plan_file (a plan file; first_iteration and iterations (0: to the end) pick its "
        "iterations; an incomplete file, whose planning run stopped early, is refused unless allow_incomplete=True). "
        "ignore_index, pad_id and decoder_start_id fill what the samples do not.")
      .def_property_readonly(
          "iterations", [](const PyRankLoader& x) { return x.loader->iterations(); }, "iterations this loader yields")
      .def_property_readonly(
          "position", [](const PyRankLoader& x) { return x.loader->position(); },
          "the iteration number the next __next__ delivers")
      .def("__len__", [](const PyRankLoader& x) { return x.loader->iterations(); })
      .def("__iter__", [](const py::object& self) { return self; })
      .def(
          "__next__",
          [](PyRankLoader& x) {
            planner::RankIteration r;
            bool more = false;
            {
              py::gil_scoped_release release;
              more = x.loader->next(r);
            }
            if (!more) throw py::stop_iteration();
            auto out = std::make_shared<PyRankIteration>();
            out->iteration = r.iteration;
            out->plan = std::make_shared<pl::Plan>(std::move(r.plan));
            for (auto& t : r.loads) out->loads.push_back(std::make_shared<LoadedTensors>(std::move(t)));
            return out;
          },
          "the next RankIteration (assembled ahead; the GIL is released while waiting); an error of planning, "
          "reading or assembly is raised here, naming the iteration, after every earlier iteration");
  def_repr(l, {"iterations", "position"});
}

}  // namespace

void declare_loader(py::module_& m) {
  LoadedClass(m, "LoadedTensors",
              "The tensors one LOAD_MB brings (int64 token ids, positions and labels of a micro-batch's rows).");
  RankIterationClass(m, "RankIteration", "One iteration of a RankLoader: the replica's plan and the rank's loads.");
  RankLoaderClass(m, "RankLoader",
                  "The plans and LOAD_MB tensors of one pipeline rank, assembled ahead on a background thread.");
}

void define_loader(py::module_& m) {
  define_loaded(m);
  define_rank_loader(m);
  def_ints(
      m, "microbatch_layout",
      [](const std::shared_ptr<pl::Plan>& plan, const py::object& mb, bool decoder) {
        PACKPIPE_CHECK_ARG(plan != nullptr, "plan must not be None");
        const auto m_ = count_arg<std::size_t>(mb, "mb");
        planner::RowLayout l;
        {
          py::gil_scoped_release release;
          l = planner::microbatch_layout(*plan, m_, decoder);
        }
        const std::vector<py::ssize_t> shape = {static_cast<py::ssize_t>(l.rows), static_cast<py::ssize_t>(l.seq)};
        py::dict d;
        d["cu_seqlens"] = owned_array(std::move(l.cu_seqlens));
        d["position_ids"] = owned_array(std::move(l.position_ids), shape);
        d["segment_ids"] = owned_array(std::move(l.segment_ids), shape);
        d["max_seqlen"] = l.max_seqlen;
        d["cu_seqlens_k"] = owned_array(std::move(l.cu_seqlens_k));
        d["max_seqlen_k"] = l.max_seqlen_k;
        d["prefix"] = owned_array(std::move(l.prefix));
        d["continues"] = owned_array(std::move(l.continues));
        return d;
      },
      py::arg("plan"), py::arg("mb"), py::arg("decoder") = false,
      "The rows of micro-batch `mb` of a plan (its encoder or whole-sample side; decoder=True: its decoder side) "
      "as packpipe.row_tensors gives them: a dict with cu_seqlens (int32, padding as its own segment), "
      "position_ids and segment_ids (int32 [rows, seq]; a slice's positions continue from its prefix), max_seqlen "
      "(at least every segment), the keys' side cu_seqlens_k and max_seqlen_k (a slice's kept prefix, then its "
      "own tokens), and per sample entry its prefix (uint32) and whether it continues in a later micro-batch "
      "(uint8).");
  def_ints(m,
      "assemble_microbatch",
      [](const dl::MultiTaskDataset& data, const std::shared_ptr<pl::Plan>& plan, const py::object& mb,
         const py::object& stage, std::int64_t ignore_index, std::int64_t pad_id, std::int64_t decoder_start_id) {
        PACKPIPE_CHECK_ARG(plan != nullptr, "plan must not be None");
        const auto m_ = count_arg<std::size_t>(mb, "mb");
        const auto v = count_arg<std::uint32_t>(stage, "stage");
        auto out = std::make_shared<LoadedTensors>();
        py::gil_scoped_release release;
        *out = planner::assemble_microbatch(data, *plan, m_, v,
                                            planner::TokenOptions{ignore_index, pad_id, decoder_start_id});
        return out;
      },
      py::arg("dataset"), py::arg("plan"), py::arg("mb"), py::arg("stage"), py::kw_only(),
      py::arg("ignore_index") = -100, py::arg("pad_id") = 0, py::arg("decoder_start_id") = 0,
      "The LoadedTensors virtual stage `stage` loads for micro-batch `mb` of a plan made from this dataset "
      "(plan_epoch, or plan_batch with refs): the tensors of its LOAD_MB by the token rule of docs/design/011.");
}

}  // namespace packpipe::bindings
