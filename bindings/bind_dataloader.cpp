// Python bindings of the dataloader: thin lambdas over the C++ API. Arrays out are zero-copy views
// whose numpy `base` keeps the owning C++ object alive; arrays in are checked, never cast.
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/arrays.h"
#include "bindings/bind.h"
#include "common/errors.h"
#include "dataloader/batch.h"
#include "dataloader/indexed_dataset.h"
#include "dataloader/manifest.h"
#include "dataloader/multitask.h"
#include "dataloader/sampler.h"
#include "dataloader/zstd_seekable.h"

namespace py = pybind11;
namespace dl = packpipe::dataloader;

namespace packpipe::bindings {

namespace {

py::dtype numpy_dtype(dl::DType dt) { return py::dtype(dl::dtype_name(dt)); }

dl::DType dtype_from_py(const py::object& obj) {
  // Accepts numpy dtypes, numpy scalar types (np.uint16) and names ("uint16").
  const std::string name = py::str(py::dtype::from_args(obj).attr("name"));
  return dl::dtype_from_name(name);
}

/// Checks a 1-D C-contiguous array of exactly `dt`; the error names the argument.
void check_array(const py::array& a, const char* arg, py::dtype dt) {
  PACKPIPE_CHECK_ARG(a.ndim() == 1, "{} must be 1-D, found {} dimensions", arg, a.ndim());
  PACKPIPE_CHECK_ARG(a.dtype().is(dt) || a.dtype().equal(dt), "{} must have dtype {}, found {}", arg,
                     std::string(py::str(dt)), std::string(py::str(a.dtype())));
  PACKPIPE_CHECK_ARG((a.flags() & py::array::c_style) != 0, "{} must be C-contiguous", arg);
}

std::uint64_t normalize_index(std::int64_t i, std::uint64_t n, const char* what) {
  const std::int64_t j = i < 0 ? i + static_cast<std::int64_t>(n) : i;
  PACKPIPE_CHECK_RANGE(j >= 0 && static_cast<std::uint64_t>(j) < n, "{} index {} out of range for {} entries",
                       what, i, n);
  return static_cast<std::uint64_t>(j);
}

/// Tokens of sequence i: a view for `.bin`, a copy for `.bin.zst`.
py::array sequence_array(const dl::IndexedDataset& ds, py::handle self, std::uint64_t i, std::uint64_t offset,
                         std::int64_t length) {
  const std::uint64_t len = ds.length(i);
  PACKPIPE_CHECK_RANGE(offset <= len, "offset {} past the end of sequence {} ({} tokens)", offset, i, len);
  const std::uint64_t n = length < 0 ? len - offset : static_cast<std::uint64_t>(length);
  if (!ds.compressed()) {
    const dl::TokenSpan s = ds.view(i);
    PACKPIPE_CHECK_RANGE(offset + n <= s.length, "slice [{}, {}) past the end of sequence {} ({} tokens)", offset,
                         offset + n, i, s.length);
    return view_array(numpy_dtype(ds.dtype()), n,
                      static_cast<const std::uint8_t*>(s.data) + offset * ds.itemsize(), self);
  }
  py::array out(numpy_dtype(ds.dtype()), std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
  ds.read(i, offset, n, out.mutable_data());
  return out;
}

/// A read-only array of an index array of the dataset `self`: a view of one in memory, a copy (through
/// the guard) of one in the mapped `.idx`, which numpy could not read safely once another process
/// truncated the file.
template <typename T>
py::array index_array(const dl::UnalignedArray<T>& a, py::handle self) {
  if (!a.guarded()) return view_array(py::dtype::of<T>(), a.size(), a.bytes(), self);
  std::vector<T> copy(a.size());
  a.copy(0, a.size(), copy.data());
  py::array out = owned_array(std::move(copy));
  out.attr("flags").attr("writeable") = false;
  return out;
}

/// Keeps an assembled batch and the dataset object alive for the arrays that view them.
struct BatchOwner {
  std::shared_ptr<dl::AssembledBatch> batch;
  py::object dataset;
};

/// (input, target) array pairs viewing the samples of an assembled batch.
py::list sample_tuples(std::shared_ptr<dl::AssembledBatch> ab, py::object dataset) {
  auto* holder = new BatchOwner{ab, std::move(dataset)};
  py::capsule owner(holder, [](void* q) { delete static_cast<BatchOwner*>(q); });
  py::list samples;
  for (const auto& v : ab->samples) {
    samples.append(py::make_tuple(view_array(numpy_dtype(v.input.dtype), v.input.length, v.input.data, owner),
                                  view_array(numpy_dtype(v.target.dtype), v.target.length, v.target.data, owner)));
  }
  return samples;
}

py::dict batch_dict(const dl::GlobalBatch& b) {
  std::vector<std::uint32_t> tasks;
  std::vector<std::uint64_t> idx;
  tasks.reserve(b.samples.size());
  idx.reserve(b.samples.size());
  for (const auto& s : b.samples) {
    tasks.push_back(s.task);
    idx.push_back(s.index);
  }
  py::dict d;
  d["epoch"] = b.epoch;
  d["index"] = b.index;
  d["first_position"] = b.first_position;
  d["tokens"] = b.tokens;
  d["tasks"] = owned_array(std::move(tasks));
  d["indices"] = owned_array(std::move(idx));
  return d;
}

/// A global batch from a dict of batch_dict's form: 'tasks' and 'indices' (1-D integer arrays or
/// lists, values checked, never cast) and optionally 'tokens'. Throws InvalidArgument naming the key.
dl::GlobalBatch batch_from_dict(const py::dict& d) {
  for (const char* key : {"tasks", "indices"}) {
    PACKPIPE_CHECK_ARG(d.contains(key), "batch has no '{}' (a dict from Sampler.next_batch has 'tasks' and "
                       "'indices')", key);
  }
  const auto tasks =
      indices_arg(d["tasks"], "batch['tasks']", std::numeric_limits<std::uint32_t>::max(), "task numbers, uint32");
  const auto idx =
      indices_arg(d["indices"], "batch['indices']", std::numeric_limits<std::uint64_t>::max(), "sample indices, uint64");
  PACKPIPE_CHECK_ARG(tasks.size() == idx.size(), "batch 'tasks' ({}) and 'indices' ({}) differ in length",
                     tasks.size(), idx.size());
  dl::GlobalBatch b;
  for (std::size_t k = 0; k < tasks.size(); ++k) b.samples.push_back({static_cast<std::uint32_t>(tasks[k]), idx[k]});
  if (d.contains("tokens")) b.tokens = count_arg<std::uint64_t>(d["tokens"], "batch['tokens']");
  return b;
}

}  // namespace

void declare_dataloader(py::module_& m) {
  py::class_<dl::IndexedDataset>(m, "IndexedDataset",
                                 "A Megatron indexed dataset (<prefix>.idx + <prefix>.bin or .bin.zst), memory-mapped.");
  py::class_<dl::IndexedDatasetBuilder>(m, "IndexedDatasetBuilder",
                                        "Streaming writer of a Megatron MMIDIDX v1 dataset.");
  py::class_<dl::MultiTaskDataset>(m, "MultiTaskDataset", "The datasets of a multi-task manifest, opened.");
  py::class_<dl::Sampler>(m, "Sampler", "Deterministic, resumable multi-task sampler of global batches.");
  py::class_<dl::Prefetcher>(m, "Prefetcher", "Background sampling and assembly of the next global batches.");
}

namespace {

/// IndexedDataset: a dataset read in place; sequences as zero-copy views (copies for .bin.zst).
void define_indexed_dataset(py::module_& m) {
  auto ds = py::reinterpret_borrow<py::class_<dl::IndexedDataset>>(m.attr("IndexedDataset"));
  ds.def(py::init([](const std::string& prefix, const std::string& modes) {
           dl::IndexedDataset::Options o;
           o.modes = dl::modes_policy_from_name(modes);
           return std::make_unique<dl::IndexedDataset>(prefix, o);
         }),
         py::arg("prefix"), py::arg("modes") = "auto", py::call_guard<py::gil_scoped_release>())
      .def("__len__", &dl::IndexedDataset::size)
      .def("__getitem__",
           [](py::object self, const py::object& key) -> py::object {
             const auto& d = self.cast<const dl::IndexedDataset&>();
             if (!py::isinstance<py::slice>(key)) {
               const std::int64_t i = int_of<std::int64_t>(key, "index");
               return sequence_array(d, self, normalize_index(i, d.size(), "sequence"), 0, -1);
             }
             py::ssize_t start = 0, stop = 0, step = 0, len = 0;
             if (!py::reinterpret_borrow<py::slice>(key).compute(static_cast<py::ssize_t>(d.size()), &start, &stop,
                                                                  &step, &len)) {
               throw py::error_already_set();
             }
             py::list out;
             for (py::ssize_t k = 0; k < len; ++k) {
               out.append(sequence_array(d, self, static_cast<std::uint64_t>(start + k * step), 0, -1));
             }
             return out;
           },
           py::arg("index"), "Sequence `index` (negative: from the end) as an array, or a list of them for a slice");
  def_ints(ds, "get",
           [](py::object self, std::int64_t i, std::uint64_t offset, std::int64_t length) {
             const auto& d = self.cast<const dl::IndexedDataset&>();
             return sequence_array(d, self, normalize_index(i, d.size(), "sequence"), offset, length);
           },
           py::arg("idx"), py::arg("offset") = 0, py::arg("length") = -1,
           "Tokens [offset, offset + length) of sequence idx (length -1: to the end).");
  ds.def_property_readonly("sizes", [](py::object self) {
        return index_array(self.cast<const dl::IndexedDataset&>().sizes(), self);
      })
      .def_property_readonly("pointers", [](py::object self) {
        return index_array(self.cast<const dl::IndexedDataset&>().pointers(), self);
      })
      .def_property_readonly("doc_idx", [](py::object self) {
        return index_array(self.cast<const dl::IndexedDataset&>().doc_idx(), self);
      })
      .def_property_readonly("modes", [](py::object self) -> py::object {
        const auto& d = self.cast<const dl::IndexedDataset&>();
        if (!d.has_modes()) return py::none();
        return index_array(d.modes(), self);
      })
      .def_property_readonly("dtype", [](const dl::IndexedDataset& d) { return numpy_dtype(d.dtype()); })
      .def_property_readonly("prefix", &dl::IndexedDataset::prefix)
      .def_property_readonly("format", [](const dl::IndexedDataset& d) { return dl::format_name(d.format()); })
      .def_property_readonly("num_documents", &dl::IndexedDataset::num_documents)
      .def_property_readonly("num_tokens", &dl::IndexedDataset::num_tokens)
      .def_property_readonly("compressed", &dl::IndexedDataset::compressed);
  def_ints(ds, "verify",
           [](const dl::IndexedDataset& d, std::size_t max_problems) {
             std::vector<std::pair<std::string, std::string>> out;
             for (const auto& p : d.verify(max_problems)) out.emplace_back(p.file, p.message);
             return out;
           },
           py::arg("max_problems") = 100, py::call_guard<py::gil_scoped_release>(),
           "Full consistency check; returns a list of (file, message), empty when consistent.");
}

/// IndexedDatasetBuilder: writing a dataset from arrays.
void define_dataset_builder(py::module_& m) {
  auto b = py::reinterpret_borrow<py::class_<dl::IndexedDatasetBuilder>>(m.attr("IndexedDatasetBuilder"));
  b.def(py::init([](const std::string& prefix, py::object dtype, const BoolArg& multimodal) {
          return std::make_unique<dl::IndexedDatasetBuilder>(prefix, dtype_from_py(dtype),
                                                             bool_of(multimodal, "multimodal"));
        }),
        py::arg("prefix"), py::arg("dtype") = py::dtype("int32"), py::arg("multimodal") = false);
  def_ints(b, "add_item",
           [](dl::IndexedDatasetBuilder& self, py::array tokens, std::int8_t mode) {
             check_array(tokens, "tokens", numpy_dtype(self.dtype()));
             py::gil_scoped_release release;
             self.add_item(tokens.data(), static_cast<std::uint64_t>(tokens.size()), mode);
           },
           py::arg("tokens"), py::arg("mode") = 0, "Append one sequence (a 1-D array of the builder's dtype).");
  b.def("end_document", &dl::IndexedDatasetBuilder::end_document)
      .def("add_document",
           [](dl::IndexedDatasetBuilder& self, py::array tokens, py::object lengths, py::object modes) {
             // Lengths and modes are small index arrays: lists or any integer array are accepted, their
             // values checked (sequence lengths are int32 in the index), never cast.
             const std::vector<std::int64_t> lens = integers_arg(
                 lengths, "lengths", 0, std::numeric_limits<std::int32_t>::max(), "tokens per sequence");
             std::vector<std::int8_t> mv;
             if (!modes.is_none()) {
               for (const std::int64_t v : integers_arg(modes, "modes", std::numeric_limits<std::int8_t>::min(),
                                                        std::numeric_limits<std::int8_t>::max(), "int8 modes")) {
                 mv.push_back(static_cast<std::int8_t>(v));
               }
               PACKPIPE_CHECK_ARG(mv.size() == lens.size(), "modes has {} entries but lengths has {} (one per "
                                  "sequence)", mv.size(), lens.size());
             }
             check_array(tokens, "tokens", numpy_dtype(self.dtype()));
             std::int64_t total = 0;
             for (const std::int64_t n : lens) total += n;
             PACKPIPE_CHECK_ARG(total == tokens.size(), "lengths sum to {} but tokens has {} entries", total,
                                tokens.size());
             py::gil_scoped_release release;
             self.add_document(tokens.data(), lens.data(), lens.size(), mv.empty() ? nullptr : mv.data());
           },
           py::arg("tokens"), py::arg("lengths"), py::arg("modes") = py::none(),
           "Append a document: sequences of `lengths` tokens (an integer array or list) taken from `tokens` (a 1-D "
           "array of the builder's dtype), with one mode each (int8 values) or none.")
      .def("add_index", &dl::IndexedDatasetBuilder::add_index, py::arg("prefix"),
           py::call_guard<py::gil_scoped_release>())
      .def("finalize", &dl::IndexedDatasetBuilder::finalize, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_sequences", &dl::IndexedDatasetBuilder::num_sequences)
      .def_property_readonly("num_documents", &dl::IndexedDatasetBuilder::num_documents);
}

/// merge_datasets and compress_dataset: whole-dataset file operations.
void define_dataset_files(py::module_& m) {
  m.def("merge_datasets", &dl::merge_datasets, py::arg("inputs"), py::arg("output_prefix"),
        py::call_guard<py::gil_scoped_release>(), "Concatenate datasets in constant memory.");
  def_ints(m, "compress_dataset",
        [](const std::string& prefix, int level, std::uint32_t frame_size) {
          dl::ZstdSeekableOptions o;
          o.level = level;
          o.frame_size = frame_size;
          return dl::zstd_seekable_compress(prefix + ".bin", prefix + ".bin.zst", o);
        },
        py::arg("prefix"), py::arg("level") = 3, py::arg("frame_size") = 256 * 1024,
        py::call_guard<py::gil_scoped_release>(), "Write <prefix>.bin.zst; returns its size in bytes.");
}

/// MultiTaskDataset: the tasks of a manifest, their lengths and samples.
void define_multitask_dataset(py::module_& m) {
  auto mt = py::reinterpret_borrow<py::class_<dl::MultiTaskDataset>>(m.attr("MultiTaskDataset"));
  mt.def(py::init([](const py::object& path_obj) {
           const std::string path = path_arg(path_obj, "path");
           py::gil_scoped_release release;
           if (path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
             return std::make_unique<dl::MultiTaskDataset>(dl::load_manifest(path));
           }
           return std::make_unique<dl::MultiTaskDataset>(dl::MultiTaskDataset::from_prefix(path));
         }),
         py::arg("path"), "Open a manifest .json or a dataset prefix (str or os.PathLike).")
      .def("__len__", [](const dl::MultiTaskDataset& d) {
        std::uint64_t n = 0;
        for (std::size_t t = 0; t < d.num_tasks(); ++t) n += d.task_size(t);
        return n;
      })
      .def_property_readonly("num_tasks", &dl::MultiTaskDataset::num_tasks)
      .def("fingerprint", [](const dl::MultiTaskDataset& d) { return fmt::format("{:016x}", d.fingerprint()); },
           "16 hex digits identifying what the dataset delivers: its tasks in order (names, layouts, weights), "
           "files and their counts (sampler and loader states carry it)")
      .def_property_readonly("task_names", [](const dl::MultiTaskDataset& d) {
        std::vector<std::string> names;
        for (const auto& t : d.manifest().tasks) names.push_back(t.name);
        return names;
      });
  def_ints(mt, "task_size", &dl::MultiTaskDataset::task_size, py::arg("task"));
  def_ints(mt, "has_targets", &dl::MultiTaskDataset::encoder_decoder, py::arg("task"),
           "Whether the task's samples have a target part (a paired task: input and target datasets), whatever the "
           "model: a decoder-only model trains on input + target");
  def_ints(mt, "encoder_decoder", &dl::MultiTaskDataset::encoder_decoder, py::arg("task"),
           "The same as has_targets: whether the task's samples have a target part (named for the encoder-decoder "
           "layout of paired samples; it says nothing about the model)");
  def_ints(mt, "lengths",
           [](const dl::MultiTaskDataset& d, std::size_t task) {
             PACKPIPE_CHECK_RANGE(task < d.num_tasks(), "task {} out of range ({} tasks)", task, d.num_tasks());
             const std::uint64_t n = d.task_size(task);
             std::vector<std::uint32_t> in(n), tg(n);
             for (std::uint64_t i = 0; i < n; ++i) {
               const dl::SampleRef r{static_cast<std::uint32_t>(task), i};
               in[i] = d.input_length(r);
               tg[i] = d.target_length(r);
             }
             return py::make_tuple(owned_array(std::move(in)), owned_array(std::move(tg)));
           },
           py::arg("task"), "(input_lengths, target_lengths) of every sample of a task, as uint32 arrays.");
  mt.def("sample",
           // Returns py::object, not the list's item accessor: an accessor would refer to the
           // temporary list after it is freed.
           [](py::object self, const py::object& task, const py::object& index) -> py::object {
             const auto& d = self.cast<const dl::MultiTaskDataset&>();
             const auto t = count_arg<std::uint64_t>(task, "task");
             const auto i = count_arg<std::uint64_t>(index, "index");
             d.check_sample(t, i);  // IndexError naming both before the task narrows to 32 bits
             dl::GlobalBatch b;
             b.samples.push_back(dl::SampleRef{static_cast<std::uint32_t>(t), i});
             auto ab = std::make_shared<dl::AssembledBatch>(dl::assemble_batch(d, std::move(b)));
             py::list one = sample_tuples(ab, self);
             return one[0];
           },
           py::arg("task"), py::arg("index"),
           "(input_tokens, target_tokens) of sample `index` of task `task`, numpy arrays of the task's dtype (read-only "
           "copies, made through the guarded reads); target_tokens is empty for a text-only task. IndexError (naming the task, the index "
           "and the size) when out of range; ValueError for a negative or non-integer argument.");
}

/// Sampler: global batches as dicts, checkpointable.
void define_sampler(py::module_& m) {
  auto s = py::reinterpret_borrow<py::class_<dl::Sampler>>(m.attr("Sampler"));
  s.def(py::init([](const dl::MultiTaskDataset& d, const py::object& seed, const py::object& global_batch_tokens,
                    const py::object& global_batch_samples, const std::string& split,
                    std::optional<std::vector<double>> weights, const py::object& epoch) {
          dl::SamplerConfig c = dl::sampler_config(d.manifest());
          c.seed = int_of<std::uint64_t>(seed, "seed");
          c.global_batch_tokens = int_of<std::uint64_t>(global_batch_tokens, "global_batch_tokens");
          c.global_batch_samples = int_of<std::uint64_t>(global_batch_samples, "global_batch_samples");
          c.split = dl::split_from_name(split);
          if (weights) c.weights = *weights;
          auto sp = std::make_unique<dl::Sampler>(d, c);
          sp->set_epoch(int_of<std::uint64_t>(epoch, "epoch"));
          return sp;
        }),
        py::arg("dataset"), py::kw_only(), py::arg("seed") = 1234, py::arg("global_batch_tokens") = 0,
        py::arg("global_batch_samples") = 0, py::arg("split") = "train", py::arg("weights") = py::none(),
        py::arg("epoch") = 0, py::keep_alive<1, 2>())
      .def_property_readonly("epoch_size", &dl::Sampler::epoch_size)
      .def_property_readonly("epoch", &dl::Sampler::epoch)
      .def_property_readonly("position", &dl::Sampler::position);
  def_ints(s, "set_epoch", &dl::Sampler::set_epoch, py::arg("epoch"));
  s.def("next_batch",
           [](dl::Sampler& self) -> py::object {
             dl::GlobalBatch b;
             bool ok;
             {
               py::gil_scoped_release release;
               ok = self.next_batch(b);
             }
             if (!ok) return py::none();
             return batch_dict(b);
           },
           "The next global batch as a dict (tasks, indices, tokens, ...), or None at the end of the epoch.")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__",
           [](dl::Sampler& self) {
             dl::GlobalBatch b;
             if (!self.next_batch(b)) throw py::stop_iteration();
             return batch_dict(b);
           })
      .def("state", [](const dl::Sampler& self) { return self.state().to_json(); },
           "Checkpoint as a JSON string.")
      .def("restore", [](dl::Sampler& self, const std::string& json) { self.restore(dl::SamplerState::from_json(json)); },
           py::arg("state"));
}

/// shard_batch: one data-parallel rank's samples of a global batch.
void define_shard_batch(py::module_& m) {
  def_ints(m, "shard_batch",
        [](const py::dict& batch, const dl::MultiTaskDataset& d, std::uint32_t rank, std::uint32_t world) {
          dl::GlobalBatch b = batch_from_dict(batch);
          const auto shard = dl::shard_batch(b, d, rank, world);
          dl::GlobalBatch out;
          out.samples = shard;
          for (const auto& r : shard) out.tokens += d.sample_tokens(r.task, r.index);
          return batch_dict(out);
        },
        py::arg("batch"), py::arg("dataset"), py::arg("rank"), py::arg("world"),
        "The samples of a global batch that data-parallel rank `rank` of `world` takes.");
}

/// Prefetcher: assembled batches in the background.
void define_prefetcher(py::module_& m) {
  auto pf = py::reinterpret_borrow<py::class_<dl::Prefetcher>>(m.attr("Prefetcher"));
  // The sampler advances as batches are delivered (sampler.state() is what a checkpoint saves), so
  // the Prefetcher keeps both the dataset and the sampler alive.
  pf.def(py::init([](const dl::MultiTaskDataset& d, dl::Sampler& s, const py::object& depth) {
           return std::make_unique<dl::Prefetcher>(d, s, int_of<std::size_t>(depth, "depth"));
         }),
         py::arg("dataset"), py::arg("sampler"), py::arg("depth") = 4, py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
      .def("state", [](const dl::Prefetcher& p) { return p.state().to_json(); },
           "Sampler state after the last delivered batch (the sampler's own state() is the same)")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", [](py::object self) {
        auto& p = self.cast<dl::Prefetcher&>();
        auto ab = std::make_shared<dl::AssembledBatch>();
        bool ok;
        {
          py::gil_scoped_release release;
          ok = p.next(*ab);
        }
        if (!ok) throw py::stop_iteration();
        py::dict d = batch_dict(ab->batch);
        py::list samples = sample_tuples(ab, self);
        d["samples"] = samples;
        return d;
      });
}

}  // namespace

void define_dataloader(py::module_& m) {
  define_indexed_dataset(m);
  define_dataset_builder(m);
  define_dataset_files(m);
  define_multitask_dataset(m);
  define_sampler(m);
  define_shard_batch(m);
  define_prefetcher(m);
}

}  // namespace packpipe::bindings
