#include "dataloader/dtype.h"

#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>

#include "common/errors.h"

namespace packpipe::dataloader {

namespace {
// Bytes per token, indexed by code - 1 (names: kDTypeNames, in the same order).
constexpr std::size_t kSizes[] = {1, 1, 2, 4, 8, 8, 4, 2};
static_assert(std::size(kSizes) == std::size(kDTypeNames), "one size per dtype");

constexpr bool names_in_code_order() {
  for (std::size_t i = 0; i < std::size(kDTypeNames); ++i) {
    if (static_cast<std::size_t>(kDTypeNames[i].value) != i + 1) return false;
  }
  return true;
}
static_assert(names_in_code_order(), "kDTypeNames must list the dtypes in code order");
}  // namespace

bool is_valid_dtype_code(std::uint64_t code) { return code >= 1 && code <= 8; }

DType dtype_from_code(std::uint64_t code, const std::string& context) {
  PACKPIPE_CHECK(is_valid_dtype_code(code), "{}: unsupported dtype code {} (expected 1..8: {})", context, code,
                 enum_name_list(kDTypeNames));
  return static_cast<DType>(code);
}

std::size_t dtype_size(DType dt) {
  const auto code = static_cast<std::size_t>(dt);
  PACKPIPE_ASSERT(code >= 1 && code <= 8);
  return kSizes[code - 1];
}

DType optimal_dtype(std::uint64_t vocab_size) {
  return vocab_size < 65500 ? DType::UInt16 : DType::Int32;
}

}  // namespace packpipe::dataloader

namespace packpipe::dataloader {

namespace {
template <typename T>
bool fits_as(std::int64_t id) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<std::int64_t>(static_cast<T>(id)) == id;
  } else {
    return id >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) &&
           id <= static_cast<std::int64_t>(std::numeric_limits<T>::max());
  }
}

template <typename T>
void encode_as(const std::int64_t* ids, std::size_t n, DType dt, void* out) {
  auto* o = static_cast<std::uint8_t*>(out);
  for (std::size_t i = 0; i < n; ++i) {
    PACKPIPE_CHECK_ARG(fits_as<T>(ids[i]), "token {} (position {}) does not fit dtype {}", ids[i], i,
                       dtype_name(dt));
    const T v = static_cast<T>(ids[i]);
    std::memcpy(o + i * sizeof(T), &v, sizeof(T));
  }
}

template <typename T>
void decode_as(const void* in, std::size_t n, std::int64_t* out) {
  const auto* p = static_cast<const std::uint8_t*>(in);
  for (std::size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    out[i] = static_cast<std::int64_t>(v);
  }
}

template <typename F>
decltype(auto) dispatch(DType dt, F&& f) {
  switch (dt) {
    case DType::UInt8: return f(std::uint8_t{});
    case DType::Int8: return f(std::int8_t{});
    case DType::Int16: return f(std::int16_t{});
    case DType::Int32: return f(std::int32_t{});
    case DType::Int64: return f(std::int64_t{});
    case DType::Float64: return f(double{});
    case DType::Float32: return f(float{});
    case DType::UInt16: return f(std::uint16_t{});
  }
  PACKPIPE_ASSERT(false);
  return f(std::uint8_t{});
}
}  // namespace

bool fits_dtype(std::int64_t id, DType dt) {
  return dispatch(dt, [&](auto t) { return fits_as<decltype(t)>(id); });
}

void encode_tokens(const std::int64_t* ids, std::size_t n, DType dt, void* out) {
  dispatch(dt, [&](auto t) { encode_as<decltype(t)>(ids, n, dt, out); });
}

void decode_tokens(const void* in, std::size_t n, DType dt, std::int64_t* out) {
  dispatch(dt, [&](auto t) { decode_as<decltype(t)>(in, n, out); });
}

}  // namespace packpipe::dataloader
