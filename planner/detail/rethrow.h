// Errors of background work rethrown on the consumer's thread, naming the iteration they belong to.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "common/errors.h"

namespace packpipe::planner::detail {

/// Rethrows `e` with "iteration N: " in front of its message unless it names the iteration already,
/// keeping its type (InvalidArgument, OutOfRange, Unsupported, Error); other exceptions as they are.
[[noreturn]] inline void rethrow_naming(const std::exception_ptr& e, std::uint64_t iteration) {
  const std::string prefix = fmt::format("iteration {}", iteration);
  auto named = [&](const std::exception& x) {
    const std::string m = x.what();
    return m.rfind(prefix, 0) == 0 ? m : prefix + ": " + m;
  };
  try {
    std::rethrow_exception(e);
  } catch (const InvalidArgument& x) {
    throw InvalidArgument(named(x));
  } catch (const OutOfRange& x) {
    throw OutOfRange(named(x));
  } catch (const Unsupported& x) {
    throw Unsupported(named(x));
  } catch (const Error& x) {
    throw Error(named(x));
  }
}

}  // namespace packpipe::planner::detail
