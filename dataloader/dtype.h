// Token dtypes of Megatron indexed datasets and their on-disk codes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/enum_names.h"

namespace packpipe::dataloader {

/// Megatron dtype codes (MMIDIDX header byte 17, TNTIDX header u64 at offset 16).
enum class DType : std::uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8,
};

/// True if `code` is one of Megatron's dtype codes 1..8.
bool is_valid_dtype_code(std::uint64_t code);
/// DType of a valid code; throws Error "<context>: unsupported dtype code N (expected 1..8)" otherwise.
DType dtype_from_code(std::uint64_t code, const std::string& context);
/// Bytes per token of `dt` (1, 2, 4 or 8).
std::size_t dtype_size(DType dt);
/// The one name table, in code order (codes 1..8): the numpy names.
inline constexpr EnumName<DType> kDTypeNames[] = {
    {DType::UInt8, "uint8"},     {DType::Int8, "int8"},       {DType::Int16, "int16"},
    {DType::Int32, "int32"},     {DType::Int64, "int64"},     {DType::Float64, "float64"},
    {DType::Float32, "float32"}, {DType::UInt16, "uint16"},
};
/// numpy name of `dt` ("uint16", "int32", ...).
constexpr const char* dtype_name(DType dt) { return enum_name(kDTypeNames, dt); }
/// DType from a numpy name; throws InvalidArgument listing the accepted names otherwise.
inline DType dtype_from_name(const std::string& name) { return enum_from_name(kDTypeNames, name, "dtype"); }
/// True if integer token id `id` is exactly representable in `dt`.
bool fits_dtype(std::int64_t id, DType dt);
/// Writes `n` ids into `out` as `dt` (n * dtype_size(dt) bytes); throws InvalidArgument naming the
/// position and value of the first id that does not fit.
void encode_tokens(const std::int64_t* ids, std::size_t n, DType dt, void* out);
/// Reads `n` tokens of dtype `dt` from `in` as int64 (floating dtypes are truncated toward zero).
void decode_tokens(const void* in, std::size_t n, DType dt, std::int64_t* out);
/// The dtype Megatron's preprocess_data.py picks for a vocabulary: uint16 below 65500, else int32.
DType optimal_dtype(std::uint64_t vocab_size);

}  // namespace packpipe::dataloader
