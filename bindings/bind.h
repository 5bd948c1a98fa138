// Per-component binding entry points, called from module.cpp, and the helpers the components share.
#pragma once

#include <cstdint>

#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

#include "common/layout.h"
#include "costmodel/cost_model.h"
#include "partition/partition.h"

namespace packpipe::bindings {

namespace part = ::packpipe::partition;

// Integer arguments: every bound function takes them as IntArg (def_ints, shown as
// typing.SupportsIndex) or as pybind11::object, and converts them here, never through pybind11's own
// integer casters, whose refusal of -1, 2**64 or 2.7 is a TypeError listing every overload instead
// of a message naming the argument. tests/python/test_integer_arguments.py checks that no bound
// function is left with a native integer parameter, and sweeps bad values through every one.
//
// Bool arguments the same way: as BoolArg (def_ints, shown as builtins.bool) or pybind11::object,
// converted by bool_arg. pybind11's own bool caster takes 0, 1, 2.5 and None as truth values
// (convert mode) and refuses "no" with its signature dump; bool_arg takes True, False and numpy
// bools and refuses anything else naming the argument. tests/python/test_bool_arguments.py checks
// that no bound function or property is left with a native bool parameter, and sweeps every one.

/// A Python integer argument `arg` as an unsigned value at most `max`: ValueError (naming the
/// argument, the value and the limit) for a negative, too large or non-integer value (a float, a
/// bool), never a wrap or a cast. Accepts numpy integers. Defined in bind_partition.cpp.
std::uint64_t unsigned_arg(const pybind11::handle& value, const char* arg, std::uint64_t max);

/// A set of layouts from a comma-separated string or a sequence of layout names ('padded',
/// 'packed', 'packed-mask'): ValueError names the argument and lists the layouts. Defined in
/// bind_partition.cpp.
LayoutSet layout_set_arg(const pybind11::object& value);
/// The names of a set of layouts, as a tuple.
pybind11::tuple layout_set_list(LayoutSet set);

/// A Python integer argument `arg` in [lo, hi]: ValueError naming the argument, the range and the
/// value for one outside it or a non-integer (a float, a bool, a string). Defined in bind_partition.cpp.
std::int64_t int_arg(const pybind11::handle& value, const char* arg, std::int64_t lo, std::int64_t hi);

/// int_arg bounded by what the signed type T holds (the C++ library checks its own range).
template <typename T>
T signed_arg(const pybind11::handle& value, const char* arg) {
  return static_cast<T>(int_arg(value, arg, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
}

/// A bool argument `arg`: True or False (numpy bools too); ValueError naming it for anything else
/// (1, "yes", None), never a truth-value cast. Defined in bind_partition.cpp.
bool bool_arg(const pybind11::handle& value, const char* arg);

/// A path argument: str or os.PathLike, as str; TypeError naming `arg` otherwise (bind_io.cpp).
std::string path_arg(const pybind11::handle& v, const std::string& arg);
/// One path, or a sequence of them (None and "" skipped), as str; TypeError naming `arg` otherwise.
std::vector<std::string> paths_arg(const pybind11::handle& v, const std::string& arg);

/// A bool argument as Python gave it, whatever its type: a bound function takes it in place of a C++
/// bool (def_ints does so for every bool parameter), so that pybind11 never casts it by its truth
/// value, and converts it with bool_arg (or bool_of), which names the argument. Shown as
/// `builtins.bool` in signatures (the type bool, spelled apart from pybind11's own caster's).
struct BoolArg {
  pybind11::object value;
  static constexpr auto py_name() { return pybind11::detail::const_name("builtins.bool"); }
};

/// bool_arg of a BoolArg.
inline bool bool_of(const BoolArg& v, const char* name) { return bool_arg(v.value, name); }

/// A list of integers argument `arg` (a sequence of Python or numpy integers), each in [lo, hi]:
/// ValueError naming the argument and the element. Defined in bind_partition.cpp.
std::vector<std::int64_t> int_list_arg(const pybind11::handle& value, const char* arg, std::int64_t lo,
                                       std::int64_t hi);

/// An integer argument as Python gave it, whatever its type: a bound function takes it in place of
/// a C++ integer (def_ints), so that pybind11 never refuses it with its signature dump, and
/// converts it with int_arg / unsigned_arg, which name the argument. Shown as
/// `typing.SupportsIndex` in signatures (an int, or a numpy integer).
struct IntArg {
  pybind11::object value;
  static constexpr auto py_name() { return pybind11::detail::const_name("typing.SupportsIndex"); }
};

/// The C++ integer `T` of the integer argument `v` named `name`: the range of T (the C++ library
/// checks its own, narrower one).
template <typename T>
T int_of(const pybind11::handle& v, const char* name) {
  if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(int_arg(v, name, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
  } else {
    return static_cast<T>(unsigned_arg(v, name, std::numeric_limits<T>::max()));
  }
}

namespace detail {

template <typename T>
inline constexpr bool kCheckedBool = std::is_same_v<std::decay_t<T>, bool>;
template <typename T>
inline constexpr bool kCheckedInt = std::is_integral_v<std::decay_t<T>> && !kCheckedBool<T>;

/// A parameter of type A as the wrapper takes it: IntArg for an integer, BoolArg for a bool, A otherwise.
template <typename A>
using Checked = std::conditional_t<kCheckedInt<A>, IntArg, std::conditional_t<kCheckedBool<A>, BoolArg, A>>;

template <typename A>
decltype(auto) unwrap(Checked<A>& v, const std::vector<std::string>& names, std::size_t i) {
  if constexpr (kCheckedInt<A> || kCheckedBool<A>) {
    thread_local std::string fallback;
    const char* name = i < names.size() ? names[i].c_str() : (fallback = "argument " + std::to_string(i + 1)).c_str();
    if constexpr (kCheckedBool<A>) {
      return bool_arg(v.value, name);
    } else {
      return int_of<std::decay_t<A>>(v.value, name);
    }
  } else {
    return std::forward<A>(v);
  }
}

template <typename T>
struct Signature : Signature<decltype(&T::operator())> {};
template <typename C, typename R, typename... A>
struct Signature<R (C::*)(A...) const> {
  using Return = R;
  using Args = std::tuple<A...>;
};
template <typename C, typename R, typename... A>
struct Signature<R (C::*)(A...)> : Signature<R (C::*)(A...) const> {};
struct FreeFunction {};
template <typename R, typename... A>
struct Signature<R (*)(A...)> : Signature<R (FreeFunction::*)(A...) const> {};

// A callable from a member function pointer (self first), a function pointer or a lambda.
template <typename C, typename R, typename... A>
auto callable(R (C::*f)(A...) const) {
  return [f](const C& self, A... a) -> R { return (self.*f)(std::forward<A>(a)...); };
}
template <typename C, typename R, typename... A>
auto callable(R (C::*f)(A...)) {
  return [f](C& self, A... a) -> R { return (self.*f)(std::forward<A>(a)...); };
}
template <typename F>
F callable(F f) {
  return f;
}

// Calls f on arguments already converted (with the GIL), releasing the GIL for the call itself
// when `Release` (the function was bound with call_guard<gil_scoped_release>).
template <bool Release, typename R, typename F, typename... P>
R call(const F& f, P&&... p) {
  if constexpr (Release) {
    pybind11::gil_scoped_release release;
    return f(std::forward<P>(p)...);
  } else {
    return f(std::forward<P>(p)...);
  }
}

template <bool Release, typename F, typename R, typename... A, std::size_t... I>
auto checked_ints(F f, std::vector<std::string> names, std::size_t offset, std::tuple<A...>*, std::index_sequence<I...>) {
  return [f = std::move(f), names = std::move(names), offset](Checked<A>... a) -> R {
    return call<Release, R>(f, unwrap<A>(a, names, I >= offset ? I - offset : names.size() + I)...);
  };
}

template <typename E>
inline constexpr bool kReleasesGil = std::is_same_v<E, pybind11::call_guard<pybind11::gil_scoped_release>>;

// The extras pybind11 gets: all but a call_guard<gil_scoped_release>, which checked_ints applies
// after the conversions (they need the GIL).
template <typename E>
auto kept(const E& e) {
  if constexpr (kReleasesGil<E>) {
    return std::tuple<>();
  } else {
    return std::tuple<const E&>(e);
  }
}

}  // namespace detail

/// Defines `name` on `scope` (a py::class_: a method, its first parameter self; or a py::module_) as
/// `f` (a lambda, a function or a member function pointer) with every integer parameter taken as an
/// IntArg and converted by int_of, and every bool parameter taken as a BoolArg and converted by
/// bool_arg, named after its py::arg: -1 for an unsigned parameter, 2**64, 2**70, True or 2.7 for
/// an integer, 1, "no" or None for a bool raise ValueError naming the argument, never pybind11's
/// "incompatible function arguments" nor a truth-value cast.
template <typename Scope, typename F, typename... Extra>
Scope& def_ints(Scope& scope, const char* name, F f, const Extra&... extra) {
  auto c = detail::callable(std::move(f));
  using Sig = detail::Signature<decltype(c)>;
  std::vector<std::string> names;
  auto collect = [&](const auto& e) {
    if constexpr (std::is_base_of_v<pybind11::arg, std::decay_t<decltype(e)>>) names.emplace_back(e.name);
  };
  (collect(extra), ...);
  constexpr bool kMethod = !std::is_same_v<Scope, pybind11::module_>;
  constexpr bool kRelease = (detail::kReleasesGil<Extra> || ...);
  using Args = typename Sig::Args;
  auto wrapper = detail::checked_ints<kRelease, decltype(c), typename Sig::Return>(
      std::move(c), std::move(names), kMethod ? 1 : 0, static_cast<Args*>(nullptr),
      std::make_index_sequence<std::tuple_size_v<Args>>());
  std::apply([&](const auto&... e) { scope.def(name, std::move(wrapper), e...); },
             std::tuple_cat(detail::kept(extra)...));
  return scope;
}

/// unsigned_arg bounded by what T holds: a count or size that is never negative in C++ (the C++
/// library checks its range).
template <typename T>
T count_arg(const pybind11::handle& value, const char* arg) {
  return static_cast<T>(unsigned_arg(value, arg, static_cast<std::uint64_t>(std::numeric_limits<T>::max())));
}

/// A read/write property `name` of the member `m`: an integer is set through count_arg (never
/// negative, never wrapped), a bool through bool_arg, another type as pybind11 converts it; then
/// `check` (a C++ check of the whole object; none when null) runs on a copy, so a refused value
/// leaves the object as it was.
template <typename Obj, typename T>
void def_field(pybind11::class_<Obj>& cls, const char* name, T Obj::*m, const char* doc,
               void (*check)(const Obj&) = nullptr) {
  constexpr bool kBool = std::is_same_v<T, bool>;
  constexpr bool kCount = std::is_integral_v<T> && !kBool;
  using Arg = std::conditional_t<kCount, pybind11::handle, std::conditional_t<kBool, BoolArg, T>>;
  cls.def_property(
      name, [m](const Obj& o) { return o.*m; },
      [m, name, check](Obj& o, const Arg& v) {
        Obj c = o;
        if constexpr (kCount) {
          c.*m = count_arg<T>(v, name);
        } else if constexpr (kBool) {
          c.*m = bool_of(v, name);
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

namespace pybind11::detail {

/// Takes any object into an argument wrapper (IntArg, BoolArg), shown as the wrapper's py_name():
/// the bound function converts it (int_of, bool_arg: naming the argument) once the call has begun.
template <typename Arg>
struct object_arg_caster {
  PYBIND11_TYPE_CASTER(Arg, Arg::py_name());
  bool load(handle src, bool) {
    value.value = reinterpret_borrow<object>(src);
    return static_cast<bool>(src);
  }
  static handle cast(const Arg& v, return_value_policy, handle) { return v.value.inc_ref(); }
};

template <>
struct type_caster<packpipe::bindings::IntArg> : object_arg_caster<packpipe::bindings::IntArg> {};
template <>
struct type_caster<packpipe::bindings::BoolArg> : object_arg_caster<packpipe::bindings::BoolArg> {};

}  // namespace pybind11::detail
