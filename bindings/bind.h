// Per-component binding entry points, called from module.cpp, and the helpers the components share.
#pragma once

#include <cstdint>

#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <pybind11/pybind11.h>

#include "costmodel/cost_model.h"
#include "partition/partition.h"

namespace packpipe::bindings {

namespace part = ::packpipe::partition;

/// A Python integer argument `arg` as an unsigned value at most `max`: ValueError (naming the
/// argument, the value and the limit) for a negative, too large or non-integer value, never a wrap.
/// Accepts numpy integers. Defined in bind_partition.cpp.
std::uint64_t unsigned_arg(const pybind11::handle& value, const char* arg, std::uint64_t max);

/// unsigned_arg bounded by what T holds: a count or size that is never negative in C++ (the C++
/// library checks its range).
template <typename T>
T count_arg(const pybind11::handle& value, const char* arg) {
  return static_cast<T>(unsigned_arg(value, arg, static_cast<std::uint64_t>(std::numeric_limits<T>::max())));
}

/// A read/write property `name` of the member `m`: an integer is set through count_arg (never
/// negative, never wrapped), another type as pybind11 converts it; then `check` (a C++ check of the
/// whole object; none when null) runs on a copy, so a refused value leaves the object as it was.
template <typename Obj, typename T>
void def_field(pybind11::class_<Obj>& cls, const char* name, T Obj::*m, const char* doc,
               void (*check)(const Obj&) = nullptr) {
  constexpr bool kCount = std::is_integral_v<T> && !std::is_same_v<T, bool>;
  using Arg = std::conditional_t<kCount, pybind11::handle, T>;
  cls.def_property(
      name, [m](const Obj& o) { return o.*m; },
      [m, name, check](Obj& o, const Arg& v) {
        Obj c = o;
        if constexpr (kCount) {
          c.*m = count_arg<T>(v, name);
        } else {
          c.*m = v;
        }
        if (check != nullptr) check(c);
        o = std::move(c);
      },
      doc);
}

/// A list of the elements of `v` (bound objects) as views into the bound object `self`, which they
/// keep alive.
template <typename T>
pybind11::list views_of(const std::vector<T>& v, const pybind11::object& self) {
  pybind11::list out;
  for (const auto& x : v) out.append(pybind11::cast(&x, pybind11::return_value_policy::reference_internal, self));
  return out;
}

/// A read/write property `name` of the enum member `m`, a string in Python: `to_name` reads it,
/// `from_name` (which throws InvalidArgument listing the names) sets it.
template <typename Obj, typename E>
void def_named(pybind11::class_<Obj>& cls, const char* name, E Obj::*m, const char* (*to_name)(E),
               E (*from_name)(const std::string&), const char* doc) {
  cls.def_property(
      name, [m, to_name](const Obj& o) { return std::string(to_name(o.*m)); },
      [m, from_name](Obj& o, const std::string& v) { o.*m = from_name(v); }, doc);
}

/// "TypeName(field=value, ...)" of a bound object from its properties `fields`: values by their
/// repr, a list, tuple or array as "[n items]" (its length).
std::string record_repr(const pybind11::handle& self, const std::vector<const char*>& fields);

/// Adds __repr__ (record_repr of `fields`) to a bound result class.
template <typename Cls>
void def_repr(Cls& cls, std::vector<const char*> fields) {
  cls.def("__repr__", [fields](const pybind11::handle& self) { return record_repr(self, fields); });
}

/// Adds __repr__, __eq__ (same type, equal `fields`), __copy__ and __deepcopy__ to a bound options class.
template <typename Cls>
void def_value(Cls& cls, std::vector<const char*> fields) {
  using T = typename Cls::type;
  def_repr(cls, fields);
  cls.def("__eq__",
          [fields](const pybind11::handle& a, const pybind11::handle& b) -> pybind11::object {
            if (!pybind11::type::of(a).is(pybind11::type::of(b))) {
              return pybind11::reinterpret_borrow<pybind11::object>(Py_NotImplemented);
            }
            for (const char* f : fields) {
              if (!a.attr(f).equal(b.attr(f))) return pybind11::bool_(false);
            }
            return pybind11::bool_(true);
          })
      .def("__copy__", [](const T& o) { return T(o); })
      .def("__deepcopy__", [](const T& o, const pybind11::handle&) { return T(o); }, pybind11::arg("memo"));
}

void declare_dataloader(pybind11::module_& m);
/// Defines the dataloader methods and functions (phase 2).
void define_dataloader(pybind11::module_& m);

/// Declares the cost-model classes (phase 1).
void declare_costmodel(pybind11::module_& m);
/// Defines the cost-model methods and functions (phase 2).
void define_costmodel(pybind11::module_& m);

/// Calibration (bind_calibration.cpp): measurements, FitOptions, Calibration, CalibratedCostModel.
void declare_calibration(pybind11::module_& m);
void define_calibration(pybind11::module_& m);

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

/// The lengths of one global batch from the input_lengths and target_lengths arguments (lengths_arg;
/// the two must have as many entries). Defined in bind_partition.cpp.
part::BatchLengths batch_arg(const pybind11::object& input_lengths, const pybind11::object& target_lengths);

/// The default shape of plan_batch(), plan_epoch() and ScheduleProblem: 4 stages, as the CLI's `plan`
/// and `schedule` (partition() defaults to PipelineShape(), one stage, as `packpipe partition`).
inline part::PipelineShape four_stage_shape() {
  part::PipelineShape s;
  s.stages = 4;
  return s;
}

/// Micro-batch partition (bind_partition.cpp): PipelineShape, PartitionOptions, MicroBatch,
/// Partition, PartitionCache and partition().
void declare_partition(pybind11::module_& m);
void define_partition(pybind11::module_& m);
/// Schedules and simulation (bind_schedule.cpp).
void declare_schedule(pybind11::module_& m);
void define_schedule(pybind11::module_& m);
/// Plans and instruction streams (bind_plan.cpp).
void declare_plan(pybind11::module_& m);
void define_plan(pybind11::module_& m);

/// The planning job for one global batch and for an epoch (bind_planner.cpp).
void declare_planner(pybind11::module_& m);
void define_planner(pybind11::module_& m);

/// Measurements of executed plans and their validation (bind_measure.cpp): measurements_from(),
/// validate_measurements(), ValidationReport, validation_plot_json().
void declare_measure(pybind11::module_& m);
void define_measure(pybind11::module_& m);

/// The data path from plans to token tensors (bind_loader.cpp): LoadedTensors, RankIteration,
/// RankLoader, microbatch_layout() and assemble_microbatch().
void declare_loader(pybind11::module_& m);
void define_loader(pybind11::module_& m);

/// packpipe._core._runtime (packpipe.runtime): the executor with Python handlers and transports.
void declare_runtime(pybind11::module_& m);
void define_runtime(pybind11::module_& m);

/// Output rules for Python writers (bind_io.cpp): write_file_atomic(), check_outputs(), same_file(),
/// dataset_files().
void define_io(pybind11::module_& m);

}  // namespace packpipe::bindings
