#include "bindings/arrays.h"

#include <string>

#include "common/errors.h"

namespace py = pybind11;

namespace packpipe::bindings {

py::array view_array(const py::dtype& dt, std::uint64_t n, const void* data, py::handle owner) {
  static const std::uint64_t kEmpty = 0;
  py::array a(dt, {static_cast<py::ssize_t>(n)}, {}, data != nullptr ? data : &kEmpty, owner);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

std::vector<std::uint32_t> lengths_arg(const py::object& obj, const char* arg) {
  std::vector<std::uint32_t> out;
  if (obj.is_none()) return out;
  PACKPIPE_CHECK_ARG(py::isinstance<py::array>(obj), "{} must be a numpy array of uint32 or int64", arg);
  const py::array a = obj.cast<py::array>();
  PACKPIPE_CHECK_ARG(a.ndim() == 1, "{} must be one-dimensional, found {} dimensions", arg, a.ndim());
  const auto n = static_cast<std::size_t>(a.shape(0));
  out.resize(n);
  if (a.dtype().equal(py::dtype::of<std::uint32_t>())) {
    auto v = a.cast<py::array_t<std::uint32_t, py::array::forcecast>>().unchecked<1>();  // handles strides
    for (std::size_t k = 0; k < n; ++k) out[k] = v(static_cast<py::ssize_t>(k));
  } else if (a.dtype().equal(py::dtype::of<std::int64_t>())) {
    auto v = a.cast<py::array_t<std::int64_t, py::array::forcecast>>().unchecked<1>();
    for (std::size_t k = 0; k < n; ++k) {
      const std::int64_t x = v(static_cast<py::ssize_t>(k));
      PACKPIPE_CHECK_ARG(x >= 0 && x <= 0xffffffffLL, "{}[{}] = {} is out of range", arg, k, x);
      out[k] = static_cast<std::uint32_t>(x);
    }
  } else {
    PACKPIPE_THROW(InvalidArgument, "{} must have dtype uint32 or int64, found {}", arg,
                   std::string(py::str(a.dtype())));
  }
  return out;
}

}  // namespace packpipe::bindings
