// The checked call for zstd return codes: one place that turns a zstd error into packpipe::Error.
//
// Header only: common does not link zstd; a component that includes this header links zstd
// itself (today dataloader and plan).
#pragma once

#include <zstd.h>

#include <cstddef>
#include <string>
#include <type_traits>

#include "common/errors.h"

namespace packpipe::detail {

/// Returns `code` unless it is a zstd error; then throws Error "<context>: zstd error: <name>
/// (function, file:line)", where <context> is make_context() (called only on failure).
template <class Code, class MakeContext>
Code check_zstd(Code code, const char* func, const char* file, int line,
                MakeContext&& make_context) {
  // Only size_t results are zstd error codes (ZSTD_getFrameContentSize, for one, is not).
  static_assert(std::is_same_v<Code, std::size_t>,
                "PACKPIPE_CHECK_ZSTD takes a size_t-returning zstd call");
  if (ZSTD_isError(code)) {
    throw Error(with_location(make_context() + ": zstd error: " + ZSTD_getErrorName(code), func,
                              file, line));
  }
  return code;
}

}  // namespace packpipe::detail

/// Evaluates the size_t-returning zstd `call` once and yields its value; on a zstd error throws
/// packpipe::Error with the fmt-formatted context (name the file and the offset or frame), the zstd
/// error name and the location, e.g.
///   const std::size_t n = PACKPIPE_CHECK_ZSTD(ZSTD_decompress(...), "{}: frame {}", path, f);
#define PACKPIPE_CHECK_ZSTD(call, ...)                                 \
  ::packpipe::detail::check_zstd((call), __func__, __FILE__, __LINE__, \
                                 [&] { return fmt::format(__VA_ARGS__); })
