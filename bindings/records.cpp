// record_repr (bind.h): the __repr__ of the bound option and result classes.
#include <string>
#include <vector>

#include <pybind11/numpy.h>

#include "bindings/bind.h"

namespace py = pybind11;

namespace packpipe::bindings {

std::string record_repr(const py::handle& self, const std::vector<const char*>& fields) {
  std::string out = py::str(py::type::of(self).attr("__name__"));
  out += '(';
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const py::object v = self.attr(fields[i]);
    if (i > 0) out += ", ";
    out += fields[i];
    out += '=';
    if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v) || py::isinstance<py::array>(v)) {
      const std::size_t n = py::len(v);
      out += "[" + std::to_string(n) + (n == 1 ? " item]" : " items]");
    } else {
      out += py::repr(v);
    }
  }
  return out + ')';
}

}  // namespace packpipe::bindings
