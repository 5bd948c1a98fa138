// Exception types of packpipe and the checking macros that throw them.
//
// User errors (bad files, bad arguments) throw one of the types below with a message that
// names the file, the offset or index, and expected versus found. Internal invariants use
// PACKPIPE_ASSERT. pybind11 maps InvalidArgument to ValueError, OutOfRange to IndexError and
// Error / Unsupported to RuntimeError without a custom translator.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace packpipe {

/// I/O, file-format, compression, CUDA and NCCL failures.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A feature this build or this file does not support (e.g. a GPU call without CUDA).
class Unsupported : public Error {
 public:
  using Error::Error;
};

/// A caller-supplied argument is invalid.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// An index is outside its valid range.
class OutOfRange : public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
};

namespace detail {
/// Appends " (function, file:line)" to msg; file is reduced to its last two path components.
std::string with_location(const std::string& msg, const char* func, const char* file, int line);
[[noreturn]] void assert_failed(const char* cond, const char* func, const char* file, int line);
}  // namespace detail

/// a * b for sizes read from files; throws Error naming `what` on overflow.
std::uint64_t mul_checked(std::uint64_t a, std::uint64_t b, const char* what);
/// a + b for sizes read from files; throws Error naming `what` on overflow.
std::uint64_t add_checked(std::uint64_t a, std::uint64_t b, const char* what);

}  // namespace packpipe

/// Throws EXC with a fmt-formatted message plus location when `cond` is false.
#define PACKPIPE_CHECK_AS(EXC, cond, ...)                                                    \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      throw EXC(::packpipe::detail::with_location(fmt::format(__VA_ARGS__), __func__,        \
                                                  __FILE__, __LINE__));                      \
    }                                                                                        \
  } while (0)

/// Input check for file contents and I/O: throws packpipe::Error.
#define PACKPIPE_CHECK(cond, ...) PACKPIPE_CHECK_AS(::packpipe::Error, cond, __VA_ARGS__)
/// Argument check: throws packpipe::InvalidArgument (Python ValueError).
#define PACKPIPE_CHECK_ARG(cond, ...) PACKPIPE_CHECK_AS(::packpipe::InvalidArgument, cond, __VA_ARGS__)
/// Index check: throws packpipe::OutOfRange (Python IndexError).
#define PACKPIPE_CHECK_RANGE(cond, ...) PACKPIPE_CHECK_AS(::packpipe::OutOfRange, cond, __VA_ARGS__)
/// Throws EXC unconditionally with a formatted message plus location.
#define PACKPIPE_THROW(EXC, ...)                                                             \
  throw EXC(::packpipe::detail::with_location(fmt::format(__VA_ARGS__), __func__, __FILE__, __LINE__))

/// Internal invariant; a failure is a packpipe bug, never a user error. Throws std::logic_error.
#define PACKPIPE_ASSERT(cond)                                                                \
  do {                                                                                       \
    if (!(cond)) ::packpipe::detail::assert_failed(#cond, __func__, __FILE__, __LINE__);     \
  } while (0)
