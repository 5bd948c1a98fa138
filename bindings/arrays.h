// numpy helpers shared by the bindings: zero-copy views, arrays that own moved vectors, and
// checked array arguments. Checks live here once so every binding words its errors the same way.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>

namespace packpipe::bindings {

/// Read-only 1-D numpy view of `n` elements of `dt` at `data` (may be unaligned), kept alive by `owner`.
pybind11::array view_array(const pybind11::dtype& dt, std::uint64_t n, const void* data, pybind11::handle owner);

/// Read-only 1-D view of a vector that `owner` keeps alive.
template <typename T>
pybind11::array view_vector(const std::vector<T>& v, pybind11::handle owner) {
  return view_array(pybind11::dtype::of<T>(), v.size(), v.data(), owner);
}

/// A numpy array owning a moved vector (its capsule is the array's base); `shape` defaults to 1-D.
template <typename T>
pybind11::array owned_array(std::vector<T>&& v, std::vector<pybind11::ssize_t> shape = {}) {
  auto* heap = new std::vector<T>(std::move(v));
  pybind11::capsule base(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  if (shape.empty()) shape.push_back(static_cast<pybind11::ssize_t>(heap->size()));
  static const T kEmpty{};
  return pybind11::array(pybind11::dtype::of<T>(), std::move(shape), {}, heap->empty() ? &kEmpty : heap->data(), base);
}

/// Lengths from a 1-D array of any integer dtype (strided views too) or a sequence numpy converts to
/// one (a list of ints); None gives an empty vector. Never casts: a float, bool, complex or object
/// array, another number of dimensions or a value outside [0, 2^32 - 1] throws InvalidArgument
/// naming `arg`, what was expected and what was found.
std::vector<std::uint32_t> lengths_arg(const pybind11::object& obj, const char* arg);

/// Integer values in [lo, hi] from a 1-D array of any integer dtype or a sequence, checked as
/// lengths_arg checks lengths (`what` says what the values are in the dtype message, e.g. "token
/// counts"): never cast, an error names `arg`, the index, what was expected and what was found.
std::vector<std::int64_t> integers_arg(const pybind11::object& obj, const char* arg, std::int64_t lo,
                                       std::int64_t hi, const char* what);
/// integers_arg for unsigned values in [0, hi] (up to 2^64 - 1: dataset indices).
std::vector<std::uint64_t> indices_arg(const pybind11::object& obj, const char* arg, std::uint64_t hi,
                                       const char* what);

/// Values of an array of `ndim` dimensions with a floating or an integer dtype (integers only where
/// exact in a double: magnitude at most 2^53), or of a sequence numpy converts to one, as doubles in
/// row-major order with its shape. Throws InvalidArgument naming `arg` for another dtype (bool,
/// complex, object, ...), another number of dimensions or an integer a double cannot hold exactly.
struct RealArray {
  std::vector<double> values;
  std::vector<pybind11::ssize_t> shape;
};
RealArray real_array_arg(const pybind11::object& obj, const char* arg, int ndim);

}  // namespace packpipe::bindings
