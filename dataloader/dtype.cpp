#include "dataloader/dtype.h"

#include "common/errors.h"

namespace packpipe::dataloader {

namespace {
struct DTypeInfo {
  DType dtype;
  std::size_t size;
  const char* name;
};
constexpr DTypeInfo kTable[] = {
    {DType::UInt8, 1, "uint8"},     {DType::Int8, 1, "int8"},       {DType::Int16, 2, "int16"},
    {DType::Int32, 4, "int32"},     {DType::Int64, 8, "int64"},     {DType::Float64, 8, "float64"},
    {DType::Float32, 4, "float32"}, {DType::UInt16, 2, "uint16"},
};
const DTypeInfo& info(DType dt) {
  const auto code = static_cast<std::size_t>(dt);
  PACKPIPE_ASSERT(code >= 1 && code <= 8);
  return kTable[code - 1];
}
}  // namespace

bool is_valid_dtype_code(std::uint64_t code) { return code >= 1 && code <= 8; }

DType dtype_from_code(std::uint64_t code, const std::string& context) {
  PACKPIPE_CHECK(is_valid_dtype_code(code),
                 "{}: unsupported dtype code {} (expected 1..8: uint8, int8, int16, int32, int64, "
                 "float64, float32, uint16)",
                 context, code);
  return static_cast<DType>(code);
}

std::size_t dtype_size(DType dt) { return info(dt).size; }

const char* dtype_name(DType dt) { return info(dt).name; }

DType dtype_from_name(const std::string& name) {
  for (const auto& e : kTable) {
    if (name == e.name) return e.dtype;
  }
  PACKPIPE_THROW(InvalidArgument,
                 "unknown dtype '{}' (expected one of uint8, int8, int16, int32, int64, float64, "
                 "float32, uint16)",
                 name);
}

DType optimal_dtype(std::uint64_t vocab_size) {
  return vocab_size < 65500 ? DType::UInt16 : DType::Int32;
}

}  // namespace packpipe::dataloader
