#include "bindings/bind.h"

namespace packpipe::bindings {
void declare_dataloader(pybind11::module_& m) { (void)m; }
void define_dataloader(pybind11::module_& m) { (void)m; }
}  // namespace packpipe::bindings
