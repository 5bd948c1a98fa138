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

/// Packing (bind_packing.cpp).
void declare_packing(pybind11::module_& m);
void define_packing(pybind11::module_& m);
/// Micro-batch partition (bind_partition.cpp).
void declare_partition(pybind11::module_& m);
void define_partition(pybind11::module_& m);
/// Schedules and simulation (bind_schedule.cpp).
void declare_schedule(pybind11::module_& m);
void define_schedule(pybind11::module_& m);
/// Plans and instruction streams (bind_plan.cpp).
void declare_plan(pybind11::module_& m);
void define_plan(pybind11::module_& m);

/// The planning job for one global batch (bind_planner.cpp).
void declare_planner(pybind11::module_& m);
void define_planner(pybind11::module_& m);

}  // namespace packpipe::bindings
