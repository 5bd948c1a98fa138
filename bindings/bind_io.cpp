// Python bindings of common/file_io.h: the CLI's output rules for Python writers. An output is
// written atomically (a temporary beside it, synced, renamed), is refused when it is one of the
// job's inputs (by inode: through links and relative paths) or another of its outputs, and is
// probed before any work so that a bad path fails at once rather than after a long run.
// Thin lambdas; the checks are the C++ ones the CLI uses.
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "dataloader/multitask.h"

namespace py = pybind11;
namespace dl = packpipe::dataloader;

namespace packpipe::bindings {

namespace {

bool is_path(const py::handle& v) {
  return py::isinstance<py::str>(v) || py::hasattr(v, "__fspath__");
}

}  // namespace

// A path argument: str or os.PathLike (os.fspath), as str; TypeError naming `arg` otherwise.
std::string path_arg(const py::handle& v, const std::string& arg) {
  if (is_path(v)) {
    const py::object p = py::module_::import("os").attr("fspath")(v);
    if (py::isinstance<py::str>(p)) {
      // (a NUL ends the path the system sees, and every message that quotes it)
      const py::object encoded = py::module_::import("os").attr("fsencode")(p);
      const std::string path(py::reinterpret_borrow<py::bytes>(encoded));
      if (path.find('\0') != std::string::npos) {
        throw py::value_error(arg + ": a path cannot hold a NUL character, found " + std::string(py::repr(p)));
      }
      return path;
    }
  }
  throw py::type_error(arg + ": expected a path (str or os.PathLike), found " +
                       std::string(py::str(py::type::of(v).attr("__name__"))));
}

// The paths of `v`: one path, or a sequence of paths (None and "" skipped).
std::vector<std::string> paths_arg(const py::handle& v, const std::string& arg) {
  std::vector<std::string> out;
  if (v.is_none()) return out;
  if (is_path(v)) {
    out.push_back(path_arg(v, arg));
  } else {
    if (!py::isinstance<py::sequence>(v) && !py::isinstance<py::iterable>(v)) {
      throw py::type_error(arg + ": expected a path or a sequence of paths, found " +
                           std::string(py::str(py::type::of(v).attr("__name__"))));
    }
    std::size_t i = 0;
    for (const py::handle& x : v) {
      if (!x.is_none()) out.push_back(path_arg(x, arg + "[" + std::to_string(i) + "]"));
      ++i;
    }
  }
  std::vector<std::string> kept;
  for (auto& p : out) {
    if (!p.empty()) kept.push_back(std::move(p));
  }
  return kept;
}

namespace {

// Outputs as (path, what) pairs: a mapping {what: path or None}, or paths (each named `what`).
std::vector<std::pair<std::string, std::string>> outputs_arg(const py::handle& v, const std::string& what) {
  std::vector<std::pair<std::string, std::string>> out;
  if (py::isinstance<py::dict>(v)) {
    for (const auto& [k, p] : py::reinterpret_borrow<py::dict>(v)) {
      if (!py::isinstance<py::str>(k)) {
        throw py::type_error("outputs: the keys name the outputs (str), found " +
                             std::string(py::str(py::type::of(k).attr("__name__"))));
      }
      const std::string name = k.cast<std::string>();
      if (p.is_none()) continue;
      std::string path = path_arg(p, "outputs['" + name + "']");
      if (!path.empty()) out.emplace_back(std::move(path), name);
    }
    return out;
  }
  for (auto& p : paths_arg(v, "outputs")) out.emplace_back(std::move(p), what);
  return out;
}

// The bytes of `data`: str as UTF-8, or any contiguous buffer (bytes, bytearray, memoryview).
std::string data_arg(const py::handle& data) {
  if (py::isinstance<py::str>(data)) {
    // (str.encode names a character UTF-8 cannot hold, such as a lone surrogate: UnicodeEncodeError)
    return std::string(py::reinterpret_borrow<py::bytes>(data.attr("encode")("utf-8")));
  }
  if (py::isinstance<py::bytes>(data)) return std::string(py::reinterpret_borrow<py::bytes>(data));
  if (PyObject_CheckBuffer(data.ptr()) != 0) {
    const py::bytes b = py::module_::import("builtins").attr("bytes")(data);
    return std::string(b);
  }
  throw py::type_error("data: expected str or bytes, found " +
                       std::string(py::str(py::type::of(data).attr("__name__"))));
}

// Every output not an input, no two outputs the same file, then (probe) each one writable.
void check_outputs_impl(const std::vector<std::pair<std::string, std::string>>& outputs,
                        const std::vector<std::string>& inputs, bool probe) {
  for (const auto& [path, what] : outputs) check_output_is_not_input(path, inputs, what);
  check_distinct_outputs(outputs);
  if (probe) {
    for (const auto& [path, what] : outputs) probe_output(path, what);
  }
}

}  // namespace

void define_io(py::module_& m) {
  m.def(
      "write_file_atomic",
      [](const py::object& path, const py::object& data, const py::object& inputs, const py::object& outputs,
         const std::string& what) {
        const std::string p = path_arg(path, "path");
        PACKPIPE_CHECK_ARG(!p.empty(), "{}: the output path is empty", what);
        const std::string bytes = data_arg(data);
        const std::vector<std::string> in = paths_arg(inputs, "inputs");
        auto all = outputs_arg(outputs, "output");
        all.emplace(all.begin(), p, what);
        py::gil_scoped_release release;
        check_output_is_not_input(p, in, what);
        check_distinct_outputs(all);
        write_file_atomic(p, bytes);
      },
      py::arg("path"), py::arg("data"), py::kw_only(), py::arg("inputs") = py::tuple(),
      py::arg("outputs") = py::tuple(), py::arg("what") = "output",
      "Writes `data` (str as UTF-8, or bytes) to `path` atomically: a temporary beside it, synced and renamed "
      "into place, so a failure never leaves a partial file. Refuses (ValueError naming `what`) a path that is "
      "one of `inputs` (the files the job reads: same inode through links and relative paths) or the same file "
      "as one of `outputs` (the job's other outputs: a {name: path} dict or paths); RuntimeError when it cannot "
      "write (a directory, a missing folder, another writer of the same path)");
  def_ints(
      m, "check_outputs",
      [](const py::object& outputs, const py::object& inputs, bool probe) {
        const auto outs = outputs_arg(outputs, "output");
        const std::vector<std::string> in = paths_arg(inputs, "inputs");
        py::gil_scoped_release release;
        check_outputs_impl(outs, in, probe);
      },
      py::arg("outputs"), py::arg("inputs") = py::tuple(), py::kw_only(), py::arg("probe") = true,
      "Checks a job's outputs before it does any work: `outputs` a {name: path or None} dict (names such as "
      "'--out' appear in the errors) or paths; ValueError when one is one of `inputs` (by inode) or two are the "
      "same file; with `probe`, also ValueError when one cannot be written (a directory, a missing or read-only "
      "folder, another writer holding it): a temporary and a lock beside it are created and removed, the output "
      "itself is not touched");
  m.def(
      "same_file",
      [](const py::object& a, const py::object& b) { return same_file(path_arg(a, "a"), path_arg(b, "b")); },
      py::arg("a"), py::arg("b"),
      "True if both paths exist and name the same file (same device and inode: through symbolic links, hard "
      "links and relative paths)");
  m.def(
      "dataset_files",
      [](const dl::MultiTaskDataset& d) {
        std::vector<std::string> out;
        const dl::Manifest& man = d.manifest();
        if (!man.path.empty()) out.push_back(man.path);
        auto add = [&](const std::string& prefix) {
          for (const char* ext : {".idx", ".bin", ".bin.zst"}) out.push_back(prefix + ext);
        };
        for (const auto& t : man.tasks) {
          for (const auto& p : t.prefixes) add(p);
          for (const auto& p : t.target_prefixes) add(p);
        }
        return out;
      },
      py::arg("dataset"),
      "The files a MultiTaskDataset reads, for a writer's inputs: its manifest and every dataset file of every "
      "task (prefix.idx, .bin and .bin.zst; a name that does not exist matches no output)");
}

}  // namespace packpipe::bindings
