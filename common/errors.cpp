#include "common/errors.h"

#include <cstring>

namespace packpipe {
namespace detail {

std::string with_location(const std::string& msg, const char* func, const char* file, int line) {
  // Keep "component/file.cpp": enough to find the spot, no build-machine directories.
  const char* short_file = file;
  int slashes = 0;
  for (const char* p = file + std::strlen(file); p != file; --p) {
    if (p[-1] == '/' && ++slashes == 2) {
      short_file = p;
      break;
    }
  }
  // A NUL quoted from the input (a name, a field) would end the message where what() is read as a
  // C string (Python's exception, the CLI's stderr): shown as \0.
  std::string text = msg;
  for (std::size_t at = text.find('\0'); at != std::string::npos; at = text.find('\0', at + 2)) {
    text.replace(at, 1, "\\0");
  }
  return fmt::format("{} ({}, {}:{})", text, func, short_file, line);
}

void assert_failed(const char* cond, const char* func, const char* file, int line) {
  throw std::logic_error(with_location(
      fmt::format("internal error: assertion '{}' failed; please report this as a packpipe bug", cond),
      func, file, line));
}

}  // namespace detail

std::uint64_t mul_checked(std::uint64_t a, std::uint64_t b, const char* what) {
  std::uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    PACKPIPE_THROW(Error, "size overflow computing {}: {} * {} exceeds 64 bits", what, a, b);
  }
  return r;
}

std::uint64_t add_checked(std::uint64_t a, std::uint64_t b, const char* what) {
  std::uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    PACKPIPE_THROW(Error, "size overflow computing {}: {} + {} exceeds 64 bits", what, a, b);
  }
  return r;
}

}  // namespace packpipe
