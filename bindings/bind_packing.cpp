// Python bindings of packing: packpipe.pack(...) -> Packing with numpy views of the rows and
// row_tensors(). Arrays in are checked (uint32, 1-D, C-contiguous; never cast); arrays out are
// zero-copy: views whose base is the Packing object, or capsules owning moved C++ vectors.
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/arrays.h"
#include "bindings/bind.h"
#include "common/errors.h"
#include "packing/packer.h"
#include "packing/rows.h"

namespace py = pybind11;
namespace pk = packpipe::packing;

namespace packpipe::bindings {

namespace {

/// A packing plus the lengths it was made from (row_tensors needs them).
struct PyPacking {
  pk::Packing packing;
  std::vector<std::uint32_t> lengths;
  std::vector<std::uint32_t> target_lengths;
  pk::Algorithm algorithm = pk::Algorithm::BestFitDecreasing;
};

/// Checks a 1-D C-contiguous uint32 array; the error names the argument.
void check_u32(const py::array& a, const char* arg) {
  const py::dtype dt = py::dtype::of<std::uint32_t>();
  PACKPIPE_CHECK_ARG(a.ndim() == 1, "{} must be 1-D, found {} dimensions", arg, a.ndim());
  PACKPIPE_CHECK_ARG(a.dtype().equal(dt), "{} must have dtype uint32, found {}", arg, std::string(py::str(a.dtype())));
  PACKPIPE_CHECK_ARG((a.flags() & py::array::c_style) != 0, "{} must be C-contiguous", arg);
}

std::vector<std::uint32_t> copy_u32(const py::array& a) {
  const auto* p = static_cast<const std::uint32_t*>(a.data());
  return std::vector<std::uint32_t>(p, p + a.size());
}

}  // namespace

void declare_packing(py::module_& m) {
  py::class_<PyPacking, std::shared_ptr<PyPacking>>(
      m, "Packing", "Rows of packed samples in CSR form (row r: samples[row_offsets[r]:row_offsets[r + 1]]).");
}

void define_packing(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<PyPacking, std::shared_ptr<PyPacking>>>(m.attr("Packing"));
  cls.def_property_readonly(
         "samples", [](py::object self) { return view_vector(self.cast<PyPacking&>().packing.samples, self); },
         "uint32 sample ids, row after row in placement order (read-only view)")
      .def_property_readonly(
          "row_offsets", [](py::object self) { return view_vector(self.cast<PyPacking&>().packing.row_offsets, self); },
          "uint64, rows + 1 entries")
      .def_property_readonly(
          "row_tokens", [](py::object self) { return view_vector(self.cast<PyPacking&>().packing.row_tokens, self); },
          "uint64 input tokens per row")
      .def_property_readonly(
          "row_target_tokens",
          [](py::object self) { return view_vector(self.cast<PyPacking&>().packing.row_target_tokens, self); },
          "uint64 target tokens per row (empty in one dimension)")
      .def_property_readonly("rows", [](const PyPacking& p) { return p.packing.rows(); })
      .def_property_readonly("capacity", [](const PyPacking& p) { return p.packing.capacity; })
      .def_property_readonly("target_capacity", [](const PyPacking& p) { return p.packing.target_capacity; })
      .def_property_readonly("algorithm", [](const PyPacking& p) { return std::string(pk::algorithm_name(p.algorithm)); })
      .def_property_readonly("efficiency", [](const PyPacking& p) { return p.packing.efficiency(); },
                             "real tokens over rows x capacity (both dimensions together)")
      .def("__len__", [](const PyPacking& p) { return p.packing.rows(); });
  def_ints(cls, "row",
          [](py::object self, std::int64_t r) {
            const auto& p = self.cast<PyPacking&>().packing;
            const auto rows = static_cast<std::int64_t>(p.rows());
            const std::int64_t j = r < 0 ? r + rows : r;
            PACKPIPE_CHECK_RANGE(j >= 0 && j < rows, "row {} out of range for {} rows", r, rows);
            const auto begin = p.row_offsets[static_cast<std::size_t>(j)];
            const auto end = p.row_offsets[static_cast<std::size_t>(j) + 1];
            return owned_array(std::vector<std::uint32_t>(p.samples.begin() + static_cast<std::ptrdiff_t>(begin),
                                                          p.samples.begin() + static_cast<std::ptrdiff_t>(end)));
          },
          py::arg("r"), "sample ids of row r (a copy)");
  cls.def(
          "row_tensors",
          [](const PyPacking& p, const py::object& padded_len_arg) {
            // A row of padded_len int32 positions: at most 2^31 - 1 (and what rows x width allocates).
            const std::uint64_t padded_len = unsigned_arg(padded_len_arg, "padded_len", (std::uint64_t{1} << 31) - 1);
            pk::RowTensors t;
            {
              py::gil_scoped_release release;
              t = pk::row_tensors(p.packing, p.lengths.data(), padded_len);
            }
            const auto width = static_cast<py::ssize_t>(padded_len > 0 ? padded_len : p.packing.capacity);
            const auto rows = static_cast<py::ssize_t>(p.packing.rows());
            py::dict d;
            d["cu_seqlens"] = owned_array(std::move(t.cu_seqlens), {static_cast<py::ssize_t>(t.cu_seqlens.size())});
            d["position_ids"] = owned_array(std::move(t.position_ids), {rows, width});
            d["segment_ids"] = owned_array(std::move(t.segment_ids), {rows, width});
            d["max_seqlen"] = t.max_seqlen;
            return d;
          },
          py::arg("padded_len") = py::int_(0),
          "dict of int32 arrays: cu_seqlens (sample boundaries, padding its own segment), position_ids and "
          "segment_ids of shape (rows, padded_len) (padded_len 0: the capacity), and max_seqlen")
      .def("__repr__", [](const PyPacking& p) {
        return "<packpipe.Packing " + std::string(pk::algorithm_name(p.algorithm)) + ": " +
               std::to_string(p.packing.rows()) + " rows of " + std::to_string(p.packing.capacity) +
               (p.packing.target_capacity ? "+" + std::to_string(p.packing.target_capacity) : std::string()) +
               " tokens, efficiency " + std::to_string(p.packing.efficiency()) + ">";
      });

  m.def(
      "pack",
      [](const py::array& lengths, const py::object& capacity_arg, const std::string& algorithm,
         const std::optional<py::array>& target_lengths, const py::object& target_capacity_arg,
         const py::object& max_samples_per_row_arg) {
        constexpr std::uint64_t kU32 = std::numeric_limits<std::uint32_t>::max();
        const std::uint64_t capacity = unsigned_arg(capacity_arg, "capacity", kU32);
        const std::uint64_t target_capacity = unsigned_arg(target_capacity_arg, "target_capacity", kU32);
        const std::uint64_t max_samples_per_row = unsigned_arg(max_samples_per_row_arg, "max_samples_per_row", kU32);
        check_u32(lengths, "lengths");
        auto out = std::make_shared<PyPacking>();
        out->lengths = copy_u32(lengths);
        if (target_lengths) {
          check_u32(*target_lengths, "target_lengths");
          PACKPIPE_CHECK_ARG(target_lengths->size() == lengths.size(),
                             "target_lengths has {} entries, lengths has {}", target_lengths->size(), lengths.size());
          out->target_lengths = copy_u32(*target_lengths);
        }
        pk::PackOptions o;
        o.algorithm = pk::algorithm_from_name(algorithm);
        o.capacity = capacity;
        o.target_capacity = target_capacity;
        o.max_samples_per_row = max_samples_per_row;
        out->algorithm = o.algorithm;
        {
          py::gil_scoped_release release;
          // a given (even empty) target array means two dimensions; pack() checks the capacities
          static const std::uint32_t kNoTargets = 0;
          const std::uint32_t* t =
              target_lengths ? (out->target_lengths.empty() ? &kNoTargets : out->target_lengths.data()) : nullptr;
          out->packing = pk::pack(out->lengths.data(), out->lengths.size(), o, t);
        }
        return out;
      },
      py::arg("lengths"), py::arg("capacity"), py::arg("algorithm") = "bfd", py::arg("target_lengths") = py::none(),
      py::arg("target_capacity") = py::int_(0), py::arg("max_samples_per_row") = py::int_(0),
      "Packs samples of uint32 `lengths` (1-D, C-contiguous) into rows of `capacity` tokens with 'ffd', 'bfd' or "
      "'histogram'; with `target_lengths` and `target_capacity`, in two dimensions. Raises ValueError naming a sample "
      "longer than a capacity. Releases the GIL while packing.");
}

}  // namespace packpipe::bindings
