// Per-component binding entry points, called from module.cpp.
#pragma once

#include <cstdint>

#include <memory>
#include <mutex>

#include <pybind11/pybind11.h>

#include "costmodel/cost_model.h"
#include "partition/partition.h"

namespace packpipe::bindings {

namespace part = ::packpipe::partition;

/// Declares the dataloader classes (phase 1).
/// A Python integer argument `arg` as an unsigned value at most `max`: ValueError (naming the
/// argument, the value and the limit) for a negative, too large or non-integer value, never a wrap.
/// Accepts numpy integers. Defined in bind_partition.cpp.
std::uint64_t unsigned_arg(const pybind11::handle& value, const char* arg, std::uint64_t max);

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
/// packpipe.PartitionCache: a part::PartitionCache for one thread at a time, holding the last
/// cost model it served (the memo is keyed by the model's address). Defined in bind_partition.cpp.
struct PyPartitionCache {
  part::PartitionCache cache;
  std::shared_ptr<costmodel::CostModel> cost;
  std::mutex busy;
  /// Holds the cache for one call (none when `c` is null); throws InvalidArgument when another
  /// thread holds it.
  struct Use {
    Use(PyPartitionCache* c, const std::shared_ptr<costmodel::CostModel>& cost);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    part::PartitionCache* get() const;
    PyPartitionCache* owner = nullptr;
  };
};

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
