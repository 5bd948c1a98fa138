// Per-component binding entry points, called from module.cpp.
#pragma once

#include <pybind11/pybind11.h>

namespace packpipe::bindings {

/// Declares the dataloader classes (phase 1).
void declare_dataloader(pybind11::module_& m);
/// Defines the dataloader methods and functions (phase 2).
void define_dataloader(pybind11::module_& m);

/// Declares the cost-model classes (phase 1).
void declare_costmodel(pybind11::module_& m);
/// Defines the cost-model methods and functions (phase 2).
void define_costmodel(pybind11::module_& m);

}  // namespace packpipe::bindings
