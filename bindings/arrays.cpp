#include "bindings/arrays.h"

#include <cmath>
#include <limits>
#include <string>

#include "common/errors.h"

namespace py = pybind11;

namespace packpipe::bindings {

namespace {

/// `obj` as a numpy array: an array as it is (no copy, no cast), anything else through
/// numpy.asarray, so that the dtype checks below see what numpy made of it.
py::array as_array(const py::object& obj) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  return py::module_::import("numpy").attr("asarray")(obj);
}

std::string dtype_text(const py::array& a) { return py::str(a.dtype()); }

/// Whether x lies in [lo, hi], compared exactly whatever the signedness of T and Out.
template <typename T, typename Out>
bool in_range(T x, Out lo, Out hi) {
  if constexpr (std::numeric_limits<T>::is_signed) {
    if (x < 0) {
      return std::numeric_limits<Out>::is_signed && static_cast<std::int64_t>(lo) <= static_cast<std::int64_t>(x);
    }
  }
  const auto u = static_cast<std::uint64_t>(x);
  if constexpr (std::numeric_limits<Out>::is_signed) {
    return hi >= 0 && u <= static_cast<std::uint64_t>(hi) && (lo <= 0 || u >= static_cast<std::uint64_t>(lo));
  } else {
    return u >= lo && u <= hi;
  }
}

/// Copies `a` (1-D, strided or not) into `out` when its dtype is T; a value outside [lo, hi] throws
/// naming `arg` and the index.
template <typename T, typename Out>
bool read_integers(const py::array& a, const char* arg, Out lo, Out hi, std::vector<Out>& out) {
  if (!a.dtype().equal(py::dtype::of<T>())) return false;
  const auto v = a.unchecked<T, 1>();
  out.resize(static_cast<std::size_t>(v.shape(0)));
  for (py::ssize_t k = 0; k < v.shape(0); ++k) {
    const T x = v(k);
    PACKPIPE_CHECK_ARG(in_range(x, lo, hi), "{}[{}] = {} is out of range [{}, {}]", arg, k, x, lo, hi);
    out[static_cast<std::size_t>(k)] = static_cast<Out>(x);
  }
  return true;
}

/// The values of a 1-D integer array or sequence `obj` in [lo, hi] (`what`: what the values are, in
/// the dtype message); see integers_arg.
template <typename Out>
std::vector<Out> integer_values(const py::object& obj, const char* arg, Out lo, Out hi, const char* what) {
  std::vector<Out> out;
  if (obj.is_none()) return out;
  const bool given_array = py::isinstance<py::array>(obj);
  const py::array a = as_array(obj);
  PACKPIPE_CHECK_ARG(a.ndim() == 1, "{} must be one-dimensional, found {} dimensions", arg, a.ndim());
  if (!given_array && a.size() == 0) return out;  // an empty list has no dtype of its own
  const char kind = a.dtype().kind();
  PACKPIPE_CHECK_ARG(kind == 'i' || kind == 'u', "{} must have an integer dtype ({}), found {}", arg, what,
                     dtype_text(a));
  const bool read = read_integers<std::uint32_t>(a, arg, lo, hi, out) ||
                    read_integers<std::int64_t>(a, arg, lo, hi, out) ||
                    read_integers<std::int32_t>(a, arg, lo, hi, out) ||
                    read_integers<std::uint64_t>(a, arg, lo, hi, out) ||
                    read_integers<std::uint16_t>(a, arg, lo, hi, out) ||
                    read_integers<std::int16_t>(a, arg, lo, hi, out) ||
                    read_integers<std::uint8_t>(a, arg, lo, hi, out) || read_integers<std::int8_t>(a, arg, lo, hi, out);
  PACKPIPE_CHECK_ARG(read, "{} must have an integer dtype in native byte order, found {}", arg, dtype_text(a));
  return out;
}

}  // namespace

py::array view_array(const py::dtype& dt, std::uint64_t n, const void* data, py::handle owner) {
  static const std::uint64_t kEmpty = 0;
  py::array a(dt, {static_cast<py::ssize_t>(n)}, {}, data != nullptr ? data : &kEmpty, owner);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

std::vector<std::uint32_t> lengths_arg(const py::object& obj, const char* arg) {
  return integer_values<std::uint32_t>(obj, arg, 0, std::numeric_limits<std::uint32_t>::max(), "lengths in tokens");
}

std::vector<std::int64_t> integers_arg(const py::object& obj, const char* arg, std::int64_t lo, std::int64_t hi,
                                       const char* what) {
  return integer_values<std::int64_t>(obj, arg, lo, hi, what);
}

std::vector<std::uint64_t> indices_arg(const py::object& obj, const char* arg, std::uint64_t hi, const char* what) {
  return integer_values<std::uint64_t>(obj, arg, 0, hi, what);
}

RealArray real_array_arg(const py::object& obj, const char* arg, int ndim) {
  const py::array a = as_array(obj);
  const char kind = a.dtype().kind();
  PACKPIPE_CHECK_ARG(kind == 'f' || kind == 'i' || kind == 'u', "{} must have a floating or integer dtype, found {}",
                     arg, dtype_text(a));
  PACKPIPE_CHECK_ARG(a.ndim() == ndim, "{} must have {} dimensions, found {}", arg, ndim, a.ndim());
  // The dtype is one a double holds (floating) or holds exactly below 2^53 (integers, checked
  // below): an explicit conversion of an accepted dtype, in C order.
  const auto d = py::array_t<double, py::array::c_style>::ensure(
      py::module_::import("numpy").attr("ascontiguousarray")(a, py::arg("dtype") = "float64"));
  PACKPIPE_ASSERT(d);
  RealArray out;
  out.shape.assign(a.shape(), a.shape() + a.ndim());
  out.values.assign(d.data(), d.data() + d.size());
  if (kind != 'f' && a.dtype().itemsize() > 4) {
    constexpr double kExact = 9007199254740992.0;  // 2^53
    for (std::size_t k = 0; k < out.values.size(); ++k) {
      PACKPIPE_CHECK_ARG(std::fabs(out.values[k]) < kExact,
                         "{} entry {} (row-major) is not exact as a double: integers must be below 2^53 in magnitude",
                         arg, k);
    }
  }
  return out;
}

}  // namespace packpipe::bindings
